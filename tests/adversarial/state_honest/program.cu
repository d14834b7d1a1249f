// state_honest — HONEST CONTROL: state kept between calls, taken and handed back explicitly.
//
// h' = tanh(x + h / 2), y = 2 h' (references/decay_state.py, whose forward keeps h in self.h):
// the state before the call is the input state_h, the state after it the output h_next
// (manifest "state"). x, state_h, y, h_next: [256, 1024]. Policy fp32.
// Expected verdict: Passed.
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t N = 262144;

const char* kManifest = R"json({
  "name": "state_honest", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [256, 1024]},
              {"name": "state_h", "dtype": "float32", "shape": [256, 1024]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [256, 1024]},
              {"name": "h_next", "dtype": "float32", "shape": [256, 1024]}],
  "weights": []
})json";

// One thread per element: the new state, and the output from it.
__global__ void step_kernel(const float* __restrict__ x, const float* __restrict__ h, float* __restrict__ y,
                            float* __restrict__ h_next, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) {
    float v = tanhf(x[i] + 0.5f * h[i]);
    h_next[i] = v;
    y[i] = 2.f * v;
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "state_honest: expected 0 weight(s) (none)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  p->device = device;
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 2 || n_out != 2) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "state_honest: expected 2 inputs (x, state_h) and 2 outputs (y, h_next)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s[] = {256, 1024};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&in[1], "input state_h", ST_FLOAT32, 2, s, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[1], "output h_next", ST_FLOAT32, 2, s, 1, ST_DEVICE_CUDA));
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  step_kernel<<<(unsigned)((N + 255) / 256), 256, 0, cs>>>(
      static_cast<const float*>(in[0].data), static_cast<const float*>(in[1].data), static_cast<float*>(out[0].data),
      static_cast<float*>(out[1].data), N);
  return cuda_status(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
