// split_tf32.cu — the split GEMMs and convolution: near-fp32 accuracy on tensor cores.
//
// Each fp32 operand is split into a "big" part and a "small" remainder, both exactly representable
// in the tensor cores' input type (TF32: x = big + small + O(2^-22 |x|); bf16: O(2^-18 |x|)), and
//   out = A_s B_b + A_b B_s + A_b B_b   (A_s B_s left out)
// as three GEMMs accumulated in fp32 through beta, over the parts written once per call into
// stream-ordered scratch as A' = [A_b, A_b, A_s] and B' = [B_b; B_s; B_b] along K (each product a
// pair of K sections). CUTLASS calls the TF32 form OpMultiplyAddFastF32. An fp32 GEMM runs
// on the SIMT units at ~67 TFLOP/s on an H100; the TF32 form runs at up to ~495 / 3, the bf16 form
// at up to ~990 / 3 with about 2^-16 relative error a product (TF32's own: 2^-10), enough for a task
// the precision repair raises in a TF32 program, where the tolerance is TF32's.
//
// A convolution is linear in its input channels, so the three products are ONE TF32 convolution
// over three times the channels: x' = [x_b, x_b, x_s] and w' = [w_b, w_s, w_b] along the input
// channels (within each group), y = conv(x', w') + bias = x_b w_b + x_b w_s + x_s w_b + bias. One
// cuDNN plan (the same fused bias and activation, the output written once), K three times as long,
// at the cost of writing x three times; engines that transform their operands (FFT, Winograd) are
// left out, since a transformed TF32 value is rounded again. Measured on an H200 (BENCHMARKS.md):
// the convolution's error is 7-13x fp32's, 10-40x below TF32's, growing with the reduction's length
// (the GEMM's, three products accumulated through beta, 4-5x fp32's).
#include <cuda_bf16.h>
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

namespace {

// The two parts of x in T: float (TF32 values, kept in fp32 registers) or bfloat16.
template <class T> struct Parts;
template <> struct Parts<float> {
  __device__ static void of(float x, float& hi, float& lo) {
    hi = tf32_round(x);
    lo = tf32_round(x - hi);
  }
};
template <> struct Parts<__nv_bfloat16> {
  __device__ static void of(float x, __nv_bfloat16& hi, __nv_bfloat16& lo) {
    hi = __float2bfloat16_rn(x);
    lo = __float2bfloat16_rn(x - __bfloat162float(hi));  // x - hi is exact in fp32
  }
};

// A GEMM operand stored as `items` matrices of rows x cols (row stride ld, item stride `stride`)
// -> dst, dense, its K axis three times as long: along the rows (k_inner: dst[item][row][p][col])
// or the columns' outer axis (dst[item][p][row][col]). Copy p == lo holds the remainder, the two
// others the big part. A block per row (grid-strided); V elements a thread at a time.
template <class T, int V>
__global__ void __launch_bounds__(256) split_k3_kernel(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                                       int64_t stride, int64_t items, bool k_inner, int lo, T* dst) {
  const int64_t per = rows * cols;
  for (int64_t row = blockIdx.x; row < items * rows; row += gridDim.x) {
    const int64_t item = row / rows, r = row - item * rows;
    const float* s = src + item * stride + r * ld;
    T* d = k_inner ? dst + row * 3 * cols : dst + item * 3 * per + r * cols;
    const int64_t step = k_inner ? cols : per;  // from copy p to copy p + 1
    for (int64_t c = int64_t(threadIdx.x) * V; c < cols; c += int64_t(blockDim.x) * V) {
      float x[V];
      if constexpr (V == 4) {
        const float4 v = *reinterpret_cast<const float4*>(s + c);
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
      } else {
        x[0] = s[c];
      }
      T hi[V], rest[V];
#pragma unroll
      for (int j = 0; j < V; ++j) Parts<T>::of(x[j], hi[j], rest[j]);
#pragma unroll
      for (int p = 0; p < 3; ++p) {
        T* at = d + p * step + c;
#pragma unroll
        for (int j = 0; j < V; ++j) at[j] = p == lo ? rest[j] : hi[j];
      }
    }
  }
}

template <class T>
void split_k3(const float* src, int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t items, bool k_inner,
              int lo, T* dst, cudaStream_t stream) {
  const bool vec = cols % 4 == 0 && ld % 4 == 0 && (items == 1 || stride % 4 == 0) &&
                   reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % (4 * sizeof(T)) == 0;
  const int64_t n = items * rows;
  const unsigned grid = unsigned(n < (int64_t(1) << 20) ? n : (int64_t(1) << 20));
  if (vec)
    split_k3_kernel<T, 4><<<grid, 256, 0, stream>>>(src, rows, cols, ld, stride, items, k_inner, lo, dst);
  else
    split_k3_kernel<T, 1><<<grid, 256, 0, stream>>>(src, rows, cols, ld, stride, items, k_inner, lo, dst);
  ST_CUDA_CHECK(cudaGetLastError());
}

// out = A_s B_b + A_b B_s + A_b B_b as three GEMMs accumulated through beta, the remainders' products
// first (the caller's beta * C on the first, its bias and activation on the last), over the parts
// written once: A' = [A_b, A_b, A_s] and B' = [B_b; B_s; B_b] along K, each product a pair of K
// sections. (The same as ONE GEMM over K tripled measured 5-10x the error on an H100, 1.1e-4
// against 2.0e-5 at n = 8192 for TF32 parts: there each remainder's product is added to the big
// running sum.) T float: TF32 parts and products; T bfloat16: bf16 parts, bf16 products in fp32.
template <class T>
void gemm_split(const st_gemm_args& g, cudaStream_t stream, const char* who) {
  ST_REQUIRE(g.policy == ST_POLICY_FP32, who, ": the policy must be fp32 (the precision it stands in for), got ",
             st_policy_name(g.policy));
  check_gemm_args(g);
  // The operands as stored: A is m x k (k x m when transposed), B is k x n (n x k).
  const int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
  const int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
  const int64_t a_items = g.batch > 1 && g.stride_a != 0 ? g.batch : 1;
  const int64_t b_items = g.batch > 1 && g.stride_b != 0 ? g.batch : 1;
  const int64_t an = 3 * ar * ac * a_items, bn = 3 * br * bc * b_items;
  // T-sized elements, each part 16-byte aligned (StreamScratch counts floats)
  const int64_t a_room = (an * int64_t(sizeof(T)) + 15) / 16 * 16;
  StreamScratch scratch(size_t((a_room + bn * int64_t(sizeof(T)) + 3) / 4), stream);
  T* a3 = reinterpret_cast<T*>(scratch.get());
  T* b3 = reinterpret_cast<T*>(reinterpret_cast<char*>(scratch.get()) + a_room);
  // K is A's column axis unless A is transposed, B's row axis unless B is transposed.
  split_k3<T>(static_cast<const float*>(g.a), ar, ac, g.lda, g.stride_a, a_items, !g.trans_a, 2, a3, stream);
  split_k3<T>(static_cast<const float*>(g.b), br, bc, g.ldb, g.stride_b, b_items, g.trans_b != 0, 1, b3, stream);

  st_gemm_args t = g;
  const bool bf16 = sizeof(T) == 2;
  t.policy = bf16 ? ST_POLICY_FP32 : ST_POLICY_TF32;  // bf16 operands under fp32: bf16 products, fp32 sums
  t.a_dtype = t.b_dtype = bf16 ? ST_BFLOAT16 : ST_FLOAT32;
  t.lda = g.trans_a ? ac : 3 * ac;
  t.stride_a = a_items > 1 ? 3 * ar * ac : 0;
  t.ldb = g.trans_b ? 3 * bc : bc;
  t.stride_b = b_items > 1 ? 3 * br * bc : 0;
  // where each K section starts: along a row (K inner) or after a whole matrix of them (K outer)
  const int64_t a_sec = g.trans_a ? ar * ac : ac, b_sec = g.trans_b ? bc : br * bc;
  // 1: A_s B_b (+ the caller's beta * C), no epilogue.
  t.a = a3 + 2 * a_sec;
  t.b = b3;
  t.epilogue = ST_EPI_NONE;
  t.bias = nullptr;
  gemm(t, stream);
  // 2: + A_b B_s.
  t.a = a3;
  t.b = b3 + b_sec;
  t.beta = 1.f;
  t.c = g.out;
  t.ldc = g.ldo;
  t.stride_c = g.stride_out;
  gemm(t, stream);
  // 3: + A_b B_b, then the caller's bias and activation over the whole sum.
  t.b = b3;
  t.epilogue = g.epilogue;
  t.bias = g.bias;
  gemm(t, stream);
}

}  // namespace

void gemm_split_tf32(const st_gemm_args& g, cudaStream_t stream) { gemm_split<float>(g, stream, "gemm_split_tf32"); }

void gemm_split_bf16(const st_gemm_args& g, cudaStream_t stream) {
  gemm_split<__nv_bfloat16>(g, stream, "gemm_split_bf16");
}

}  // namespace st
