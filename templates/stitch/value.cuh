// value.cuh — any storage type read as fp32 and written from fp32.
//
// Parameters: T, a storage type: float, __half, __nv_bfloat16, or an integer type / bool.
// Contract: integers convert exactly below 2^24 (like the elementwise templates); a float written
// to an integer type is truncated toward zero, to bool it is `!= 0`. Used by the templates whose
// inputs or outputs may be integer tensors (scans, arg reductions, gathers, iota).
#pragma once

#include <type_traits>

#include "stitch/numeric.cuh"

namespace stitch {

template <class T>
__device__ __forceinline__ float any_to_float(T x) {
  if constexpr (std::is_integral_v<T>) return float(x);
  else return to_float<T>(x);
}

template <class T>
__device__ __forceinline__ T any_from_float(float x) {
  if constexpr (std::is_same_v<T, bool>) return x != 0.f;
  else if constexpr (std::is_integral_v<T>) return T(x);
  else return from_float<T>(x);
}

// Src to Dst: a plain copy when the types agree (no detour through fp32), else through fp32.
template <class Dst, class Src>
__device__ __forceinline__ Dst convert_value(Src x) {
  if constexpr (std::is_same_v<Dst, Src>) return x;
  else return any_from_float<Dst>(any_to_float<Src>(x));
}

}  // namespace stitch
