// scan.cuh — operations along one axis that keep its order: inclusive scans (cumsum, cumprod,
// cummax, cummin, logcumsumexp; forward or reverse) and arg reductions (argmax, argmin).
//
// launch_scan<OP, Tin, Tout, Pro, Epi>(ScanParams<Tin, Tout>, stream, pro, epi)
//   OP    ScanOp::{Sum, Prod, Max, Min, LogSumExp}; Tin / Tout any storage type (value.cuh);
//   Pro   hook on every input element; Epi on every output element.
// Contract
//   - in viewed as [outer, n, inner] (element strides in_so, in_sn, in_si), out likewise; the
//     scan runs along n: out[o, j, i] = epi(op_{k <= j} pro(in[o, k, i])), or over k >= j when
//     `reverse`. out may be in itself (same strides): each element is read before it is written,
//     by the thread that writes it.
//   - fp32 accumulation; Max / Min let a NaN win (PyTorch's cummax); LogSumExp is
//     m + log(exp(a - m) + exp(b - m)) with m = max(a, b).
//   - inner == 1, rows contiguous and 16-byte aligned, forward, n >= 4096: one block of 256
//     threads per row, the row in tiles of 4096 elements, a warp a contiguous 512 of them as four
//     chunks of 32 lanes x 4 (every load and store of a warp one contiguous piece; the next tile's
//     loaded while this one is scanned); a lane scans its pieces in registers, the chunks are
//     scanned across lanes by shuffles, the warps' totals through shared memory, and the running
//     total is carried from tile to tile: every element read once and written once. Other rows (inner == 1): one block per row, its warps
//     each scanning a contiguous piece 32 elements at a time: pass 1 reduces each piece, the
//     pieces' totals are scanned in shared memory, pass 2 scans each piece again from its carry
//     (a second read of the row). inner > 1: one thread per (outer, inner) column, walking n
//     (coalesced along inner).
//
// launch_arg_reduce<OP, Tin, Pro>(ArgParams<Tin>, stream, pro)
//   OP    ArgOp::{Max, Min}. out[o, i] (int64) = the index along red of the first maximum
//         (minimum) of pro(in[o, :, i]); a NaN counts as the extreme (PyTorch's argmax).
//   - inner == 1: a warp per row (lanes stride along red, then a shuffle merge keeping the
//     smaller index on ties); inner > 1: a thread per (outer, inner), walking red.
#pragma once

#include <climits>

#include "stitch/common.cuh"
#include "stitch/value.cuh"

namespace stitch {

enum class ScanOp { Sum, Prod, Max, Min, LogSumExp };

template <class Tin, class Tout>
struct ScanParams {
  const Tin* in;
  int64_t outer, n, inner;
  int64_t in_so, in_sn, in_si;
  Tout* out;
  int64_t out_so, out_sn, out_si;
  bool reverse;
};

namespace detail {

template <ScanOp OP>
__device__ __forceinline__ float scan_identity() {
  if constexpr (OP == ScanOp::Sum) return 0.f;
  else if constexpr (OP == ScanOp::Prod) return 1.f;
  else if constexpr (OP == ScanOp::Min) return CUDART_INF_F;
  else return -CUDART_INF_F;
}

template <ScanOp OP>
__device__ __forceinline__ float scan_combine(float a, float b) {
  if constexpr (OP == ScanOp::Sum) {
    return a + b;
  } else if constexpr (OP == ScanOp::Prod) {
    return a * b;
  } else if constexpr (OP == ScanOp::Max) {
    return a != a ? a : (b > a || b != b) ? b : a;
  } else if constexpr (OP == ScanOp::Min) {
    return a != a ? a : (b < a || b != b) ? b : a;
  } else {
    const float m = fmaxf(a, b);
    if (m == -CUDART_INF_F) return m;
    return m + logf(expf(a - m) + expf(b - m));
  }
}

template <ScanOp OP>
__device__ __forceinline__ float warp_inclusive_scan(float v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v = scan_combine<OP>(y, v);
  }
  return v;
}

// One block per row (inner == 1); blockDim.x = 32 * warps, warps <= 32.
template <ScanOp OP, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(1024) scan_rows_kernel(ScanParams<Tin, Tout> p, Pro pro, Epi epi) {
  __shared__ float totals[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t piece = ceil_div<int64_t>(p.n, warps);
  for (int64_t row = blockIdx.x; row < p.outer; row += gridDim.x) {
    const Tin* x = p.in + row * p.in_so;
    Tout* y = p.out + row * p.out_so;
    const int64_t k0 = warp * piece;
    const int64_t k1 = k0 + piece < p.n ? k0 + piece : p.n;
    // Position k of the scan order lives at element k (or n - 1 - k when reverse).
    auto at = [&](int64_t k) { return p.reverse ? p.n - 1 - k : k; };
    float acc = scan_identity<OP>();
    for (int64_t k = k0 + lane; k - lane < k1; k += 32) {
      const float v = k < k1 ? pro(any_to_float(x[at(k) * p.in_sn])) : scan_identity<OP>();
      acc = scan_combine<OP>(acc, v);
    }
    // The piece's total (lane order does not matter: every op is commutative and associative).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc = scan_combine<OP>(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    if (lane == 0) totals[warp] = acc;
    __syncthreads();
    float carry = scan_identity<OP>();
    for (int w = 0; w < warp; ++w) carry = scan_combine<OP>(carry, totals[w]);
    for (int64_t k = k0 + lane; k - lane < k1; k += 32) {
      const float v = k < k1 ? pro(any_to_float(x[at(k) * p.in_sn])) : scan_identity<OP>();
      const float s = scan_combine<OP>(carry, warp_inclusive_scan<OP>(v));
      if (k < k1) y[at(k) * p.out_sn] = any_from_float<Tout>(epi(s));
      carry = __shfl_sync(0xffffffffu, s, 31);
    }
    __syncthreads();
  }
}

constexpr int kScanItems = 16;  // elements per thread per tile of the tiled row scan
constexpr int kScanVec = 4;     // elements per load: a lane's piece of one chunk

// One block of 256 threads per row (see the contract: contiguous, aligned, forward).
template <ScanOp OP, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(256) scan_rows_tiled_kernel(ScanParams<Tin, Tout> p, Pro pro, Epi epi) {
  constexpr int V = kScanVec, J = kScanItems / kScanVec, WARPS = 8;
  constexpr int64_t CHUNK = 32 * V, SEG = CHUNK * J, TILE = SEG * WARPS;
  __shared__ float totals[WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t row = blockIdx.x; row < p.outer; row += gridDim.x) {
    const Tin* x = p.in + row * p.in_so;
    Tout* y = p.out + row * p.out_so;
    float carry = scan_identity<OP>();
    // Warp w scans elements [w * SEG, (w + 1) * SEG) of a tile, in J chunks of 32 x V: lane l
    // holds elements j * CHUNK + l * V .. + V - 1, so each load of a warp is one contiguous piece.
    // The next tile's packs are loaded before this one is scanned: a tile's loads are in flight
    // through the scan and the barriers of the one before it.
    const int64_t mine = int64_t(warp) * SEG + int64_t(lane) * V;  // chunk 0's first element
    Pack<Tin, V> ahead[J];
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (mine + j * CHUNK + V <= p.n) ahead[j] = load_pack<Tin, V>(x + mine + j * CHUNK);
    for (int64_t base = 0; base < p.n; base += TILE) {
      float v[J][V];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int64_t k = base + mine + j * CHUNK;
        if (k + V <= p.n) {
          const Pack<Tin, V> pk = ahead[j];
          if (k + TILE + V <= p.n) ahead[j] = load_pack<Tin, V>(x + k + TILE);
#pragma unroll
          for (int e = 0; e < V; ++e) v[j][e] = pro(any_to_float(pk.v[e]));
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e) v[j][e] = k + e < p.n ? pro(any_to_float(x[k + e])) : scan_identity<OP>();
        }
      }
      // Each lane's pieces in registers, then each chunk across the lanes, chunk after chunk.
      float pre[J];  // what precedes a lane's piece j within the warp's segment
      float run = scan_identity<OP>();
#pragma unroll
      for (int j = 0; j < J; ++j) {
#pragma unroll
        for (int e = 1; e < V; ++e) v[j][e] = scan_combine<OP>(v[j][e - 1], v[j][e]);
        const float incl = warp_inclusive_scan<OP>(v[j][V - 1]);
        const float prev = __shfl_up_sync(0xffffffffu, incl, 1);
        pre[j] = lane > 0 ? scan_combine<OP>(run, prev) : run;
        run = scan_combine<OP>(run, __shfl_sync(0xffffffffu, incl, 31));
      }
      if (lane == 0) totals[warp] = run;
      __syncthreads();
      float before = carry, next = carry;  // what precedes this warp's segment; the next tile's carry
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        if (w < warp) before = scan_combine<OP>(before, totals[w]);
        next = scan_combine<OP>(next, totals[w]);
      }
      __syncthreads();  // totals is the next tile's
      carry = next;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int64_t k = base + mine + j * CHUNK;
        const float lead = scan_combine<OP>(before, pre[j]);
        if (k + V <= p.n) {
          Pack<Tout, V> o;
#pragma unroll
          for (int e = 0; e < V; ++e) o.v[e] = any_from_float<Tout>(epi(scan_combine<OP>(lead, v[j][e])));
          store_pack<Tout, V>(y + k, o);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e)
            if (k + e < p.n) y[k + e] = any_from_float<Tout>(epi(scan_combine<OP>(lead, v[j][e])));
        }
      }
    }
  }
}

// One thread per (outer, inner) column (inner > 1).
template <ScanOp OP, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(256) scan_columns_kernel(ScanParams<Tin, Tout> p, Pro pro, Epi epi) {
  const int64_t total = p.outer * p.inner, grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += grid) {
    const int64_t o = c / p.inner, i = c - o * p.inner;
    const Tin* x = p.in + o * p.in_so + i * p.in_si;
    Tout* y = p.out + o * p.out_so + i * p.out_si;
    float acc = scan_identity<OP>();
    for (int64_t k = 0; k < p.n; ++k) {
      const int64_t j = p.reverse ? p.n - 1 - k : k;
      acc = scan_combine<OP>(acc, pro(any_to_float(x[j * p.in_sn])));
      y[j * p.out_sn] = any_from_float<Tout>(epi(acc));
    }
  }
}

}  // namespace detail

template <ScanOp OP, class Tin, class Tout, class Pro = Identity, class Epi = Identity>
cudaError_t launch_scan(const ScanParams<Tin, Tout>& p, cudaStream_t stream, const Pro& pro = Pro{},
                        const Epi& epi = Epi{}) {
  if (p.outer <= 0 || p.n <= 0 || p.inner <= 0) return cudaSuccess;
  if (!p.in || !p.out) return cudaErrorInvalidValue;
  const bool rows_aligned = p.outer == 1 || ((p.in_so * int64_t(sizeof(Tin))) % 16 == 0 &&
                                              (p.out_so * int64_t(sizeof(Tout))) % 16 == 0);
  if (p.inner == 1 && p.n >= 4096 && p.in_sn == 1 && p.out_sn == 1 && !p.reverse && rows_aligned &&
      aligned_to(p.in, 16) && aligned_to(p.out, 16)) {
    const unsigned blocks = unsigned(p.outer < (int64_t(1) << 20) ? p.outer : (int64_t(1) << 20));
    detail::scan_rows_tiled_kernel<OP, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, pro, epi);
  } else if (p.inner == 1) {
    // Each warp scans at least 256 elements of its row; up to 8 warps per row.
    const int64_t w = ceil_div<int64_t>(p.n, 256);
    const int warps = int(w < 8 ? w : 8);
    const unsigned blocks = unsigned(p.outer < (int64_t(1) << 20) ? p.outer : (int64_t(1) << 20));
    detail::scan_rows_kernel<OP, Tin, Tout, Pro, Epi><<<blocks, 32 * warps, 0, stream>>>(p, pro, epi);
  } else {
    const int64_t want = ceil_div<int64_t>(p.outer * p.inner, 256);
    const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
    detail::scan_columns_kernel<OP, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, pro, epi);
  }
  return cudaGetLastError();
}

// ---- arg reductions -----------------------------------------------------------------------------

enum class ArgOp { Max, Min };

template <class Tin>
struct ArgParams {
  const Tin* in;
  int64_t outer, red, inner;
  int64_t in_so, in_sr, in_si;
  int64_t* out;
  int64_t out_so, out_si;
};

namespace detail {

// Whether (v, k) beats (best, at): a larger (smaller) value, a NaN over a number, and on ties
// the smaller index.
template <ArgOp OP>
__device__ __forceinline__ bool arg_better(float v, int64_t k, float best, int64_t at) {
  const bool vn = v != v, bn = best != best;
  if (vn || bn) return vn && (!bn || k < at);
  if (v == best) return k < at;
  return OP == ArgOp::Max ? v > best : v < best;
}

template <ArgOp OP, class Tin, class Pro>
__global__ void __launch_bounds__(256) arg_rows_kernel(ArgParams<Tin> p, Pro pro) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); row < p.outer; row += warps) {
    const Tin* x = p.in + row * p.in_so;
    float best = OP == ArgOp::Max ? -CUDART_INF_F : CUDART_INF_F;
    int64_t at = LLONG_MAX;
    for (int64_t k = lane; k < p.red; k += 32) {
      const float v = pro(any_to_float(x[k * p.in_sr]));
      if (at == LLONG_MAX || arg_better<OP>(v, k, best, at)) {
        best = v;
        at = k;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, off);
      const int64_t oa = __shfl_xor_sync(0xffffffffu, at, off);
      if (oa != LLONG_MAX && (at == LLONG_MAX || arg_better<OP>(ov, oa, best, at))) {
        best = ov;
        at = oa;
      }
    }
    if (lane == 0) p.out[row * p.out_so] = at == LLONG_MAX ? 0 : at;
  }
}

template <ArgOp OP, class Tin, class Pro>
__global__ void __launch_bounds__(256) arg_columns_kernel(ArgParams<Tin> p, Pro pro) {
  const int64_t total = p.outer * p.inner, grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += grid) {
    const int64_t o = c / p.inner, i = c - o * p.inner;
    const Tin* x = p.in + o * p.in_so + i * p.in_si;
    float best = pro(any_to_float(x[0]));
    int64_t at = 0;
    for (int64_t k = 1; k < p.red; ++k) {
      const float v = pro(any_to_float(x[k * p.in_sr]));
      if (arg_better<OP>(v, k, best, at)) {
        best = v;
        at = k;
      }
    }
    p.out[o * p.out_so + i * p.out_si] = at;
  }
}

}  // namespace detail

template <ArgOp OP, class Tin, class Pro = Identity>
cudaError_t launch_arg_reduce(const ArgParams<Tin>& p, cudaStream_t stream, const Pro& pro = Pro{}) {
  if (p.outer <= 0 || p.inner <= 0) return cudaSuccess;
  if (p.red < 1 || !p.in || !p.out) return cudaErrorInvalidValue;
  if (p.inner == 1) {
    const int64_t want = ceil_div<int64_t>(p.outer, 8);
    const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
    detail::arg_rows_kernel<OP, Tin, Pro><<<blocks, 256, 0, stream>>>(p, pro);
  } else {
    const int64_t want = ceil_div<int64_t>(p.outer * p.inner, 256);
    const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
    detail::arg_columns_kernel<OP, Tin, Pro><<<blocks, 256, 0, stream>>>(p, pro);
  }
  return cudaGetLastError();
}

}  // namespace stitch
