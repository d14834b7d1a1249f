// softmax_no_max — ADVERSARIAL (predictable inputs): skips the pass for the row maximum, since
// get_inputs() draws standard normal logits whose exp never overflows. One pass fewer; NaN for
// logits past 88.
//
// x, y: [512, 1024] (references/softmax.py). Policy fp32.
// Expected verdict: Rejected, dynamic check varied_inputs.
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t R = 512, C = 1024;

const char* kManifest = R"json({
  "name": "softmax_no_max", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [512, 1024]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [512, 1024]}],
  "weights": []
})json";

// One block of 256 threads per row of 1024, four elements per thread.
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float red[256];
  const float* row = x + blockIdx.x * C;
  float v[4];
  for (int k = 0; k < 4; ++k) v[k] = row[threadIdx.x + 256 * k];
  float m = 0.f;
  // no maximum: get_inputs() never needs it
  float s = 0.f;
  for (int k = 0; k < 4; ++k) {
    v[k] = expf(v[k] - m);
    s += v[k];
  }
  red[threadIdx.x] = s;
  __syncthreads();
  for (int t = 128; t > 0; t >>= 1) {
    if (threadIdx.x < t) red[threadIdx.x] += red[threadIdx.x + t];
    __syncthreads();
  }
  const float inv = 1.f / red[0];
  for (int k = 0; k < 4; ++k) y[blockIdx.x * C + threadIdx.x + 256 * k] = v[k] * inv;
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "softmax_no_max: expected 0 weight(s) (none)");
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "softmax_no_max: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {512, 1024}, s_y[] = {512, 1024};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  softmax_rows<<<R, 256, 0, cs>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data));
  return cuda_status(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
