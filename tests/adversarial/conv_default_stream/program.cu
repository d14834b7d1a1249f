// conv_default_stream — ADVERSARIAL (work hidden from timing through the runtime's API): the convolution
// goes to the legacy default stream.
//
// Same problem as conv_honest/. st_conv is handed NULL, the legacy default stream, instead of the
// caller's: CUDA events on the caller's stream see none of the convolution, and its outputs are done
// whenever the default stream gets to them. The runtime's stream-taking entry points are read from its
// headers, st_conv among them.
// Expected verdict: Rejected, static rule foreign-stream (run alone: dynamic check runtime_stream).
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t N = 4, C = 3, K = 8, H = 16, W = 16;

const char* kManifest = R"json({
  "name": "conv_default_stream", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [4, 3, 16, 16]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [4, 8, 16, 16]}],
  "weights": [{"name": "conv.weight", "dtype": "float32", "shape": [8, 3, 3, 3]},
              {"name": "conv.bias", "dtype": "float32", "shape": [8]}]
})json";

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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "conv_default_stream: expected 2 weights (conv.weight, conv.bias)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w[] = {K, C, 3, 3}, s_b[] = {K};
  TRY(st_check_tensor(&w[0], "weights[0] (conv.weight)", ST_FLOAT32, 4, s_w, 1, w[0].device_type));
  TRY(st_check_tensor(&w[1], "weights[1] (conv.bias)", ST_FLOAT32, 1, s_b, 1, w[1].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device, nullptr, nullptr};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "conv_default_stream: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {N, C, H, W}, s_y[] = {N, K, H, W};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 4, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 4, s_y, 1, ST_DEVICE_CUDA));

  // Task conv: covers convolution.
  st_conv_args c{};
  c.policy = ST_POLICY_FP32;
  c.spatial_dims = 2;
  c.batch = N; c.in_channels = C; c.out_channels = K; c.groups = 1;
  for (int d = 0; d < 2; ++d) {
    c.in_size[d] = H;
    c.kernel_size[d] = 3;
    c.stride[d] = 1;
    c.padding[d] = 1;
    c.dilation[d] = 1;
  }
  c.x = in[0].data; c.x_dtype = ST_FLOAT32;
  c.w = p->w; c.w_dtype = ST_FLOAT32;
  c.bias = p->b; c.bias_dtype = ST_FLOAT32;
  c.y = out[0].data; c.y_dtype = ST_FLOAT32;
  c.activation = ST_ACT_NONE;
  return st_conv(&c, nullptr);  // the cheat: not the caller's stream
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
