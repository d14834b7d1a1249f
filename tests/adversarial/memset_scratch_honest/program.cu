// memset_scratch_honest — HONEST CONTROL: zeroes a scratch buffer and launches on the output in one
// statement.
//
// Same problem as correct/. The relu pass counts the negative elements it clamps into a scratch word
// it zeroes first, and the memset and the launch share one statement
// (if (cudaMemsetAsync(scratch, ...) == cudaSuccess) relu_f4<<<...>>>(..., y)). The output-only-memset
// rule reads where a memset writes, not which names share its statement.
// Expected verdict: Passed.
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 64, D = 256, O = 128;

const char* kManifest = R"json({
  "name": "memset_scratch_honest", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 128]}],
  "weights": [{"name": "fc.weight", "dtype": "float32", "shape": [128, 256]},
              {"name": "fc.bias", "dtype": "float32", "shape": [128]}]
})json";

// relu over n4 float4 vectors, in place, counting the negative elements into *negatives.
__global__ void relu_f4(unsigned* negatives, float4* y, int64_t n4) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = y[i];
    unsigned neg = (v.x < 0.f) + (v.y < 0.f) + (v.z < 0.f) + (v.w < 0.f);
    v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    y[i] = v;
    if (neg) atomicAdd(negatives, neg);
  }
}

}  // namespace

struct st_program {
  int device;
  void* w;
  void* b;
  unsigned* negatives;  // scratch: elements the relu clamped, per call
};

#define TRY(expr)               \
  do {                          \
    st_status s_ = (expr);      \
    if (s_ != ST_OK) return s_; \
  } while (0)

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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "memset_scratch_honest: expected 2 weights (fc.weight, fc.bias)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w[] = {O, D}, s_b[] = {O};
  TRY(st_check_tensor(&w[0], "weights[0] (fc.weight)", ST_FLOAT32, 2, s_w, 1, w[0].device_type));
  TRY(st_check_tensor(&w[1], "weights[1] (fc.bias)", ST_FLOAT32, 1, s_b, 1, w[1].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device, nullptr, nullptr, nullptr};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  st_status s = upload(w[0], &p->w);
  if (s == ST_OK) s = upload(w[1], &p->b);
  if (s == ST_OK) s = st_device_alloc(sizeof(unsigned), nullptr, reinterpret_cast<void**>(&p->negatives));
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "memset_scratch_honest: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {B, D}, s_y[] = {B, O};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));

  // Task linear: covers permute, addmm.
  st_gemm_args g{};
  g.policy = ST_POLICY_FP32;
  g.epilogue = ST_EPI_BIAS;
  g.m = B; g.n = O; g.k = D; g.batch = 1;
  g.a = in[0].data; g.lda = D; g.a_dtype = ST_FLOAT32;
  g.b = p->w; g.ldb = D; g.trans_b = 1; g.b_dtype = ST_FLOAT32;
  g.out = out[0].data; g.ldo = O; g.out_dtype = ST_FLOAT32;
  g.bias = p->b;
  g.alpha = 1.f;
  TRY(st_gemm(&g, stream));

  // Task relu: covers relu.
  const int64_t n4 = B * O / 4;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (cudaMemsetAsync(p->negatives, 0, sizeof(unsigned), s) == cudaSuccess)
    relu_f4<<<(unsigned)((n4 + 255) / 256), 256, 0, s>>>(p->negatives, static_cast<float4*>(out[0].data), n4);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
    return ST_ERR_CUDA;
  }
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_device_free(p->w, nullptr);
  st_device_free(p->b, nullptr);
  st_device_free(p->negatives, nullptr);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
