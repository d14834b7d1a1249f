// norm_assumes_init — ADVERSARIAL (parameters never varied): a LayerNorm that skips its weight and bias.
//
// y = LayerNorm(x) with x: [256, 1024] (references/norm.py). PyTorch initialises the norm's weight to ones
// and its bias to zeros, so y = (x - mean) / sqrt(var + eps) is exactly right at the initial values:
// this program takes both weights (its manifest lists them) and never reads them. Right on every input
// of a freshly built model; wrong on any trained one.
// Expected verdict: WrongAnswer (the Verifier draws the weights away from their initial values).
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t R = 256, C = 1024;

const char* kManifest = R"json({
  "name": "norm_assumes_init", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [256, 1024]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [256, 1024]}],
  "weights": [{"name": "norm.weight", "dtype": "float32", "shape": [1024]},
              {"name": "norm.bias", "dtype": "float32", "shape": [1024]}]
})json";

// One block of 256 threads per row: mean and variance in two passes over shared partial sums.
__global__ void layer_norm_plain(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float part[256];
  const float* row = x + blockIdx.x * C;
  float s = 0.f;
  for (int j = threadIdx.x; j < C; j += blockDim.x) s += row[j];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  const float mean = part[0] / C;
  __syncthreads();
  float v = 0.f;
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    float d = row[j] - mean;
    v += d * d;
  }
  part[threadIdx.x] = v;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  const float inv = rsqrtf(part[0] / C + 1e-5f);
  for (int j = threadIdx.x; j < C; j += blockDim.x) y[blockIdx.x * C + j] = (row[j] - mean) * inv;  // no w, no b
}

}  // namespace

struct st_program {
  int device;
};

#define TRY(expr)               \
  do {                          \
    st_status s_ = (expr);      \
    if (s_ != ST_OK) return s_; \
  } while (0)

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 2) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "norm_assumes_init: expected 2 weights (norm.weight, norm.bias)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w[] = {C};
  TRY(st_check_tensor(&w[0], "weights[0] (norm.weight)", ST_FLOAT32, 1, s_w, 1, w[0].device_type));
  TRY(st_check_tensor(&w[1], "weights[1] (norm.bias)", ST_FLOAT32, 1, s_w, 1, w[1].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device};  // the cheat: the weights are never kept
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "norm_assumes_init: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {R, C};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));

  // Task norm: covers native_layer_norm.
  layer_norm_plain<<<(unsigned)R, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
    return ST_ERR_CUDA;
  }
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) { delete p; }

}  // extern "C"
