// depthwise.cuh — depthwise 2-d convolution (one filter per channel: groups = in = out channels),
// with a per-channel bias and an activation, in either layout.
//
// launch_depthwise<Tin, Tout, Act>(DepthwiseParams<Tin, Tout>, stream, act)
//   Tin / Tout storage (float, __half, __nv_bfloat16); Act a `float(float)` functor applied last.
// Contract
//   - x is [batch, channels, h, w] and out [batch, channels, oh, ow], each with its own element
//     strides (any layout; the two need not match); w is [channels, kh, kw] dense (PyTorch's
//     [channels, 1, kh, kw]), in Tin — or tap-major, [kh, kw, channels], when w_tap_stride (=
//     channels) is set: consecutive channels' taps side by side; bias (may be null) [channels] in Tin.
//   - out[n, c, i, j] = act(bias[c] + sum over taps (a, b) inside the input of
//       x[n, c, i * stride_h - pad_h + a * dil_h, j * stride_w - pad_w + b * dil_w] * w[c, a, b]),
//     taps outside the input count as zero (PyTorch's zero padding); math in fp32.
//   - When out's channel stride is 1 (channels-last): one thread per output element, consecutive
//     threads on consecutive channels. Otherwise (kw <= kDwMaxKw): one thread per kDwRows
//     consecutive output rows of one column, consecutive threads on consecutive columns, walking
//     the input rows those outputs cover once each (a row's kw taps loaded once, then multiplied
//     into every output whose window holds it: a stride-1 3x3 filter loads 4.5 taps an output,
//     not 9); wider filters, one thread per output. Either way the loads of a tap and the stores
//     are coalesced across a warp. The weights, a few hundred bytes per channel, are read
//     through L1.
//   - Square 3x3, 5x5 and 7x7 filters with out not channels-last take a tiled path first when the
//     input under a 64 x 32 tile of outputs fits shared memory and the output plane fills at least
//     half a tile (smaller planes take the rows path): a block stages it once (zeros
//     as padding), holds its channel's filter in registers (the filter's size a compile-time
//     constant, so every tap unrolls), and each thread computes eight rows of one column from
//     shared memory: one global load an input element (plus the tile's halo) where the rows path
//     made 4.5 input and 9 filter loads an output through L1.
// Depthwise convolutions move far more bytes than they compute (k*k multiply-adds per element):
// this kernel aims at the bandwidth floor, where cuDNN's engines convert layouts or run an
// implicit GEMM with one useful channel per group.
#pragma once

#include <climits>

#include "stitch/common.cuh"

namespace stitch {

template <class Tin, class Tout>
struct DepthwiseParams {
  const Tin* x;
  const Tin* w;
  const Tin* bias;
  Tout* out;
  int64_t batch, channels, h, w_in, oh, ow;
  int64_t x_stride[4];    // batch, channel, row, column
  int64_t out_stride[4];
  int kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int64_t w_tap_stride;  // 0: w is [channels, kh, kw]; channels: [kh, kw, channels] (tap-major)
};

namespace detail {
// A channel's filter and the step between its taps, in either layout of w.
template <class Tin, class Tout>
__device__ __forceinline__ const Tin* filter(const DepthwiseParams<Tin, Tout>& p, int64_t c, int64_t& step) {
  step = p.w_tap_stride ? p.w_tap_stride : 1;
  return p.w + (p.w_tap_stride ? c : c * p.kh * p.kw);
}
}  // namespace detail

namespace detail {

// I: the index type of the output walk (int32_t when the output has fewer than 2^31 elements).
template <bool CHANNELS_FAST, class I, class Tin, class Tout, class Act>
__global__ void __launch_bounds__(256) depthwise_kernel(DepthwiseParams<Tin, Tout> p, I total, Act act) {
  const I grid = I(gridDim.x) * I(blockDim.x);
  const I channels = I(p.channels), oh_n = I(p.oh), ow_n = I(p.ow);
  const int h = int(p.h), w_in = int(p.w_in);
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < total; idx += grid) {
    I t = idx, n, c, i, j;
    if constexpr (CHANNELS_FAST) {
      c = t % channels;
      t /= channels;
      j = t % ow_n;
      t /= ow_n;
      i = t % oh_n;
      n = t / oh_n;
    } else {
      j = t % ow_n;
      t /= ow_n;
      i = t % oh_n;
      t /= oh_n;
      c = t % channels;
      n = t / channels;
    }
    const Tin* xc = p.x + int64_t(n) * p.x_stride[0] + int64_t(c) * p.x_stride[1];
    int64_t ts;
    const Tin* wc = filter(p, int64_t(c), ts);
    float acc = p.bias ? to_float(p.bias[c]) : 0.f;
    const int r0 = int(i) * p.stride_h - p.pad_h, c0 = int(j) * p.stride_w - p.pad_w;
    for (int a = 0; a < p.kh; ++a) {
      const int r = r0 + a * p.dil_h;
      if (r < 0 || r >= h) continue;
      const Tin* row = xc + int64_t(r) * p.x_stride[2];
      for (int b = 0; b < p.kw; ++b) {
        const int col = c0 + b * p.dil_w;
        if (col < 0 || col >= w_in) continue;
        acc = fmaf(to_float(row[int64_t(col) * p.x_stride[3]]), to_float(__ldg(wc + (a * p.kw + b) * ts)), acc);
      }
    }
    p.out[int64_t(n) * p.out_stride[0] + int64_t(c) * p.out_stride[1] + int64_t(i) * p.out_stride[2] +
          int64_t(j) * p.out_stride[3]] = from_float<Tout>(act(acc));
  }
}

// Channels-last with a square K x K filter (3, 5, 7), channels and every x / out stride a multiple of 4,
// both 4-element aligned: each thread computes one vector of 4 consecutive channels for
// kDwNhwcCols consecutive output columns of one row, the filter in registers (see below). With
// stride S of 1 or 2 and no dilation the outputs slide along the row: each input column a tap row
// reads is loaded once for all of them ((kDwNhwcCols - 1) * S + K vectors, not kDwNhwcCols * K: a
// 5x5 filter of stride 2 loads 11, not 20; S = 0 takes any stride and dilation). Every load and
// store is a vector, coalesced across a warp (consecutive threads on consecutive channel groups).
// The taps are summed in the order of depthwise_kernel (bias, then row by row), so the two agree
// bit for bit. (The one-element-a-thread kernel ran SegFormer's 3x3 convolutions at 7 % of the
// bandwidth.)
constexpr int kDwNhwcCols = 4;
// STITCH_DW_SLIDE2 0 (defined before this header) takes stride 2 on the any-stride form (S = 0):
// the form before the sliding window of stride 2, for measuring the two in one process.
#ifndef STITCH_DW_SLIDE2
#define STITCH_DW_SLIDE2 1
#endif
template <int K, int S, class Tin, class Tout, class Act>
__global__ void __launch_bounds__(256) depthwise_nhwc_kernel(DepthwiseParams<Tin, Tout> p, int64_t total, Act act) {
  constexpr int V = 4, JT = kDwNhwcCols, NC = S > 0 ? (JT - 1) * S + K : JT * K;
  const int64_t cg_n = p.channels / V, jt_n = ceil_div<int64_t>(p.ow, JT);
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += grid) {
    int64_t t = idx;
    const int64_t cg = t % cg_n;
    t /= cg_n;
    const int64_t jt = t % jt_n;
    t /= jt_n;
    const int64_t i = t % p.oh, n = t / p.oh, c = cg * V, j0 = jt * JT;
    // The filter's K * K vectors in registers (K <= 5); a 7x7 filter's 49 would not fit beside the
    // rest: its K vectors of a tap row are loaded with the row (through L1, shared by the 4 outputs).
    constexpr bool ALL = K <= 5;
    float wv[ALL ? K * K : K][V];
    auto load_w = [&](int k, float(&dst)[V]) {
      if (p.w_tap_stride) {
        const Pack<Tin, V> wk = load_pack<Tin, V>(p.w + k * p.w_tap_stride + c);
#pragma unroll
        for (int v = 0; v < V; ++v) dst[v] = to_float(wk.v[v]);
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) dst[v] = to_float(__ldg(p.w + (c + v) * K * K + k));
      }
    };
    if constexpr (ALL) {
#pragma unroll
      for (int k = 0; k < K * K; ++k) load_w(k, wv[k]);
    }
    float acc[JT][V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float b = p.bias ? to_float(p.bias[c + v]) : 0.f;
#pragma unroll
      for (int jj = 0; jj < JT; ++jj) acc[jj][v] = b;
    }
    const Tin* xb = p.x + n * p.x_stride[0] + c;
    const int64_t r0 = i * p.stride_h - p.pad_h, col0 = j0 * p.stride_w - p.pad_w;
#pragma unroll
    for (int a = 0; a < K; ++a) {
      const int64_t r = r0 + int64_t(a) * p.dil_h;
      if (r < 0 || r >= p.h) continue;
      const Tin* row = xb + r * p.x_stride[2];
      if constexpr (!ALL) {
#pragma unroll
        for (int b = 0; b < K; ++b) load_w(a * K + b, wv[b]);
      }
      float xin[NC][V];
#pragma unroll
      for (int q = 0; q < NC; ++q) {
        // S > 0: column col0 + q; otherwise output jj = q / K, tap b = q % K
        const int64_t col = S > 0 ? col0 + q : col0 + int64_t(q / K) * p.stride_w + int64_t(q % K) * p.dil_w;
        if (col >= 0 && col < p.w_in) {
          const Pack<Tin, V> xv = load_pack<Tin, V>(row + col * p.x_stride[3]);
#pragma unroll
          for (int v = 0; v < V; ++v) xin[q][v] = to_float(xv.v[v]);
        } else {
#pragma unroll
          for (int v = 0; v < V; ++v) xin[q][v] = 0.f;  // zero padding: adds nothing, as a skipped tap
        }
      }
#pragma unroll
      for (int b = 0; b < K; ++b)
#pragma unroll
        for (int jj = 0; jj < JT; ++jj)
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const int q = S > 0 ? jj * S + b : jj * K + b;
            acc[jj][v] = fmaf(xin[q][v], wv[ALL ? a * K + b : b][v], acc[jj][v]);
          }
    }
    Tout* ob = p.out + n * p.out_stride[0] + i * p.out_stride[2] + c;
#pragma unroll
    for (int jj = 0; jj < JT; ++jj) {
      if (j0 + jj >= p.ow) break;
      Pack<Tout, V> y;
#pragma unroll
      for (int v = 0; v < V; ++v) y.v[v] = from_float<Tout>(act(acc[jj][v]));
      store_pack<Tout, V>(ob + (j0 + jj) * p.out_stride[3], y);
    }
  }
}

// Whether depthwise_nhwc_kernel takes p: channels-last x and out, channels and strides whole
// vectors, vector-aligned addresses (the filter's too when tap-major).
template <class Tin, class Tout>
bool depthwise_nhwc_ok(const DepthwiseParams<Tin, Tout>& p) {
  auto aligned = [](const void* q, size_t bytes) { return reinterpret_cast<uintptr_t>(q) % bytes == 0; };
  bool ok = p.x_stride[1] == 1 && p.out_stride[1] == 1 && p.channels % 4 == 0 && aligned(p.x, 4 * sizeof(Tin)) &&
            aligned(p.out, 4 * sizeof(Tout)) && (!p.w_tap_stride || (p.w_tap_stride % 4 == 0 && aligned(p.w, 4 * sizeof(Tin))));
  for (int d : {0, 2, 3}) ok = ok && p.x_stride[d] % 4 == 0 && p.out_stride[d] % 4 == 0;
  return ok;
}

constexpr int kDwRows = 4;
constexpr int kDwMaxKw = 8;

// Channels-first: kDwRows output rows of one column per thread (kw <= kDwMaxKw); I as above.
template <class I, class Tin, class Tout, class Act>
__global__ void __launch_bounds__(256) depthwise_rows_kernel(DepthwiseParams<Tin, Tout> p, I total, Act act) {
  constexpr int R = kDwRows;
  const I grid = I(gridDim.x) * I(blockDim.x);
  const I channels = I(p.channels), ohb_n = I((p.oh + R - 1) / R), ow_n = I(p.ow);
  const int h = int(p.h), w_in = int(p.w_in), oh = int(p.oh), kw = p.kw, sh = p.stride_h, dh = p.dil_h;
  const int reach = (p.kh - 1) * dh;
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < total; idx += grid) {
    I t = idx;
    const I j = t % ow_n;
    t /= ow_n;
    const int i0 = int(t % ohb_n) * R;
    t /= ohb_n;
    const I c = t % channels;
    const I n = t / channels;
    const Tin* xc = p.x + int64_t(n) * p.x_stride[0] + int64_t(c) * p.x_stride[1];
    int64_t ts;
    const Tin* wc = filter(p, int64_t(c), ts);
    const float b0 = p.bias ? to_float(p.bias[c]) : 0.f;
    float acc[R];
#pragma unroll
    for (int q = 0; q < R; ++q) acc[q] = b0;
    const int c0 = int(j) * p.stride_w - p.pad_w;
    const int first = i0 * sh - p.pad_h;
    const int r_lo = first < 0 ? 0 : first;
    const int last = first + (R - 1) * sh + reach;
    const int r_hi = last < h - 1 ? last : h - 1;
    for (int r = r_lo; r <= r_hi; ++r) {
      const Tin* row = xc + int64_t(r) * p.x_stride[2];
      float xv[kDwMaxKw];
      unsigned inside = 0;  // taps of the row inside the input (the others are skipped, as zeros)
#pragma unroll
      for (int b = 0; b < kDwMaxKw; ++b) {
        const int col = c0 + b * p.dil_w;
        const bool in = b < kw && col >= 0 && col < w_in;
        xv[b] = in ? to_float(row[int64_t(col) * p.x_stride[3]]) : 0.f;
        inside |= unsigned(in) << b;
      }
#pragma unroll
      for (int q = 0; q < R; ++q) {
        const int tap = r - (first + q * sh);
        if (i0 + q >= oh || tap < 0 || tap > reach || (dh != 1 && tap % dh != 0)) continue;
        const Tin* wr = wc + (dh == 1 ? tap : tap / dh) * kw * ts;
#pragma unroll
        for (int b = 0; b < kDwMaxKw; ++b)
          if (inside >> b & 1u) acc[q] = fmaf(xv[b], to_float(__ldg(wr + b * ts)), acc[q]);
      }
    }
    Tout* out = p.out + int64_t(n) * p.out_stride[0] + int64_t(c) * p.out_stride[1] + int64_t(j) * p.out_stride[3];
#pragma unroll
    for (int q = 0; q < R; ++q)
      if (i0 + q < oh) out[int64_t(i0 + q) * p.out_stride[2]] = from_float<Tout>(act(acc[q]));
  }
}

// ---- tiled path: square 3x3 / 5x5 / 7x7 filters, outputs not channels-last ---------------------

constexpr int kDwTileW = 64, kDwTileH = 32, kDwTileRows = 8;  // 256 threads: 64 columns x 4 x 8 rows
constexpr int kDwTileSmemFloats = 12 * 1024;                    // 48 KB

template <int K>
inline bool depthwise_tile_fits(int64_t sh, int64_t sw, int64_t dh, int64_t dw, int& ih, int& iw) {
  const int64_t h = (kDwTileH - 1) * sh + (K - 1) * dh + 1, w = (kDwTileW - 1) * sw + (K - 1) * dw + 1;
  ih = int(h), iw = int(w);
  return h * w <= kDwTileSmemFloats;
}

// grid: x tiles along the output's columns, y along its rows, z planes (batch x channels,
// grid-stride). Thread: column tid % 64, rows (tid / 64) * 8 .. + 7 of the tile.
template <int K, class Tin, class Tout, class Act>
__global__ void __launch_bounds__(256) depthwise_tile_kernel(DepthwiseParams<Tin, Tout> p, int ih_n, int iw_n,
                                                             Act act) {
  extern __shared__ float xs[];
  const int sh = p.stride_h, sw = p.stride_w, dh = p.dil_h, dw = p.dil_w;
  const int64_t oi0 = int64_t(blockIdx.y) * kDwTileH, oj0 = int64_t(blockIdx.x) * kDwTileW;
  const int64_t r0 = oi0 * sh - p.pad_h, c0 = oj0 * sw - p.pad_w;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = threadIdx.x % kDwTileW, row0 = (threadIdx.x / kDwTileW) * kDwTileRows;
  for (int64_t plane = blockIdx.z; plane < p.batch * p.channels; plane += gridDim.z) {
    const int64_t n = plane / p.channels, c = plane - n * p.channels;
    const Tin* xc = p.x + n * p.x_stride[0] + c * p.x_stride[1];
    for (int r = warp; r < ih_n; r += 8) {  // stage: a warp a row, lanes along its columns
      const int64_t gr = r0 + r;
      const bool row_in = gr >= 0 && gr < p.h;
      for (int q = lane; q < iw_n; q += 32) {
        const int64_t gc = c0 + q;
        xs[r * iw_n + q] = row_in && gc >= 0 && gc < p.w_in ? to_float(xc[gr * p.x_stride[2] + gc * p.x_stride[3]]) : 0.f;
      }
    }
    float wk[K * K];
    {  // 32-bit tap steps: a 64-bit one cost this kernel 8 registers and a sixth of its occupancy
      const int ts = p.w_tap_stride ? int(p.w_tap_stride) : 1;
      const Tin* wc = p.w + (p.w_tap_stride ? c : c * K * K);
#pragma unroll
      for (int t = 0; t < K * K; ++t) wk[t] = to_float(__ldg(wc + t * ts));
    }
    const float b0 = p.bias ? to_float(p.bias[c]) : 0.f;
    __syncthreads();
    const int64_t oj = oj0 + col;
    if (oj < p.ow) {
      Tout* out = p.out + n * p.out_stride[0] + c * p.out_stride[1] + oj * p.out_stride[3];
#pragma unroll 1
      for (int q = 0; q < kDwTileRows; ++q) {
        const int64_t oi = oi0 + row0 + q;
        if (oi < p.oh) {
          const float* base = xs + (row0 + q) * sh * iw_n + col * sw;
          float acc = b0;
#pragma unroll
          for (int a = 0; a < K; ++a)
#pragma unroll
            for (int b = 0; b < K; ++b) acc = fmaf(base[a * dh * iw_n + b * dw], wk[a * K + b], acc);
          out[oi * p.out_stride[2]] = from_float<Tout>(act(acc));
        }
      }
    }
    __syncthreads();
  }
}

// The tiled path where its threads have work: a plane of outputs that fills at least half a tile
// (smaller planes take the rows path, whose threads each own outputs wherever the plane ends). The
// input staged is what the plane's outputs need, not a whole tile's: a 7 x 7 plane staged its
// 65 x 129 tile window (33 KB of mostly zeros a block) and ran at 2 % of the bandwidth.
template <int K, class Tin, class Tout, class Act>
inline bool depthwise_tiled(const DepthwiseParams<Tin, Tout>& p, cudaStream_t stream, const Act& act) {
  int ih = 0, iw = 0;
  if (!depthwise_tile_fits<K>(p.stride_h, p.stride_w, p.dil_h, p.dil_w, ih, iw)) return false;
  const int64_t th = p.oh < kDwTileH ? p.oh : kDwTileH, tw = p.ow < kDwTileW ? p.ow : kDwTileW;
  if (2 * th * tw < int64_t(kDwTileH) * kDwTileW) return false;
  ih = int((th - 1) * p.stride_h + (K - 1) * p.dil_h + 1);
  iw = int((tw - 1) * p.stride_w + (K - 1) * p.dil_w + 1);
  const int64_t tx = ceil_div<int64_t>(p.ow, kDwTileW), ty = ceil_div<int64_t>(p.oh, kDwTileH);
  if (tx >= (int64_t(1) << 31) || ty >= 65536) return false;
  const int64_t planes = p.batch * p.channels;
  const dim3 grid(unsigned(tx), unsigned(ty), unsigned(planes < 65535 ? planes : 65535));
  depthwise_tile_kernel<K><<<grid, 256, size_t(ih) * iw * sizeof(float), stream>>>(p, ih, iw, act);
  return true;
}

}  // namespace detail

// FAST and SQ: what the caller knows when it compiles the call, so that only the kernels that can
// run are instantiated (nine a call otherwise: a net of seventeen depthwise convolutions spent most
// of its two and a half minutes of nvcc on them). FAST: 1 when out's channel stride is 1 and there
// are several channels, 0 when not, -1 decided from p at run time. SQ: the square filter size
// (3, 5, 7) of the tiled path (channels-first) or of the vector path (channels-last), 0 when it
// cannot apply, -1 any. A hint changes which kernel runs,
// never what it computes (every path reads and writes through the strides).
template <int FAST = -1, int SQ = -1, class Tin, class Tout, class Act = Identity>
cudaError_t launch_depthwise(const DepthwiseParams<Tin, Tout>& p, cudaStream_t stream, const Act& act = Act{}) {
  if (!p.x || !p.w || !p.out || p.kh < 1 || p.kw < 1 || p.stride_h < 1 || p.stride_w < 1 || p.dil_h < 1 ||
      p.dil_w < 1 || p.pad_h < 0 || p.pad_w < 0)
    return cudaErrorInvalidValue;
  const int64_t total = p.batch * p.channels * p.oh * p.ow;
  if (total <= 0) return cudaSuccess;
  const int64_t want = ceil_div<int64_t>(total, 256);
  const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
  const bool fast_channels = FAST >= 0 ? FAST == 1 : p.out_stride[1] == 1 && p.channels > 1;
  const bool small = total <= INT_MAX && p.h <= INT_MAX / 2 && p.w_in <= INT_MAX / 2;
  if constexpr (FAST != 1 && SQ != 0) {
    if (!fast_channels && p.kh == p.kw && (p.kh == 3 || p.kh == 5 || p.kh == 7)) {
      bool tiled = false;
      if constexpr (SQ == 3 || SQ < 0) tiled = tiled || (p.kh == 3 && detail::depthwise_tiled<3>(p, stream, act));
      if constexpr (SQ == 5 || SQ < 0) tiled = tiled || (p.kh == 5 && detail::depthwise_tiled<5>(p, stream, act));
      if constexpr (SQ == 7 || SQ < 0) tiled = tiled || (p.kh == 7 && detail::depthwise_tiled<7>(p, stream, act));
      if (tiled) return cudaGetLastError();
    }
  }
  if constexpr (FAST != 1) {
    if (!fast_channels && p.kw <= detail::kDwMaxKw) {
      const int64_t work = p.batch * p.channels * ceil_div<int64_t>(p.oh, detail::kDwRows) * p.ow;
      const int64_t w2 = ceil_div<int64_t>(work, 256);
      const unsigned b2 = unsigned(w2 < (int64_t(1) << 20) ? w2 : (int64_t(1) << 20));
      if (small)
        detail::depthwise_rows_kernel<int32_t><<<b2, 256, 0, stream>>>(p, int32_t(work), act);
      else
        detail::depthwise_rows_kernel<int64_t><<<b2, 256, 0, stream>>>(p, work, act);
      return cudaGetLastError();
    }
  }
  if (fast_channels) {
    if constexpr (FAST != 0 && SQ != 0) {
      if (p.kh == p.kw && (p.kh == 3 || p.kh == 5 || p.kh == 7) && detail::depthwise_nhwc_ok(p)) {
        // the sliding window's stride as a constant (1 or 2, no dilation), else 0: any
        const int slide = p.dil_w == 1 && (p.stride_w == 1 || (STITCH_DW_SLIDE2 && p.stride_w == 2)) ? p.stride_w : 0;
        const int64_t work = p.batch * p.oh * ceil_div<int64_t>(p.ow, detail::kDwNhwcCols) * (p.channels / 4);
        const int64_t w3 = ceil_div<int64_t>(work, 256);
        const unsigned b3 = unsigned(w3 < (int64_t(1) << 20) ? w3 : (int64_t(1) << 20));
        if constexpr (SQ == 3 || SQ < 0)
          if (p.kh == 3) {
            if (slide == 1) detail::depthwise_nhwc_kernel<3, 1><<<b3, 256, 0, stream>>>(p, work, act);
            else if (slide == 2) detail::depthwise_nhwc_kernel<3, 2><<<b3, 256, 0, stream>>>(p, work, act);
            else detail::depthwise_nhwc_kernel<3, 0><<<b3, 256, 0, stream>>>(p, work, act);
            return cudaGetLastError();
          }
        if constexpr (SQ == 5 || SQ < 0)
          if (p.kh == 5) {
            if (slide == 1) detail::depthwise_nhwc_kernel<5, 1><<<b3, 256, 0, stream>>>(p, work, act);
            else if (slide == 2) detail::depthwise_nhwc_kernel<5, 2><<<b3, 256, 0, stream>>>(p, work, act);
            else detail::depthwise_nhwc_kernel<5, 0><<<b3, 256, 0, stream>>>(p, work, act);
            return cudaGetLastError();
          }
        if constexpr (SQ == 7 || SQ < 0)
          if (p.kh == 7) {
            if (slide == 1) detail::depthwise_nhwc_kernel<7, 1><<<b3, 256, 0, stream>>>(p, work, act);
            else if (slide == 2) detail::depthwise_nhwc_kernel<7, 2><<<b3, 256, 0, stream>>>(p, work, act);
            else detail::depthwise_nhwc_kernel<7, 0><<<b3, 256, 0, stream>>>(p, work, act);
            return cudaGetLastError();
          }
      }
    }
    if constexpr (FAST != 0) {
      if (small)
        detail::depthwise_kernel<true, int32_t><<<blocks, 256, 0, stream>>>(p, int32_t(total), act);
      else
        detail::depthwise_kernel<true, int64_t><<<blocks, 256, 0, stream>>>(p, total, act);
    }
  } else if constexpr (FAST != 1) {
    if (small)
      detail::depthwise_kernel<false, int32_t><<<blocks, 256, 0, stream>>>(p, int32_t(total), act);
    else
      detail::depthwise_kernel<false, int64_t><<<blocks, 256, 0, stream>>>(p, total, act);
  }
  return cudaGetLastError();
}

}  // namespace stitch
