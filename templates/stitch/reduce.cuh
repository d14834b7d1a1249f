// reduce.cuh — reductions over the last dim of a row-major matrix, and sum/mean/max/min over a
// middle axis.
//
// Row reductions: launch_row_reduce<OP, Tin, Tout, TW, Pro, Epi>(RowParams, stream, pro, epi)
//   OP    RowOp::{Softmax, LogSoftmax, LayerNorm, RmsNorm}   -> out is rows x cols (ld ldo)
//         RowOp::{Sum, Mean, Max, Min, LogSumExp, Var}       -> out[r * ldo], one value per row
//   Tin   storage of `in` (float, __half, __nv_bfloat16); Tout of `out` (defaults to Tin);
//   TW    storage of the norms' weight / bias (defaults to Tin);
//   Pro   hook applied to every input element before the reduction (e.g. scale before softmax);
//   Epi   hook applied to every output value (e.g. GELU after a layer norm, sqrt after var).
//   Hooks are types with `__device__ float operator()(float) const`; Identity by default.
// Contract
//   - in: rows x cols, element (r, c) at in[r * ldi + c]; out likewise with ldo. out must not
//     overlap in unless it is exactly in with ldo == ldi (the row is read before it is written,
//     by the same thread, in every path).
//   - 1 <= cols (< 2^31 per row), any rows >= 0 (the grid is 1-D, so rows up to 2^31 blocks).
//   - Math in fp32, one rounding to Tout. Softmax / log-softmax / logsumexp subtract the row
//     max (an online max-and-sum merge); layer norm and var are two-pass over registers when
//     the row fits in them, Welford with Chan's merge otherwise. Var divides by cols - 1 when
//     `unbiased` (NaN for cols == 1, like PyTorch). layer norm: (x - mean) * rsqrt(var + eps)
//     * weight + bias with biased var; rms norm: x * rsqrt(mean(x^2) + eps) * weight; weight and
//     bias may be null. Max / min use fmaxf / fminf (a NaN element is skipped, unlike PyTorch).
//     Exponentials use ex2.approx after a log2(e) pre-scale (~1e-6 relative in softmax).
//   - 16-byte loads when in is 16-byte aligned and cols, ldi are multiples of 16 / sizeof(Tin)
//     (plus, for row outputs, ldo a multiple and out aligned to its pack); scalar loads
//     otherwise. weight / bias are read per element (they stay in L1 / L2).
// Work split (chunks = cols / vector width, or cols when scalar):
//   chunks <= 32         a group of next_pow2(chunks) lanes per row, row cached in registers;
//   chunks <= 256        a warp per row, up to 8 chunks per lane cached in registers;
//   chunks <= 4096       a block per row (64..512 threads), 8 chunks per thread in registers;
//   larger, a row-writing op whose row fits the shared memory of a thread-block cluster (sm_90+
//                        binaries: 2 .. 16 blocks of 512 threads, up to 112 KB each): one row per
//                        cluster, each block's slice read once into shared memory, the statistics
//                        merged across the cluster through distributed shared memory;
//   larger               a block of 1024 per row, looping over global memory (two reads of the
//                        row for the ops that write a row; the second read hits L2 only while
//                        the rows in flight fit it).
//   One block per row for long rows: a single very long row (rows = 1, cols = 1M) runs on one SM,
//   except a layer / rms norm given a workspace (launch_*_norm_ws): when rows < SMs and cols >=
//   kRowSplitMinCols its rows are split over up to kRowMaxSplits blocks each (two passes).
//
// Middle axis: launch_reduce_axis<OP, Tin, Tout, Pro, Epi>(AxisParams, stream, pro, epi)
//   OP    AxisOp::{Sum, Mean, Max, Min}
//   in viewed as [outer, red, inner] with element strides (in_so, in_sr, in_si); out is
//   [outer, inner] with strides (out_so, out_si). Pro on inputs, Epi on results, as above.
//   A block is bx x by threads: bx (<= 32) threads along inner, each reading V consecutive
//   elements (one 16-byte load when in_si == 1, inner, in_so, in_sr are multiples of V and in is
//   16-byte aligned; V = 1 otherwise), by = 256 / bx threads along red, combined through shared
//   memory. When outer x inner gives fewer than 512 such tiles and AxisParams carries a workspace
//   of reduce_axis_workspace_floats(p) floats, red is also split across blocks: pass 1 writes fp32
//   partials, pass 2 reduces them (deterministic, no atomics). Without it, such shapes run on
//   few blocks (slow, still correct).
//
// Softmax over a middle axis: launch_softmax_axis<OP, Tin, Tout, Pro, Epi>(AxisRowParams, ...)
//   OP    RowOp::{Softmax, LogSoftmax}; in and out both viewed as [outer, red, inner] with their
//   own element strides (a softmax over the channels of channels-first data: no transposing
//   copies). A thread owns V consecutive inner elements of one outer index (16-byte loads and
//   stores when both sides allow them) and walks red: held in registers when red <=
//   kAxisRowCache, else an online max-and-sum pass and a second read (from L2: the thread
//   rereads what it has just read). Math as the row softmax's. out may be in itself only with
//   the same strides (each element is read before it is written, by the same thread).
#pragma once

#include <climits>

#include "stitch/common.cuh"

namespace stitch {

// SafeSoftmax: softmax, except that a row whose every element is -inf is written as zeros instead
// of NaN (scaled_dot_product_attention's rule for a fully masked query row).
enum class RowOp { Softmax, LogSoftmax, LayerNorm, RmsNorm, Sum, Mean, Max, Min, LogSumExp, Var, SafeSoftmax };

__host__ __device__ constexpr bool row_op_writes_row(RowOp op) {
  return op == RowOp::Softmax || op == RowOp::SafeSoftmax || op == RowOp::LogSoftmax || op == RowOp::LayerNorm ||
         op == RowOp::RmsNorm;
}

template <class Tin, class Tout = Tin, class TW = Tin>
struct RowParams {
  const Tin* in;
  int64_t ldi;
  Tout* out;
  int64_t ldo;          // row outputs: leading dim; per-row outputs: stride between results
  const TW* weight;     // layer / rms norm only; may be null
  const TW* bias;       // layer norm only; may be null
  int64_t rows, cols;
  float eps;            // layer / rms norm
  bool unbiased;        // var
  // Optional fp32 scratch of row_reduce_workspace_floats(rows, cols) floats (from the program's
  // arena): lets a layer / rms norm over few, long rows split each row over many blocks.
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};

// Most blocks one row of a split layer / rms norm is cut into, and the shortest row split.
constexpr int kRowMaxSplits = 256;
constexpr int64_t kRowSplitMinCols = 32768;

// Floats of workspace a split layer / rms norm over rows x cols may use (0: never split).
__host__ __device__ constexpr int64_t row_reduce_workspace_floats(int64_t rows, int64_t cols) {
  return cols >= kRowSplitMinCols && rows > 0 ? rows * kRowMaxSplits * 3 : 0;
}

// Running max and sum of exp(x - max) of a softmax.
struct MaxSum {
  float m, s;
};
// Count, mean and sum of squared deviations (Welford).
struct Moments {
  float n, mean, m2;
};

__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int off) {
  return {shfl_xor(v.m, off), shfl_xor(v.s, off)};
}
__device__ __forceinline__ Moments shfl_xor(Moments v, int off) {
  return {shfl_xor(v.n, off), shfl_xor(v.mean, off), shfl_xor(v.m2, off)};
}

struct MaxSumOp {
  __device__ __forceinline__ MaxSum operator()(MaxSum a, MaxSum b) const {
    const float m = fmaxf(a.m, b.m);
    if (m == -CUDART_INF_F) return {m, 0.f};
    return {m, a.s * fast_exp2((a.m - m) * kLog2e) + b.s * fast_exp2((b.m - m) * kLog2e)};
  }
};

// Chan et al.'s pairwise merge of two Welford states.
struct MomentsOp {
  __device__ __forceinline__ Moments operator()(Moments a, Moments b) const {
    const float n = a.n + b.n;
    if (n == 0.f) return {0.f, 0.f, 0.f};
    const float d = b.mean - a.mean;
    const float wb = b.n / n;
    return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
  }
};

// STITCH_ROW_BULK 0 (defined before this header) loads a cluster's row slices through registers:
// the form before the copy engine, for measuring the two in one process.
#ifndef STITCH_ROW_BULK
#define STITCH_ROW_BULK 1
#endif

namespace detail {

template <class T> struct NoDeduce { using type = T; };

// One row per `group` lanes (group <= 32, several rows per block) or per block (group ==
// blockDim.x > 32). CACHE > 0: chunk k of a thread is lane + k * group, held in registers and
// cols <= group * CACHE * VEC; CACHE == 0: the row is streamed from global memory per pass;
// CACHE == kRowCluster: one row per thread-block cluster (sm_90+), block k of the cluster holding
// chunks [k * per, (k + 1) * per) of it in dynamic shared memory (per = ceil(chunks / cluster
// size)), the statistics merged across the cluster through distributed shared memory.
constexpr int kRowCluster = -1;

template <RowOp OP, class Tin, class Tout, class TW, class Pro, class Epi, int VEC, int CACHE>
__global__ void __launch_bounds__(CACHE == 0 ? 1024 : 512)
row_reduce_kernel(RowParams<Tin, Tout, TW> p, int group, Pro pro, Epi epi) {
  __shared__ float4 red_smem[33];  // block-reduction scratch, 16 bytes per slot
  constexpr bool kCluster = CACHE == kRowCluster;
  constexpr bool kOnChip = CACHE != 0;  // the row (or this block's slice of it) is held on chip
  const bool block_group = group > 32;
  const int lane = block_group ? int(threadIdx.x) : int(threadIdx.x & (group - 1));
  const int rows_per_block = block_group ? 1 : int(blockDim.x) / group;
  const uint2 place = kCluster ? cluster_place() : uint2{0u, 1u};
  const int64_t row = kCluster ? int64_t(blockIdx.x / place.y)
                               : int64_t(blockIdx.x) * rows_per_block + (block_group ? 0 : int(threadIdx.x) / group);
  const bool valid = row < p.rows;
  // Lanes of a row past the end still run every shuffle / barrier, with nothing to read.
  const int64_t nchunks = valid ? p.cols / VEC : 0;
  const Tin* x = p.in + (valid ? row * p.ldi : 0);
  const float fcols = float(p.cols);
  // This block's chunks: the whole row, or its slice of the row in a cluster.
  const int64_t per = kCluster ? ceil_div<int64_t>(nchunks, place.y) : nchunks;
  const int64_t c0 = kCluster ? place.x * per : 0;
  const int64_t c1 = c0 + per < nchunks ? c0 + per : nchunks;

  auto reduce = [&](auto v, auto op, auto identity) {
    using V = decltype(v);
    if constexpr (kCluster) return cluster_allreduce(v, op, identity, reinterpret_cast<V*>(red_smem));
    if (block_group) return block_allreduce(v, op, identity, reinterpret_cast<V*>(red_smem));
    return warp_allreduce(v, op, group);
  };

  extern __shared__ float4 slice_smem[];  // kCluster: the block's slice of the row, as packs
  Pack<Tin, VEC>* slice = reinterpret_cast<Pack<Tin, VEC>*>(slice_smem);
  if constexpr (kCluster) {
    // The slice by the copy engine where its packs are 16 bytes (all of it in flight at once: loaded
    // through registers, 4 packs a thread at a time, the load phase kept DRAM under half busy on an
    // H200), else through registers.
    __shared__ unsigned long long bar;
    const int64_t bytes = (c1 > c0 ? c1 - c0 : 0) * int64_t(sizeof(Pack<Tin, VEC>));
    if (!(STITCH_ROW_BULK && sizeof(Pack<Tin, VEC>) == 16 &&
          reinterpret_cast<uintptr_t>(x + c0 * VEC) % 16 == 0 &&
          bulk_load_shared(slice, x + c0 * VEC, uint32_t(bytes), &bar))) {
#pragma unroll 4
      for (int64_t c = c0 + lane; c < c1; c += group) slice[c - c0] = load_pack<Tin, VEC>(x + c * VEC);
      __syncthreads();
    }
  }

  Pack<Tin, VEC> cache[CACHE > 0 ? CACHE : 1];
  if constexpr (CACHE > 0) {
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int64_t c = lane + int64_t(k) * group;
      if (c < nchunks) cache[k] = load_pack<Tin, VEC>(x + c * VEC);
    }
  }

  // f(v, c): v = the VEC prologue'd values of chunk c (columns c * VEC ...).
  auto for_each_chunk = [&](auto&& f) {
    if constexpr (CACHE > 0) {
#pragma unroll
      for (int k = 0; k < CACHE; ++k) {
        const int64_t c = lane + int64_t(k) * group;
        if (c < nchunks) {
          float v[VEC];
#pragma unroll
          for (int i = 0; i < VEC; ++i) v[i] = pro(to_float(cache[k].v[i]));
          f(v, c);
        }
      }
    } else {
#pragma unroll 4
      for (int64_t c = c0 + lane; c < c1; c += group) {
        const Pack<Tin, VEC> pk = kCluster ? slice[c - c0] : load_pack<Tin, VEC>(x + c * VEC);
        float v[VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = pro(to_float(pk.v[i]));
        f(v, c);
      }
    }
  };

  Tout* y = p.out + (valid ? row * p.ldo : 0);
  // g(value, column) -> the row op's result for that element, before the epilogue hook.
  auto write_row = [&](auto&& g) {
    for_each_chunk([&](const float* v, int64_t c) {
      Pack<Tout, VEC> o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.v[i] = from_float<Tout>(epi(g(v[i], c * VEC + i)));
      store_pack<Tout, VEC>(y + c * VEC, o);
    });
  };
  auto write_scalar = [&](float r) {
    if (valid && lane == 0) p.out[row * p.ldo] = from_float<Tout>(epi(r));
  };

  if constexpr (OP == RowOp::Softmax || OP == RowOp::SafeSoftmax || OP == RowOp::LogSoftmax || OP == RowOp::LogSumExp) {
    MaxSum st{-CUDART_INF_F, 0.f};
    if constexpr (kOnChip) {
      for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) st.m = fmaxf(st.m, v[i]);
      });
      if (st.m != -CUDART_INF_F)
        for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) st.s += fast_exp2((v[i] - st.m) * kLog2e);
        });
    } else {
      for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float xv = v[i];
          if (xv > st.m) {
            st.s = st.s * fast_exp2((st.m - xv) * kLog2e) + 1.f;
            st.m = xv;
          } else if (xv != -CUDART_INF_F) {
            st.s += fast_exp2((xv - st.m) * kLog2e);
          }
        }
      });
    }
    st = reduce(st, MaxSumOp{}, MaxSum{-CUDART_INF_F, 0.f});
    if constexpr (OP == RowOp::Softmax) {
      const float m = st.m, inv = 1.f / st.s;
      write_row([&](float xv, int64_t) { return fast_exp2((xv - m) * kLog2e) * inv; });
    } else if constexpr (OP == RowOp::SafeSoftmax) {
      const bool none = st.m == -CUDART_INF_F;  // every element masked: zeros
      const float m = none ? 0.f : st.m, inv = none ? 0.f : 1.f / st.s;
      write_row([&](float xv, int64_t) { return none ? 0.f : fast_exp2((xv - m) * kLog2e) * inv; });
    } else if constexpr (OP == RowOp::LogSoftmax) {
      const float m = st.m, ls = logf(st.s);
      write_row([&](float xv, int64_t) { return (xv - m) - ls; });
    } else {
      write_scalar(st.m == -CUDART_INF_F ? -CUDART_INF_F : st.m + logf(st.s));
    }
  } else if constexpr (OP == RowOp::LayerNorm || OP == RowOp::Var) {
    float mean, m2;
    if constexpr (kOnChip) {
      float s = 0.f;
      for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += v[i];
      });
      mean = reduce(s, SumOp{}, 0.f) / fcols;
      float q = 0.f;
      for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float d = v[i] - mean;
          q += d * d;
        }
      });
      m2 = reduce(q, SumOp{}, 0.f);
    } else {
      Moments mo{0.f, 0.f, 0.f};
      for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          mo.n += 1.f;
          const float d = v[i] - mo.mean;
          mo.mean += d / mo.n;
          mo.m2 += d * (v[i] - mo.mean);
        }
      });
      mo = reduce(mo, MomentsOp{}, Moments{0.f, 0.f, 0.f});
      mean = mo.mean;
      m2 = mo.m2;
    }
    if constexpr (OP == RowOp::Var) {
      write_scalar(m2 / (p.unbiased ? fcols - 1.f : fcols));
    } else {
      const float rstd = rsqrtf(m2 / fcols + p.eps);
      const TW* w = p.weight;
      const TW* b = p.bias;
      write_row([&](float xv, int64_t col) {
        float r = (xv - mean) * rstd;
        if (w) r *= to_float(w[col]);
        if (b) r += to_float(b[col]);
        return r;
      });
    }
  } else if constexpr (OP == RowOp::RmsNorm) {
    float ss = 0.f;
    for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss += v[i] * v[i];
    });
    ss = reduce(ss, SumOp{}, 0.f);
    const float rstd = rsqrtf(ss / fcols + p.eps);
    const TW* w = p.weight;
    write_row([&](float xv, int64_t col) { return w ? xv * rstd * to_float(w[col]) : xv * rstd; });
  } else if constexpr (OP == RowOp::Sum || OP == RowOp::Mean) {
    float s = 0.f;
    for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += v[i];
    });
    s = reduce(s, SumOp{}, 0.f);
    write_scalar(OP == RowOp::Mean ? s / fcols : s);
  } else if constexpr (OP == RowOp::Max) {
    float m = -CUDART_INF_F;
    for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) m = fmaxf(m, v[i]);
    });
    write_scalar(reduce(m, MaxOp{}, -CUDART_INF_F));
  } else {
    static_assert(OP == RowOp::Min, "unhandled RowOp");
    float m = CUDART_INF_F;
    for_each_chunk([&](const float* v, int64_t) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) m = fminf(m, v[i]);
    });
    write_scalar(reduce(m, MinOp{}, CUDART_INF_F));
  }
}

// ---- split rows: a layer / rms norm over few, long rows ---------------------------------------
// One block per row leaves most SMs idle when rows < SMs (a 16 x 4M layer norm runs on 16 of 132
// SMs). Pass 1: block (s, r) reduces columns [s * chunk, (s + 1) * chunk) of row r to Welford
// moments (layer norm) or a mean of squares (rms norm) in workspace[(r * splits + s) * 3 ...].
// Pass 2: block (s, r) merges row r's `splits` partials (Chan's merge, in split order: the same
// result in every block) and writes its columns. x is read twice, y written once, like the
// single-block path for rows longer than its registers; chunk is a multiple of VEC.
template <RowOp OP, class Tin, class Tout, class TW, class Pro, int VEC>
__global__ void __launch_bounds__(512)
row_split_partial_kernel(RowParams<Tin, Tout, TW> p, int64_t chunk, Pro pro) {
  __shared__ float4 red_smem[33];
  const int64_t row = blockIdx.y;
  const int64_t c0 = int64_t(blockIdx.x) * chunk;
  const int64_t c1 = c0 + chunk < p.cols ? c0 + chunk : p.cols;
  const Tin* x = p.in + row * p.ldi;
  Moments mo{0.f, 0.f, 0.f};
  for (int64_t c = c0 + int64_t(threadIdx.x) * VEC; c < c1; c += int64_t(blockDim.x) * VEC) {
    const Pack<Tin, VEC> pk = load_pack<Tin, VEC>(x + c);
    float v[VEC], m = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      v[i] = pro(to_float(pk.v[i]));
      if constexpr (OP == RowOp::RmsNorm) v[i] *= v[i];
      m += v[i];
    }
    m /= float(VEC);
    float q = 0.f;
    if constexpr (OP == RowOp::LayerNorm) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) q += (v[i] - m) * (v[i] - m);
    }
    mo = MomentsOp{}(mo, Moments{float(VEC), m, q});
  }
  mo = block_allreduce(mo, MomentsOp{}, Moments{0.f, 0.f, 0.f}, reinterpret_cast<Moments*>(red_smem));
  if (threadIdx.x == 0) {
    float* w = p.workspace + (row * gridDim.x + blockIdx.x) * 3;
    w[0] = mo.n;
    w[1] = mo.mean;
    w[2] = mo.m2;
  }
}

template <RowOp OP, class Tin, class Tout, class TW, class Pro, class Epi, int VEC>
__global__ void __launch_bounds__(512)
row_split_apply_kernel(RowParams<Tin, Tout, TW> p, int64_t chunk, Pro pro, Epi epi) {
  __shared__ float stat[2];
  const int64_t row = blockIdx.y;
  if (threadIdx.x < 32) {  // one warp merges the row's partials, in split order within each lane
    const int splits = int(gridDim.x);
    const float* w = p.workspace + row * splits * 3;
    Moments mo{0.f, 0.f, 0.f};
    for (int s = int(threadIdx.x); s < splits; s += 32) mo = MomentsOp{}(mo, Moments{w[3 * s], w[3 * s + 1], w[3 * s + 2]});
    mo = warp_allreduce(mo, MomentsOp{});
    if (threadIdx.x == 0) {
      const float fcols = float(p.cols);
      stat[0] = OP == RowOp::LayerNorm ? mo.mean : 0.f;
      stat[1] = rsqrtf((OP == RowOp::LayerNorm ? mo.m2 / fcols : mo.mean) + p.eps);
    }
  }
  __syncthreads();
  const float mean = stat[0], rstd = stat[1];
  const int64_t c0 = int64_t(blockIdx.x) * chunk;
  const int64_t c1 = c0 + chunk < p.cols ? c0 + chunk : p.cols;
  const Tin* x = p.in + row * p.ldi;
  Tout* y = p.out + row * p.ldo;
  for (int64_t c = c0 + int64_t(threadIdx.x) * VEC; c < c1; c += int64_t(blockDim.x) * VEC) {
    const Pack<Tin, VEC> pk = load_pack<Tin, VEC>(x + c);
    Pack<Tout, VEC> o;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      float r = (pro(to_float(pk.v[i])) - mean) * rstd;
      if (p.weight) r *= to_float(p.weight[c + i]);
      if (OP == RowOp::LayerNorm && p.bias) r += to_float(p.bias[c + i]);
      o.v[i] = from_float<Tout>(epi(r));
    }
    store_pack<Tout, VEC>(y + c, o);
  }
}

// Blocks per row for a split layer / rms norm on this device (1: run one block per row).
inline int row_split_count(int64_t rows, int64_t cols, int vec) {
  if (cols < kRowSplitMinCols || rows <= 0) return 1;
  int n = 0;
  if (sm_count(n) != cudaSuccess || n == 0 || rows >= n) return 1;  // (or every SM already has a row)
  const int64_t want = ceil_div<int64_t>(2 * int64_t(n), rows);       // two blocks per SM
  const int64_t most = ceil_div<int64_t>(cols, int64_t(512) * vec * 4);  // >= 4 packs per thread
  const int64_t s = want < most ? want : most;
  return int(s < kRowMaxSplits ? (s < 1 ? 1 : s) : kRowMaxSplits);
}

template <RowOp OP, int VEC, class Tin, class Tout, class TW, class Pro, class Epi>
cudaError_t launch_row_split(const RowParams<Tin, Tout, TW>& p, int splits, cudaStream_t stream,
                             const Pro& pro, const Epi& epi) {
  const int64_t chunk = ceil_div<int64_t>(ceil_div<int64_t>(p.cols, splits), VEC) * VEC;
  splits = int(ceil_div<int64_t>(p.cols, chunk));
  if (p.rows > 65535) return cudaErrorInvalidConfiguration;  // grid.y
  const dim3 grid{unsigned(splits), unsigned(p.rows)};
  row_split_partial_kernel<OP, Tin, Tout, TW, Pro, VEC><<<grid, 512, 0, stream>>>(p, chunk, pro);
  row_split_apply_kernel<OP, Tin, Tout, TW, Pro, Epi, VEC><<<grid, 512, 0, stream>>>(p, chunk, pro, epi);
  return cudaGetLastError();
}

// A row too long for one block's registers, held in the shared memory of a thread-block cluster
// instead of read twice from global memory (a row-writing op reads its row once for the
// statistics and once for the output; at these lengths the second read misses L2). Tried where
// the kernel's binary is sm_90+ and for row-writing ops only: the smallest cluster of 2, 4, 8 or
// 16 blocks (16 where the device allows that non-portable size) whose slice fits kRowClusterSmem
// bytes, if the device can co-schedule it; returns false (nothing launched) otherwise.
constexpr int kRowClusterThreads = 512;
constexpr int64_t kRowClusterSmem = 112 * 1024;  // two blocks an SM: one loads while one writes

template <RowOp OP, int VEC, class Tin, class Tout, class TW, class Pro, class Epi>
bool launch_row_cluster(const RowParams<Tin, Tout, TW>& p, cudaStream_t stream, const Pro& pro, const Epi& epi,
                        cudaError_t* status) {
  if constexpr (!row_op_writes_row(OP)) {
    return false;  // (a row reduced to one value is read once already: no cluster variant compiled)
  } else {
    auto* kernel = row_reduce_kernel<OP, Tin, Tout, TW, Pro, Epi, VEC, kRowCluster>;
    static const int arch = kernel_binary_arch(kernel);
    if (arch < 90) return false;
    const int64_t chunks = p.cols / VEC;
    for (int cl : {2, 4, 8, 16}) {
      const int64_t smem = ceil_div<int64_t>(chunks, cl) * int64_t(sizeof(Pack<Tin, VEC>));
      if (smem > kRowClusterSmem) continue;
      if (p.rows * cl > INT_MAX) return false;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess ||
          (cl > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
        cudaGetLastError();
        return false;
      }
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = unsigned(cl);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(unsigned(p.rows * cl));
      cfg.blockDim = dim3(kRowClusterThreads);
      cfg.dynamicSmemBytes = size_t(smem);
      cfg.stream = stream;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int fits = 0;
      if (cudaOccupancyMaxActiveClusters(&fits, kernel, &cfg) != cudaSuccess || fits < 1) {
        cudaGetLastError();
        return false;
      }
      *status = cudaLaunchKernelEx(&cfg, kernel, p, kRowClusterThreads, pro, epi);
      return true;
    }
    return false;
  }
}

template <RowOp OP, int VEC, class Tin, class Tout, class TW, class Pro, class Epi>
cudaError_t launch_row_reduce_vec(const RowParams<Tin, Tout, TW>& p, cudaStream_t stream,
                                  const Pro& pro, const Epi& epi) {
  const int64_t chunks = p.cols / VEC;
  int cache, group, threads = 256;
  if (chunks <= 32) {
    cache = 1;
    group = next_pow2(int(chunks));
  } else if (chunks <= 256) {
    cache = 8;  // guarded: a lane with fewer chunks skips the rest (one variant, shorter builds)
    group = 32;
  } else if (chunks <= 512 * 8) {
    cache = 8;
    group = threads = int(ceil_div<int64_t>(ceil_div<int64_t>(chunks, 8), 32) * 32);
  } else {
    cudaError_t status = cudaSuccess;
    if (launch_row_cluster<OP, VEC>(p, stream, pro, epi, &status)) return status;
    cache = 0;
    group = threads = 1024;
  }
  const int rows_per_block = group > 32 ? 1 : threads / group;
  const int64_t blocks = ceil_div<int64_t>(p.rows, rows_per_block);
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid{unsigned(blocks)};
  switch (cache) {
    case 1: row_reduce_kernel<OP, Tin, Tout, TW, Pro, Epi, VEC, 1><<<grid, threads, 0, stream>>>(p, group, pro, epi); break;
    case 8: row_reduce_kernel<OP, Tin, Tout, TW, Pro, Epi, VEC, 8><<<grid, threads, 0, stream>>>(p, group, pro, epi); break;
    default: row_reduce_kernel<OP, Tin, Tout, TW, Pro, Epi, VEC, 0><<<grid, threads, 0, stream>>>(p, group, pro, epi); break;
  }
  return cudaGetLastError();
}

}  // namespace detail

// Launch a row reduction on `stream`; returns the launch status (cudaErrorInvalidValue for
// cols < 1 or null pointers).
template <RowOp OP, class Tin, class Tout = Tin, class TW = Tin, class Pro = Identity,
          class Epi = Identity>
cudaError_t launch_row_reduce(const RowParams<Tin, Tout, TW>& p, cudaStream_t stream,
                              const Pro& pro = Pro{}, const Epi& epi = Epi{}) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.cols < 1 || p.cols > INT_MAX || !p.in || !p.out) return cudaErrorInvalidValue;
  constexpr int N = VecWidth<Tin>::value;
  bool vec = p.cols % N == 0 && p.ldi % N == 0 && aligned_to(p.in, 16);
  if (row_op_writes_row(OP)) vec = vec && p.ldo % N == 0 && aligned_to(p.out, pack_align<Tout, N>());
  if constexpr (OP == RowOp::LayerNorm || OP == RowOp::RmsNorm) {
    if (p.workspace && p.workspace_floats >= row_reduce_workspace_floats(p.rows, p.cols)) {
      const int splits = detail::row_split_count(p.rows, p.cols, vec ? N : 1);
      if (splits > 1)
        return vec ? detail::launch_row_split<OP, N>(p, splits, stream, pro, epi)
                   : detail::launch_row_split<OP, 1>(p, splits, stream, pro, epi);
    }
  }
  return vec ? detail::launch_row_reduce_vec<OP, N>(p, stream, pro, epi)
             : detail::launch_row_reduce_vec<OP, 1>(p, stream, pro, epi);
}

// ---- named entry points: what a generated program calls ---------------------------------------

#define STITCH_ROW_ENTRY(NAME, OP)                                                              \
  template <class Tin, class Tout, class Pro = Identity, class Epi = Identity>                  \
  cudaError_t NAME(const Tin* in, int64_t ldi, Tout* out, int64_t ldo, int64_t rows,            \
                   int64_t cols, cudaStream_t stream, const Pro& pro = Pro{},                   \
                   const Epi& epi = Epi{}) {                                                    \
    RowParams<Tin, Tout, Tin> p{in, ldi, out, ldo, nullptr, nullptr, rows, cols, 0.f, false};   \
    return launch_row_reduce<OP>(p, stream, pro, epi);                                          \
  }

// out = softmax(pro(in)) along each row, then epi.
STITCH_ROW_ENTRY(launch_softmax, RowOp::Softmax)
// out = softmax(pro(in)) along each row, a row of -inf written as zeros, then epi.
STITCH_ROW_ENTRY(launch_safe_softmax, RowOp::SafeSoftmax)
// out = log_softmax(pro(in)) along each row, then epi.
STITCH_ROW_ENTRY(launch_log_softmax, RowOp::LogSoftmax)
// out[r * ldo] = epi(log(sum_c exp(pro(in[r, c])))).
STITCH_ROW_ENTRY(launch_logsumexp, RowOp::LogSumExp)
// out[r * ldo] = epi(sum_c pro(in[r, c])).
STITCH_ROW_ENTRY(launch_row_sum, RowOp::Sum)
// out[r * ldo] = epi(mean_c pro(in[r, c])).
STITCH_ROW_ENTRY(launch_row_mean, RowOp::Mean)
// out[r * ldo] = epi(max_c pro(in[r, c])).
STITCH_ROW_ENTRY(launch_row_max, RowOp::Max)
// out[r * ldo] = epi(min_c pro(in[r, c])).
STITCH_ROW_ENTRY(launch_row_min, RowOp::Min)
#undef STITCH_ROW_ENTRY

// out[r * ldo] = epi(sum_c (x - mean)^2 / (cols - unbiased)), x = pro(in[r, c]).
template <class Tin, class Tout, class Pro = Identity, class Epi = Identity>
cudaError_t launch_row_var(const Tin* in, int64_t ldi, Tout* out, int64_t ldo, int64_t rows,
                           int64_t cols, bool unbiased, cudaStream_t stream,
                           const Pro& pro = Pro{}, const Epi& epi = Epi{}) {
  RowParams<Tin, Tout, Tin> p{in, ldi, out, ldo, nullptr, nullptr, rows, cols, 0.f, unbiased};
  return launch_row_reduce<RowOp::Var>(p, stream, pro, epi);
}

// out = epi((x - mean) * rsqrt(var + eps) * weight + bias), x = pro(in), biased var.
// weight / bias may be null; their type TW is Tin unless named explicitly.
template <class Tin, class Tout, class TW = Tin, class Pro = Identity, class Epi = Identity>
cudaError_t launch_layer_norm(const Tin* in, int64_t ldi, Tout* out, int64_t ldo,
                              const typename detail::NoDeduce<TW>::type* weight,
                              const typename detail::NoDeduce<TW>::type* bias, int64_t rows,
                              int64_t cols, float eps, cudaStream_t stream,
                              const Pro& pro = Pro{}, const Epi& epi = Epi{}) {
  RowParams<Tin, Tout, TW> p{in, ldi, out, ldo, weight, bias, rows, cols, eps, false};
  return launch_row_reduce<RowOp::LayerNorm>(p, stream, pro, epi);
}

// launch_layer_norm with a workspace of row_reduce_workspace_floats(rows, cols) floats: few, long
// rows are split over many blocks (two passes); otherwise the same as launch_layer_norm.
template <class Tin, class Tout, class TW = Tin, class Pro = Identity, class Epi = Identity>
cudaError_t launch_layer_norm_ws(const Tin* in, int64_t ldi, Tout* out, int64_t ldo,
                                 const typename detail::NoDeduce<TW>::type* weight,
                                 const typename detail::NoDeduce<TW>::type* bias, int64_t rows,
                                 int64_t cols, float eps, float* workspace, int64_t workspace_floats,
                                 cudaStream_t stream, const Pro& pro = Pro{}, const Epi& epi = Epi{}) {
  RowParams<Tin, Tout, TW> p{in, ldi, out, ldo, weight, bias, rows, cols, eps, false, workspace, workspace_floats};
  return launch_row_reduce<RowOp::LayerNorm>(p, stream, pro, epi);
}

// launch_rms_norm with a workspace (as launch_layer_norm_ws).
template <class Tin, class Tout, class TW = Tin, class Pro = Identity, class Epi = Identity>
cudaError_t launch_rms_norm_ws(const Tin* in, int64_t ldi, Tout* out, int64_t ldo,
                               const typename detail::NoDeduce<TW>::type* weight, int64_t rows,
                               int64_t cols, float eps, float* workspace, int64_t workspace_floats,
                               cudaStream_t stream, const Pro& pro = Pro{}, const Epi& epi = Epi{}) {
  RowParams<Tin, Tout, TW> p{in, ldi, out, ldo, weight, nullptr, rows, cols, eps, false, workspace, workspace_floats};
  return launch_row_reduce<RowOp::RmsNorm>(p, stream, pro, epi);
}

// out = epi(x * rsqrt(mean(x^2) + eps) * weight), x = pro(in). weight may be null.
template <class Tin, class Tout, class TW = Tin, class Pro = Identity, class Epi = Identity>
cudaError_t launch_rms_norm(const Tin* in, int64_t ldi, Tout* out, int64_t ldo,
                            const typename detail::NoDeduce<TW>::type* weight, int64_t rows,
                            int64_t cols, float eps, cudaStream_t stream, const Pro& pro = Pro{},
                            const Epi& epi = Epi{}) {
  RowParams<Tin, Tout, TW> p{in, ldi, out, ldo, weight, nullptr, rows, cols, eps, false};
  return launch_row_reduce<RowOp::RmsNorm>(p, stream, pro, epi);
}

// ---- reduction over a middle axis --------------------------------------------------------------

enum class AxisOp { Sum, Mean, Max, Min };

template <class Tin, class Tout = Tin>
struct AxisParams {
  const Tin* in;
  int64_t outer, red, inner;        // in viewed as [outer, red, inner]
  int64_t in_so, in_sr, in_si;      // its element strides
  Tout* out;                        // [outer, inner]
  int64_t out_so, out_si;
  // Optional fp32 scratch of reduce_axis_workspace_floats(p) floats (from the program's arena):
  // lets few, long reductions split the reduced axis over many blocks (two deterministic passes).
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};

namespace detail {

template <AxisOp OP>
__device__ __forceinline__ float axis_identity() {
  return OP == AxisOp::Max ? -CUDART_INF_F : OP == AxisOp::Min ? CUDART_INF_F : 0.f;
}
template <AxisOp OP>
__device__ __forceinline__ float axis_combine(float a, float b) {
  if constexpr (OP == AxisOp::Max) return fmaxf(a, b);
  else if constexpr (OP == AxisOp::Min) return fminf(a, b);
  else return a + b;
}

// How a middle-axis reduction is cut: V inner elements per thread (one 16-byte load), a block of
// bx x by threads (bx along inner, by along red), the reduced axis in `splits` pieces of
// `rows_per_split` (splits > 1 needs the workspace).
struct AxisPlan {
  int vec, bx, by;
  int64_t splits, rows_per_split, tiles;
};

constexpr int kAxisThreads = 256;
constexpr int64_t kAxisBlocksWanted = 1024;  // enough to fill any current GPU a few times

template <class Tin, class Tout>
inline AxisPlan axis_plan(const AxisParams<Tin, Tout>& p, bool with_workspace) {
  constexpr int N = VecWidth<Tin>::value;
  AxisPlan a{};
  const bool vec = p.in_si == 1 && p.inner % N == 0 && p.in_so % N == 0 && p.in_sr % N == 0 &&
                   aligned_to(p.in, 16);
  a.vec = vec ? N : 1;
  const int64_t ivec = p.inner / a.vec;
  a.bx = ivec >= 32 ? 32 : next_pow2(int(ivec));
  a.tiles = p.outer * ceil_div<int64_t>(ivec, a.bx);
  const int max_by = kAxisThreads / a.bx;
  a.splits = 1;
  if (with_workspace && a.tiles < kAxisBlocksWanted / 2) {
    // Each thread keeps at least 8 rows of its piece, so the second pass stays small.
    const int64_t by_rows = ceil_div<int64_t>(p.red, int64_t(max_by) * 8);
    const int64_t want = ceil_div<int64_t>(kAxisBlocksWanted, a.tiles);
    a.splits = want < by_rows ? want : by_rows;
    if (a.splits < 1) a.splits = 1;
  }
  a.rows_per_split = ceil_div<int64_t>(p.red, a.splits);
  a.splits = ceil_div<int64_t>(p.red, a.rows_per_split);
  a.by = a.rows_per_split >= max_by ? max_by : next_pow2(int(a.rows_per_split));
  return a;
}

// Pass over [outer, red, inner]: block w covers split w / tiles of tile w % tiles. With one
// split it writes out[o, i] = epi(acc * out_scale); else the raw fp32 partial at
// partial[(s * outer + o) * inner + i].
template <AxisOp OP, int V, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(kAxisThreads)
reduce_axis_kernel(AxisParams<Tin, Tout> p, AxisPlan plan, float out_scale, Pro pro, Epi epi) {
  __shared__ float part[kAxisThreads * V];
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t tiles_inner = ceil_div<int64_t>(p.inner / V, bx);
  const int64_t total = plan.tiles * plan.splits;
  for (int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const int64_t s = w / plan.tiles, t = w - s * plan.tiles;
    const int64_t o = t / tiles_inner;
    const int64_t i0 = ((t - o * tiles_inner) * bx + tx) * V;
    const int64_t r_begin = s * plan.rows_per_split;
    const int64_t r_end = r_begin + plan.rows_per_split < p.red ? r_begin + plan.rows_per_split : p.red;
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = axis_identity<OP>();
    if (i0 < p.inner) {
      const Tin* base = p.in + o * p.in_so + i0 * p.in_si;
#pragma unroll 4
      for (int64_t r = r_begin + ty; r < r_end; r += by) {
        if constexpr (V > 1) {
          const Pack<Tin, V> pk = load_pack<Tin, V>(base + r * p.in_sr);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = axis_combine<OP>(acc[e], pro(to_float(pk.v[e])));
        } else {
          acc[0] = axis_combine<OP>(acc[0], pro(to_float(base[r * p.in_sr])));
        }
      }
    }
#pragma unroll
    for (int e = 0; e < V; ++e) part[(ty * bx + tx) * V + e] = acc[e];
    __syncthreads();
    for (int h = by >> 1; h > 0; h >>= 1) {
      if (ty < h) {
#pragma unroll
        for (int e = 0; e < V; ++e)
          part[(ty * bx + tx) * V + e] =
              axis_combine<OP>(part[(ty * bx + tx) * V + e], part[((ty + h) * bx + tx) * V + e]);
      }
      __syncthreads();
    }
    if (ty == 0 && i0 < p.inner) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float r = part[tx * V + e];
        if (plan.splits == 1)
          p.out[o * p.out_so + (i0 + e) * p.out_si] = from_float<Tout>(epi(r * out_scale));
        else
          p.workspace[(s * p.outer + o) * p.inner + i0 + e] = r;
      }
    }
    __syncthreads();
  }
}

template <AxisOp OP, int V, class Tin, class Tout, class Pro, class Epi>
cudaError_t launch_axis_pass(const AxisParams<Tin, Tout>& p, const AxisPlan& plan,
                             float out_scale, const Pro& pro, const Epi& epi, cudaStream_t stream) {
  const int64_t work = plan.tiles * plan.splits;
  const unsigned blocks = unsigned(work < (int64_t(1) << 20) ? work : (int64_t(1) << 20));
  reduce_axis_kernel<OP, V, Tin, Tout, Pro, Epi>
      <<<blocks, dim3(plan.bx, plan.by), 0, stream>>>(p, plan, out_scale, pro, epi);
  return cudaGetLastError();
}

}  // namespace detail

// fp32 elements of workspace that launch_reduce_axis would use for p (0: it never splits p).
template <class Tin, class Tout>
int64_t reduce_axis_workspace_floats(const AxisParams<Tin, Tout>& p) {
  if (p.outer <= 0 || p.inner <= 0 || p.red < 1) return 0;
  const detail::AxisPlan a = detail::axis_plan(p, true);
  return a.splits > 1 ? a.splits * p.outer * p.inner : 0;
}

// out[o, i] = epi(reduce_r pro(in[o, r, i])) on `stream`; returns the launch status. With a
// large enough workspace the reduced axis is split over blocks (pass 1 writes fp32 partials,
// pass 2 reduces them: deterministic); without one a block reduces a whole column tile.
template <AxisOp OP, class Tin, class Tout = Tin, class Pro = Identity, class Epi = Identity>
cudaError_t launch_reduce_axis(const AxisParams<Tin, Tout>& p, cudaStream_t stream,
                               const Pro& pro = Pro{}, const Epi& epi = Epi{}) {
  if (p.outer <= 0 || p.inner <= 0) return cudaSuccess;
  if (p.red < 1 || !p.in || !p.out) return cudaErrorInvalidValue;
  constexpr AxisOp ACC = OP == AxisOp::Mean ? AxisOp::Sum : OP;
  constexpr int N = VecWidth<Tin>::value;
  const float mean_scale = OP == AxisOp::Mean ? 1.f / float(p.red) : 1.f;
  detail::AxisPlan plan = detail::axis_plan(p, p.workspace != nullptr);
  if (plan.splits > 1 && p.workspace_floats < plan.splits * p.outer * p.inner)
    plan = detail::axis_plan(p, false);
  if (plan.splits == 1) {
    return plan.vec == N
               ? detail::launch_axis_pass<ACC, N>(p, plan, mean_scale, pro, epi, stream)
               : detail::launch_axis_pass<ACC, 1>(p, plan, mean_scale, pro, epi, stream);
  }
  cudaError_t e = plan.vec == N
                      ? detail::launch_axis_pass<ACC, N>(p, plan, 1.f, pro, Identity{}, stream)
                      : detail::launch_axis_pass<ACC, 1>(p, plan, 1.f, pro, Identity{}, stream);
  if (e != cudaSuccess) return e;
  // Pass 2: the partials as [outer, splits, inner] (strides inner, outer * inner, 1).
  AxisParams<float, Tout> q{p.workspace, p.outer, plan.splits, p.inner, p.inner,
                            p.outer * p.inner, 1, p.out, p.out_so, p.out_si};
  const detail::AxisPlan plan2 = detail::axis_plan(q, false);
  return plan2.vec == 4 ? detail::launch_axis_pass<ACC, 4>(q, plan2, mean_scale, Identity{}, epi, stream)
                        : detail::launch_axis_pass<ACC, 1>(q, plan2, mean_scale, Identity{}, epi, stream);
}

// ---- softmax over a middle axis ----------------------------------------------------------------

template <class Tin, class Tout = Tin>
struct AxisRowParams {
  const Tin* in;
  int64_t outer, red, inner;        // in viewed as [outer, red, inner]
  int64_t in_so, in_sr, in_si;      // its element strides
  Tout* out;                        // [outer, red, inner] too
  int64_t out_so, out_sr, out_si;
};

// The longest reduced axis held in registers (V floats per element).
constexpr int kAxisRowCache = 16;

namespace detail {

constexpr int kAxisRowThreads = 256;

template <RowOp OP, int V, int CACHE, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(kAxisRowThreads)
softmax_axis_kernel(AxisRowParams<Tin, Tout> p, Pro pro, Epi epi) {
  static_assert(OP == RowOp::Softmax || OP == RowOp::LogSoftmax, "softmax_axis_kernel: softmax ops only");
  const int64_t ivec = p.inner / V;  // (V divides inner when V > 1)
  const int64_t columns = p.outer * ivec;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = c / ivec, i0 = (c - o * ivec) * V;
    const Tin* x = p.in + o * p.in_so + i0 * p.in_si;
    Tout* y = p.out + o * p.out_so + i0 * p.out_si;
    auto load = [&](int64_t r, float* v) {
      if constexpr (V > 1) {
        const Pack<Tin, V> pk = load_pack<Tin, V>(x + r * p.in_sr);
#pragma unroll
        for (int e = 0; e < V; ++e) v[e] = pro(to_float(pk.v[e]));
      } else {
        v[0] = pro(to_float(x[r * p.in_sr]));
      }
    };
    auto store = [&](int64_t r, const float* v) {
      if constexpr (V > 1) {
        Pack<Tout, V> pk;
#pragma unroll
        for (int e = 0; e < V; ++e) pk.v[e] = from_float<Tout>(epi(v[e]));
        store_pack<Tout, V>(y + r * p.out_sr, pk);
      } else {
        y[r * p.out_sr] = from_float<Tout>(epi(v[0]));
      }
    };
    float m[V], s[V];
#pragma unroll
    for (int e = 0; e < V; ++e) m[e] = -CUDART_INF_F, s[e] = 0.f;
    auto finish = [&](float* v) {  // v: one element's values in place of their result
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if constexpr (OP == RowOp::Softmax) v[e] = fast_exp2((v[e] - m[e]) * kLog2e) * (1.f / s[e]);
        else v[e] = (v[e] - m[e]) - logf(s[e]);
      }
    };
    if constexpr (CACHE > 0) {  // red <= CACHE: every value in registers, one read
      float v[CACHE][V];
#pragma unroll
      for (int r = 0; r < CACHE; ++r)
        if (r < p.red) load(r, v[r]);
#pragma unroll
      for (int r = 0; r < CACHE; ++r)
        if (r < p.red)
#pragma unroll
          for (int e = 0; e < V; ++e) m[e] = fmaxf(m[e], v[r][e]);
#pragma unroll
      for (int r = 0; r < CACHE; ++r)
        if (r < p.red)
#pragma unroll
          for (int e = 0; e < V; ++e)
            if (m[e] != -CUDART_INF_F) s[e] += fast_exp2((v[r][e] - m[e]) * kLog2e);
#pragma unroll
      for (int r = 0; r < CACHE; ++r)
        if (r < p.red) {
          finish(v[r]);
          store(r, v[r]);
        }
    } else {  // online max and sum, then a second read
      for (int64_t r = 0; r < p.red; ++r) {
        float v[V];
        load(r, v);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if (v[e] > m[e]) {
            s[e] = s[e] * fast_exp2((m[e] - v[e]) * kLog2e) + 1.f;
            m[e] = v[e];
          } else if (v[e] != -CUDART_INF_F) {
            s[e] += fast_exp2((v[e] - m[e]) * kLog2e);
          }
        }
      }
      for (int64_t r = 0; r < p.red; ++r) {
        float v[V];
        load(r, v);
        finish(v);
        store(r, v);
      }
    }
  }
}

template <RowOp OP, int V, class Tin, class Tout, class Pro, class Epi>
cudaError_t launch_softmax_axis_v(const AxisRowParams<Tin, Tout>& p, const Pro& pro, const Epi& epi,
                                  cudaStream_t stream) {
  const int64_t threads = p.outer * (p.inner / V);
  const int64_t want = ceil_div<int64_t>(threads, kAxisRowThreads);
  const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
  if (p.red <= kAxisRowCache)
    softmax_axis_kernel<OP, V, kAxisRowCache, Tin, Tout, Pro, Epi>
        <<<blocks, kAxisRowThreads, 0, stream>>>(p, pro, epi);
  else
    softmax_axis_kernel<OP, V, 0, Tin, Tout, Pro, Epi><<<blocks, kAxisRowThreads, 0, stream>>>(p, pro, epi);
  return cudaGetLastError();
}

}  // namespace detail

// out[o, :, i] = softmax (or log-softmax) over r of pro(in[o, r, i]), each value through epi, on
// `stream`; returns the launch status.
template <RowOp OP, class Tin, class Tout = Tin, class Pro = Identity, class Epi = Identity>
cudaError_t launch_softmax_axis(const AxisRowParams<Tin, Tout>& p, cudaStream_t stream,
                                const Pro& pro = Pro{}, const Epi& epi = Epi{}) {
  if (p.outer <= 0 || p.inner <= 0) return cudaSuccess;
  if (p.red < 1 || !p.in || !p.out) return cudaErrorInvalidValue;
  constexpr int N = VecWidth<Tin>::value == VecWidth<Tout>::value ? VecWidth<Tin>::value : 1;
  const bool vec = N > 1 && p.in_si == 1 && p.out_si == 1 && p.inner % N == 0 && p.in_so % N == 0 &&
                   p.in_sr % N == 0 && p.out_so % N == 0 && p.out_sr % N == 0 && aligned_to(p.in, 16) &&
                   aligned_to(p.out, 16);
  return vec ? detail::launch_softmax_axis_v<OP, N>(p, pro, epi, stream)
             : detail::launch_softmax_axis_v<OP, 1>(p, pro, epi, stream);
}

}  // namespace stitch
