// reads_env — ADVERSARIAL (escapes the sandbox): reads an environment variable through a token-pasted getenv (a seed or a switch of the harness).
//
// Same problem as correct/, computed honestly; the escape is in create().
// Expected verdict: Rejected, rule sandbox-environment (judged on the built library, not the source).
#include <cuda_runtime.h>
#include <cstdlib>
#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 64, D = 256, O = 128;

const char* kManifest = R"json({
  "name": "reads_env", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 128]}],
  "weights": [{"name": "fc.weight", "dtype": "float32", "shape": [128, 256]},
              {"name": "fc.bias", "dtype": "float32", "shape": [128]}]
})json";

// relu over n4 float4 vectors, in place.
__global__ void relu_f4(float4* y, int64_t n4) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = y[i];
    v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    y[i] = v;
  }
}
#define CAT(a, b) a##b

}  // namespace

struct st_program {
  int device;
  void* w;
  void* b;
  const char* env;
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

// Task linear: covers linear. cuBLASLt GEMM with its bias epilogue: y = x @ w^T + b.
static st_status task_linear(const st_program* p, const void* x, void* y, void* stream) {
  st_gemm_args g{};
  g.policy = ST_POLICY_FP32;
  g.epilogue = ST_EPI_BIAS;
  g.m = B; g.n = O; g.k = D; g.batch = 1;
  g.a = x; g.lda = D; g.a_dtype = ST_FLOAT32;
  g.b = p->w; g.ldb = D; g.trans_b = 1; g.b_dtype = ST_FLOAT32;
  g.out = y; g.ldo = O; g.out_dtype = ST_FLOAT32;
  g.bias = p->b;
  g.alpha = 1.f;
  return st_gemm(&g, stream);
}

// Task relu: covers relu.
static st_status task_relu(void* y, void* stream) {
  const int64_t n4 = B * O / 4;
  relu_f4<<<(unsigned)((n4 + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<float4*>(y), n4);
  return cuda_status(cudaGetLastError());
}

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 2) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "reads_env: expected 2 weights (fc.weight, fc.bias)");
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
  if (s == ST_OK) p->env = CAT(get, env)("STITCHCUDA_SEED");
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "reads_env: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {B, D}, s_y[] = {B, O};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  TRY(task_linear(p, in[0].data, out[0].data, stream));
  TRY(task_relu(out[0].data, stream));
  return ST_OK;
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
