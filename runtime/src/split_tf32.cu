// split_tf32.cu — the split-TF32 GEMM: fp32-grade accuracy on TF32 tensor cores.
//
// Each fp32 operand is split into a TF32 "big" part and a TF32 "small" remainder
// (x = big + small + O(2^-22 |x|), both exactly representable in TF32), and
//   out = A_s B_b + A_b B_s + A_b B_b   (A_s B_s, ~2^-22 of the product, left out)
// as three TF32 GEMMs accumulated in fp32 through cuBLASLt's beta (the caller's residual and beta on
// the first, its bias and activation on the last). CUTLASS calls this OpMultiplyAddFastF32; here the
// three products are the runtime's own TF32 GEMMs (cached plans, the same epilogues), and the splits
// are written once per call into stream-ordered scratch. An fp32 GEMM runs on the SIMT units at
// ~67 TFLOP/s on an H100; three TF32 products run at up to ~495 / 3.
#include <cuda_runtime.h>

#include <cstdint>

#include "error.hpp"
#include "gemm.hpp"

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

}  // namespace

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
  float* buf = nullptr;
  ST_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), size_t(2 * (an + bn)) * sizeof(float), stream));
  struct Scratch {
    float* p;
    cudaStream_t s;
    ~Scratch() { cudaFreeAsync(p, s); }
  } scratch{buf, stream};
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
