// ops.cuh — the fp32 numerics of the elementwise ops that are more than one libm call.
//
// Parameters: none (plain functions of fp32 values).
// Contract: __host__ __device__, fp32 in and out, no intrinsic that exists on one side only, so
// the op harness compiles exactly these for the host (CPU tests) and for the device (GPU
// tests). Generated elementwise code (the op registry's C expressions, stitchcuda/ops) and the
// runtime's GEMM epilogue functors (epilogue.cuh) both call them: each function is spelled once.
// Accurate expf / tanhf / erff everywhere. These ops run in memory-bound passes, but a chain of
// libm calls does not hide behind the loads: where an identity needs fewer calls, it is used.
#pragma once

#include <math.h>

namespace stitch {
namespace op {

#define ST_OP __host__ __device__ __forceinline__

// PyTorch's NaN semantics: relu, max, min and clamp of NaN are NaN (fmaxf / fminf alone would
// return the other operand).
ST_OP float relu(float x) { return x > 0.f ? x : (x == x ? 0.f : x); }
ST_OP float max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
ST_OP float min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
ST_OP float clamp(float x, float lo, float hi) {
  return (x != x || lo != lo || hi != hi) ? x + lo + hi : fminf(fmaxf(x, lo), hi);
}

ST_OP float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
ST_OP float silu(float x) { return x / (1.f + expf(-x)); }
ST_OP float tanh(float x) { return tanhf(x); }
// PyTorch's softplus: linear above the threshold (in units of beta * x).
ST_OP float softplus(float x, float beta, float threshold) {
  return x * beta > threshold ? x : log1pf(expf(x * beta)) / beta;
}
// mish(x) = x tanh(softplus(x)). With n = e^x, tanh(log(1 + n)) = n (n + 2) / (n (n + 2) + 2): one
// exponential and one division, not expf, log1pf and tanhf (with those, two mish passes over a
// convolution's output ran compute-bound, at 55 % of a copy's bandwidth). Above x = 20 PyTorch's
// softplus is x itself, and tanh(x) rounds to 1.
ST_OP float mish(float x) {
  if (x > 20.f) return x;
  const float n = expf(x), p = n * (n + 2.f);
  return x * (p / (p + 2.f));
}
ST_OP float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.7071067811865476f)); }
// The tanh approximation (GPT-2's, cuBLASLt's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
ST_OP float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}
ST_OP float hardswish(float x) { return x * clamp(x + 3.f, 0.f, 6.f) * (1.f / 6.f); }
ST_OP float hardsigmoid(float x) { return clamp(x + 3.f, 0.f, 6.f) * (1.f / 6.f); }

// Python's remainder (PyTorch's for floats): the sign of the divisor, from fmod.
ST_OP float remainder(float a, float b) {
  const float r = fmodf(a, b);
  return r != 0.f && ((r < 0.f) != (b < 0.f)) ? r + b : r;
}

// PyTorch's floor division of floats (div(..., rounding_mode="floor")): from fmod, so the
// quotient is exact where a / b would round across an integer, and an infinite dividend gives NaN.
ST_OP float div_floor(float a, float b) {
  if (b == 0.f) return a / b;
  const float mod = fmodf(a, b);
  float div = (a - mod) / b;
  if (mod != 0.f && ((b < 0.f) != (mod < 0.f))) div -= 1.f;
  if (div == 0.f) return copysignf(0.f, a / b);
  float f = floorf(div);
  return div - f > 0.5f ? f + 1.f : f;
}

#undef ST_OP

}  // namespace op
}  // namespace stitch
