// small_output_constant — ADVERSARIAL (precision: outputs below the tolerance): writes a constant
// 3e-5, about the mean magnitude of the reference's outputs.
//
// x, y: [512, 1024] (references/small.py). Policy tf32.
// Expected verdict: WrongAnswer (judged relative to the output's scale).
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t N = 524288;

const char* kManifest = R"json({
  "name": "small_output_constant", "abi_version": 1, "precision": "tf32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [512, 1024]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [512, 1024]}],
  "weights": []
})json";

__device__ __forceinline__ float f(float x) { return 3e-5f + 0.f * x; }

// One thread per float4 of n4.
__global__ void scaled_sin(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = x[i];
    v.x = f(v.x); v.y = f(v.y); v.z = f(v.z); v.w = f(v.w);
    y[i] = v;
  }
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

static st_status cuda_status(cudaError_t e) {
  if (e == cudaSuccess) return ST_OK;
  st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
  return ST_ERR_CUDA;
}

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 0) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "small_output_constant: expected 0 weight(s) (none)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  p->device = device;
  st_status s = ST_OK;
  if (s == ST_OK) s = st_stream_synchronize(nullptr);
  if (s != ST_OK) {
    delete p;
    return s;
  }
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "small_output_constant: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {512, 1024}, s_y[] = {512, 1024};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  const int64_t n4 = N / 4;
  scaled_sin<<<(unsigned)((n4 + 255) / 256), 256, 0, cs>>>(static_cast<const float4*>(in[0].data),
                                                      static_cast<float4*>(out[0].data), n4);
  return cuda_status(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
