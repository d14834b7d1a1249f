// narrow_conv.cuh — dense 2-d convolutions over few input channels (a short sum: in_channels x
// the filter's taps), on tensor cores, reading and writing either layout, with an epilogue hook.
//
// launch_narrow_conv<SPLIT, NT>(NarrowConvParams, stream, epi)
//   SPLIT: false, one TF32 product per multiply (the operands rounded to TF32, as cuDNN's TF32
//          engines do); true, split TF32 (mma.cuh: three products, about fp32's accuracy).
//   NT:    8-channel n-tiles a warp holds (1, 2 or 4): a block computes 16 NT output channels at a
//          time, all of them when out_channels <= 16 NT, else a chunk of them per pass.
//   epi:   a `float(float)` functor applied to bias + the sum before the store.
// Contract
//   - x is [batch, in_channels, h, w] and out [batch, out_channels, oh, ow], each with its own
//     element strides (any layout; the two need not match); w is [out_channels, in_channels, kh,
//     kw] dense (PyTorch's layout); bias (may be null) [out_channels]. All fp32.
//   - out[n, o, i, j] = epi(bias[o] + sum over (c, a, b) with the tap inside the input of
//       x[n, c, i * stride_h - pad_h + a * dil_h, j * stride_w - pad_w + b * dil_w] * w[o, c, a, b])
//     (PyTorch's zero padding), each product at TF32 (or split TF32), summed in fp32.
//   - in_channels * kh * kw <= kNcMaxK, and the input under one tile of outputs, in_channels x
//     ((kNcTileH - 1) stride_h + (kh - 1) dil_h + 1) x ((kNcTileW - 1) stride_w + (kw - 1) dil_w + 1),
//     at most kNcMaxStage values (narrow_conv_fits); else cudaErrorInvalidValue.
// Why: such a convolution does few multiply-adds per byte it writes (72 for 8 channels of 3x3
// taps): it is bound by its output's bytes, yet cuDNN's implicit GEMMs ran one (128 x 8 x 128 x 128
// -> 64 channels, 3x3) at 2.5x that floor on an H100 and need channels-last data (a copy of the
// input before, a layout change after). Here a block stages the input under a tile of 8 x 16
// outputs once (rounded to TF32 as it lands in shared memory), holds the filters of its channels in
// shared memory for every tile it takes, and each warp multiplies two rows of 16 outputs by NT
// 8-channel tiles with mma.sync; the hook runs on the accumulators and each store writes whole
// 32-byte sectors (8 consecutive columns of a channel channels-first, two channels of a position
// channels-last).
#pragma once

#include "stitch/common.cuh"
#include "stitch/mma.cuh"

namespace stitch {

struct NarrowConvParams {
  const float* x;
  const float* w;
  const float* bias;
  float* out;
  int64_t batch, in_channels, h, w_in, out_channels, oh, ow;
  int64_t x_stride[4];    // batch, channel, row, column
  int64_t out_stride[4];
  int kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};

constexpr int kNcTileH = 8, kNcTileW = 16;  // outputs a tile: 8 rows of 16 columns (8 m-tiles)
constexpr int kNcThreads = 256;             // 8 warps: 4 along the rows (2 each) x 2 along the channels
constexpr int kNcMaxK = 160;                // in_channels x kh x kw
constexpr int kNcMaxStage = 6144;           // staged input values a tile (24 KB)

// The staged input's rows and columns under one tile of outputs.
inline int narrow_conv_in_rows(const NarrowConvParams& p) { return (kNcTileH - 1) * p.stride_h + (p.kh - 1) * p.dil_h + 1; }
inline int narrow_conv_in_cols(const NarrowConvParams& p) { return (kNcTileW - 1) * p.stride_w + (p.kw - 1) * p.dil_w + 1; }

// Whether launch_narrow_conv takes p's shape (the contract's bounds).
inline bool narrow_conv_fits(const NarrowConvParams& p) {
  return p.in_channels * p.kh * p.kw <= kNcMaxK &&
         p.in_channels * narrow_conv_in_rows(p) * narrow_conv_in_cols(p) <= kNcMaxStage;
}

namespace detail {

// Shared memory: the filters of 16 NT channels ([16 NT][ldw], ldw = kpad + 4: an odd multiple of 4,
// so the 32 lanes of a B-fragment load hit 32 banks; the small parts after them under SPLIT), the
// offset of each k in the staged input (-1 past the sum: a zero), then the staged input
// [in_channels][rows][cols].
template <bool SPLIT, int NT>
inline size_t narrow_conv_smem(int kpad, int staged) {
  return size_t(16 * NT) * (kpad + 4) * sizeof(float) * (SPLIT ? 2 : 1) + size_t(kpad) * sizeof(int) +
         size_t(staged) * sizeof(float);
}

// grid-stride over tiles ordered (channel chunk, batch, tile row, tile column), the chunk slowest, so
// that a block reloads its filters only when its chunk changes.
template <bool SPLIT, int NT, class Epi>
__global__ void __launch_bounds__(kNcThreads) narrow_conv_kernel(NarrowConvParams p, int ih_n, int iw_n, int kpad,
                                                                 int64_t tiles, Epi epi) {
  constexpr int NB = 16 * NT;
  extern __shared__ float smem[];
  const int ldw = kpad + 4, taps = p.kh * p.kw, K = int(p.in_channels) * taps, plane = ih_n * iw_n;
  const int cin = int(p.in_channels), staged = cin * plane;
  const bool cl = p.x_stride[1] == 1 && cin > 1;
  float* ws = smem;
  float* ws_lo = ws + NB * ldw;  // SPLIT only
  int* koff = reinterpret_cast<int*>(ws + (SPLIT ? 2 : 1) * NB * ldw);
  float* xs = reinterpret_cast<float*>(koff + kpad);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wm = warp % 4, wn = warp / 4;  // tile rows 2 wm, 2 wm + 1; n-tiles wn NT .. wn NT + NT - 1
  for (int k = tid; k < kpad; k += kNcThreads) {
    int off = -1;
    if (k < K) {
      const int c = k / taps, r = k - c * taps, a = r / p.kw, b = r - a * p.kw;
      off = c * plane + a * p.dil_h * iw_n + b * p.dil_w;
    }
    koff[k] = off;
  }
  // Each thread's two pixel rows x two columns (g, g + 8) of A, as offsets into a channel's plane.
  int base[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) base[i][hh] = (2 * wm + i) * p.stride_h * iw_n + (g + 8 * hh) * p.stride_w;
  const int64_t tx = ceil_div<int64_t>(p.ow, kNcTileW), ty = ceil_div<int64_t>(p.oh, kNcTileH);
  int64_t loaded = -1;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int64_t r = tile;
    const int64_t txi = r % tx;
    r /= tx;
    const int64_t tyi = r % ty;
    r /= ty;
    const int64_t n = r % p.batch, chunk = r / p.batch;
    __syncthreads();  // the last tile's reads of the staged input (and filters) are done
    if (chunk != loaded) {
      for (int i = tid; i < NB * kpad; i += kNcThreads) {
        const int j = i / kpad, k = i - j * kpad;
        const int64_t o = chunk * NB + j;
        const float v = o < p.out_channels && k < K ? __ldg(p.w + o * K + k) : 0.f;
        const float hi = tf32_round(v);
        ws[j * ldw + k] = hi;
        if constexpr (SPLIT) ws_lo[j * ldw + k] = tf32_round(v - hi);
      }
      loaded = chunk;
    }
    const int64_t oh0 = tyi * kNcTileH, ow0 = txi * kNcTileW;
    const int64_t r0 = oh0 * p.stride_h - p.pad_h, c0 = ow0 * p.stride_w - p.pad_w;
    const float* xn = p.x + n * p.x_stride[0];
    for (int i = tid; i < staged; i += kNcThreads) {
      // consecutive threads on consecutive addresses: along a row channels-first, along the
      // channels of a position channels-last
      int c, rr, cc;
      if (cl) {
        const int at = i / cin;
        c = i - at * cin, rr = at / iw_n, cc = at - rr * iw_n;
      } else {
        c = i / plane;
        const int rem = i - c * plane;
        rr = rem / iw_n, cc = rem - rr * iw_n;
      }
      const int64_t gr = r0 + rr, gc = c0 + cc;
      float v = 0.f;
      if (gr >= 0 && gr < p.h && gc >= 0 && gc < p.w_in) v = xn[c * p.x_stride[1] + gr * p.x_stride[2] + gc * p.x_stride[3]];
      xs[c * plane + rr * iw_n + cc] = SPLIT ? v : tf32_round(v);  // SPLIT splits as it loads the fragments
    }
    __syncthreads();

    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < NT; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][q][e] = 0.f;
    for (int k0 = 0; k0 < kpad; k0 += 8) {
      const int o0 = koff[k0 + t], o1 = koff[k0 + t + 4];
      uint32_t a[2][4], al[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float v[4];
        v[0] = o0 >= 0 ? xs[base[i][0] + o0] : 0.f;  // A(g, t)
        v[1] = o0 >= 0 ? xs[base[i][1] + o0] : 0.f;  // A(g + 8, t)
        v[2] = o1 >= 0 ? xs[base[i][0] + o1] : 0.f;  // A(g, t + 4)
        v[3] = o1 >= 0 ? xs[base[i][1] + o1] : 0.f;  // A(g + 8, t + 4)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (SPLIT) {
            const float hi = tf32_round(v[e]);
            a[i][e] = __float_as_uint(hi);
            al[i][e] = tf32_bits(v[e] - hi);
          } else {
            a[i][e] = __float_as_uint(v[e]);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < NT; ++q) {
        const int j = (wn * NT + q) * 8 + g;
        const uint32_t b0 = __float_as_uint(ws[j * ldw + k0 + t]), b1 = __float_as_uint(ws[j * ldw + k0 + t + 4]);
#pragma unroll
        for (int i = 0; i < 2; ++i) mma_1688_tf32(acc[i][q], a[i], b0, b1);
        if constexpr (SPLIT) {
          const uint32_t l0 = __float_as_uint(ws_lo[j * ldw + k0 + t]), l1 = __float_as_uint(ws_lo[j * ldw + k0 + t + 4]);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            mma_1688_tf32(acc[i][q], a[i], l0, l1);
            mma_1688_tf32(acc[i][q], al[i], b0, b1);
          }
        }
      }
    }

    // D(m, n): m = g (+ 8) a column of row 2 wm + i, n = 2t (+ 1) a channel of n-tile q
    float* on = p.out + n * p.out_stride[0];
#pragma unroll
    for (int q = 0; q < NT; ++q)
#pragma unroll
      for (int e1 = 0; e1 < 2; ++e1) {
        const int64_t o = chunk * NB + (wn * NT + q) * 8 + 2 * t + e1;
        if (o >= p.out_channels) continue;
        const float b = p.bias ? __ldg(p.bias + o) : 0.f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int64_t oi = oh0 + 2 * wm + i;
          if (oi >= p.oh) continue;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int64_t oj = ow0 + g + 8 * hh;
            if (oj < p.ow)
              on[o * p.out_stride[1] + oi * p.out_stride[2] + oj * p.out_stride[3]] = epi(acc[i][q][2 * hh + e1] + b);
          }
        }
      }
  }
}

}  // namespace detail

template <bool SPLIT, int NT, class Epi = Identity>
cudaError_t launch_narrow_conv(const NarrowConvParams& p, cudaStream_t stream, const Epi& epi = Epi{}) {
  static_assert(NT == 1 || NT == 2 || NT == 4, "1, 2 or 4 n-tiles a warp");
  if (!p.x || !p.w || !p.out || p.kh < 1 || p.kw < 1 || p.stride_h < 1 || p.stride_w < 1 || p.dil_h < 1 ||
      p.dil_w < 1 || p.pad_h < 0 || p.pad_w < 0 || p.in_channels < 1 || !narrow_conv_fits(p))
    return cudaErrorInvalidValue;
  if (p.batch <= 0 || p.out_channels <= 0 || p.oh <= 0 || p.ow <= 0) return cudaSuccess;
  const int ih = narrow_conv_in_rows(p), iw = narrow_conv_in_cols(p);
  const int kpad = int(ceil_div<int64_t>(p.in_channels * p.kh * p.kw, 8) * 8);
  const int64_t tiles = ceil_div<int64_t>(p.out_channels, 16 * NT) * p.batch * ceil_div<int64_t>(p.oh, kNcTileH) *
                        ceil_div<int64_t>(p.ow, kNcTileW);
  const size_t smem = detail::narrow_conv_smem<SPLIT, NT>(kpad, int(p.in_channels) * ih * iw);
  auto kernel = detail::narrow_conv_kernel<SPLIT, NT, Epi>;
  int sm = 0;
  cudaError_t e = sm_count(sm);
  if (e != cudaSuccess) return e;
  if (smem > 48 * 1024 &&
      (e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem))) != cudaSuccess)
    return e;
  int per_sm = 0;
  if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kNcThreads, smem)) != cudaSuccess) return e;
  const int64_t most = int64_t(sm) * (per_sm > 0 ? per_sm : 1);
  kernel<<<unsigned(tiles < most ? tiles : most), kNcThreads, smem, stream>>>(p, ih, iw, kpad, tiles, epi);
  return cudaGetLastError();
}

}  // namespace stitch
