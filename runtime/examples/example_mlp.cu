// example_mlp.cu — a hand-written stitchcuda program on the program ABI (stitchrt/program.h).
//
//   y = relu(x @ w1^T + b1) @ w2^T + b2        x: [64, 256]  w1: [512, 256]  w2: [128, 512]
//
// It shows what every generated program does: check descriptors against the manifest, copy
// weights to the device once at create time, take intermediates from the stream's arena, and
// launch everything on the caller's stream. Policy fp32. Build:
//   nvcc -shared -Xcompiler -fPIC -arch=sm_90 -I<stitchcuda>/include example_mlp.cu \
//        -L<stitchcuda>/lib -lstitchrt -o example_mlp.so
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 64, D = 256, H = 512, O = 128;

const char* kManifest = R"json({
  "name": "example_mlp",
  "abi_version": 1,
  "precision": "fp32",
  "inputs":  [{"name": "x",  "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y",  "dtype": "float32", "shape": [64, 128]}],
  "weights": [{"name": "w1", "dtype": "float32", "shape": [512, 256]},
              {"name": "b1", "dtype": "float32", "shape": [512]},
              {"name": "w2", "dtype": "float32", "shape": [128, 512]},
              {"name": "b2", "dtype": "float32", "shape": [128]}]
})json";

}  // namespace

struct st_program {
  int device;
  void* w1; void* b1; void* w2; void* b2;
};

#define TRY(expr)                       \
  do {                                  \
    st_status s_ = (expr);              \
    if (s_ != ST_OK) return s_;         \
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
  if (n != 4) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "example_mlp: expected 4 weights (w1, b1, w2, b2)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w1[] = {H, D}, s_b1[] = {H}, s_w2[] = {O, H}, s_b2[] = {O};
  TRY(st_check_tensor(&w[0], "weights[0] (w1)", ST_FLOAT32, 2, s_w1, 1, w[0].device_type));
  TRY(st_check_tensor(&w[1], "weights[1] (b1)", ST_FLOAT32, 1, s_b1, 1, w[1].device_type));
  TRY(st_check_tensor(&w[2], "weights[2] (w2)", ST_FLOAT32, 2, s_w2, 1, w[2].device_type));
  TRY(st_check_tensor(&w[3], "weights[3] (b2)", ST_FLOAT32, 1, s_b2, 1, w[3].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device, nullptr, nullptr, nullptr, nullptr};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  st_status s = ST_OK;
  if (s == ST_OK) s = upload(w[0], &p->w1);
  if (s == ST_OK) s = upload(w[1], &p->b1);
  if (s == ST_OK) s = upload(w[2], &p->w2);
  if (s == ST_OK) s = upload(w[3], &p->b2);
  if (s == ST_OK) s = st_stream_synchronize(nullptr);
  if (s != ST_OK) {
    st_device_free(p->w1, nullptr); st_device_free(p->b1, nullptr);
    st_device_free(p->w2, nullptr); st_device_free(p->b2, nullptr);
    delete p;
    return s;
  }
  *out = p;
  return ST_OK;
}

// Task linear1_relu: covers fc1 (addmm) and relu.   Task linear2: covers fc2 (addmm).
ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "example_mlp: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {B, D}, s_y[] = {B, O};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  void* arena = nullptr;
  TRY(st_arena_reserve(stream, B * H * sizeof(float), &arena));

  st_gemm_args g{};
  g.policy = ST_POLICY_FP32;
  g.epilogue = ST_EPI_BIAS_RELU;
  g.m = B; g.n = H; g.k = D; g.batch = 1;
  g.a = in[0].data; g.lda = D; g.a_dtype = ST_FLOAT32;
  g.b = p->w1; g.ldb = D; g.trans_b = 1; g.b_dtype = ST_FLOAT32;
  g.out = arena; g.ldo = H; g.out_dtype = ST_FLOAT32;
  g.bias = p->b1;
  g.alpha = 1.f;
  TRY(st_gemm(&g, stream));

  g.epilogue = ST_EPI_BIAS;
  g.n = O; g.k = H;
  g.a = arena; g.lda = H;
  g.b = p->w2; g.ldb = H;
  g.out = out[0].data; g.ldo = O;
  g.bias = p->b2;
  TRY(st_gemm(&g, stream));
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_device_free(p->w1, nullptr); st_device_free(p->b1, nullptr);
  st_device_free(p->w2, nullptr); st_device_free(p->b2, nullptr);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
