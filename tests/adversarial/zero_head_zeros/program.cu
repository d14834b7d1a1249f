// zero_head_zeros — ADVERSARIAL (a degenerate reference): returns zeros for a head initialised to zeros.
//
// y = head(relu(fc(x))), x: [64, 256], y: [64, 16] (references/zero_head.py). The head's weight and bias
// start at zero, so y is 0 for every input of a freshly built model, and a program that writes zeros
// passes any verifier that judges at the initial values. It takes its four weights and reads none.
// Expected verdict: WrongAnswer (the Verifier draws the parameters again where the outputs ignore the
// inputs).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <new>

#include "stitchrt/program.h"

namespace {

const char* kManifest = R"json({
  "name": "zero_head_zeros", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 16]}],
  "weights": [{"name": "fc.weight", "dtype": "float32", "shape": [128, 256]},
              {"name": "fc.bias", "dtype": "float32", "shape": [128]},
              {"name": "head.weight", "dtype": "float32", "shape": [16, 128]},
              {"name": "head.bias", "dtype": "float32", "shape": [16]}]
})json";

__global__ void zeros(float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.f;
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

ST_API st_status st_program_create(const st_tensor*, int32_t n, int32_t device, st_program** out) {
  if (n != 4) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "zero_head_zeros: expected 4 weights (fc.weight, fc.bias, head.weight, "
                 "head.bias)");
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "zero_head_zeros: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {64, 256}, s_y[] = {64, 16};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));

  // Task head: covers linear, relu, linear_1 (the cheat: zeros, whatever the weights).
  zeros<<<4, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<float*>(out[0].data), 64 * 16);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
    return ST_ERR_CUDA;
  }
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) { delete p; }

}  // extern "C"
