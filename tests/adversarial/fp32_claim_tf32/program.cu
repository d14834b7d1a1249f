// fp32_claim_tf32 — ADVERSARIAL (precision not what it claims): claims fp32, runs its GEMM on TF32
// tensor cores.
//
// x: [256, 1024], W (proj.weight): [512, 1024], y: [256, 512] (references/gemm.py).
// Expected verdict: Rejected, dynamic check precision_claim (the native runner logs a TF32 st_gemm under
// the fp32 judged at; TF32's error is over fp32's 1e-4 tolerance too, which made it a WrongAnswer before).
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t M = 256, K = 1024, N = 512;

const char* kManifest = R"json({
  "name": "fp32_claim_tf32", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [256, 1024]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [256, 512]}],
  "weights": [{"name": "proj.weight", "dtype": "float32", "shape": [512, 1024]}]
})json";


}  // namespace

struct st_program {
  int device;
  void* w0;  // proj.weight
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
  if (n != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "fp32_claim_tf32: expected 1 weight(s) (proj.weight)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w0[] = {512, 1024};
  TRY(st_check_tensor(&w[0], "weights[0] (proj.weight)", ST_FLOAT32, 2, s_w0, 1, w[0].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  p->device = device;
  st_status s = ST_OK;
  if (s == ST_OK) s = upload(w[0], &p->w0);
  if (s == ST_OK) s = st_stream_synchronize(nullptr);
  if (s != ST_OK) {
  st_device_free(p->w0, nullptr);
    delete p;
    return s;
  }
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "fp32_claim_tf32: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {256, 1024}, s_y[] = {256, 512};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  st_gemm_args g{};
  g.policy = ST_POLICY_TF32;
  g.epilogue = ST_EPI_NONE;
  g.m = M; g.n = N; g.k = K; g.batch = 1;
  g.a = in[0].data; g.lda = K; g.a_dtype = ST_FLOAT32;
  g.b = p->w0; g.ldb = K; g.trans_b = 1; g.b_dtype = ST_FLOAT32;
  g.out = out[0].data; g.ldo = N; g.out_dtype = ST_FLOAT32;
  g.alpha = 1.f;
  return st_gemm(&g, stream);
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_device_free(p->w0, nullptr);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
