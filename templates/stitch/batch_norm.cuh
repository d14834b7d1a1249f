// batch_norm.cuh — batch norm's per-channel scale and shift, from batch or running statistics,
// for an elementwise pass to apply (fused with what follows the norm).
//
// Training mode (batch statistics), two passes over x viewed as [n, c, s] (strides sn, sc, ss):
//   pass 1, per slice of the n * s reduced rows, a Welford state (count, mean, m2) per channel into
//     part[(slice * c + channel) * 3]:
//       launch_bn_partial_lanes<T>(x, n, c, s, sn, sc, ss, rows_per_split, splits, part, pro, stream)
//         (lanes along c: NHWC, or few elements per plane; 16-byte loads where the channels are
//         dense, else bn_partial_kernel<T><<<(ceil(c / 32), splits), (32, 8)>>>(..., part, 0, pro)), or
//       bn_plane_partial_kernel<T><<<(c, splits), 256>>>(x, n, c, s, sn, sc, per, part, pro)
//         (each channel's elements in contiguous runs of s >= 64: NCHW; `per` elements a slice);
//   pass 2, bn_finish_kernel<TW><<<c, 128>>>(part, splits, c, weight, bias, eps, scale, shift):
//     the slices merged per channel (Chan et al., a block per channel); with the biased variance,
//       scale[ch] = weight[ch] * rsqrt(var + eps),  shift[ch] = bias[ch] - mean * scale[ch].
// Eval mode: bn_running_kernel<TW><<<ceil(c / 256), 256>>>(mean, var, weight, bias, c, eps, scale, shift),
//   the same from the running statistics.
//   pro: a hook (common.cuh) on every element read, so the statistics are those of pro(x): the
//   elementwise ops that made the norm's input are recomputed here and by the apply, and that
//   input is never written (stitch::Identity{} for none).
// T: storage of x (float, __half, __nv_bfloat16); TW of weight / bias / running statistics (either
// of weight and bias may be null: 1 and 0). scale and shift are fp32, c each; part holds
// splits * c * 3 floats. Accumulation in fp32.
#pragma once

#include <cstdint>

#include "stitch/common.cuh"
#include "stitch/numeric.cuh"

namespace stitch {

// Batch statistics, pass 1: x viewed as [n, c, s]; block (32, 8) covers 32 channels (lanes
// along c) of one slice of the n * s reduced rows. Each thread sums (v - shift) and its square over
// its rows (every 8th, walked by (sample, position) counters: no 64-bit division a row, which is
// what the kernel spent its time on over NHWC data; four loads in flight), shift = the slice's
// first value of the channel (no division per element, and the data's offset cancels: the
// shifted-data algorithm); the sums become a (count, mean, m2) state,
// the 8 row lanes are merged (Chan et al.) and the slice's state per channel written to
// part[(slice * c + channel) * 3].
template <class T, class Pro>
__global__ void __launch_bounds__(256) bn_partial_kernel(const T* x, int64_t n, int64_t c, int64_t s, int64_t sn,
                                                         int64_t sc, int64_t ss, int64_t rows_per_split,
                                                         float* part, int64_t zstride, Pro pro) {
  // grid z: independent tensors zstride elements apart, each with its own splits * c states
  // (norm.cuh's channels-last group statistics: one per sample); z = 0 for batch norm
  x += int64_t(blockIdx.z) * zstride;
  part += int64_t(blockIdx.z) * gridDim.y * c * 3;
  __shared__ float sh[3][8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t ch = int64_t(blockIdx.x) * 32 + tx;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < n * s ? r0 + rows_per_split : n * s;
  float cnt = 0.f, mean = 0.f, m2 = 0.f;
  if (ch < c && r0 < r1) {
    const int64_t i0 = r0 / s;
    const T* xc = x + ch * sc;
    const float shift = pro(to_float(xc[i0 * sn + (r0 - i0 * s) * ss]));
    float sum = 0.f, sq = 0.f;
    int64_t count = 0;
    // Row r = i * s + j walked by its (i, j) — no division a row — four loads in flight.
    int64_t r = r0 + ty, i = r / s, j = r - i * s;
    auto next = [&]() {
      j += 8;
      while (j >= s) j -= s, ++i;
    };
    for (; r + 24 < r1; r += 32) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        v[u] = pro(to_float(xc[i * sn + j * ss]));
        next();
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float d = v[u] - shift;
        sum += d;
        sq = fmaf(d, d, sq);
      }
      count += 4;
    }
    for (; r < r1; r += 8) {
      const float d = pro(to_float(xc[i * sn + j * ss])) - shift;
      next();
      sum += d;
      sq = fmaf(d, d, sq);
      ++count;
    }
    cnt = float(count);
    mean = count ? sum / cnt : 0.f;
    m2 = count ? fmaxf(sq - sum * mean, 0.f) : 0.f;
    mean += shift;
  }
  sh[0][ty][tx] = cnt;
  sh[1][ty][tx] = mean;
  sh[2][ty][tx] = m2;
  __syncthreads();
  if (ty == 0 && ch < c) {
    for (int k = 1; k < 8; ++k) {
      const float nb = sh[0][k][tx];
      if (nb == 0.f) continue;
      const float nt = cnt + nb;
      const float d = sh[1][k][tx] - mean;
      mean += d * (nb / nt);
      m2 += sh[2][k][tx] + d * d * cnt * (nb / nt);
      cnt = nt;
    }
    float* o = part + (int64_t(blockIdx.y) * c + ch) * 3;
    o[0] = cnt;
    o[1] = mean;
    o[2] = m2;
  }
}

// Batch statistics, pass 1 when each channel's elements are contiguous runs (NCHW: s > 1 with
// stride 1): block (ch, slice) of 256 threads walks the slice's elements of channel ch plane by
// plane, consecutive threads on consecutive elements (coalesced, where the lanes-along-c kernel
// above would read one element per channel plane), four loads in flight; each thread's shifted
// sums become a (count, mean, m2) state, merged (Chan et al.) over the warp, then the 8 warps,
// into part[(slice * c + ch) * 3].
__device__ __forceinline__ void bn_merge(float& cnt, float& mean, float& m2, float nb, float mb, float m2b) {
  if (nb == 0.f) return;
  const float nt = cnt + nb;
  const float d = mb - mean;
  mean += d * (nb / nt);
  m2 += m2b + d * d * cnt * (nb / nt);
  cnt = nt;
}

template <class T, class Pro>
__global__ void __launch_bounds__(256) bn_plane_partial_kernel(const T* x, int64_t n, int64_t c, int64_t s,
                                                               int64_t sn, int64_t sc, int64_t per, float* part,
                                                               Pro pro) {
  __shared__ float sh[3][8];
  const int64_t ch = blockIdx.x;
  const int64_t e0 = int64_t(blockIdx.y) * per;
  const int64_t e1 = e0 + per < n * s ? e0 + per : n * s;
  const T* base = x + ch * sc;
  // Sums of (v - shift), shift = the slice's first element: no division per element, and the
  // offset of the data cancels (the shifted-data algorithm); each thread's sums become a
  // (count, mean, m2) state before the merge.
  const float shift = e0 < e1 ? pro(to_float(base[(e0 / s) * sn + e0 % s])) : 0.f;
  float sum = 0.f, sq = 0.f;
  int64_t count = 0;
  for (int64_t i = e0 / s; i * s < e1; ++i) {
    const int64_t j0 = e0 > i * s ? e0 - i * s : 0;
    const int64_t j1 = e1 - i * s < s ? e1 - i * s : s;
    const T* row = base + i * sn;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += 4 * 256) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = j + u * 256 < j1 ? pro(to_float(row[j + u * 256])) - shift : 0.f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        sum += v[u];
        sq = fmaf(v[u], v[u], sq);
      }
      count += j + 3 * 256 < j1 ? 4 : (j1 - j + 255) / 256;
    }
  }
  float cnt = float(count);
  float mean = count ? sum / cnt : 0.f;
  float m2 = count ? fmaxf(sq - sum * mean, 0.f) : 0.f;
  mean += shift;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float nb = __shfl_down_sync(0xffffffffu, cnt, off);
    const float mb = __shfl_down_sync(0xffffffffu, mean, off);
    const float m2b = __shfl_down_sync(0xffffffffu, m2, off);
    bn_merge(cnt, mean, m2, nb, mb, m2b);
  }
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    sh[0][warp] = cnt;
    sh[1][warp] = mean;
    sh[2][warp] = m2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 8; ++w) bn_merge(cnt, mean, m2, sh[0][w], sh[1][w], sh[2][w]);
    float* o = part + (int64_t(blockIdx.y) * c + ch) * 3;
    o[0] = cnt;
    o[1] = mean;
    o[2] = m2;
  }
}

// Batch statistics, pass 1 over lanes along c with V channels a lane (one 16-byte load each):
// channels dense and innermost (NHWC: sc == 1), c, sn and ss multiples of V, x aligned to 16 bytes.
// Block of 256 threads: `lc` = min(c / V, 256) channel lanes times 256 / lc row lanes (the
// rest idle), each lane walking its rows as bn_partial_kernel does (counters, four loads in
// flight); the row lanes are merged (Chan et al.) per channel in shared memory. The one-channel
// lanes read 128 bytes a warp a row: 33 % of the bandwidth on 2:52 with a mish hook.
template <class T, int V, class Pro>
__global__ void __launch_bounds__(256) bn_partial_vec_kernel(const T* x, int64_t n, int64_t c, int64_t s, int64_t sn,
                                                             int64_t ss, int64_t rows_per_split, float* part, int lc,
                                                             int64_t zstride, Pro pro) {
  // grid z: independent tensors zstride elements apart, as bn_partial_kernel's
  x += int64_t(blockIdx.z) * zstride;
  part += int64_t(blockIdx.z) * gridDim.y * c * 3;
  __shared__ float sh[3][256 * V];
  const int t = threadIdx.x, lane = t % lc, rl = t / lc, step = 256 / lc;
  const int64_t ch = (int64_t(blockIdx.x) * lc + lane) * V;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < n * s ? r0 + rows_per_split : n * s;
  float cnt = 0.f, mean[V], m2[V];
#pragma unroll
  for (int e = 0; e < V; ++e) mean[e] = 0.f, m2[e] = 0.f;
  const bool active = rl < step && ch < c;
  if (active && r0 < r1) {
    const int64_t i0 = r0 / s;
    const T* xc = x + ch;
    const Pack<T, V> first = load_pack<T, V>(xc + i0 * sn + (r0 - i0 * s) * ss);
    float shift[V], sum[V], sq[V];
#pragma unroll
    for (int e = 0; e < V; ++e) shift[e] = pro(to_float(first.v[e])), sum[e] = 0.f, sq[e] = 0.f;
    int64_t count = 0;
    int64_t r = r0 + rl, i = r / s, j = r - i * s;
    auto next = [&]() {
      j += step;
      while (j >= s) j -= s, ++i;
    };
    auto add = [&](const Pack<T, V>& v) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = pro(to_float(v.v[e])) - shift[e];
        sum[e] += d;
        sq[e] = fmaf(d, d, sq[e]);
      }
    };
    for (; r + 3 * step < r1; r += 4 * step) {
      Pack<T, V> v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        v[u] = load_pack<T, V>(xc + i * sn + j * ss);
        next();
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) add(v[u]);
      count += 4;
    }
    for (; r < r1; r += step) {
      add(load_pack<T, V>(xc + i * sn + j * ss));
      next();
      ++count;
    }
    cnt = float(count);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      mean[e] = count ? sum[e] / cnt : 0.f;
      m2[e] = count ? fmaxf(sq[e] - sum[e] * mean[e], 0.f) : 0.f;
      mean[e] += shift[e];
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    sh[0][t * V + e] = active ? cnt : 0.f;
    sh[1][t * V + e] = mean[e];
    sh[2][t * V + e] = m2[e];
  }
  __syncthreads();
  if (rl == 0 && ch < c) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float ct = cnt, mt = mean[e], qt = m2[e];
      for (int k = 1; k < step; ++k) {
        const int at = (k * lc + lane) * V + e;
        bn_merge(ct, mt, qt, sh[0][at], sh[1][at], sh[2][at]);
      }
      float* o = part + (int64_t(blockIdx.y) * c + ch + e) * 3;
      o[0] = ct;
      o[1] = mt;
      o[2] = qt;
    }
  }
}

// Whether pass 1 over lanes along c can take V channels a lane (bn_partial_vec_kernel's terms).
template <int V, class T>
inline bool bn_vec_ok(const T* x, int64_t c, int64_t sn, int64_t sc, int64_t ss) {
  return sc == 1 && c % V == 0 && sn % V == 0 && ss % V == 0 && aligned_to(x, 16);
}

// Pass 1 over lanes along c (NHWC, or few elements per plane), `splits` slices of the n * s rows:
// V = 16 / sizeof(T) channels a lane where bn_vec_ok holds, else one (bn_partial_kernel).
template <class T, class Pro>
cudaError_t launch_bn_partial_lanes(const T* x, int64_t n, int64_t c, int64_t s, int64_t sn, int64_t sc, int64_t ss,
                                    int64_t rows_per_split, int64_t splits, float* part, const Pro& pro,
                                    cudaStream_t stream) {
  constexpr int V = 16 / int(sizeof(T));
  if (splits < 1 || splits > 65535) return cudaErrorInvalidValue;
  if (bn_vec_ok<V>(x, c, sn, sc, ss)) {
    const int64_t packs = c / V;
    const int lc = int(packs < 256 ? packs : 256);
    const dim3 grid(unsigned(ceil_div<int64_t>(packs, lc)), unsigned(splits));
    bn_partial_vec_kernel<T, V, Pro><<<grid, 256, 0, stream>>>(x, n, c, s, sn, ss, rows_per_split, part, lc, 0, pro);
  } else {
    const dim3 grid(unsigned(ceil_div<int64_t>(c, 32)), unsigned(splits));
    bn_partial_kernel<T, Pro><<<grid, dim3(32, 8), 0, stream>>>(x, n, c, s, sn, sc, ss, rows_per_split, part, 0, pro);
  }
  return cudaGetLastError();
}

// Batch statistics, pass 2: merge the slices per channel — one block of 128 threads per channel,
// each thread merging a strided share of the slices, then the warps (shuffles) and the block's four
// warps (Chan et al.); scale = weight * rsqrt(var + eps) with the biased variance (what batch norm
// normalises with), shift = bias - mean * scale. Launch: <<<c, 128>>>.
template <class TW>
__global__ void __launch_bounds__(128) bn_finish_kernel(const float* part, int64_t splits, int64_t c, const TW* weight,
                                                        const TW* bias, float eps, float* scale, float* shift) {
  __shared__ float sh[3][4];
  const int64_t ch = blockIdx.x;
  float cnt = 0.f, mean = 0.f, m2 = 0.f;
  for (int64_t k = threadIdx.x; k < splits; k += blockDim.x) {
    const float* q = part + (k * c + ch) * 3;
    bn_merge(cnt, mean, m2, q[0], q[1], q[2]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float nb = __shfl_down_sync(0xffffffffu, cnt, off);
    const float mb = __shfl_down_sync(0xffffffffu, mean, off);
    const float m2b = __shfl_down_sync(0xffffffffu, m2, off);
    bn_merge(cnt, mean, m2, nb, mb, m2b);
  }
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    sh[0][warp] = cnt;
    sh[1][warp] = mean;
    sh[2][warp] = m2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w) bn_merge(cnt, mean, m2, sh[0][w], sh[1][w], sh[2][w]);
    const float a = (weight ? to_float(weight[ch]) : 1.f) * rsqrtf(m2 / cnt + eps);
    scale[ch] = a;
    shift[ch] = (bias ? to_float(bias[ch]) : 0.f) - mean * a;
  }
}

// Eval-mode batch norm: the same scale and shift from the running statistics.
template <class TW>
__global__ void bn_running_kernel(const TW* mean, const TW* var, const TW* weight, const TW* bias, int64_t c,
                                  float eps, float* scale, float* shift) {
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const float a = (weight ? to_float(weight[ch]) : 1.f) * rsqrtf(to_float(var[ch]) + eps);
  scale[ch] = a;
  shift[ch] = (bias ? to_float(bias[ch]) : 0.f) - to_float(mean[ch]) * a;
}

}  // namespace stitch
