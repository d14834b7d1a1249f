// numeric.cuh — storage types, conversions to and from fp32, and 16-byte vectors.
//
// Parameters: T, the storage type (float, __half, __nv_bfloat16).
// Contract: all math is done in fp32; a Vec<T> is 16 bytes (4 floats, 8 halves) and must be
// loaded from and stored to 16-byte aligned addresses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace stitch {

template <class T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements of T in one 16-byte access.
template <class T> struct VecWidth { static constexpr int value = 16 / sizeof(T); };

template <class T>
struct alignas(16) Vec {
  static constexpr int N = VecWidth<T>::value;
  T v[N];
};

template <class T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  Vec<T> r;
  // Plain (coherent) load: the epilogue may write where it read.
  *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
  return r;
}

template <class T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& r) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
}

__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace stitch
