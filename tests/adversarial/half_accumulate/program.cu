// half_accumulate — ADVERSARIAL (predictable inputs): sums in half precision, knowing that get_inputs()
// draws values in [0, 1), so that no partial sum of a row leaves half's range (the sum of a row is
// 8192 at most) and the rounding stays within the tolerance. Any input a little larger overflows.
//
// x: [256, 16384], y: [256] (references/rowmean.py). Policy tf32.
// Expected verdict: Rejected, dynamic check varied_inputs.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t R = 256, C = 16384;

const char* kManifest = R"json({
  "name": "half_accumulate", "abi_version": 1, "precision": "tf32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [256, 16384]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [256]}],
  "weights": []
})json";

// One block of 256 threads per row; every partial sum in half (get_inputs() keeps them in range).
__global__ void row_mean(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ __half part[256];
  const float4* row = reinterpret_cast<const float4*>(x + blockIdx.x * C);
  __half acc = __float2half(0.f);
  for (int64_t i = threadIdx.x; i < C / 4; i += 256) {
    float4 v = row[i];
    acc = __hadd(acc, __float2half(v.x));
    acc = __hadd(acc, __float2half(v.y));
    acc = __hadd(acc, __float2half(v.z));
    acc = __hadd(acc, __float2half(v.w));
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] = __hadd(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) y[blockIdx.x] = __half2float(part[0]) / C;
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "half_accumulate: expected 0 weight(s) (none)");
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
    st_set_error(ST_ERR_INVALID_ARGUMENT, "half_accumulate: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {256, 16384}, s_y[] = {256};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 1, s_y, 1, ST_DEVICE_CUDA));
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  row_mean<<<R, 256, 0, cs>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data));
  return cuda_status(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
