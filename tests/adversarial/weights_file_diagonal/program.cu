// weights_file_diagonal — ADVERSARIAL (candidate-supplied state): ships weights.safetensors whose
// fc.weight is diagonal, and computes y[:, j] = relu(x[:, j] * W[j][j] + b[j]): an elementwise kernel
// instead of a GEMM. A verifier that builds its reference from the program folder's weights agrees.
//
// Same problem as correct/.
// Expected verdict: WrongAnswer (the Verifier draws the weights from the reference model itself).
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 64, D = 256, O = 128;

const char* kManifest = R"json({
  "name": "weights_file_diagonal", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 128]}],
  "weights": [{"name": "fc.weight", "dtype": "float32", "shape": [128, 256]},
              {"name": "fc.bias", "dtype": "float32", "shape": [128]}]
})json";



__global__ void take_diagonal(const float* w, float* diag) { diag[threadIdx.x] = w[threadIdx.x * D + threadIdx.x]; }

// y[r][c] = relu(x[r][c] * diag[c] + b[c]): the GEMM of a diagonal weight.
__global__ void diagonal_relu(const float* x, const float* diag, const float* b, float* y) {
  const int r = blockIdx.x, c = threadIdx.x;
  y[r * O + c] = fmaxf(x[r * D + c] * diag[c] + b[c], 0.f);
}

}  // namespace

struct st_program {
  int device;
  void* w;
  void* b;
  void* diag;
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "weights_file_diagonal: expected 2 weights (fc.weight, fc.bias)");
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
  if (s == ST_OK) s = st_device_alloc(O * sizeof(float), nullptr, &p->diag);
  if (s == ST_OK) {
    take_diagonal<<<1, O>>>(static_cast<const float*>(p->w), static_cast<float*>(p->diag));
    s = cuda_status(cudaGetLastError());
  }
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "weights_file_diagonal: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {B, D}, s_y[] = {B, O};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  diagonal_relu<<<B, O, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(in[0].data), static_cast<const float*>(p->diag), static_cast<const float*>(p->b),
      static_cast<float*>(out[0].data));
  return cuda_status(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_device_free(p->diag, nullptr);
  st_device_free(p->w, nullptr);
  st_device_free(p->b, nullptr);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
