// mma.cuh — the sm_80+ instructions the templates share: warp-level tensor-core products
// (mma.sync), the TF32 rounding their operands take, and asynchronous copies into shared memory.
//
// mma_1688_tf32(d, a, b0, b1): d (16 x 8) += a (16 x 8, row) * b (8 x 8, col), fp32 accumulators.
//   With g = lane / 4 and t = lane % 4, the fragments hold (PTX ISA, "mma.m16n8k8"):
//     a[0] = A(g, t), a[1] = A(g + 8, t), a[2] = A(g, t + 4), a[3] = A(g + 8, t + 4);
//     b0 = B(t, g), b1 = B(t + 4, g);
//     d[0] = D(g, 2t), d[1] = D(g, 2t + 1), d[2] = D(g + 8, 2t), d[3] = D(g + 8, 2t + 1).
//   The operands are fp32 bit patterns whose low 13 bits the tensor cores ignore: round them first
//   (tf32_bits / tf32_round), as cuBLAS and cuDNN do, or the product truncates.
// tf32_bits(x) / tf32_round(x): x rounded to TF32 (10 mantissa bits, to nearest, ties away from
//   zero), as bits / as a float. x - tf32_round(x) is exact in fp32 and rounds to TF32 again with a
//   relative error of about 2^-22: the "big" and "small" parts of a split-TF32 product (three mma
//   per product, big x big + big x small + small x big, about fp32's accuracy).
// tf32_split(x, big, small): those two parts of x's bits; mma_1688_tf32x3(d, a_big, a_small, b0_big,
//   b1_big, b0_small, b1_small): d += a * b from them, the three mma.
// cp_async16 / cp_async4(smem, gmem, valid): copy 16 / 4 bytes global -> shared without a register
//   (cp.async; 16-byte copies bypass L1), zeros where !valid (nothing read); cp_async_commit() closes
//   a group of them, cp_async_wait<N>() waits until at most N groups are in flight.
#pragma once

#include <cstdint>

namespace stitch {

__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float tf32_round(float x) { return __uint_as_float(tf32_bits(x)); }

// x (fp32 bits) as its split-TF32 parts: big = x rounded to TF32, small = the rest rounded to TF32.
__device__ __forceinline__ void tf32_split(uint32_t x, uint32_t& big, uint32_t& small) {
  big = tf32_bits(__uint_as_float(x));
  small = tf32_bits(__uint_as_float(x) - __uint_as_float(big));
}

// d += a * b in split TF32 from the operands' parts: the two small products first, then big x big.
__device__ __forceinline__ void mma_1688_tf32x3(float (&d)[4], const uint32_t (&a_big)[4], const uint32_t (&a_small)[4],
                                                uint32_t b0_big, uint32_t b1_big, uint32_t b0_small, uint32_t b1_small) {
  mma_1688_tf32(d, a_small, b0_big, b1_big);
  mma_1688_tf32(d, a_big, b0_small, b1_small);
  mma_1688_tf32(d, a_big, b0_big, b1_big);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 4 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

}  // namespace stitch
