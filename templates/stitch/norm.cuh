// norm.cuh — statistics of group norm and instance norm, as a per-(sample, channel) scale and
// shift that an elementwise pass applies (fused with what follows the norm).
//
// launch_group_stats<Tin, TW>(x, ldi, rows, cols, groups, cpg, weight, bias, eps, scale, shift,
//                             workspace, splits, stream)
//   Tin   storage of x (float, __half, __nv_bfloat16); TW of weight / bias (either may be null).
// Contract
//   - x is rows x cols: row r at x + r * ldi, unit stride along the row. Row r is group
//     g = r % groups of sample s = r / groups and holds the elements of channels
//     g * cpg ... g * cpg + cpg - 1 (cols / cpg consecutive elements each).
//   - For each row: mean and biased variance over its cols elements (Welford, fp32, pieces merged
//     with Chan's formula); for each of its channels c (C = groups * cpg):
//       scale[s * C + c] = weight[c] * rsqrt(var + eps)
//       shift[s * C + c] = bias[c] - mean * scale[s * C + c]
//     so that y = x * scale + shift is the normalised, affine output (fp32 scale / shift).
//   - workspace holds rows * splits * 3 floats; each row is cut into `splits` pieces (pass 1, one
//     group of lanes per piece: `group` lanes, a power of two up to 32, or a block of 256), whose
//     (count, mean, m2) pass 2 merges, one thread per (row, channel). cols >= 1. Where x and ldi
//     are 16-byte aligned the pieces are whole 16-byte packs, each pack's moments merged into the
//     lane's.
// Group norm is groups = G, cpg = C / G; instance norm is one channel per group (cpg = 1) over
// x viewed as [N * C, H * W].
//
// launch_group_stats_cl<Tin, TW>(x, samples, s, sn, ss, groups, cpg, weight, bias, eps, scale,
//                                shift, workspace, splits, stream)
//   The same scale and shift from channels-last x (see its comment below).
#pragma once

#include <climits>

#include "stitch/batch_norm.cuh"
#include "stitch/reduce.cuh"

namespace stitch {

constexpr int kGroupStatsThreads = 256;
// STITCH_GROUP_STATS_INFLIGHT 1 (defined before this header): one pack loaded a lane at a time, the
// form before, for measuring the two in one process.
#ifndef STITCH_GROUP_STATS_INFLIGHT
#define STITCH_GROUP_STATS_INFLIGHT 4
#endif

namespace detail {

// VEC > 1: x, ldi and every piece's start aligned to VEC elements (16 bytes).
template <class Tin, int VEC>
__global__ void __launch_bounds__(kGroupStatsThreads)
group_stats_partial(const Tin* x, int64_t ldi, int64_t units, int64_t splits, int64_t cols, int64_t per,
                    int group, float* ws) {
  __shared__ Moments smem[33];
  const bool block_group = group > 32;
  const int lane = block_group ? int(threadIdx.x) : int(threadIdx.x & (group - 1));
  const int64_t unit = block_group ? int64_t(blockIdx.x)
                                   : int64_t(blockIdx.x) * (kGroupStatsThreads / group) + threadIdx.x / group;
  const bool valid = unit < units;
  Moments m{0.f, 0.f, 0.f};
  if (valid) {
    const int64_t r = unit / splits, s = unit - r * splits;
    const int64_t c0 = s * per;
    const int64_t c1 = c0 + per < cols ? c0 + per : cols;
    const Tin* row = x + r * ldi;
    int64_t c = c0;
    if (VEC > 1) {  // whole packs: each one's moments, merged (one division a pack, 16-byte loads)
      const int64_t packs = c1 > c0 ? (c1 - c0) / VEC : 0;
      auto merge = [&](const Pack<Tin, VEC>& pk) {
        float v[VEC], sum = 0.f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = to_float(pk.v[e]), sum += v[e];
        const float pm = sum * (1.f / VEC);
        float q = 0.f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) q += (v[e] - pm) * (v[e] - pm);
        m = MomentsOp{}(m, Moments{float(VEC), pm, q});
      };
      // kInFlight packs loaded before any is merged: one load at a time a lane left the DRAM a
      // quarter idle (Nsight Compute on an H200: 77 % of its bandwidth, stalled on the loads).
      constexpr int kInFlight = STITCH_GROUP_STATS_INFLIGHT;
      int64_t k = lane;
      for (; k + (kInFlight - 1) * int64_t(group) < packs; k += kInFlight * int64_t(group)) {
        Pack<Tin, VEC> pk[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) pk[u] = load_pack<Tin, VEC>(row + c0 + (k + u * int64_t(group)) * VEC);
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) merge(pk[u]);
      }
      for (; k < packs; k += group) merge(load_pack<Tin, VEC>(row + c0 + k * VEC));
      c = c0 + packs * VEC;
    }
    for (c += lane; c < c1; c += group) {  // the rest, one element at a time (Welford)
      const float v = to_float(row[c]);
      m.n += 1.f;
      const float d = v - m.mean;
      m.mean += d / m.n;
      m.m2 += d * (v - m.mean);
    }
  }
  m = block_group ? block_allreduce(m, MomentsOp{}, Moments{0.f, 0.f, 0.f}, smem)
                  : warp_allreduce(m, MomentsOp{}, group);
  if (valid && lane == 0) {
    ws[unit * 3 + 0] = m.n;
    ws[unit * 3 + 1] = m.mean;
    ws[unit * 3 + 2] = m.m2;
  }
}

// One thread per (row, channel of the row): each merges its row's pieces (a few, read through
// L1) and writes one scale and one shift, so that consecutive threads write consecutive
// channels (a thread per row writing its cpg channels strided every warp's stores by cpg).
template <class TW>
__global__ void group_stats_finish(const float* ws, int64_t rows, int64_t splits, int64_t groups, int64_t cpg,
                                   const TW* weight, const TW* bias, float eps, float* scale, float* shift) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cpg) return;
  const int64_t r = i / cpg, j = i - r * cpg;
  Moments m{0.f, 0.f, 0.f};
  for (int64_t s = 0; s < splits; ++s) {
    const float* q = ws + (r * splits + s) * 3;
    m = MomentsOp{}(m, Moments{q[0], q[1], q[2]});
  }
  const float rstd = rsqrtf(m.m2 / m.n + eps);
  const int64_t g = r % groups, sample = r / groups, channels = groups * cpg;
  const int64_t c = g * cpg + j;
  const float a = (weight ? to_float(weight[c]) : 1.f) * rstd;
  scale[sample * channels + c] = a;
  shift[sample * channels + c] = (bias ? to_float(bias[c]) : 0.f) - m.mean * a;
}

// Channels-last statistics, pass 2: one thread per (sample, channel) merges its group's
// splits x cpg states (batch_norm.cuh's partial kernel wrote them per (sample, split, channel)).
template <class TW>
__global__ void group_stats_cl_finish(const float* ws, int64_t samples, int64_t splits, int64_t groups, int64_t cpg,
                                      const TW* weight, const TW* bias, float eps, float* scale, float* shift) {
  const int64_t channels = groups * cpg;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= samples * channels) return;
  const int64_t sample = i / channels, c = i - sample * channels, c0 = c - c % cpg;
  Moments m{0.f, 0.f, 0.f};
  for (int64_t k = 0; k < splits; ++k) {
    const float* q = ws + ((sample * splits + k) * channels + c0) * 3;
    for (int64_t j = 0; j < cpg; ++j) m = MomentsOp{}(m, Moments{q[3 * j], q[3 * j + 1], q[3 * j + 2]});
  }
  const float a = (weight ? to_float(weight[c]) : 1.f) * rsqrtf(m.m2 / m.n + eps);
  scale[i] = a;
  shift[i] = (bias ? to_float(bias[c]) : 0.f) - m.mean * a;
}

}  // namespace detail

// The same statistics over channels-last x: sample n's channel c at position j (of s) is
// x[n * sn + c + j * ss] (unit channel stride). Pass 1 is batch statistics' lanes-along-channels
// kernel, one grid layer a sample (32 channels of a position a warp's load, coalesced), each
// sample's positions cut into `splits` pieces (16 bytes a lane where the channels allow:
// bn_vec_ok); workspace holds samples * splits * channels * 3
// floats. samples <= 65535 (a grid layer each). No copy of x into rows first: after a
// channels-last convolution that copy was a full pass over the tensor.
template <class Tin, class TW>
cudaError_t launch_group_stats_cl(const Tin* x, int64_t samples, int64_t s, int64_t sn, int64_t ss, int64_t groups,
                                  int64_t cpg, const TW* weight, const TW* bias, float eps, float* scale,
                                  float* shift, float* workspace, int64_t splits, cudaStream_t stream) {
  if (samples <= 0) return cudaSuccess;
  if (s < 1 || groups < 1 || cpg < 1 || splits < 1 || !x || !scale || !shift || !workspace)
    return cudaErrorInvalidValue;
  if (samples > 65535) return cudaErrorInvalidConfiguration;
  const int64_t channels = groups * cpg;
  constexpr int V = 16 / int(sizeof(Tin));
  if (bn_vec_ok<V>(x, channels, sn, 1, ss)) {  // 16 bytes a lane (see batch_norm.cuh)
    const int64_t packs = channels / V;
    const int lc = int(packs < 256 ? packs : 256);
    const dim3 grid(unsigned(ceil_div<int64_t>(packs, lc)), unsigned(splits), unsigned(samples));
    bn_partial_vec_kernel<Tin, V><<<grid, 256, 0, stream>>>(x, 1, channels, s, 0, ss, ceil_div<int64_t>(s, splits),
                                                            workspace, lc, sn, Identity{});
  } else {
    const dim3 grid(unsigned(ceil_div<int64_t>(channels, 32)), unsigned(splits), unsigned(samples));
    bn_partial_kernel<Tin><<<grid, dim3(32, 8), 0, stream>>>(x, 1, channels, s, 0, 1, ss, ceil_div<int64_t>(s, splits),
                                                             workspace, sn, Identity{});
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int64_t fin = ceil_div<int64_t>(samples * channels, 256);
  if (fin > INT_MAX) return cudaErrorInvalidConfiguration;
  detail::group_stats_cl_finish<TW><<<unsigned(fin), 256, 0, stream>>>(workspace, samples, splits, groups, cpg, weight,
                                                                       bias, eps, scale, shift);
  return cudaGetLastError();
}

template <class Tin, class TW>
cudaError_t launch_group_stats(const Tin* x, int64_t ldi, int64_t rows, int64_t cols, int64_t groups,
                               int64_t cpg, const TW* weight, const TW* bias, float eps, float* scale,
                               float* shift, float* workspace, int64_t splits, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cols < 1 || groups < 1 || cpg < 1 || splits < 1 || !x || !scale || !shift || !workspace)
    return cudaErrorInvalidValue;
  constexpr int VEC = 16 / sizeof(Tin);
  // Pieces of whole 16-byte packs where the rows allow (the last piece may be short or empty).
  const bool vec = aligned_to(x, 16) && (rows == 1 || ldi % VEC == 0) && cols >= int64_t(VEC) * splits;
  const int64_t per = vec ? ceil_div<int64_t>(ceil_div<int64_t>(cols, splits), VEC) * VEC : ceil_div<int64_t>(cols, splits);
  const int64_t units = rows * splits;
  // Lanes per piece: enough to cover it in a few loads (of a pack each, where packed), one block
  // at most.
  const int64_t loads = vec ? ceil_div<int64_t>(per, VEC) : per;
  int group = next_pow2(int(loads < kGroupStatsThreads ? loads : kGroupStatsThreads));
  if (group > 32) group = kGroupStatsThreads;
  const int64_t blocks = group > 32 ? units : ceil_div<int64_t>(units, kGroupStatsThreads / group);
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  if (vec)
    detail::group_stats_partial<Tin, VEC><<<unsigned(blocks), kGroupStatsThreads, 0, stream>>>(
        x, ldi, units, splits, cols, per, group, workspace);
  else
    detail::group_stats_partial<Tin, 1><<<unsigned(blocks), kGroupStatsThreads, 0, stream>>>(
        x, ldi, units, splits, cols, per, group, workspace);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int64_t fin = ceil_div<int64_t>(rows * cpg, 256);
  if (fin > INT_MAX) return cudaErrorInvalidConfiguration;
  detail::group_stats_finish<TW><<<unsigned(fin), 256, 0, stream>>>(workspace, rows, splits, groups, cpg, weight,
                                                                     bias, eps, scale, shift);
  return cudaGetLastError();
}

}  // namespace stitch
