// masked_honest — HONEST CONTROL: y = x @ mask^T with the reference's lower-triangular mask, a buffer
// registered with persistent=False (not in state_dict()): the Verifier hands it over as a weight like
// any parameter.
//
// x: [128, 256], mask: [256, 256], y: [128, 256] (references/masked.py). Policy fp32.
// Expected verdict: Passed.
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t M = 128, K = 256, N = 256;

const char* kManifest = R"json({
  "name": "masked_honest", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [128, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [128, 256]}],
  "weights": [{"name": "mask", "dtype": "float32", "shape": [256, 256]}]
})json";


}  // namespace

struct st_program {
  int device;
  void* w0;  // mask
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "masked_honest: expected 1 weight(s) (mask)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w0[] = {256, 256};
  TRY(st_check_tensor(&w[0], "weights[0] (mask)", ST_FLOAT32, 2, s_w0, 1, w[0].device_type));
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "masked_honest: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {128, 256}, s_y[] = {128, 256};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  st_gemm_args g{};
  g.policy = ST_POLICY_FP32;
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
