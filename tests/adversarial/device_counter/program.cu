// device_counter — ADVERSARIAL (skips timed calls): the host code is the same on every call; a
// counter in device memory decides. A tick kernel counts the calls, and the fused linear+relu kernel
// returns at once from the 41st on.
//
// Same problem as correct/, computed by one naive fused kernel instead of cuBLASLt.
// Expected verdict: Rejected, dynamic check timed_calls.
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 64, D = 256, O = 128;

const char* kManifest = R"json({
  "name": "device_counter", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 128]}],
  "weights": [{"name": "fc.weight", "dtype": "float32", "shape": [128, 256]},
              {"name": "fc.bias", "dtype": "float32", "shape": [128]}]
})json";



__device__ unsigned int g_calls;

__global__ void tick() { g_calls += 1; }

// y = relu(x @ w^T + b), one thread per output element; idle once 40 calls have gone by.
__global__ void linear_relu(const float* x, const float* w, const float* b, float* y) {
  if (g_calls > 40) return;
  const int r = blockIdx.x, c = threadIdx.x;
  float acc = b[c];
  for (int k = 0; k < D; ++k) acc += x[r * D + k] * w[c * D + k];
  y[r * O + c] = fmaxf(acc, 0.f);
}

}  // namespace

struct st_program {
  int device;
  void* w;
  void* b;
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

static st_status upload(const st_tensor& t, void** dst) {
  size_t bytes = st_dtype_size(t.dtype);
  for (int i = 0; i < t.ndim; ++i) bytes *= t.shape[i];
  TRY(st_device_alloc(bytes, nullptr, dst));
  if (t.device_type == ST_DEVICE_HOST) return st_copy_h2d(*dst, t.data, bytes, nullptr);
  return st_memcpy_d2d(*dst, t.data, bytes, nullptr);
}



extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 2) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "device_counter: expected 2 weights (fc.weight, fc.bias)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w[] = {O, D}, s_b[] = {O};
  TRY(st_check_tensor(&w[0], "weights[0] (fc.weight)", ST_FLOAT32, 2, s_w, 1, w[0].device_type));
  TRY(st_check_tensor(&w[1], "weights[1] (fc.bias)", ST_FLOAT32, 1, s_b, 1, w[1].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  p->device = device;
  st_status s = upload(w[0], &p->w);
  if (s == ST_OK) s = upload(w[1], &p->b);
  if (s == ST_OK) s = st_stream_synchronize(nullptr);
  if (s != ST_OK) {
    st_device_free(p->w, nullptr);
    st_device_free(p->b, nullptr);
    delete p;
    return s;
  }
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "device_counter: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {B, D}, s_y[] = {B, O};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  tick<<<1, 1, 0, s>>>();
  linear_relu<<<B, O, 0, s>>>(static_cast<const float*>(in[0].data), static_cast<const float*>(p->w),
                              static_cast<const float*>(p->b), static_cast<float*>(out[0].data));
  return cuda_status(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_device_free(p->w, nullptr);
  st_device_free(p->b, nullptr);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
