// runtime_host.cu — host-side costs of the runtime, measured in C++ the way a generated program
// calls it, against the bare CUDA / cuBLASLt calls they wrap.
//
//   1. GEMM host time per call: st_gemm with a cached plan vs a bare cublasLtMatmul with
//      prebuilt descriptors and the same algorithm; the uncached first call for contrast.
//   2. Pinned transfers, 256 MiB: st_copy_h2d / st_copy_d2h from the runtime's pinned pool vs
//      cudaMemcpyAsync from cudaHostAlloc memory; the staged pageable path for contrast.
//
// Prints one JSON object. Build (see benchmarks/run_gpu.sh):
//   nvcc -O2 -std=c++17 runtime_host.cu -I<pkg>/include -I<cublas include> -L<pkg>/lib -lstitchrt
//        -L<cublas lib> -l:libcublasLt.so.13 -o runtime_host
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "stitchrt/stitchrt.h"

#define CK(x)                                                                                    \
  do {                                                                                           \
    auto e_ = (x);                                                                               \
    if (e_ != 0) {                                                                               \
      std::fprintf(stderr, "%s failed (%d) at line %d: %s\n", #x, int(e_), __LINE__, st_last_error()); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

using clk = std::chrono::steady_clock;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5))];
}

// Time each call's host duration; synchronise every `batch` calls so the launch queue never
// fills up (a full queue would make enqueue block on the GPU and measure the GPU instead).
template <class F>
std::vector<double> host_us(F&& call, cudaStream_t s, int iters, int batch = 64) {
  std::vector<double> out;
  out.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    auto t0 = clk::now();
    call();
    auto t1 = clk::now();
    out.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if ((i + 1) % batch == 0) cudaStreamSynchronize(s);
  }
  cudaStreamSynchronize(s);
  return out;
}

struct GemmCase {
  int64_t m, n, k;
  st_policy policy;
  st_epilogue epi;
  const char* name;
};

static void gemm_host(const GemmCase& c, cudaStream_t s, std::string& json) {
  const bool bf = c.policy == ST_POLICY_BF16;
  const size_t es = bf ? 2 : 4;
  const st_dtype dt = bf ? ST_BFLOAT16 : ST_FLOAT32;
  void *a, *b, *o, *bias;
  CK(cudaMalloc(&a, c.m * c.k * es));
  CK(cudaMalloc(&b, c.k * c.n * es));
  CK(cudaMalloc(&o, c.m * c.n * es));
  CK(cudaMalloc(&bias, c.n * es));
  CK(cudaMemset(a, 0, c.m * c.k * es));
  CK(cudaMemset(b, 0, c.k * c.n * es));
  CK(cudaMemset(bias, 0, c.n * es));

  st_gemm_args g{};
  g.policy = c.policy; g.epilogue = c.epi;
  g.m = c.m; g.n = c.n; g.k = c.k; g.batch = 1;
  g.a = a; g.lda = c.k; g.a_dtype = dt;
  g.b = b; g.ldb = c.n; g.b_dtype = dt;
  g.out = o; g.ldo = c.n; g.out_dtype = dt;
  g.bias = (c.epi == ST_EPI_BIAS || c.epi == ST_EPI_BIAS_GELU || c.epi == ST_EPI_BIAS_RELU) ? bias : nullptr;
  g.alpha = 1.f; g.beta = 0.f;

  // Uncached first calls: clear the plan cache before each (the context itself stays).
  std::vector<double> first;
  for (int i = 0; i < 50; ++i) {
    CK(st_plan_cache_clear(s));
    auto t0 = clk::now();
    CK(st_gemm(&g, s));
    auto t1 = clk::now();
    first.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    CK(cudaStreamSynchronize(s));
  }
  for (int i = 0; i < 200; ++i) CK(st_gemm(&g, s));  // warm
  CK(cudaStreamSynchronize(s));

  // Bare cuBLASLt with the same problem mapping as the runtime (row-major via operand swap),
  // descriptors and algorithm built once outside the timed loop.
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  cudaDataType_t t = bf ? CUDA_R_16BF : CUDA_R_32F;
  cublasComputeType_t ct = c.policy == ST_POLICY_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
  cublasLtEpilogue_t e = c.epi == ST_EPI_BIAS_GELU ? CUBLASLT_EPILOGUE_GELU_BIAS
                       : c.epi == ST_EPI_BIAS      ? CUBLASLT_EPILOGUE_BIAS
                       : c.epi == ST_EPI_BIAS_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                   : CUBLASLT_EPILOGUE_DEFAULT;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
  if (g.bias) CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, t, c.n, c.k, c.n));
  CK(cublasLtMatrixLayoutCreate(&lb, t, c.k, c.m, c.k));
  CK(cublasLtMatrixLayoutCreate(&lc, t, c.n, c.m, c.n));
  size_t ws_bytes = 32u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
  float alpha = 1.f, beta = 0.f;
  auto bare = [&] {
    cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, o, lc, o, lc, &res.algo, ws, ws_bytes, s);
  };
  auto ours = [&] { st_gemm(&g, s); };
  for (int i = 0; i < 200; ++i) bare();
  cudaStreamSynchronize(s);
  // Interleave rounds so drift on a shared machine hits both alike.
  std::vector<double> tb, to;
  for (int round = 0; round < 10; ++round) {
    auto x = host_us(bare, s, 500);
    auto y = host_us(ours, s, 500);
    tb.insert(tb.end(), x.begin(), x.end());
    to.insert(to.end(), y.begin(), y.end());
  }
  uint64_t hits = 0, misses = 0, size = 0;
  CK(st_plan_cache_stats(s, &hits, &misses, &size));
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"case\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"policy\": \"%s\", "
                "\"bare_median_us\": %.3f, \"bare_p90_us\": %.3f, \"cached_median_us\": %.3f, \"cached_p90_us\": %.3f, "
                "\"overhead_median_us\": %.3f, \"uncached_median_us\": %.3f, \"plan_hits\": %llu, \"plan_misses\": %llu}",
                c.name, (long long)c.m, (long long)c.n, (long long)c.k, st_policy_name(c.policy), median(tb),
                quantile(tb, 0.9), median(to), quantile(to, 0.9), median(to) - median(tb), median(first),
                (unsigned long long)hits, (unsigned long long)misses);
  json += buf;
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  cudaFree(ws); cudaFree(a); cudaFree(b); cudaFree(o); cudaFree(bias);
}

static double gbps(size_t bytes, float ms) { return bytes / (ms * 1e-3) / 1e9; }

template <class F>
static double time_copy_ms(F&& f, cudaStream_t s, int iters) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  f();  // warm
  cudaStreamSynchronize(s);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(e0, s);
    f();
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float x = 0;
    cudaEventElapsedTime(&x, e0, e1);
    ms.push_back(x);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(ms);
}

static void transfers(cudaStream_t s, std::string& json) {
  const size_t bytes = 256u << 20;
  void* dev;
  CK(cudaMalloc(&dev, bytes));
  void* raw;
  CK(cudaHostAlloc(&raw, bytes, cudaHostAllocDefault));
  void* pool;
  int pinned = 0;
  CK(st_host_alloc(bytes, &pool, &pinned));
  std::memset(raw, 1, bytes);
  std::memset(pool, 1, bytes);
  std::vector<char> pageable(bytes, 1);
  const int iters = 10;
  double raw_h2d = time_copy_ms([&] { cudaMemcpyAsync(dev, raw, bytes, cudaMemcpyHostToDevice, s); }, s, iters);
  double raw_d2h = time_copy_ms([&] { cudaMemcpyAsync(raw, dev, bytes, cudaMemcpyDeviceToHost, s); }, s, iters);
  double st_h2d = time_copy_ms([&] { CK(st_copy_h2d(dev, pool, bytes, s)); }, s, iters);
  double st_d2h = time_copy_ms([&] { CK(st_copy_d2h(pool, dev, bytes, s)); }, s, iters);
  // The staged pageable path synchronises internally; time it on the host clock.
  auto host_ms = [&](auto f) {
    std::vector<double> v;
    for (int i = 0; i < 5; ++i) {
      auto t0 = clk::now();
      f();
      cudaStreamSynchronize(s);
      v.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
    }
    return median(v);
  };
  double pg_h2d = host_ms([&] { CK(st_copy_h2d(dev, pageable.data(), bytes, s)); });
  double pg_d2h = host_ms([&] { CK(st_copy_d2h(pageable.data(), dev, bytes, s)); });
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"bytes\": %zu, \"pool_pinned\": %d, \"cudaHostAlloc_h2d_GBps\": %.2f, \"cudaHostAlloc_d2h_GBps\": %.2f, "
                "\"pool_h2d_GBps\": %.2f, \"pool_d2h_GBps\": %.2f, \"h2d_ratio\": %.4f, \"d2h_ratio\": %.4f, "
                "\"staged_pageable_h2d_GBps\": %.2f, \"staged_pageable_d2h_GBps\": %.2f}",
                bytes, pinned, gbps(bytes, raw_h2d), gbps(bytes, raw_d2h), gbps(bytes, st_h2d), gbps(bytes, st_d2h),
                raw_h2d / st_h2d, raw_d2h / st_d2h, gbps(bytes, pg_h2d), gbps(bytes, pg_d2h));
  json += buf;
  cudaFreeHost(raw);
  st_host_free(pool);
  cudaFree(dev);
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::string json = "{\"gemm_host\": [";
  GemmCase cases[] = {
      {64, 64, 64, ST_POLICY_FP32, ST_EPI_NONE, "small_fp32"},
      {128, 4096, 4096, ST_POLICY_BF16, ST_EPI_BIAS_GELU, "mlp_bf16_bias_gelu"},
      {1024, 1024, 1024, ST_POLICY_TF32, ST_EPI_BIAS, "square_tf32_bias"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    if (i) json += ", ";
    gemm_host(cases[i], s, json);
  }
  json += "], \"transfers\": ";
  transfers(s, json);
  json += "}";
  std::printf("%s\n", json.c_str());
  return 0;
}
