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
// input before, a layout change after). Here a block holds the filters of its channels in shared
// memory for every tile it takes and stages the input under a tile of 8 x 16 outputs by cp.async,
// the next tile's while this one computes (two buffers); each warp multiplies two rows of 16
// outputs by NT 8-channel tiles with mma.sync (the operands rounded to TF32 as they are loaded);
// the hook runs on the accumulators and each store writes whole 32-byte sectors (8 consecutive
// columns of a channel channels-first, two channels of a position channels-last).
#pragma once

#include <climits>
#include <type_traits>

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
constexpr int kNcMaxStage = 6144;           // staged input values a tile (24 KB a buffer)

// The staged input's rows and columns under one tile of outputs.
inline int narrow_conv_in_rows(const NarrowConvParams& p) { return (kNcTileH - 1) * p.stride_h + (p.kh - 1) * p.dil_h + 1; }
inline int narrow_conv_in_cols(const NarrowConvParams& p) { return (kNcTileW - 1) * p.stride_w + (p.kw - 1) * p.dil_w + 1; }

// Whether launch_narrow_conv takes p's shape (the contract's bounds).
inline bool narrow_conv_fits(const NarrowConvParams& p) {
  return p.in_channels * p.kh * p.kw <= kNcMaxK &&
         p.in_channels * narrow_conv_in_rows(p) * narrow_conv_in_cols(p) <= kNcMaxStage;
}

namespace detail {

// Shared memory: the filters of 16 NT channels ([16 NT][ldw]; within each 8 k, the order k0, k0 + 4,
// k0 + 1, k0 + 5, ...: a B fragment's two values side by side, one 8-byte load; ldw = 8 mod 16, so
// that a half-warp's 8-byte loads hit 32 banks), the small parts after them under SPLIT, their bias;
// the offsets in the staged input of the k pairs (k0 + t, k0 + t + 4), -1 past the sum (a zero);
// then two buffers of staged input [in_channels][rows][cols] (the next tile's copied in while this
// one computes). 80 registers a thread: three blocks an SM.
__host__ __device__ inline int narrow_conv_ldw(int kpad) { return kpad % 16 == 8 ? kpad : kpad + 8; }
template <bool SPLIT, int NT>
inline size_t narrow_conv_smem(int kpad, int staged) {
  return size_t(16 * NT) * (narrow_conv_ldw(kpad) * (SPLIT ? 2 : 1) + 1) * sizeof(float) + size_t(kpad) * sizeof(int) +
         2 * size_t(staged) * sizeof(float);
}

// A tile: its sample, its filter chunk and its top-left output.
struct NcTile {
  int n, chunk, oh0, ow0;
};

// The input under tile t into xs, by cp.async (zeros outside the input): a warp a staged row
// channels-first (lanes along its columns), a warp a position channels-last (lanes along its
// channels), so that consecutive lanes read consecutive addresses. The walks step their counters
// instead of dividing (a division is some twenty instructions a thread).
__device__ __forceinline__ void narrow_conv_stage(const NarrowConvParams& p, float* xs, NcTile t, int ih_n, int iw_n,
                                                  bool cl) {
  constexpr int W = kNcThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, cin = int(p.in_channels), plane = ih_n * iw_n;
  const int64_t r0 = int64_t(t.oh0) * p.stride_h - p.pad_h, c0 = int64_t(t.ow0) * p.stride_w - p.pad_w;
  const float* xn = p.x + t.n * p.x_stride[0];
  if (!cl) {
    int c = 0, rr = warp;  // staged row c * ih_n + rr
    while (rr >= ih_n) rr -= ih_n, ++c;
    for (int row = warp; row < cin * ih_n; row += W) {
      const int64_t gr = r0 + rr;
      const bool in = gr >= 0 && gr < p.h;
      const float* src = xn + c * p.x_stride[1] + gr * p.x_stride[2];
      for (int cc = lane; cc < iw_n; cc += 32) {
        const int64_t gc = c0 + cc;
        const bool ok = in && gc >= 0 && gc < p.w_in;
        cp_async4(xs + row * iw_n + cc, ok ? src + gc * p.x_stride[3] : p.x, ok);
      }
      rr += W;
      while (rr >= ih_n) rr -= ih_n, ++c;
    }
  } else {
    int rr = 0, cc = warp;  // position rr * iw_n + cc
    while (cc >= iw_n) cc -= iw_n, ++rr;
    for (int at = warp; at < plane; at += W) {
      const int64_t gr = r0 + rr, gc = c0 + cc;
      const bool ok = gr >= 0 && gr < p.h && gc >= 0 && gc < p.w_in;
      const float* src = xn + gr * p.x_stride[2] + gc * p.x_stride[3];
      for (int c = lane; c < cin; c += 32) cp_async4(xs + c * plane + at, ok ? src + c * p.x_stride[1] : p.x, ok);
      cc += W;
      while (cc >= iw_n) cc -= iw_n, ++rr;
    }
  }
}

// grid-stride over tiles ordered (channel chunk, batch, tile row, tile column), the chunk slowest, so
// that a block reloads its filters only when its chunk changes.
template <bool SPLIT, int NT, class Epi>
__global__ void __launch_bounds__(kNcThreads, 3) narrow_conv_kernel(NarrowConvParams p, int ih_n, int iw_n, int kpad,
                                                                    int tiles, Epi epi) {
  constexpr int NB = 16 * NT;
  extern __shared__ float smem[];
  const int ldw = narrow_conv_ldw(kpad), taps = p.kh * p.kw, K = int(p.in_channels) * taps, plane = ih_n * iw_n;
  const int staged = int(p.in_channels) * plane;
  const bool cl = p.x_stride[1] == 1 && p.in_channels > 1;
  float* ws = smem;
  float* ws_lo = ws + NB * ldw;  // SPLIT only
  float* bs = ws + (SPLIT ? 2 : 1) * NB * ldw;                          // the chunk's bias [NB]
  int2* koff = reinterpret_cast<int2*>(bs + NB);                         // [kpad / 8][4]
  float* xs = reinterpret_cast<float*>(koff + kpad / 2);                  // two buffers of `staged`
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wm = warp % 4, wn = warp / 4;  // tile rows 2 wm, 2 wm + 1; n-tiles wn NT .. wn NT + NT - 1
  auto offset = [&](int k) {
    if (k >= K) return -1;
    const int c = k / taps, r = k - c * taps, a = r / p.kw, b = r - a * p.kw;
    return c * plane + a * p.dil_h * iw_n + b * p.dil_w;
  };
  for (int i = tid; i < kpad / 2; i += kNcThreads) koff[i] = make_int2(offset(i / 4 * 8 + i % 4), offset(i / 4 * 8 + i % 4 + 4));
  // Each thread's two pixel rows x two columns (g, g + 8) of A, as offsets into a channel's plane.
  int base[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) base[i][hh] = (2 * wm + i) * p.stride_h * iw_n + (g + 8 * hh) * p.stride_w;
  // tiles < 2^31 (launch_narrow_conv): 32-bit divisions, once a tile
  const int tx = int(ceil_div<int64_t>(p.ow, kNcTileW)), ty = int(ceil_div<int64_t>(p.oh, kNcTileH)), nb = int(p.batch);
  auto decode = [&](int tile) {
    const int txi = tile % tx, r = tile / tx, tyi = r % ty, s = r / ty;
    return NcTile{s % nb, s / nb, tyi * kNcTileH, txi * kNcTileW};
  };
  int tile = blockIdx.x;
  NcTile next{};
  if (tile < tiles) {
    next = decode(tile);
    narrow_conv_stage(p, xs, next, ih_n, iw_n, cl);
  }
  cp_async_commit();
  int loaded = -1;
  for (int buf = 0; tile < tiles; tile += gridDim.x, buf ^= 1) {
    const NcTile cur = next;
    const int n = cur.n, chunk = cur.chunk, oh0 = cur.oh0, ow0 = cur.ow0;
    if (tile + int(gridDim.x) < tiles) {  // the next tile's input, copied while this one computes
      next = decode(tile + gridDim.x);
      narrow_conv_stage(p, xs + (buf ^ 1) * staged, next, ih_n, iw_n, cl);
    }
    cp_async_commit();
    if (chunk != loaded) {  // every warp is past the last tile's products (the loop's last barrier)
      for (int i = tid; i < NB * kpad; i += kNcThreads) {
        const int j = i / kpad, k = i - j * kpad;
        const int64_t o = int64_t(chunk) * NB + j;
        const float v = o < p.out_channels && k < K ? __ldg(p.w + o * K + k) : 0.f;
        const float hi = tf32_round(v);
        const int at = j * ldw + (k & ~7) + 2 * (k & 3) + ((k >> 2) & 1);  // the pair order above
        ws[at] = hi;
        if constexpr (SPLIT) ws_lo[at] = tf32_round(v - hi);
      }
      for (int j = tid; j < NB; j += kNcThreads) {
        const int64_t o = int64_t(chunk) * NB + j;
        bs[j] = o < p.out_channels && p.bias ? __ldg(p.bias + o) : 0.f;
      }
      loaded = chunk;
    }
    cp_async_wait<1>();  // this tile's input has landed (the next one's may still be in flight)
    __syncthreads();
    const float* xb = xs + buf * staged;

    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < NT; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][q][e] = 0.f;
    // one k-step of 8: A from the staged input (a zero past the sum only where CHECK: the last,
    // partial step), B from the filters, NT x 2 (x 3 under SPLIT) products
    auto step = [&](int k0, auto check) {
      constexpr bool CHECK = decltype(check)::value;
      const int2 o = koff[k0 / 2 + t];
      uint32_t a[2][4];
      [[maybe_unused]] uint32_t al[2][4];  // the small parts (SPLIT)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float v[4];
        if constexpr (CHECK) {
          v[0] = o.x >= 0 ? xb[base[i][0] + o.x] : 0.f;  // A(g, t)
          v[1] = o.x >= 0 ? xb[base[i][1] + o.x] : 0.f;  // A(g + 8, t)
          v[2] = o.y >= 0 ? xb[base[i][0] + o.y] : 0.f;  // A(g, t + 4)
          v[3] = o.y >= 0 ? xb[base[i][1] + o.y] : 0.f;  // A(g + 8, t + 4)
        } else {
          v[0] = xb[base[i][0] + o.x], v[1] = xb[base[i][1] + o.x];
          v[2] = xb[base[i][0] + o.y], v[3] = xb[base[i][1] + o.y];
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float hi = tf32_round(v[e]);
          a[i][e] = __float_as_uint(hi);
          if constexpr (SPLIT) al[i][e] = tf32_bits(v[e] - hi);
        }
      }
#pragma unroll
      for (int q = 0; q < NT; ++q) {
        const int at = ((wn * NT + q) * 8 + g) * ldw + k0 + 2 * t;
        const float2 b = *reinterpret_cast<const float2*>(ws + at);
#pragma unroll
        for (int i = 0; i < 2; ++i) mma_1688_tf32(acc[i][q], a[i], __float_as_uint(b.x), __float_as_uint(b.y));
        if constexpr (SPLIT) {
          const float2 l = *reinterpret_cast<const float2*>(ws_lo + at);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            mma_1688_tf32(acc[i][q], a[i], __float_as_uint(l.x), __float_as_uint(l.y));
            mma_1688_tf32(acc[i][q], al[i], __float_as_uint(b.x), __float_as_uint(b.y));
          }
        }
      }
    };
    const int whole = K / 8 * 8;
    for (int k0 = 0; k0 < whole; k0 += 8) step(k0, std::false_type{});
    if (whole < kpad) step(whole, std::true_type{});

    // D(m, n): m = g (+ 8) a column of row 2 wm + i, n = 2t (+ 1) a channel of n-tile q
    float* on = p.out + int64_t(n) * p.out_stride[0];
    const int oc = chunk * NB + wn * NT * 8 + 2 * t;  // this thread's first channel (< 2^31)
    float bias[NT][2];
#pragma unroll
    for (int q = 0; q < NT; ++q)
#pragma unroll
      for (int e1 = 0; e1 < 2; ++e1) bias[q][e1] = bs[(wn * NT + q) * 8 + 2 * t + e1];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t oi = int64_t(oh0) + 2 * wm + i;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t oj = int64_t(ow0) + g + 8 * hh;
        if (oi >= p.oh || oj >= p.ow) continue;
        float* px = on + oi * p.out_stride[2] + oj * p.out_stride[3];
#pragma unroll
        for (int q = 0; q < NT; ++q)
#pragma unroll
          for (int e1 = 0; e1 < 2; ++e1)
            if (oc + q * 8 + e1 < p.out_channels)
              px[int64_t(oc + q * 8 + e1) * p.out_stride[1]] = epi(acc[i][q][2 * hh + e1] + bias[q][e1]);
      }
    }
    __syncthreads();  // this buffer is the next-but-one tile's, and the filters may change
  }
  cp_async_wait<0>();
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
  if (tiles > INT_MAX / 2) return cudaErrorInvalidValue;  // (the kernel counts tiles in 32 bits)
  const size_t smem = detail::narrow_conv_smem<SPLIT, NT>(kpad, int(p.in_channels) * ih * iw);
  auto kernel = detail::narrow_conv_kernel<SPLIT, NT, Epi>;
  static int sms[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int& sm = sms[dev & 63];
  if (sm == 0 && (e = cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
  if (smem > 48 * 1024 &&
      (e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem))) != cudaSuccess)
    return e;
  int per_sm = 0;
  if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kNcThreads, smem)) != cudaSuccess) return e;
  const int64_t most = int64_t(sm) * (per_sm > 0 ? per_sm : 1);
  kernel<<<unsigned(tiles < most ? tiles : most), kNcThreads, smem, stream>>>(p, ih, iw, kpad, int(tiles), epi);
  return cudaGetLastError();
}

}  // namespace stitch
