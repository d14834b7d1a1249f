// index.cuh — gathers (gather, index_select, embedding, advanced indexing, flip, constant
// padding, repeat, nearest-neighbour upsampling, linear interpolation) and iota (arange).
//
// launch_gather<Tx, Tout>(GatherParams<Tx, Tout>, stream)
// Contract
//   - For every index p of out's shape (ndim <= kGatherMaxDims, out_stride in elements):
//       src_d = nearest[d] > 0 ? min(floor(p_d * nearest[d]), size[d] - 1)   (fp32, PyTorch's)
//                              : p_d - lo[d]
//       off   = base + sum_d src_d * coef[d] + sum_k idx_k * idx_coef[k]
//       idx_k = idx[k][p . idx_stride[k]] (int64), plus idx_size[k] when negative
//       out[p . out_stride] = (every 0 <= src_d < size[d]) ? x[off] : fill
//   - Linear interpolation (linear[d] != 0, at most kGatherMaxLinear dims): the dim's source index
//       s  = align_corners ? linear_scale[d] * p_d : max(linear_scale[d] * (p_d + 0.5) - 0.5, 0)
//     (fp32, PyTorch's area_pixel_compute_source_index) gives two taps, i0 = min(int(s), size[d] - 1)
//     and min(i0 + 1, size[d] - 1), blended as (1 - l) * x[.. i0 ..] + l * x[.. i1 ..], l = s - i0,
//     in fp32, the innermost interpolated dim first (PyTorch's nesting).
//     Offsets are elements from x (which points at the tensor's first element) and may step
//     backwards (flip: base at the last element, a negative coef). An index out of its range is
//     the caller's error, as in PyTorch (not checked).
//   - Values convert Tx -> Tout through fp32 unless the types agree (value.cuh).
//   - One thread per output element (gather_plain_kernel: per 16-byte vector of the innermost
//     dim where it is dense and unpadded in x and out), grid-stride, the last dim fastest (the
//     caller orders the dims as out lies in memory); offsets in 64 bits, an element's coordinates
//     found with 32-bit divisions where the output has fewer than 2^31 elements (a 64-bit division
//     is emulated in dozens of instructions, four of them an element made the gather
//     instruction-bound).
//
// launch_iota<T>(out, n, stride, start, step, stream): out[i * stride] = start + i * step for
//   i < n, computed in double and stored in T (arange).
#pragma once

#include <climits>

#include "stitch/common.cuh"
#include "stitch/value.cuh"

namespace stitch {

constexpr int kGatherMaxDims = 8;
constexpr int kGatherMaxIndices = 4;
constexpr int kGatherMaxLinear = 3;

template <class Tx, class Tout>
struct GatherParams {
  const Tx* x;
  Tout* out;
  int ndim;
  int64_t shape[kGatherMaxDims];
  int64_t out_stride[kGatherMaxDims];
  int64_t base;
  int64_t coef[kGatherMaxDims];
  int64_t lo[kGatherMaxDims];
  int64_t size[kGatherMaxDims];
  float nearest[kGatherMaxDims];   // 0: not an upsampled dim
  int nidx;
  const int64_t* idx[kGatherMaxIndices];
  int64_t idx_stride[kGatherMaxIndices][kGatherMaxDims];
  int64_t idx_coef[kGatherMaxIndices];
  int64_t idx_size[kGatherMaxIndices];
  float fill;
  int linear[kGatherMaxDims];         // 1: an interpolated dim (two taps blended)
  float linear_scale[kGatherMaxDims];
  int align_corners;
};

namespace detail {

// Both gather kernels' per-dim arithmetic. An interpolated dim's fp32 source index (PyTorch's
// area_pixel_compute_source_index):
template <class Tx, class Tout>
__device__ __forceinline__ float linear_source(const GatherParams<Tx, Tout>& p, int d, int64_t c) {
  return p.align_corners ? p.linear_scale[d] * float(c) : fmaxf(p.linear_scale[d] * (float(c) + 0.5f) - 0.5f, 0.f);
}
// Any other dim's source index: nearest-neighbour upsampled, or shifted by lo (padding).
template <class Tx, class Tout>
__device__ __forceinline__ int64_t plain_source(const GatherParams<Tx, Tout>& p, int d, int64_t c) {
  return p.nearest[d] > 0.f ? min(int64_t(floorf(float(c) * p.nearest[d])), p.size[d] - 1) : c - p.lo[d];
}

template <class Tx, class Tout, class Idx>
__global__ void __launch_bounds__(256) gather_kernel(GatherParams<Tx, Tout> p, int64_t total) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += grid) {
    Idx rem = Idx(e);
    int64_t off = p.base, o = 0;
    int64_t ioff[kGatherMaxIndices] = {0, 0, 0, 0};
    int64_t step[kGatherMaxLinear];  // the second tap's offset from the first, the innermost dim first
    float w1[kGatherMaxLinear];
    int nlin = 0;
    bool valid = true;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const Idx q = rem / Idx(p.shape[d]);
      const int64_t c = int64_t(rem - q * Idx(p.shape[d]));
      rem = q;
      o += c * p.out_stride[d];
      if (p.linear[d] && nlin < kGatherMaxLinear) {
        const float s = linear_source(p, d, c);
        const int64_t i0 = min(int64_t(s), p.size[d] - 1);
        off += i0 * p.coef[d];
        step[nlin] = i0 < p.size[d] - 1 ? p.coef[d] : 0;
        w1[nlin] = s - float(i0);
        ++nlin;
        for (int k = 0; k < p.nidx; ++k) ioff[k] += c * p.idx_stride[k][d];
        continue;
      }
      const int64_t src = plain_source(p, d, c);
      valid = valid && src >= 0 && src < p.size[d];
      off += src * p.coef[d];
      for (int k = 0; k < p.nidx; ++k) ioff[k] += c * p.idx_stride[k][d];
    }
    for (int k = 0; k < p.nidx; ++k) {
      int64_t i = p.idx[k][ioff[k]];
      if (i < 0) i += p.idx_size[k];
      off += i * p.idx_coef[k];
    }
    if (nlin == 0) {
      p.out[o] = valid ? convert_value<Tout>(p.x[off]) : any_from_float<Tout>(p.fill);
      continue;
    }
    // tap m: bit j set reads the second tap of the j-th interpolated dim (the innermost is j = 0);
    // the blends pair taps 2m, 2m + 1 over the innermost dim, then the next, as PyTorch nests them
    float v[1 << kGatherMaxLinear];
    for (int m = 0; m < (1 << nlin); ++m) {
      int64_t at = off;
      for (int j = 0; j < nlin; ++j) at += (m >> j & 1) ? step[j] : 0;
      v[m] = valid ? any_to_float<Tx>(p.x[at]) : p.fill;
    }
    for (int j = 0; j < nlin; ++j)
      for (int m = 0; m < (1 << (nlin - 1 - j)); ++m) v[m] = (1.f - w1[j]) * v[2 * m] + w1[j] * v[2 * m + 1];
    p.out[o] = any_from_float<Tout>(valid ? v[0] : p.fill);
  }
}

// Linear interpolation without index tensors (upsampling), NLIN interpolated dims known when
// compiled: the dims' walk unrolled over kGatherMaxDims, each interpolated dim's tap step and weight
// kept in registers (a select per slot, never an indexed store), the 2^NLIN taps loaded together.
// The generic kernel's run-time counts put those arrays and the taps in local memory: SegFormer's
// four upsamplings were a third of its GPU time on an H200 after their stores were coalesced.
// Same arithmetic as gather_kernel, in the same order.
template <class Tx, class Tout, class Idx, int NLIN>
__global__ void __launch_bounds__(256) gather_linear_kernel(GatherParams<Tx, Tout> p, int64_t total) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += grid) {
    Idx rem = Idx(e);
    int64_t off = p.base, o = 0;
    int64_t step[NLIN];
    float w1[NLIN];
    int nlin = 0;
    bool valid = true;
#pragma unroll
    for (int d = kGatherMaxDims - 1; d >= 0; --d) {
      if (d >= p.ndim) continue;
      const Idx q = rem / Idx(p.shape[d]);
      const int64_t c = int64_t(rem - q * Idx(p.shape[d]));
      rem = q;
      o += c * p.out_stride[d];
      if (p.linear[d]) {
        const float s = linear_source(p, d, c);
        const int64_t i0 = min(int64_t(s), p.size[d] - 1);
        off += i0 * p.coef[d];
        const int64_t st = i0 < p.size[d] - 1 ? p.coef[d] : 0;
        const float l = s - float(i0);
#pragma unroll
        for (int j = 0; j < NLIN; ++j) {
          if (j == nlin) {
            step[j] = st;
            w1[j] = l;
          }
        }
        ++nlin;
        continue;
      }
      const int64_t src = plain_source(p, d, c);
      valid = valid && src >= 0 && src < p.size[d];
      off += src * p.coef[d];
    }
    float v[1 << NLIN];
#pragma unroll
    for (int m = 0; m < (1 << NLIN); ++m) {
      int64_t at = off;
#pragma unroll
      for (int j = 0; j < NLIN; ++j) at += (m >> j & 1) ? step[j] : 0;
      v[m] = valid ? any_to_float<Tx>(p.x[at]) : p.fill;
    }
#pragma unroll
    for (int j = 0; j < NLIN; ++j)
#pragma unroll
      for (int m = 0; m < (1 << (NLIN - 1 - j)); ++m) v[m] = (1.f - w1[j]) * v[2 * m] + w1[j] * v[2 * m + 1];
    p.out[o] = any_from_float<Tout>(valid ? v[0] : p.fill);
  }
}

// A gather with no interpolated dim, NIDX index tensors known when compiled (embedding,
// index_select, torch.roll's index_selects, advanced indexing, padding, flip, repeat, nearest
// upsampling): the dims' walk unrolled over kGatherMaxDims, the index tensors' offsets in registers.
// The generic kernel kept them (and the interpolation's tap arrays) in a 112-byte local-memory
// frame, indexed by run-time counts. VEC > 1: each thread moves VEC elements of the innermost dim
// as one 16-byte vector (the caller checked that dim dense and unpadded in x and out, every offset
// a multiple of VEC, the pointers 16-byte aligned, Tx == Tout). Same arithmetic as gather_kernel.
template <class Tx, class Tout, class Idx, int NIDX, int VEC>
__global__ void __launch_bounds__(256) gather_plain_kernel(GatherParams<Tx, Tout> p, int64_t total) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += grid) {
    Idx rem = Idx(e);
    int64_t off = p.base, o = 0;
    int64_t ioff[NIDX > 0 ? NIDX : 1] = {};
    bool valid = true;
#pragma unroll
    for (int d = kGatherMaxDims - 1; d >= 0; --d) {
      if (d >= p.ndim) continue;
      const bool inner = d == p.ndim - 1;
      const Idx n = Idx(inner ? p.shape[d] / VEC : p.shape[d]);
      const Idx q = rem / n;
      const int64_t c = int64_t(rem - q * n) * (inner ? VEC : 1);
      rem = q;
      o += c * p.out_stride[d];
      const int64_t src = plain_source(p, d, c);
      valid = valid && src >= 0 && src < p.size[d];
      off += src * p.coef[d];
#pragma unroll
      for (int k = 0; k < NIDX; ++k) ioff[k] += c * p.idx_stride[k][d];
    }
#pragma unroll
    for (int k = 0; k < NIDX; ++k) {
      int64_t i = __ldg(p.idx[k] + ioff[k]);
      if (i < 0) i += p.idx_size[k];
      off += i * p.idx_coef[k];
    }
    if constexpr (VEC == 1) {
      p.out[o] = valid ? convert_value<Tout>(p.x[off]) : any_from_float<Tout>(p.fill);
    } else {
      static_assert(sizeof(Tx) * VEC == 16 && std::is_same_v<Tx, Tout>, "a vector is 16 bytes of one type");
      uint4 v;
      if (valid) {
        v = __ldg(reinterpret_cast<const uint4*>(p.x + off));
      } else {
        Tout f[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) f[j] = any_from_float<Tout>(p.fill);
        v = *reinterpret_cast<const uint4*>(f);
      }
      *reinterpret_cast<uint4*>(p.out + o) = v;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(256) iota_kernel(T* out, int64_t n, int64_t stride, double start, double step) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += grid) {
    const double v = start + double(i) * step;
    if constexpr (std::is_integral_v<T>) out[i * stride] = T(v);
    else out[i * stride] = from_float<T>(float(v));
  }
}

inline unsigned grid_for(int64_t total) {
  const int64_t want = ceil_div<int64_t>(total, 256);
  return unsigned(want < 1 ? 1 : want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
}

// Whether gather_plain_kernel may move VEC elements a thread: the innermost dim dense and unpadded
// in x and out and read by no index tensor, every offset a multiple of VEC, both pointers 16-byte
// aligned.
template <int VEC, class Tx, class Tout>
bool gather_vectorizable(const GatherParams<Tx, Tout>& p) {
  const int L = p.ndim - 1;
  if (L < 0 || p.shape[L] % VEC || p.out_stride[L] != 1 || p.coef[L] != 1 || p.lo[L] != 0 ||
      p.nearest[L] != 0.f || p.size[L] < p.shape[L] || p.base % VEC)
    return false;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.out) % 16) return false;
  for (int d = 0; d < L; ++d)
    if (p.out_stride[d] % VEC || p.coef[d] % VEC) return false;
  for (int k = 0; k < p.nidx; ++k)
    if (p.idx_stride[k][L] != 0 || p.idx_coef[k] % VEC) return false;
  return true;
}

template <class Idx, int NIDX, class Tx, class Tout>
cudaError_t launch_gather_plain(const GatherParams<Tx, Tout>& p, int64_t total, cudaStream_t stream) {
  constexpr int V = 16 / int(sizeof(Tx));
  if constexpr (std::is_same_v<Tx, Tout> && 16 % sizeof(Tx) == 0 && V > 1) {
    if (gather_vectorizable<V>(p)) {
      gather_plain_kernel<Tx, Tout, Idx, NIDX, V><<<grid_for(total / V), 256, 0, stream>>>(p, total / V);
      return cudaGetLastError();
    }
  }
  gather_plain_kernel<Tx, Tout, Idx, NIDX, 1><<<grid_for(total), 256, 0, stream>>>(p, total);
  return cudaGetLastError();
}

}  // namespace detail

// NLIN: the number of interpolated dims when the caller knows it as it compiles the call (1 to 3,
// no index tensors: gather_linear_kernel; 0 with NIDX, the number of index tensors:
// gather_plain_kernel), -1 otherwise (the generic kernel only), so that a gather instantiates only
// the kernel it can take. A hint changes which kernel runs, never what it computes.
template <int NLIN = -1, int NIDX = -1, class Tx, class Tout>
cudaError_t launch_gather(const GatherParams<Tx, Tout>& p, cudaStream_t stream) {
  if (p.ndim < 0 || p.ndim > kGatherMaxDims || p.nidx < 0 || p.nidx > kGatherMaxIndices || !p.x || !p.out)
    return cudaErrorInvalidValue;
  int64_t total = 1;
  for (int d = 0; d < p.ndim; ++d) total *= p.shape[d];
  if (total <= 0) return cudaSuccess;
  if constexpr (NLIN == 0 && NIDX >= 0 && NIDX <= kGatherMaxIndices) {
    bool lin = false;
    for (int d = 0; d < p.ndim; ++d) lin = lin || p.linear[d];
    if (!lin && p.nidx == NIDX) {
      if (total < (int64_t(1) << 31)) return detail::launch_gather_plain<uint32_t, NIDX>(p, total, stream);
      return detail::launch_gather_plain<int64_t, NIDX>(p, total, stream);
    }
  }
  if constexpr (NLIN >= 1 && NLIN <= kGatherMaxLinear) {
    int nlin = 0;
    for (int d = 0; d < p.ndim; ++d) nlin += p.linear[d] ? 1 : 0;
    if (nlin == NLIN && p.nidx == 0) {
      if (total < (int64_t(1) << 31))
        detail::gather_linear_kernel<Tx, Tout, uint32_t, NLIN><<<detail::grid_for(total), 256, 0, stream>>>(p, total);
      else
        detail::gather_linear_kernel<Tx, Tout, int64_t, NLIN><<<detail::grid_for(total), 256, 0, stream>>>(p, total);
      return cudaGetLastError();
    }
  }
  if (total < (int64_t(1) << 31))
    detail::gather_kernel<Tx, Tout, uint32_t><<<detail::grid_for(total), 256, 0, stream>>>(p, total);
  else
    detail::gather_kernel<Tx, Tout, int64_t><<<detail::grid_for(total), 256, 0, stream>>>(p, total);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_iota(T* out, int64_t n, int64_t stride, double start, double step, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!out) return cudaErrorInvalidValue;
  detail::iota_kernel<T><<<detail::grid_for(n), 256, 0, stream>>>(out, n, stride, start, step);
  return cudaGetLastError();
}

}  // namespace stitch
