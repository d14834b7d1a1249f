// scan_honest — HONEST CONTROL: the last state of a decaying scan over every one of its 2048 steps.
//
// y[b, f] = sum_t 0.995^(2047 - t) x[b, t, f], x: [32, 2048, 64], y: [32, 64] (references/decay_scan.py),
// judged at tf32.
// Expected verdict: Passed.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <new>

#include "stitchrt/program.h"

namespace {

const char* kManifest = R"json({
  "name": "scan_honest", "abi_version": 1, "precision": "tf32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [32, 2048, 64]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [32, 64]}],
  "weights": []
})json";

// y[b, f] = sum over steps t 0..2047 of 0.995^(2047 - t) x[b, t, f]: one thread per (b, f), the weight
// carried down from the last step (fp32; the decay is the model's constant, from get_init_inputs()).
__global__ void decay_scan(const float* __restrict__ x, float* __restrict__ y) {
  int b = blockIdx.x, f = threadIdx.x;  // 32 blocks of 64 threads
  const float* xb = x + (int64_t)b * 2048 * 64 + f;
  float acc = 0.f, w = 1.f;
  for (int t = 2047; t >= 0; --t) {
    acc += w * xb[(int64_t)t * 64];
    w *= 0.995f;
  }
  y[b * 64 + f] = acc;
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "scan_honest: expected no weights");
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "scan_honest: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {32, 2048, 64}, s_y[] = {32, 64};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 3, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));

  // Task scan: covers pow_1, bmm.
  decay_scan<<<32, 64, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const float*>(in[0].data),
                                                              static_cast<float*>(out[0].data));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
    return ST_ERR_CUDA;
  }
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) { delete p; }

}  // extern "C"
