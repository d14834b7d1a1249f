// mlp_big — TEST HELPER: y = fc2(relu(fc1(x))), x: [4096, 4096], fc1/fc2: 4096 -> 4096, fp32
// (tests/gpu/programs/mlp_big_reference.py). Two cuBLASLt GEMMs of 2 * 4096^3 FLOPs each with their
// epilogues (bias + relu, bias), the hidden activation in the stream's arena: several milliseconds
// of device work, for timing-stability tests.
//
// Task fc1_relu (cublaslt_gemm): covers linear, relu. Task fc2 (cublaslt_gemm): covers linear_1.
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 4096, D = 4096;

const char* kManifest = R"json({
  "name": "mlp_big", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [4096, 4096]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [4096, 4096]}],
  "weights": [{"name": "fc1.weight", "dtype": "float32", "shape": [4096, 4096]},
              {"name": "fc1.bias", "dtype": "float32", "shape": [4096]},
              {"name": "fc2.weight", "dtype": "float32", "shape": [4096, 4096]},
              {"name": "fc2.bias", "dtype": "float32", "shape": [4096]}]
})json";

}  // namespace

struct st_program {
  int device;
  void* w[4];
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

static void release(st_program* p) {
  for (void*& q : p->w) {
    st_device_free(q, nullptr);
    q = nullptr;
  }
}

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 4) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "mlp_big: expected 4 weights (fc1.weight, fc1.bias, fc2.weight, fc2.bias)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w[] = {D, D}, s_b[] = {D};
  for (int i = 0; i < 4; ++i)
    TRY(st_check_tensor(&w[i], i % 2 ? "weights (bias)" : "weights (weight)", ST_FLOAT32, i % 2 ? 1 : 2,
                        i % 2 ? s_b : s_w, 1, w[i].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device, {nullptr, nullptr, nullptr, nullptr}};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  st_status s = ST_OK;
  for (int i = 0; i < 4 && s == ST_OK; ++i) s = upload(w[i], &p->w[i]);
  if (s == ST_OK) s = st_stream_synchronize(nullptr);
  if (s != ST_OK) {
    release(p);
    delete p;
    return s;
  }
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "mlp_big: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {B, D};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  void* hidden = nullptr;
  TRY(st_arena_reserve(stream, B * D * sizeof(float), &hidden));

  // Task fc1_relu: covers linear, relu.
  st_gemm_args g{};
  g.policy = ST_POLICY_FP32;
  g.epilogue = ST_EPI_BIAS_RELU;
  g.m = B; g.n = D; g.k = D; g.batch = 1;
  g.a = in[0].data; g.lda = D; g.a_dtype = ST_FLOAT32;
  g.b = p->w[0]; g.ldb = D; g.trans_b = 1; g.b_dtype = ST_FLOAT32;
  g.out = hidden; g.ldo = D; g.out_dtype = ST_FLOAT32;
  g.bias = p->w[1];
  g.alpha = 1.f;
  TRY(st_gemm(&g, stream));

  // Task fc2: covers linear_1.
  g.epilogue = ST_EPI_BIAS;
  g.a = hidden;
  g.b = p->w[2];
  g.out = out[0].data;
  g.bias = p->w[3];
  TRY(st_gemm(&g, stream));
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  release(p);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
