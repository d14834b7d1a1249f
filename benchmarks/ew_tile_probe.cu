// The tiled layout-change kernel (stitch/elementwise.cuh's ew_tile_kernel) alone: copies and
// the element functions of conv chains (a norm's x * scale + shift, two mish) between NCHW and
// NHWC, CUDA-event medians of 20 trials with a 256 MB memset before each (L2 flushed), GB/s as
// the bytes read and written once. Build beside the installed headers:
//   nvcc -std=c++17 -O3 -arch=sm_90 -Itemplates -Iruntime/include -o /tmp/ew_tile_probe \
//     benchmarks/ew_tile_probe.cu && /tmp/ew_tile_probe
// A tile variant is a copy of templates/stitch with kEwTile / kEwTileThreads / kEwTileSmem edited,
// put first on the include path.
#include "stitch/elementwise.cuh"
#include <cstdio>
#include <vector>
#include <algorithm>
using namespace stitch;

struct MulAdd3 { __device__ float operator()(const float* a) const { return a[0] * a[1] + a[2]; } };
struct Copy1 { __device__ float operator()(const float* a) const { return a[0]; } };
struct Mish2 {
  __device__ float operator()(const float* a) const {
    float x = a[0];
    x = x * tanhf(log1pf(expf(x)));
    return x * tanhf(log1pf(expf(x)));
  }
};

static float* flush_buf;
static void flush() { cudaMemsetAsync(flush_buf, 0, 256 << 20); }

template <class F, int N>
void run(const char* name, int64_t n, int64_t c, int64_t h, int64_t w, bool to_nchw) {
  const int64_t total = n * c * h * w;
  float *x, *y, *s, *b;
  cudaMalloc(&x, total * 4); cudaMalloc(&y, total * 4); cudaMalloc(&s, c * 4); cudaMalloc(&b, c * 4);
  cudaMemset(x, 0, total * 4); cudaMemset(s, 0, c * 4); cudaMemset(b, 0, c * 4);
  EwLayout<N> L{};
  L.ndim = 4;
  int64_t shp[4] = {n, c, h, w};
  int64_t nchw[4] = {c * h * w, h * w, w, 1}, nhwc[4] = {h * w * c, 1, w * c, c}, ch[4] = {0, 1, 0, 0};
  for (int d = 0; d < 4; ++d) {
    L.shape[d] = shp[d];
    L.out_stride[d] = to_nchw ? nchw[d] : nhwc[d];
    L.in_stride[0][d] = to_nchw ? nhwc[d] : nchw[d];
    for (int k = 1; k < N; ++k) L.in_stride[k][d] = ch[d];  // per-channel operands
  }
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < 25; ++r) {
    flush();
    cudaEventRecord(e0);
    if constexpr (N == 1) launch_elementwise(F{}, y, L, 0, (const float*)x);
    else launch_elementwise(F{}, y, L, 0, (const float*)x, (const float*)s, (const float*)b);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float t; cudaEventElapsedTime(&t, e0, e1); if (r >= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const float med = ms[ms.size() / 2];
  printf("%-28s %4ldx%3ldx%4ldx%4ld %s  %.3f ms  %.0f GB/s  err=%s\n", name, (long)n, (long)c, (long)h, (long)w,
         to_nchw ? "NHWC->NCHW" : "NCHW->NHWC", med, 2.0 * total * 4 / med / 1e6, cudaGetErrorString(cudaGetLastError()));
  cudaFree(x); cudaFree(y); cudaFree(s); cudaFree(b);
}

struct MishFast2 {
  __device__ float operator()(const float* a) const { return op::mish(op::mish(a[0])); }
};

int main() {
  cudaMalloc(&flush_buf, 256 << 20);
  run<Copy1, 1>("copy", 32, 64, 128, 128, false);
  run<Copy1, 1>("copy", 32, 64, 128, 128, true);
  run<Copy1, 1>("copy", 128, 64, 126, 126, true);
  run<MulAdd3, 3>("x*scale+shift (2:73 apply)", 128, 64, 126, 126, true);
  run<Mish2, 1>("mish(mish(x)) (2:4)", 128, 64, 254, 254, true);
  run<MishFast2, 1>("op::mish twice", 128, 64, 254, 254, true);
  run<Copy1, 1>("copy", 128, 32, 256, 256, true);
  run<Copy1, 1>("copy", 128, 128, 64, 64, true);
  return 0;
}
