// epilogue.cuh — mixed-precision epilogue functors and the fused kernel that applies them.
//
// Parameters
//   T      storage type of the matrix (float, __half, __nv_bfloat16)
//   Ops... functors with `__device__ float operator()(float x, const EpCtx&) const`
// Contract
//   - x and out are rows x cols, row-major with leading dims ldx / ldo (elements); out may
//     alias x (each element is read before it is written, by the same thread).
//   - residual (ldr) and bias (cols elements) have type T; they are read only by the ops that
//     name them.
//   - math in fp32; one rounding to T at the end of the chain.
//   - 16-byte vector path when x, out, residual are 16-byte aligned, cols and the leading dims
//     are multiples of the vector width; a scalar path otherwise.
//
// Two ways in:
//   * compile time — a generated program writes `Chain<Scale, LeakyRelu>` and launches
//     `launch_epilogue<T>(chain, ...)`: the chain inlines into one kernel.
//   * run time — the runtime applies an array of st_ep_op with `RuntimeChain`, for callers that
//     build the chain dynamically (the Python binding, tests).
#pragma once

#include <cuda_runtime.h>

#include "stitch/numeric.cuh"
#include "stitch/ops.cuh"
#include "stitchrt/stitchrt.h"

namespace stitch {

// What an op may read besides x: the element's residual and bias values (fp32).
struct EpCtx {
  float residual;
  float bias;
};

struct Scale { float s; __device__ float operator()(float x, const EpCtx&) const { return x * s; } };
struct DivScalar { float s; __device__ float operator()(float x, const EpCtx&) const { return x / s; } };
struct AddScalar { float s; __device__ float operator()(float x, const EpCtx&) const { return x + s; } };
struct Relu { __device__ float operator()(float x, const EpCtx&) const { return op::relu(x); } };
struct LeakyRelu {
  float slope;
  __device__ float operator()(float x, const EpCtx&) const { return x >= 0.f ? x : x * slope; }
};
struct Sigmoid { __device__ float operator()(float x, const EpCtx&) const { return op::sigmoid(x); } };
struct Silu { __device__ float operator()(float x, const EpCtx&) const { return op::silu(x); } };
struct Tanh { __device__ float operator()(float x, const EpCtx&) const { return op::tanh(x); } };
struct Mish { __device__ float operator()(float x, const EpCtx&) const { return op::mish(x); } };
// PyTorch's softplus defaults: beta = 1, threshold = 20.
struct Softplus { __device__ float operator()(float x, const EpCtx&) const { return op::softplus(x, 1.f, 20.f); } };
struct Clamp {
  float lo, hi;
  __device__ float operator()(float x, const EpCtx&) const { return op::clamp(x, lo, hi); }
};
using Hardtanh = Clamp;
struct Hardswish { __device__ float operator()(float x, const EpCtx&) const { return op::hardswish(x); } };
struct Elu {
  float alpha;
  __device__ float operator()(float x, const EpCtx&) const { return x > 0.f ? x : alpha * expm1f(x); }
};
struct GeluTanh { __device__ float operator()(float x, const EpCtx&) const { return op::gelu_tanh(x); } };
struct GeluErf { __device__ float operator()(float x, const EpCtx&) const { return op::gelu_erf(x); } };
struct Abs { __device__ float operator()(float x, const EpCtx&) const { return fabsf(x); } };
struct Exp { __device__ float operator()(float x, const EpCtx&) const { return expf(x); } };
struct Square { __device__ float operator()(float x, const EpCtx&) const { return x * x; } };
struct ResidualAdd {
  float scale;
  __device__ float operator()(float x, const EpCtx& c) const { return x + scale * c.residual; }
};
struct BiasAdd { __device__ float operator()(float x, const EpCtx& c) const { return x + c.bias; } };

// Left-to-right composition: Chain<A, B>{a, b}(x) == b(a(x)).
template <class... Ops> struct Chain;
template <> struct Chain<> {
  __device__ float operator()(float x, const EpCtx&) const { return x; }
};
template <class Op, class... Rest>
struct Chain<Op, Rest...> {
  Op op;
  Chain<Rest...> rest;
  __device__ float operator()(float x, const EpCtx& c) const { return rest(op(x, c), c); }
};

// A chain chosen at run time: up to ST_MAX_EPILOGUE_OPS st_ep_op, interpreted per element.
struct RuntimeChain {
  st_ep_op ops[ST_MAX_EPILOGUE_OPS];
  int n;
  __device__ float operator()(float x, const EpCtx& c) const {
#pragma unroll
    for (int i = 0; i < ST_MAX_EPILOGUE_OPS; ++i) {
      if (i >= n) break;
      const st_ep_op& o = ops[i];
      switch (o.kind) {
        case ST_EP_SCALE: x = x * o.a; break;
        case ST_EP_DIV_SCALAR: x = x / o.a; break;
        case ST_EP_ADD_SCALAR: x = x + o.a; break;
        case ST_EP_LEAKY_RELU: x = LeakyRelu{o.a}(x, c); break;
        case ST_EP_SILU: x = Silu{}(x, c); break;
        case ST_EP_SIGMOID: x = Sigmoid{}(x, c); break;
        case ST_EP_TANH: x = op::tanh(x); break;
        case ST_EP_MISH: x = Mish{}(x, c); break;
        case ST_EP_HARDTANH:
        case ST_EP_CLAMP: x = Clamp{o.a, o.b}(x, c); break;
        case ST_EP_GELU_TANH: x = GeluTanh{}(x, c); break;
        case ST_EP_GELU_ERF: x = GeluErf{}(x, c); break;
        case ST_EP_RELU: x = op::relu(x); break;
        case ST_EP_RESIDUAL_ADD: x = x + o.a * c.residual; break;
        case ST_EP_BIAS_ADD: x = x + c.bias; break;
        case ST_EP_HARDSWISH: x = Hardswish{}(x, c); break;
        case ST_EP_SOFTPLUS: x = op::softplus(x, 1.f, 20.f); break;
        case ST_EP_ELU: x = Elu{o.a}(x, c); break;
        case ST_EP_ABS: x = fabsf(x); break;
        case ST_EP_EXP: x = expf(x); break;
        case ST_EP_SQUARE: x = x * x; break;
        default: break;
      }
    }
    return x;
  }
};

template <class T>
struct EpilogueParams {
  const T* x; int64_t ldx;
  T* out; int64_t ldo;
  const T* residual; int64_t ldr;
  const T* bias;
  int64_t rows, cols;
};

// Grid-stride over 16-byte vectors. cols and leading dims are multiples of Vec<T>::N.
template <class T, class F>
__global__ void epilogue_vec_kernel(EpilogueParams<T> p, F f) {
  constexpr int N = Vec<T>::N;
  const int64_t vcols = p.cols / N;
  const int64_t total = p.rows * vcols;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / vcols;
    const int64_t c = (idx - r * vcols) * N;
    Vec<T> xv = load_vec(p.x + r * p.ldx + c);
    Vec<T> rv, bv;
    if (p.residual) rv = load_vec(p.residual + r * p.ldr + c);
    if (p.bias) bv = load_vec(p.bias + c);
    Vec<T> ov;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      EpCtx ctx{p.residual ? to_float(rv.v[i]) : 0.f, p.bias ? to_float(bv.v[i]) : 0.f};
      ov.v[i] = from_float<T>(f(to_float(xv.v[i]), ctx));
    }
    store_vec(p.out + r * p.ldo + c, ov);
  }
}

template <class T, class F>
__global__ void epilogue_scalar_kernel(EpilogueParams<T> p, F f) {
  const int64_t total = p.rows * p.cols;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / p.cols;
    const int64_t c = idx - r * p.cols;
    EpCtx ctx{p.residual ? to_float(p.residual[r * p.ldr + c]) : 0.f,
              p.bias ? to_float(p.bias[c]) : 0.f};
    p.out[r * p.ldo + c] = from_float<T>(f(to_float(p.x[r * p.ldx + c]), ctx));
  }
}

template <class T>
inline bool epilogue_can_vectorise(const EpilogueParams<T>& p) {
  constexpr int N = Vec<T>::N;
  return aligned16(p.x) && aligned16(p.out) && (!p.residual || aligned16(p.residual)) &&
         (!p.bias || aligned16(p.bias)) && p.cols % N == 0 && p.ldx % N == 0 && p.ldo % N == 0 &&
         (!p.residual || p.ldr % N == 0);
}

// Launch the fused epilogue on a stream; returns the launch status.
template <class T, class F>
cudaError_t launch_epilogue(const EpilogueParams<T>& p, const F& f, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return cudaSuccess;
  const int threads = 256;
  const bool vec = epilogue_can_vectorise(p);
  const int64_t work = vec ? p.rows * (p.cols / Vec<T>::N) : p.rows * p.cols;
  // Enough blocks to fill any current GPU several times over; grid-stride for the rest.
  int64_t blocks = (work + threads - 1) / threads;
  if (blocks > 65535) blocks = 65535;
  if (vec)
    epilogue_vec_kernel<T, F><<<(unsigned)blocks, threads, 0, stream>>>(p, f);
  else
    epilogue_scalar_kernel<T, F><<<(unsigned)blocks, threads, 0, stream>>>(p, f);
  return cudaGetLastError();
}

}  // namespace stitch
