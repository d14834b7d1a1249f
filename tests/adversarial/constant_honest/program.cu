// constant_honest — HONEST CONTROL: y = x - x + 1, which no input moves.
//
// x: [64, 256], y: [64, 256] (references/constant.py). Right, and proves nothing: the verdict passes and
// says so.
// Expected verdict: Passed, marked degenerate: outputs independent of inputs.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <new>

#include "stitchrt/program.h"

namespace {

const char* kManifest = R"json({
  "name": "constant_honest", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 256]}],
  "weights": []
})json";

__global__ void x_minus_x_plus_one(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = (x[i] - x[i]) + 1.f;
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
  if (n != 0) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "constant_honest: expected no weights");
    return ST_ERR_INVALID_ARGUMENT;
  }
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "constant_honest: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {64, 256}, s_y[] = {64, 256};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));

  // Task ones: covers sub, add.
  x_minus_x_plus_one<<<64, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), 64 * 256);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
    return ST_ERR_CUDA;
  }
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) { delete p; }

}  // extern "C"
