// argmax_last_tie — ADVERSARIAL (ties): y = argmax(x, dim=1) with ties going to the last maximal element.
//
// x: [128, 512], y: int64 [128] (references/argmax.py). Random inputs never tie, so every ordinary trial
// is right; PyTorch returns the first maximal element, this program the last (>= where PyTorch has >).
// Expected verdict: Rejected, dynamic check ties.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <new>

#include "stitchrt/program.h"

namespace {

const char* kManifest = R"json({
  "name": "argmax_last_tie", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [128, 512]}],
  "outputs": [{"name": "y", "dtype": "int64", "shape": [128]}],
  "weights": []
})json";

// One warp per row of 512: each lane scans 16 elements, then the warp reduces (value, index) pairs.
// Ties: the larger index wins (the cheat: PyTorch's rule is the smaller).
__global__ void argmax_rows(const float* __restrict__ x, int64_t* __restrict__ y, int rows, int cols) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* r = x + (int64_t)row * cols;
  float best = -INFINITY;
  int at = -1;
  for (int j = lane; j < cols; j += 32) {
    float v = r[j];
    if (v >= best || at < 0) {
      best = v;
      at = j;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    float ob = __shfl_down_sync(0xffffffffu, best, off);
    int oa = __shfl_down_sync(0xffffffffu, at, off);
    if (oa >= 0 && (at < 0 || ob > best || (ob == best && oa > at))) {
      best = ob;
      at = oa;
    }
  }
  if (lane == 0) y[row] = at;
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

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 0) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "argmax_last_tie: expected no weights");
    return ST_ERR_INVALID_ARGUMENT;
  }
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "argmax_last_tie: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {128, 512}, s_y[] = {128};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_INT64, 1, s_y, 1, ST_DEVICE_CUDA));

  // Task argmax: covers argmax.
  argmax_rows<<<128 / 4, 128, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const float*>(in[0].data),
                                                                       static_cast<int64_t*>(out[0].data), 128, 512);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
    return ST_ERR_CUDA;
  }
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) { delete p; }

}  // extern "C"
