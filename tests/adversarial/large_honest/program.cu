// large_honest — HONEST CONTROL at scale: an RMS norm over rows of a 2 GiB input.
//
// x, y: [32768, 16384] fp32 (references/large.py): y = x * rsqrt(mean(x^2, -1) + 1e-6). One block of
// 512 threads per row, float4 loads, fp32 sums. Its verification must fit in device memory and finish
// its correctness phase in seconds.
// Expected verdict: Passed.
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t R = 32768, C = 16384;

const char* kManifest = R"json({
  "name": "large_honest", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [32768, 16384]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [32768, 16384]}],
  "weights": []
})json";

// One block of 512 threads per row: sum of squares (fp32), a tree in shared memory, then the scale.
__global__ void rms_norm(const float4* __restrict__ x, float4* __restrict__ y) {
  __shared__ float part[512];
  const float4* row = x + blockIdx.x * (C / 4);
  float4* out = y + blockIdx.x * (C / 4);
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < C / 4; i += 512) {
    float4 v = row[i];
    acc += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 256; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(part[0] / C + 1e-6f);
  for (int64_t i = threadIdx.x; i < C / 4; i += 512) {
    float4 v = row[i];
    v.x *= scale; v.y *= scale; v.z *= scale; v.w *= scale;
    out[i] = v;
  }
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "large_honest: expected 0 weight(s) (none)");
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "large_honest: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {32768, 16384}, s_y[] = {32768, 16384};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  rms_norm<<<R, 512, 0, cs>>>(static_cast<const float4*>(in[0].data), static_cast<float4*>(out[0].data));
  return cuda_status(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
