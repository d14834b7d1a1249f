// norm_stream.cuh — group norm and instance norm over a tensor larger than L2, in one kernel that
// reads each row from memory once: its statistics, then its normalised, affine output a little
// later, while the row is still in L2.
//
// launch_norm_stream<TW>(p, stream, epi)
// Contract
//   - x is rows x cols floats: row r at x + r * ldi, unit stride along the row; out the same shape
//     (row r at out + r * ldo, unit stride). Row r is group g = r % groups of sample r / groups and
//     holds channels g * cpg ... g * cpg + cpg - 1, hw = cols / cpg consecutive elements each.
//   - out = epi((x - mean) * rstd * weight[c] + bias[c]) per element (weight, bias of TW, either
//     may be null), mean and biased variance over the row (rstd = rsqrt(var + eps)): the group
//     statistics of norm.cuh and the elementwise affine after them, in one kernel.
//   - workspace: norm_stream_workspace_floats(rows, cols, 1) floats (the launch packs 4 elements
//     where x and out allow, which needs fewer). Each launch zeroes its counters first (one
//     memset on the stream).
//   - out may be x itself: a row is written only after its statistics are complete, and no later
//     statistics read it.
// How: the row is cut into tiles of kNsThreads * kNsPacks packs. Blocks (as many as fit on the
// device at once) take tickets from a counter in order. Ticket t is step t / (2 * tiles): its first
// `tiles` tickets are the statistics of row `step` (each tile's Welford moments into the
// workspace; the tile that completes the row merges them, in tile order, into the row's mean and
// rstd), the next `tiles` the output of row `step - lag`, whose statistics finished at least one
// step before. A block with an output ticket waits (spinning on the row's counter) until its row's
// statistics are published; every statistics ticket before it was taken by a running block that
// never waits, so the wait ends. Between a tile's two reads pass about `lag + 1` rows of reads and
// `lag` of writes (the writes streamed, evict-first): with rows of a few MB that is well inside
// an H100's 50 MB L2, so the second read costs no DRAM traffic — the statistics-then-affine pair
// read the tensor from DRAM twice (three passes with the write), this reads it once.
// Deterministic: the merge order is fixed.
#pragma once

#include <climits>

#include "stitch/reduce.cuh"

namespace stitch {

constexpr int kNsThreads = 256;
constexpr int kNsPacks = 4;  // packs a thread per tile

// Floats of workspace for rows x cols at `vec` elements a pack: per tile (n, mean, m2), per row
// (mean, rstd), then rows + 1 counters.
inline int64_t norm_stream_workspace_floats(int64_t rows, int64_t cols, int vec) {
  const int64_t tiles = ceil_div<int64_t>(cols, int64_t(kNsThreads) * kNsPacks * vec);
  return rows * tiles * 3 + rows * 2 + rows + 1;
}

template <class TW>
struct NormStreamParams {
  const float* x;
  float* out;
  int64_t ldi, ldo, rows, cols, hw, groups, cpg;
  const TW* weight;
  const TW* bias;
  float eps;
  float* workspace;
};

namespace detail {

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  const unsigned v = *reinterpret_cast<const volatile unsigned*>(p);
  __threadfence();
  return v;
#endif
}

__device__ __forceinline__ void ns_pause() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(64);
#endif
}

template <int VEC, class TW, class Epi>
__global__ void __launch_bounds__(kNsThreads)
norm_stream_kernel(NormStreamParams<TW> p, int64_t tiles, int64_t lag, int64_t tickets, Epi epi) {
  constexpr int64_t kTile = int64_t(kNsThreads) * kNsPacks * VEC;
  __shared__ Moments smem[33];
  __shared__ int64_t s_ticket;
  __shared__ bool s_last;
  float* partials = p.workspace;                     // rows * tiles * 3
  float* stats = partials + p.rows * tiles * 3;      // rows * 2
  unsigned* done = reinterpret_cast<unsigned*>(stats + p.rows * 2);  // rows
  unsigned* ticket = done + p.rows;
  const int tid = int(threadIdx.x);
  for (;;) {
    if (tid == 0) s_ticket = int64_t(atomicAdd(ticket, 1u));
    __syncthreads();
    const int64_t t = s_ticket;
    __syncthreads();  // (thread 0 writes s_ticket again next round)
    if (t >= tickets) return;
    const int64_t step = t / (2 * tiles), k = t - step * 2 * tiles;
    const bool is_stats = k < tiles;
    const int64_t r = is_stats ? step : step - lag, tile = is_stats ? k : k - tiles;
    if (r < 0 || r >= p.rows) continue;
    const int64_t c0 = tile * kTile;
    if (is_stats) {
      const float* row = p.x + r * p.ldi;
      float v[kNsPacks][VEC];
      float sum = 0.f, n = 0.f;
#pragma unroll
      for (int j = 0; j < kNsPacks; ++j) {
        const int64_t c = c0 + (int64_t(j) * kNsThreads + tid) * VEC;
        const bool in = c < p.cols;
        const Pack<float, VEC> pk = in ? load_pack<float, VEC>(row + c) : Pack<float, VEC>{};
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[j][e] = pk.v[e], sum += pk.v[e];
        n += in ? float(VEC) : 0.f;
      }
      const float mean = n > 0.f ? sum / n : 0.f;
      float m2 = 0.f;
#pragma unroll
      for (int j = 0; j < kNsPacks; ++j) {
        const bool in = c0 + (int64_t(j) * kNsThreads + tid) * VEC < p.cols;
#pragma unroll
        for (int e = 0; e < VEC; ++e) m2 += in ? (v[j][e] - mean) * (v[j][e] - mean) : 0.f;
      }
      const Moments m = block_allreduce(Moments{n, mean, m2}, MomentsOp{}, Moments{0.f, 0.f, 0.f}, smem);
      if (tid == 0) {
        float* q = partials + (r * tiles + tile) * 3;
        q[0] = m.n, q[1] = m.mean, q[2] = m.m2;
        __threadfence();
        s_last = atomicAdd(done + r, 1u) == unsigned(tiles - 1);
      }
      __syncthreads();
      if (s_last) {  // every tile of the row is in: merge them in tile order, publish mean and rstd
        __threadfence();
        Moments a{0.f, 0.f, 0.f};
        for (int64_t i = tid; i < tiles; i += kNsThreads) {
          const float* q = partials + (r * tiles + i) * 3;
          a = MomentsOp{}(a, Moments{__ldcg(q), __ldcg(q + 1), __ldcg(q + 2)});
        }
        a = block_allreduce(a, MomentsOp{}, Moments{0.f, 0.f, 0.f}, smem);
        if (tid == 0) {
          stats[r * 2] = a.mean;
          stats[r * 2 + 1] = rsqrtf(a.m2 / a.n + p.eps);
          __threadfence();
          atomicAdd(done + r, 1u);  // tiles + 1: published
        }
      }
    } else {
      if (tid == 0)
        while (ld_acquire_gpu(done + r) < unsigned(tiles + 1)) ns_pause();
      __syncthreads();
      const float mean = __ldcg(stats + r * 2), rstd = __ldcg(stats + r * 2 + 1);
      const float* row = p.x + r * p.ldi;
      float* orow = p.out + r * p.ldo;
      const int64_t g = r % p.groups;
      int64_t ch = -1, next = 0;  // channel within the group, and where the next one starts
      float a = 0.f, b = 0.f;
#pragma unroll
      for (int j = 0; j < kNsPacks; ++j) {
        const int64_t c = c0 + (int64_t(j) * kNsThreads + tid) * VEC;
        if (c >= p.cols) break;
        if (c >= next) {  // packs never straddle channels (hw % VEC == 0)
          ch = c / p.hw;
          next = (ch + 1) * p.hw;
          const int64_t cc = g * p.cpg + ch;
          a = (p.weight ? to_float(p.weight[cc]) : 1.f) * rstd;
          b = (p.bias ? to_float(p.bias[cc]) : 0.f) - mean * a;
        }
        Pack<float, VEC> pk;  // the tile's last read: evict-first, as its write
        if (VEC == 4)
          *reinterpret_cast<float4*>(pk.v) = __ldcs(reinterpret_cast<const float4*>(row + c));
        else
          pk = load_pack<float, VEC>(row + c);
#pragma unroll
        for (int e = 0; e < VEC; ++e) pk.v[e] = epi(fmaf(pk.v[e], a, b));
        if (VEC == 4)
          __stcs(reinterpret_cast<float4*>(orow + c), *reinterpret_cast<const float4*>(pk.v));
        else
          store_pack<float, VEC>(orow + c, pk);
      }
    }
  }
}

}  // namespace detail

template <class TW, class Epi = Identity>
cudaError_t launch_norm_stream(const NormStreamParams<TW>& p, cudaStream_t stream, Epi epi = {}) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.cols < 1 || p.groups < 1 || p.cpg < 1 || p.hw < 1 || p.hw * p.cpg != p.cols || !p.x || !p.out ||
      !p.workspace)
    return cudaErrorInvalidValue;
  const bool vec = p.cols % 4 == 0 && p.hw % 4 == 0 && (p.rows == 1 || (p.ldi % 4 == 0 && p.ldo % 4 == 0)) &&
                   aligned_to(p.x, 16) && aligned_to(p.out, 16);
  const int v = vec ? 4 : 1;
  const int64_t tiles = ceil_div<int64_t>(p.cols, int64_t(kNsThreads) * kNsPacks * v);
  if (tiles >= INT_MAX / 2) return cudaErrorInvalidConfiguration;
  int sm = 0;
  cudaError_t e = sm_count(sm);
  if (e != cudaSuccess) return e;
  auto kernel = vec ? detail::norm_stream_kernel<4, TW, Epi> : detail::norm_stream_kernel<1, TW, Epi>;
  int per_sm = 0;
  if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kNsThreads, 0)) != cudaSuccess) return e;
  const int64_t grid = int64_t(sm) * (per_sm > 0 ? per_sm : 1);
  // A row's first output ticket comes 2 * tiles * lag + 1 >= grid tickets after its last statistics
  // ticket: the blocks reading that row's statistics have (nearly always) finished when it is taken.
  const int64_t lag = ceil_div<int64_t>(grid, 2 * tiles);
  const int64_t tickets = 2 * tiles * (p.rows + lag);
  if (tickets + grid >= int64_t(UINT_MAX)) return cudaErrorInvalidConfiguration;  // (each block's last ticket)
  const int64_t counters = p.rows * tiles * 3 + p.rows * 2;
  if ((e = cudaMemsetAsync(p.workspace + counters, 0, size_t(p.rows + 1) * sizeof(unsigned), stream)) != cudaSuccess)
    return e;
  const int64_t blocks = grid < p.rows * tiles * 2 ? grid : p.rows * tiles * 2;
  kernel<<<unsigned(blocks), kNsThreads, 0, stream>>>(p, tiles, lag, tickets, epi);
  return cudaGetLastError();
}

}  // namespace stitch
