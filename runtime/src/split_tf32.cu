// split_tf32.cu — the split-TF32 GEMM and convolution: near-fp32 accuracy on TF32 tensor cores.
//
// Each fp32 operand is split into a TF32 "big" part and a TF32 "small" remainder
// (x = big + small + O(2^-22 |x|), both exactly representable in TF32), and
//   out = A_s B_b + A_b B_s + A_b B_b   (A_s B_s, ~2^-22 of the product, left out)
// as three TF32 GEMMs accumulated in fp32 through cuBLASLt's beta (the caller's residual and beta on
// the first, its bias and activation on the last). CUTLASS calls this OpMultiplyAddFastF32; here the
// three products are the runtime's own TF32 GEMMs (cached plans, the same epilogues), and the splits
// are written once per call into stream-ordered scratch. An fp32 GEMM runs on the SIMT units at
// ~67 TFLOP/s on an H100; three TF32 products run at up to ~495 / 3.
//
// A convolution is linear in its input channels, so the three products are ONE TF32 convolution
// over three times the channels: x' = [x_b, x_b, x_s] and w' = [w_b, w_s, w_b] along the input
// channels (within each group), y = conv(x', w') + bias = x_b w_b + x_b w_s + x_s w_b + bias. One
// cuDNN plan (the same fused bias and activation, the output written once), K three times as long,
// at the cost of writing x three times; engines that transform their operands (FFT, Winograd) are
// left out, since a transformed TF32 value is rounded again. Measured on an H200 (BENCHMARKS.md):
// the convolution's error is 7-13x fp32's, 10-40x below TF32's, growing with the reduction's length
// (the GEMM's, three products accumulated through beta, 4-5x fp32's).
#include <cuda_runtime.h>

#include <cstdint>

#include "conv.hpp"
#include "error.hpp"
#include "gemm.hpp"
#include "memory.hpp"

namespace st {

namespace {

// x rounded to TF32 (10 mantissa bits, to nearest, ties away), kept in an fp32 register.
__device__ __forceinline__ float tf32_round(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
#else  // (no TF32 cores before sm_80: the same rounding by hand, for a build that targets them too)
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf / NaN unchanged
  return __uint_as_float((u + 0x1000u) & 0xffffe000u);
#endif
}

// src: `items` matrices of rows x cols (row stride ld, item stride `stride`) -> big / small, dense
// (row stride cols, item stride rows * cols).
__global__ void __launch_bounds__(256) split_kernel(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                                    int64_t stride, int64_t items, float* big, float* small) {
  const int64_t per = rows * cols, n = per * items;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / per, rc = i - b * per, r = rc / cols, c = rc - r * cols;
    const float v = src[b * stride + r * ld + c];
    const float hi = tf32_round(v);
    big[i] = hi;
    small[i] = tf32_round(v - hi);
  }
}

void split(const void* src, int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t items, float* big,
           float* small, cudaStream_t stream) {
  const int64_t n = rows * cols * items;
  const int64_t want = (n + 255) / 256;
  const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
  split_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(src), rows, cols, ld, stride, items, big, small);
  ST_CUDA_CHECK(cudaGetLastError());
}

// src viewed as [blocks, run] -> dst as [blocks, 3, run]: copy `lo` of each run holds the TF32
// remainder, the two others the TF32 big part. V: float or float4 (run a multiple of 4, 16-byte
// aligned pointers).
template <class V>
__global__ void __launch_bounds__(256) split3_kernel(const V* src, int64_t n, int64_t run, int lo, V* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / run, at = i + 2 * b * run;  // b * 3 * run + (i - b * run)
    V hi = src[i], rest;
    float* h = reinterpret_cast<float*>(&hi);
    float* r = reinterpret_cast<float*>(&rest);
#pragma unroll
    for (int j = 0; j < int(sizeof(V) / sizeof(float)); ++j) {
      const float v = h[j];
      h[j] = tf32_round(v);
      r[j] = tf32_round(v - h[j]);
    }
    for (int p = 0; p < 3; ++p) dst[at + p * run] = p == lo ? rest : hi;
  }
}

void split3(const void* src, int64_t blocks, int64_t run, int lo, float* dst, cudaStream_t stream) {
  const bool vec = run % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t n = blocks * run / (vec ? 4 : 1), r = run / (vec ? 4 : 1);
  const int64_t want = (n + 255) / 256;
  const unsigned grid = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
  if (vec)
    split3_kernel<float4><<<grid, 256, 0, stream>>>(static_cast<const float4*>(src), n, r, lo,
                                                    reinterpret_cast<float4*>(dst));
  else
    split3_kernel<float><<<grid, 256, 0, stream>>>(static_cast<const float*>(src), n, r, lo, dst);
  ST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void split_conv_operands(const st_conv_args& a, float* xs, float* ws, cudaStream_t stream) {
  const int64_t g = a.groups, cin = a.in_channels / g, cout = a.out_channels / g;
  int64_t s = 1, k = 1;
  for (int i = 0; i < a.spatial_dims; ++i) {
    s *= a.in_size[i];
    k *= a.kernel_size[i];
  }
  const bool cl = a.channels_last != 0;
  // x: [batch, groups, cin, s] channels-first, [batch * s, groups, cin] channels-last.
  split3(a.x, cl ? a.batch * s * g : a.batch * g, cl ? cin : cin * s, 2, xs, stream);  // [x_b, x_b, x_s]
  // w: its input-channel dim is the first of a transposed weight ([groups * cin, cout, k...]),
  // the second of a forward one ([out, cin, k...], channels-last [out, k..., cin]).
  if (a.transposed)
    split3(a.w, g, cin * cout * k, 1, ws, stream);  // [w_b, w_s, w_b]
  else
    split3(a.w, cl ? a.out_channels * k : a.out_channels, cl ? cin : cin * k, 1, ws, stream);
}

void gemm_split_tf32(const st_gemm_args& g, cudaStream_t stream) {
  ST_REQUIRE(g.policy == ST_POLICY_FP32, "gemm_split_tf32: the policy must be fp32 (the precision it stands in "
             "for), got ", st_policy_name(g.policy));
  check_gemm_args(g);
  // The operands as stored: A is m x k (k x m when transposed), B is k x n (n x k).
  const int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
  const int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
  const int64_t a_items = g.batch > 1 && g.stride_a != 0 ? g.batch : 1;
  const int64_t b_items = g.batch > 1 && g.stride_b != 0 ? g.batch : 1;
  const int64_t an = ar * ac * a_items, bn = br * bc * b_items;
  StreamScratch scratch(size_t(2 * (an + bn)), stream);
  float* buf = scratch.get();
  float *a_big = buf, *a_small = buf + an, *b_big = buf + 2 * an, *b_small = buf + 2 * an + bn;
  split(g.a, ar, ac, g.lda, g.stride_a, a_items, a_big, a_small, stream);
  split(g.b, br, bc, g.ldb, g.stride_b, b_items, b_big, b_small, stream);

  st_gemm_args t = g;
  t.policy = ST_POLICY_TF32;
  t.lda = ac;
  t.ldb = bc;
  t.stride_a = a_items > 1 ? ar * ac : 0;
  t.stride_b = b_items > 1 ? br * bc : 0;
  // 1: A_s B_b (+ the caller's beta * C), no epilogue.
  t.a = a_small;
  t.b = b_big;
  t.epilogue = ST_EPI_NONE;
  t.bias = nullptr;
  gemm(t, stream);
  // 2: + A_b B_s.
  t.a = a_big;
  t.b = b_small;
  t.beta = 1.f;
  t.c = g.out;
  t.ldc = g.ldo;
  t.stride_c = g.stride_out;
  gemm(t, stream);
  // 3: + A_b B_b, then the caller's bias and activation over the whole sum.
  t.b = b_big;
  t.epilogue = g.epilogue;
  t.bias = g.bias;
  gemm(t, stream);
}

}  // namespace st
