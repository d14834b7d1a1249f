// pool.cuh — max and average pooling over up to three spatial dims (1-d / 2-d / 3-d pooling,
// adaptive pooling, global pooling), with prologue / epilogue hooks.
//
// launch_pool<MODE, Tin, Tout, Pro, Epi>(PoolParams<Tin, Tout>, stream, pro, epi)
//   MODE  PoolMode::Max or PoolMode::Avg; Tin / Tout storage (float, __half, __nv_bfloat16);
//   Pro   hook on every input element read; Epi on every output value (see common.cuh).
// Contract
//   - in is [planes, d, h, w] with element strides in_stride (a missing spatial dim has size 1),
//     out is [planes, od, oh, ow] with out_stride; both are arbitrary strided views that do not
//     overlap.
//   - Window of output index o along a spatial dim: taps o * stride - pad + t * dilation,
//     t = 0 .. kernel - 1, those inside [0, size) only; `adaptive`: the input range
//     [floor(o * size / osize), ceil((o + 1) * size / osize)) (kernel, stride, pad, dilation
//     unused).
//   - Max: the largest tap (a NaN tap wins, as in PyTorch); -inf for an empty window.
//     Avg: the sum over the valid taps divided by `divisor` when > 0, else by the window clipped to
//     the padded input (count_include_pad; PyTorch's pool_size) or by the number of valid taps.
//   - Math in fp32. Fixed windows: one thread per kPoolRows consecutive output rows of one column
//     (grid-stride), walking the input rows their windows cover once each: a row's taps are
//     reduced once and merged into every output whose window holds it (a stride-1 window of k
//     rows shares k - 1 rows with the next). Adaptive windows: one thread per output element.
//     Taps read through L1/L2.
//   - 1-d / 2-d fixed windows (no depth window) whose input tile fits shared memory take a tiled
//     path instead: a block stages the input under a tile of outputs once (hook applied, padding
//     as the merge's identity), reduces each staged row across the window's columns, then those
//     row results down the window's rows; every input element is read from memory once (plus the
//     tile's halo) and the taps from shared memory, where the rows path read each element about
//     kernel-width times through L1 with 64-bit index arithmetic a tap. The generated program names
//     a small window of dilation 1 when it is compiled (launch_pool<MODE, KH, KW, SH, SW>), so the
//     tap loops unroll; the staging keeps four loads in flight a thread.
//
// launch_pool_channels_last<MODE, Tin, Tout, Pro, Epi>(PoolClParams<Tin, Tout>, stream, pro, epi)
//   The same pooling over in [batch, channels, d, h, w] and out [batch, channels, od, oh, ow] (element
//   strides per dim, in that logical order), with the channel index varying fastest between
//   consecutive threads: for channels-last data (channel stride 1) every tap's loads and the stores
//   are coalesced across a warp, where launch_pool's threads would stride by the channel count.
//   With unit channel strides, a channel count and strides that are multiples of 4 and aligned
//   pointers, a thread takes 4 channels (one 16-byte load of fp32 a tap): a quarter of the index
//   arithmetic, which is what the one-channel walk spent its time on.
#pragma once

#include <climits>

#include "stitch/common.cuh"

namespace stitch {

enum class PoolMode { Max, Avg };

template <class Tin, class Tout>
struct PoolParams {
  const Tin* in;
  int64_t planes;
  int64_t in_size[3];
  int64_t in_stride[4];   // planes, d, h, w
  Tout* out;
  int64_t out_size[3];
  int64_t out_stride[4];
  int kernel[3], stride[3], pad[3], dilation[3];
  bool adaptive;
  bool count_include_pad;
  int divisor;            // > 0: divisor_override
};

template <class Tin, class Tout>
struct PoolClParams {
  const Tin* in;
  int64_t batch, channels;
  int64_t in_size[3];
  int64_t in_stride[5];   // batch, channels, d, h, w
  Tout* out;
  int64_t out_size[3];
  int64_t out_stride[5];
  int kernel[3], stride[3], pad[3], dilation[3];
  bool adaptive;
  bool count_include_pad;
  int divisor;
};

namespace detail {

// Taps of output index o along one dim: [lo, hi) stepping `step`, and the avg pool_size factor.
struct PoolWindow {
  int64_t lo, hi, step, padded;
};

template <class P>
__device__ __forceinline__ PoolWindow pool_window(const P& p, int j, int64_t o) {
  const int64_t n = p.in_size[j];
  if (p.adaptive) {
    const int64_t m = p.out_size[j];
    const int64_t lo = (o * n) / m, hi = ((o + 1) * n + m - 1) / m;
    return {lo, hi, 1, hi - lo};
  }
  const int64_t start = o * p.stride[j] - p.pad[j];
  const int64_t d = p.dilation[j];
  const int64_t last = start + int64_t(p.kernel[j] - 1) * d;  // the window's last tap
  const int64_t padded_end = last + 1 < n + p.pad[j] ? last + 1 : n + p.pad[j];
  int64_t lo = start, hi = last + 1;
  if (lo < 0) lo += ((-lo + d - 1) / d) * d;  // first tap inside
  if (hi > n) hi = n;
  return {lo, hi, d, padded_end - start};
}

// How many taps of a window lie inside the input.
__device__ __forceinline__ int64_t pool_taps(const PoolWindow& w) {
  return w.hi > w.lo ? (w.hi - w.lo + w.step - 1) / w.step : 0;
}

// One tap v into the window's running value: the largest (a NaN wins, as in PyTorch), or the sum.
// sm_80+: max.NaN.f32, one instruction (the NaN-aware select is four or five, and the tiled
// path is bound by instruction issue: ncu, 88 % of the SMs' issue slots on 1:42).
template <PoolMode MODE>
__device__ __forceinline__ float pool_merge(float acc, float v) {
  if constexpr (MODE == PoolMode::Max) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(acc), "f"(v));
    return r;
#else
    return (v > acc || v != v) ? (acc != acc ? acc : v) : acc;
#endif
  } else {
    return acc + v;
  }
}

template <PoolMode MODE, class I, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(256) pool_kernel(PoolParams<Tin, Tout> p, I total, Pro pro, Epi epi) {
  const I grid = I(gridDim.x) * I(blockDim.x);
  const I ow_n = I(p.out_size[2]), oh_n = I(p.out_size[1]), od_n = I(p.out_size[0]);
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < total; idx += grid) {
    I t = idx;
    const I ow = t % ow_n;
    t /= ow_n;
    const I oh = t % oh_n;
    t /= oh_n;
    const I od = t % od_n;
    const I pl = t / od_n;
    const PoolWindow wd = pool_window(p, 0, od), wh = pool_window(p, 1, oh), ww = pool_window(p, 2, ow);
    const Tin* base = p.in + int64_t(pl) * p.in_stride[0];
    float acc = MODE == PoolMode::Max ? -CUDART_INF_F : 0.f;
    int64_t count = 0;
    for (int64_t d = wd.lo; d < wd.hi; d += wd.step) {
      for (int64_t h = wh.lo; h < wh.hi; h += wh.step) {
        const Tin* row = base + d * p.in_stride[1] + h * p.in_stride[2];
        for (int64_t w = ww.lo; w < ww.hi; w += ww.step) {
          acc = pool_merge<MODE>(acc, pro(to_float(row[w * p.in_stride[3]])));
          ++count;
        }
      }
    }
    float r = acc;
    if constexpr (MODE == PoolMode::Avg) {
      const int64_t div = p.divisor > 0 ? p.divisor
                          : (p.count_include_pad && !p.adaptive) ? wd.padded * wh.padded * ww.padded
                                                                 : count;
      r = acc / float(div);
    }
    p.out[int64_t(pl) * p.out_stride[0] + int64_t(od) * p.out_stride[1] + int64_t(oh) * p.out_stride[2] +
          int64_t(ow) * p.out_stride[3]] =
        from_float<Tout>(epi(r));
  }
}

constexpr int kPoolRows = 4;

// Fixed windows (not adaptive): kPoolRows output rows per thread; I as below.
template <PoolMode MODE, class I, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(256) pool_rows_kernel(PoolParams<Tin, Tout> p, I total, Pro pro, Epi epi) {
  constexpr int R = kPoolRows;
  const float kInit = MODE == PoolMode::Max ? -CUDART_INF_F : 0.f;
  const I grid = I(gridDim.x) * I(blockDim.x);
  const I ow_n = I(p.out_size[2]), oh_n = I(p.out_size[1]), od_n = I(p.out_size[0]);
  const I ohb_n = (oh_n + R - 1) / R;
  const int64_t sh = p.stride[1], ph = p.pad[1], dh = p.dilation[1], reach = int64_t(p.kernel[1] - 1) * dh;
  const int64_t rows = p.in_size[1];
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < total; idx += grid) {
    I t = idx;
    const I ow = t % ow_n;
    t /= ow_n;
    const I oh0 = (t % ohb_n) * R;
    t /= ohb_n;
    const I od = t % od_n;
    const I pl = t / od_n;
    const PoolWindow wd = pool_window(p, 0, od), ww = pool_window(p, 2, ow);
    const Tin* base = p.in + int64_t(pl) * p.in_stride[0];
    float acc[R];
    int held[R];  // input rows inside each output's window
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] = kInit, held[j] = 0;
    const int64_t first = int64_t(oh0) * sh - ph;
    const int64_t r_lo = first < 0 ? 0 : first;
    const int64_t last = (int64_t(oh0) + R - 1) * sh - ph + reach;
    const int64_t r_hi = last < rows - 1 ? last : rows - 1;
    for (int64_t r = r_lo; r <= r_hi; ++r) {
      unsigned hold = 0;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int64_t tap = r - (first + j * sh);
        if (oh0 + j < oh_n && tap >= 0 && tap <= reach && (dh == 1 || tap % dh == 0)) hold |= 1u << j;
      }
      if (!hold) continue;
      float v = kInit;
      for (int64_t d = wd.lo; d < wd.hi; d += wd.step) {
        const Tin* row = base + d * p.in_stride[1] + r * p.in_stride[2];
        for (int64_t w = ww.lo; w < ww.hi; w += ww.step) v = pool_merge<MODE>(v, pro(to_float(row[w * p.in_stride[3]])));
      }
#pragma unroll
      for (int j = 0; j < R; ++j)
        if (hold >> j & 1u) acc[j] = pool_merge<MODE>(acc[j], v), ++held[j];
    }
    const int64_t taps_dw = pool_taps(wd) * pool_taps(ww);
    Tout* out = p.out + int64_t(pl) * p.out_stride[0] + int64_t(od) * p.out_stride[1] + int64_t(ow) * p.out_stride[3];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (oh0 + j >= oh_n) break;
      float r = acc[j];
      if constexpr (MODE == PoolMode::Avg) {
        const PoolWindow wh = pool_window(p, 1, int64_t(oh0) + j);
        const int64_t div = p.divisor > 0 ? p.divisor
                            : p.count_include_pad ? wd.padded * wh.padded * ww.padded
                                                  : taps_dw * held[j];
        r = acc[j] / float(div);
      }
      out[(int64_t(oh0) + j) * p.out_stride[2]] = from_float<Tout>(epi(r));
    }
  }
}

// ---- tiled path: 1-d / 2-d fixed windows through shared memory --------------------------------

constexpr int kPoolTileThreads = 256;
constexpr int kPoolTileSmemFloats = 12 * 1024;  // 48 KB: the staged input and the row results
constexpr int kPoolStageLoads = 4;               // staging loads in flight a thread

struct PoolTileShape {
  int tw, th;  // outputs a tile: columns, rows
  int iw, ih;  // staged input: columns, rows
};

// The tile for p, or {0, ...} when even the smallest does not fit shared memory.
template <class P>
inline PoolTileShape pool_tile_shape(const P& p) {
  for (int tw : {64, 32})
    for (int th : {32, 16, 8}) {
      const int64_t iw = int64_t(tw - 1) * p.stride[2] + int64_t(p.kernel[2] - 1) * p.dilation[2] + 1;
      const int64_t ih = int64_t(th - 1) * p.stride[1] + int64_t(p.kernel[1] - 1) * p.dilation[1] + 1;
      if (iw * ih + ih * tw <= kPoolTileSmemFloats) return {tw, th, int(iw), int(ih)};
    }
  return {0, 0, 0, 0};
}

// grid: x tiles along w, y tiles along h, z planes (grid-stride). Shared memory: the staged input
// (ih x iw) then the row results (ih x tw).
// KH, KW, SH, SW > 0: the window's rows, columns and strides known when compiled (dilation 1):
// the tap loops unroll and the shared-memory offsets are constants.
template <PoolMode MODE, int KH, int KW, int SH, int SW, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(kPoolTileThreads) pool_tile_kernel(PoolParams<Tin, Tout> p, PoolTileShape t,
                                                                     Pro pro, Epi epi) {
  extern __shared__ float smem[];
  float* in_s = smem;
  float* row_s = smem + t.ih * t.iw;
  const float kInit = MODE == PoolMode::Max ? -CUDART_INF_F : 0.f;
  constexpr bool kFixed = KH > 0;
  const int kh = kFixed ? KH : p.kernel[1], kw = kFixed ? KW : p.kernel[2];
  const int sh = kFixed ? SH : p.stride[1], sw = kFixed ? SW : p.stride[2];
  const int dh = kFixed ? 1 : p.dilation[1], dw = kFixed ? 1 : p.dilation[2];
  const int64_t H = p.in_size[1], W = p.in_size[2], OH = p.out_size[1], OW = p.out_size[2];
  const int64_t oh0 = int64_t(blockIdx.y) * t.th, ow0 = int64_t(blockIdx.x) * t.tw;
  const int64_t ih0 = oh0 * sh - p.pad[1], iw0 = ow0 * sw - p.pad[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kWarps = kPoolTileThreads / 32;
  for (int64_t pl = blockIdx.z; pl < p.planes; pl += gridDim.z) {
    const Tin* base = p.in + pl * p.in_stride[0];
    // stage: the window's elements in order, thread k taking k, k + 256, ..., their (row, column)
    // kept as counters; kPoolStageLoads loads in flight a thread before their shared stores (one
    // at a time, the staging could not cover the memory's latency: 1.0 TB/s on 1:42)
    {
      int r = threadIdx.x / t.iw, c = threadIdx.x % t.iw;
      const int dr = kPoolTileThreads / t.iw, dc = kPoolTileThreads % t.iw;
      for (int e0 = threadIdx.x; e0 < t.ih * t.iw; e0 += kPoolStageLoads * kPoolTileThreads) {
        float v[kPoolStageLoads];
        int at[kPoolStageLoads];
#pragma unroll
        for (int u = 0; u < kPoolStageLoads; ++u) {
          at[u] = r < t.ih ? r * t.iw + c : -1;
          const int64_t ih = ih0 + r, iw = iw0 + c;
          v[u] = r < t.ih && ih >= 0 && ih < H && iw >= 0 && iw < W
                     ? pro(to_float(base[ih * p.in_stride[2] + iw * p.in_stride[3]]))
                     : kInit;
          r += dr;
          c += dc;
          if (c >= t.iw) c -= t.iw, ++r;
        }
#pragma unroll
        for (int u = 0; u < kPoolStageLoads; ++u)
          if (at[u] >= 0) in_s[at[u]] = v[u];
      }
    }
    __syncthreads();
    // each staged row across the window's columns, for every output column of the tile
    for (int r = warp; r < t.ih; r += kWarps)
      for (int c = lane; c < t.tw; c += 32) {
        const float* src = in_s + r * t.iw + c * sw;
        float v = kInit;
#pragma unroll 4
        for (int j = 0; j < kw; ++j) v = pool_merge<MODE>(v, src[j * dw]);
        row_s[r * t.tw + c] = v;
      }
    __syncthreads();
    // those results down the window's rows, lanes along the output's columns
    for (int r = warp; r < t.th; r += kWarps) {
      const int64_t oh = oh0 + r;
      if (oh >= OH) break;
      for (int c = lane; c < t.tw; c += 32) {
        const int64_t ow = ow0 + c;
        if (ow >= OW) break;
        const float* src = row_s + r * sh * t.tw + c;
        float v = kInit;
#pragma unroll 4
        for (int i = 0; i < kh; ++i) v = pool_merge<MODE>(v, src[i * dh * t.tw]);
        if constexpr (MODE == PoolMode::Avg) {
          const PoolWindow wh = pool_window(p, 1, oh), ww = pool_window(p, 2, ow);
          const int64_t div = p.divisor > 0 ? p.divisor
                              : p.count_include_pad ? wh.padded * ww.padded : pool_taps(wh) * pool_taps(ww);
          v = v / float(div);
        }
        p.out[pl * p.out_stride[0] + oh * p.out_stride[2] + ow * p.out_stride[3]] = from_float<Tout>(epi(v));
      }
    }
    __syncthreads();
  }
}

// I: the index type of the output walk (int32_t when the output has fewer than 2^31 elements:
// 64-bit division is what such a kernel would otherwise spend its time on).
template <PoolMode MODE, class I, int VEC, class Tin, class Tout, class Pro, class Epi>
__global__ void __launch_bounds__(256) pool_cl_kernel(PoolClParams<Tin, Tout> p, I total, Pro pro, Epi epi) {
  const I grid = I(gridDim.x) * I(blockDim.x);
  const I packs = I(p.channels / VEC), ow_n = I(p.out_size[2]), oh_n = I(p.out_size[1]), od_n = I(p.out_size[0]);
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < total; idx += grid) {
    I t = idx;
    const I c = (t % packs) * I(VEC);
    t /= packs;
    const I ow = t % ow_n;
    t /= ow_n;
    const I oh = t % oh_n;
    t /= oh_n;
    const I od = t % od_n;
    const I n = t / od_n;
    const PoolWindow wd = pool_window(p, 0, od), wh = pool_window(p, 1, oh), ww = pool_window(p, 2, ow);
    const Tin* base = p.in + int64_t(n) * p.in_stride[0] + int64_t(c) * p.in_stride[1];
    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = MODE == PoolMode::Max ? -CUDART_INF_F : 0.f;
    int count = 0;
    for (int64_t d = wd.lo; d < wd.hi; d += wd.step) {
      for (int64_t h = wh.lo; h < wh.hi; h += wh.step) {
        const Tin* row = base + d * p.in_stride[2] + h * p.in_stride[3];
        for (int64_t w = ww.lo; w < ww.hi; w += ww.step) {
          if constexpr (VEC == 1) {
            acc[0] = pool_merge<MODE>(acc[0], pro(to_float(row[w * p.in_stride[4]])));
          } else {
            const Pack<Tin, VEC> v = load_pack<Tin, VEC>(row + w * p.in_stride[4]);
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] = pool_merge<MODE>(acc[e], pro(to_float(v.v[e])));
          }
          ++count;
        }
      }
    }
    float div = 1.f;
    if constexpr (MODE == PoolMode::Avg)
      div = float(p.divisor > 0 ? p.divisor
                  : (p.count_include_pad && !p.adaptive) ? wd.padded * wh.padded * ww.padded
                                                         : int64_t(count));
    Tout* o = p.out + int64_t(n) * p.out_stride[0] + int64_t(c) * p.out_stride[1] + int64_t(od) * p.out_stride[2] +
              int64_t(oh) * p.out_stride[3] + int64_t(ow) * p.out_stride[4];
    if constexpr (VEC == 1) {
      o[0] = from_float<Tout>(epi(MODE == PoolMode::Avg ? acc[0] / div : acc[0]));
    } else {
      Pack<Tout, VEC> r;
#pragma unroll
      for (int e = 0; e < VEC; ++e) r.v[e] = from_float<Tout>(epi(MODE == PoolMode::Avg ? acc[e] / div : acc[e]));
      store_pack<Tout, VEC>(o, r);
    }
  }
}

// Whether the channels-last walk may take VEC channels a thread: unit channel stride in and out,
// the channel count and every other stride multiples of VEC, both pointers aligned to the packs.
template <int VEC, class Tin, class Tout>
inline bool pool_cl_vec_ok(const PoolClParams<Tin, Tout>& p) {
  if (p.in_stride[1] != 1 || p.out_stride[1] != 1 || p.channels % VEC != 0) return false;
  for (int d = 0; d < 5; ++d)
    if (d != 1 && (p.in_stride[d] % VEC != 0 || p.out_stride[d] % VEC != 0)) return false;
  return aligned_to(p.in, pack_align<Tin, VEC>()) && aligned_to(p.out, pack_align<Tout, VEC>());
}

template <class P>
inline bool pool_args_ok(const P& p) {
  for (int j = 0; j < 3; ++j)
    if (p.in_size[j] < 1 || p.out_size[j] < 0 || (!p.adaptive && (p.kernel[j] < 1 || p.stride[j] < 1 ||
                                                                    p.dilation[j] < 1)))
      return false;
  return true;
}

}  // namespace detail

template <PoolMode MODE, class Tin, class Tout, class Pro = Identity, class Epi = Identity>
cudaError_t launch_pool_channels_last(const PoolClParams<Tin, Tout>& p, cudaStream_t stream, const Pro& pro = Pro{},
                                      const Epi& epi = Epi{}) {
  if (!p.in || !p.out || !detail::pool_args_ok(p)) return cudaErrorInvalidValue;
  const bool vec = detail::pool_cl_vec_ok<4>(p);
  const int64_t total = p.batch * (vec ? p.channels / 4 : p.channels) * p.out_size[0] * p.out_size[1] * p.out_size[2];
  if (total <= 0) return cudaSuccess;
  const int64_t want = ceil_div<int64_t>(total, 256);
  const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
  if (vec && total <= INT_MAX)
    detail::pool_cl_kernel<MODE, int32_t, 4, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, int32_t(total), pro, epi);
  else if (vec)
    detail::pool_cl_kernel<MODE, int64_t, 4, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, total, pro, epi);
  else if (total <= INT_MAX)
    detail::pool_cl_kernel<MODE, int32_t, 1, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, int32_t(total), pro, epi);
  else
    detail::pool_cl_kernel<MODE, int64_t, 1, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, total, pro, epi);
  return cudaGetLastError();
}

// KH, KW, SH, SW (all > 0, or all 0): a 1-d / 2-d window of dilation 1 whose rows, columns and
// strides are these, compiled into the tiled path (p must say the same).
template <PoolMode MODE, int KH = 0, int KW = 0, int SH = 0, int SW = 0, class Tin, class Tout, class Pro = Identity,
          class Epi = Identity>
cudaError_t launch_pool(const PoolParams<Tin, Tout>& p, cudaStream_t stream, const Pro& pro = Pro{},
                        const Epi& epi = Epi{}) {
  static_assert((KH > 0) == (KW > 0) && (KH > 0) == (SH > 0) && (KH > 0) == (SW > 0), "a fixed window names all four");
  if (!p.in || !p.out || !detail::pool_args_ok(p)) return cudaErrorInvalidValue;
  if (KH > 0 && (p.adaptive || p.kernel[0] != 1 || p.kernel[1] != KH || p.kernel[2] != KW || p.stride[1] != SH ||
                 p.stride[2] != SW || p.dilation[1] != 1 || p.dilation[2] != 1))
    return cudaErrorInvalidValue;
  if (p.planes * p.out_size[0] * p.out_size[1] * p.out_size[2] <= 0) return cudaSuccess;
  if (!p.adaptive && p.in_size[0] == 1 && p.out_size[0] == 1 && p.kernel[0] == 1) {
    const detail::PoolTileShape t = detail::pool_tile_shape(p);
    const int64_t tiles_w = ceil_div<int64_t>(p.out_size[2], t.tw > 0 ? t.tw : 1);
    const int64_t tiles_h = ceil_div<int64_t>(p.out_size[1], t.th > 0 ? t.th : 1);
    if (t.tw > 0 && tiles_w < (int64_t(1) << 31) && tiles_h < 65536) {
      const size_t smem = size_t(t.ih) * (t.iw + t.tw) * sizeof(float);  // at most 48 KB
      const dim3 grid(unsigned(tiles_w), unsigned(tiles_h), unsigned(p.planes < 65535 ? p.planes : 65535));
      detail::pool_tile_kernel<MODE, KH, KW, SH, SW, Tin, Tout, Pro, Epi>
          <<<grid, detail::kPoolTileThreads, smem, stream>>>(p, t, pro, epi);
      return cudaGetLastError();
    }
  }
  const int64_t rows = p.adaptive ? p.out_size[1] : ceil_div<int64_t>(p.out_size[1], detail::kPoolRows);
  const int64_t total = p.planes * p.out_size[0] * rows * p.out_size[2];
  const int64_t want = ceil_div<int64_t>(total, 256);
  const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
  if (p.adaptive && total <= INT_MAX)
    detail::pool_kernel<MODE, int32_t, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, int32_t(total), pro, epi);
  else if (p.adaptive)
    detail::pool_kernel<MODE, int64_t, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, total, pro, epi);
  else if (total <= INT_MAX)
    detail::pool_rows_kernel<MODE, int32_t, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, int32_t(total), pro, epi);
  else
    detail::pool_rows_kernel<MODE, int64_t, Tin, Tout, Pro, Epi><<<blocks, 256, 0, stream>>>(p, total, pro, epi);
  return cudaGetLastError();
}

}  // namespace stitch
