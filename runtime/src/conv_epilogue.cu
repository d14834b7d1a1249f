// conv_epilogue.cu — bias and activation applied in place after a convolution whose cuDNN engine
// did not fuse them: one read and one write of y, 16-byte vectors where the layout allows.
#include <algorithm>

#include "conv.hpp"
#include "error.hpp"
#include "stitch/epilogue.cuh"

namespace st {

namespace {

__device__ __forceinline__ float activate(float x, int act) {
  const stitch::EpCtx none{0.f, 0.f};
  switch (act) {
    case ST_ACT_RELU: return stitch::op::relu(x);
    case ST_ACT_GELU_ERF: return stitch::GeluErf{}(x, none);
    case ST_ACT_GELU_TANH: return stitch::GeluTanh{}(x, none);
    case ST_ACT_SILU: return stitch::Silu{}(x, none);
    case ST_ACT_SIGMOID: return stitch::Sigmoid{}(x, none);
    case ST_ACT_TANH: return stitch::op::tanh(x);
    case ST_ACT_RELU6: return stitch::op::clamp(x, 0.f, 6.f);
    default: return x;
  }
}

// Element i has channel (i / inner) % c: inner = spatial (channels-first) or 1 (channels-last).
template <class T>
__global__ void bias_act_scalar(T* y, const T* bias, int64_t total, int64_t inner, int64_t c, int act) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float v = stitch::to_float(y[i]);
    if (bias) v += stitch::to_float(bias[(i / inner) % c]);
    y[i] = stitch::from_float<T>(activate(v, act));
  }
}

// The vector path: a vector never straddles two channels (channels-first, inner % N == 0) or
// covers N consecutive channels from a multiple of N (channels-last, c % N == 0).
template <class T>
__global__ void bias_act_vec(T* y, const T* bias, int64_t total, int64_t inner, int64_t c, int act) {
  constexpr int N = stitch::Vec<T>::N;
  const int64_t vectors = total / N;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = v * N;
    stitch::Vec<T> x = stitch::load_vec(y + i);
    stitch::Vec<T> b;
    const int64_t ch = (i / inner) % c;
    if (bias) {
      if (inner == 1) {
        b = stitch::load_vec(bias + ch);
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) b.v[k] = bias[ch];
      }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float f = stitch::to_float(x.v[k]);
      if (bias) f += stitch::to_float(b.v[k]);
      x.v[k] = stitch::from_float<T>(activate(f, act));
    }
    stitch::store_vec(y + i, x);
  }
}

template <class T>
void launch(void* y_, const void* bias_, int64_t n, int64_t c, int64_t spatial, bool channels_last, int act,
            cudaStream_t stream) {
  T* y = static_cast<T*>(y_);
  const T* bias = static_cast<const T*>(bias_);
  const int64_t total = n * c * spatial;
  if (total == 0) return;
  const int64_t inner = channels_last ? 1 : spatial;
  constexpr int N = stitch::Vec<T>::N;
  const bool vec = stitch::aligned16(y) && (!bias || stitch::aligned16(bias)) && total % N == 0 &&
                   (channels_last ? c % N == 0 : inner % N == 0);
  const int threads = 256;
  const int64_t work = vec ? total / N : total;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((work + threads - 1) / threads, 65535));
  if (vec)
    bias_act_vec<T><<<blocks, threads, 0, stream>>>(y, bias, total, inner, c, act);
  else
    bias_act_scalar<T><<<blocks, threads, 0, stream>>>(y, bias, total, inner, c, act);
  ST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void conv_bias_act(st_dtype dtype, void* y, const void* bias, int64_t n, int64_t c, int64_t spatial,
                   bool channels_last, st_activation act, cudaStream_t stream) {
  switch (dtype) {
    case ST_FLOAT32: launch<float>(y, bias, n, c, spatial, channels_last, act, stream); break;
    case ST_FLOAT16: launch<__half>(y, bias, n, c, spatial, channels_last, act, stream); break;
    case ST_BFLOAT16: launch<__nv_bfloat16>(y, bias, n, c, spatial, channels_last, act, stream); break;
    default: throw Error(ST_ERR_INVALID_ARGUMENT, cat("conv: dtype ", st_dtype_name(dtype), " has no bias/activation pass"));
  }
}

}  // namespace st
