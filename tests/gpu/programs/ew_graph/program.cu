// ew_graph — TEST HELPER: y = tanh(2 relu(x) + 1) + x on 8192x8192 fp32 (tests/gpu/programs/ew_reference.py),
// the four kernels of ew_plain captured into a CUDA graph on the run's own stream and replayed with
// cudaGraphLaunch. The graph lives in st_program; when the run's buffers differ from the ones it was
// captured with, it is captured again and the executable graph updated (cudaGraphExecUpdate), so
// the kernels always read this call's input and write this call's output. Called on a stream the
// caller is capturing, it launches the four kernels into that capture instead.
#include <cuda_runtime.h>

#include <cstdint>
#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t R = 8192, C = 8192, N = R * C;

const char* kManifest = R"json({
  "name": "ew_graph", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [8192, 8192]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [8192, 8192]}],
  "weights": []
})json";

// One kernel per task, named after it; float4 over n4 vectors (N is a multiple of 4).
__global__ void relu_kernel(const float4* __restrict__ x, float4* __restrict__ a, int64_t n4) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = x[i];
    v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    a[i] = v;
  }
}

__global__ void affine_kernel(const float4* __restrict__ a, float4* __restrict__ b, int64_t n4) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = a[i];
    v.x = v.x * 2.f + 1.f; v.y = v.y * 2.f + 1.f; v.z = v.z * 2.f + 1.f; v.w = v.w * 2.f + 1.f;
    b[i] = v;
  }
}

__global__ void tanh_kernel(const float4* __restrict__ b, float4* __restrict__ c, int64_t n4) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = b[i];
    v.x = tanhf(v.x); v.y = tanhf(v.y); v.z = tanhf(v.z); v.w = tanhf(v.w);
    c[i] = v;
  }
}

__global__ void residual_kernel(const float4* __restrict__ c, const float4* __restrict__ x, float4* __restrict__ y,
                                int64_t n4) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 u = c[i], v = x[i];
    u.x += v.x; u.y += v.y; u.z += v.z; u.w += v.w;
    y[i] = u;
  }
}

// Tasks relu, affine, tanh, residual, in order; intermediates ping-pong between two arena halves.
cudaError_t launch_all(const float* x, float* y, float* t0, float* t1, cudaStream_t s) {
  const int64_t n4 = N / 4;
  const unsigned grid = (unsigned)((n4 + 255) / 256);
  relu_kernel<<<grid, 256, 0, s>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(t0), n4);
  affine_kernel<<<grid, 256, 0, s>>>(reinterpret_cast<const float4*>(t0), reinterpret_cast<float4*>(t1), n4);
  tanh_kernel<<<grid, 256, 0, s>>>(reinterpret_cast<const float4*>(t1), reinterpret_cast<float4*>(t0), n4);
  residual_kernel<<<grid, 256, 0, s>>>(reinterpret_cast<const float4*>(t0), reinterpret_cast<const float4*>(x),
                                       reinterpret_cast<float4*>(y), n4);
  return cudaGetLastError();
}

}  // namespace

struct st_program {
  int device;
  cudaGraphExec_t exec;
  const float* x;  // the buffers the executable graph was captured with
  float* y;
  void* arena;
};

static st_status cuda_status(cudaError_t e) {
  if (e == cudaSuccess) return ST_OK;
  st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
  return ST_ERR_CUDA;
}

// Capture the four launches on `s` and make p->exec replay them.
static st_status capture(st_program* p, const float* x, float* y, void* arena, cudaStream_t s) {
  float* t0 = static_cast<float*>(arena);
  float* t1 = t0 + N;
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return cuda_status(e);
  cudaError_t launched = launch_all(x, y, t0, t1, s);
  e = cudaStreamEndCapture(s, &g);
  if (launched != cudaSuccess || e != cudaSuccess) {
    if (g) cudaGraphDestroy(g);
    return cuda_status(launched != cudaSuccess ? launched : e);
  }
  if (p->exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(p->exec, g, &info) != cudaSuccess) {
      cudaGetLastError();  // a topology change is reported, not sticky: instantiate anew
      cudaGraphExecDestroy(p->exec);
      p->exec = nullptr;
    }
  }
  if (!p->exec) e = cudaGraphInstantiate(&p->exec, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    p->exec = nullptr;
    return cuda_status(e);
  }
  p->x = x;
  p->y = y;
  p->arena = arena;
  return ST_OK;
}

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor*, int32_t n, int32_t device, st_program** out) {
  if (n != 0) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "ew_graph: expected no weights");
    return ST_ERR_INVALID_ARGUMENT;
  }
  st_status s = st_set_device(device);
  if (s != ST_OK) return s;
  auto* p = new (std::nothrow) st_program{device, nullptr, nullptr, nullptr, nullptr};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "ew_graph: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {R, C};
  st_status st = st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA);
  if (st == ST_OK) st = st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA);
  if (st != ST_OK) return st;
  void* arena = nullptr;
  st = st_arena_reserve(stream, 2 * N * sizeof(float), &arena);
  if (st != ST_OK) return st;
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);

  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The caller is capturing its stream (a serving framework's own graph): the launches go into the
  // caller's capture, as the runtime's graph runner does for generated programs; a capture of our own
  // cannot begin on a stream that is already being captured.
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(s, &cap);
  if (e != cudaSuccess) return cuda_status(e);
  if (cap != cudaStreamCaptureStatusNone)
    return cuda_status(launch_all(x, y, static_cast<float*>(arena), static_cast<float*>(arena) + N, s));
  if (!p->exec || p->x != x || p->y != y || p->arena != arena) {
    st = capture(p, x, y, arena, s);
    if (st != ST_OK) return st;
  }
  return cuda_status(cudaGraphLaunch(p->exec, s));
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  if (p->exec) cudaGraphExecDestroy(p->exec);
  delete p;
}

}  // extern "C"
