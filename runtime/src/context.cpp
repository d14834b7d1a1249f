#include "context.hpp"

#include <atomic>
#include <cstdlib>
#include <map>
#include <utility>

#include "conv.hpp"
#include "error.hpp"

namespace st {

GemmPlan::~GemmPlan() {
  // Destructors never throw: a failing destroy at teardown is not worth a crash.
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

namespace {
std::atomic<size_t> g_workspace_override{0};

size_t env_workspace_bytes() {
  const char* v = std::getenv("STITCHCUDA_WORKSPACE_BYTES");
  if (!v || !*v) return 0;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  return (end && *end == '\0') ? static_cast<size_t>(n) : 0;
}
}  // namespace

size_t default_workspace_bytes(int cc_major) {
  if (size_t o = g_workspace_override.load()) return o;
  if (size_t e = env_workspace_bytes()) return e;
  // cuBLAS recommends 32 MiB on Hopper and later for its best kernels, 4 MiB before.
  return cc_major >= 9 ? (32u << 20) : (4u << 20);
}

void set_default_workspace_bytes(size_t bytes) { g_workspace_override.store(bytes); }

int current_device() {
  int dev = 0;
  ST_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

Context::Context(int device, cudaStream_t stream)
    : plans(gemm_plan_capacity()), conv_plans(conv_plan_capacity()), device_(device), stream_(stream) {
  ST_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device));
}

Context::~Context() {
  plans.clear();
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  conv_plans.clear();  // before the cuDNN handle they were built with
  if (cudnn_) cudnnDestroy(cudnn_);
  if (workspace_) cudaFree(workspace_);
  for (void* w : retired_workspaces_) cudaFree(w);
  if (arena_) cudaFree(arena_);
  if (lt_) cublasLtDestroy(lt_);
  if (prev >= 0) cudaSetDevice(prev);
}

cublasLtHandle_t Context::lt() {
  if (!lt_) ST_CUBLAS_CHECK(cublasLtCreate(&lt_));
  return lt_;
}

cudnnContext* Context::cudnn() {
  if (!cudnn_) {
    cudnnHandle_t h = nullptr;
    ST_CUDNN_CHECK(cudnnCreate(&h));
    const cudnnStatus_t s = cudnnSetStream(h, stream_);
    if (s != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(h);
      ST_CUDNN_CHECK(s);
    }
    cudnn_ = h;
  }
  return cudnn_;
}

void* Context::workspace_at_least(size_t bytes, size_t* got) {
  size_t have = 0;
  workspace(&have);
  if (bytes > have) {
    void* fresh = nullptr;
    ST_CUDA_CHECK(cudaMalloc(&fresh, bytes));
    if (workspace_) retired_workspaces_.push_back(workspace_);
    workspace_ = fresh;
    workspace_bytes_ = bytes;
  }
  if (got) *got = workspace_bytes_;
  return workspace_;
}

void* Context::workspace(size_t* bytes) {
  if (!workspace_) {
    size_t want = default_workspace_bytes(cc_major_);
    if (want) ST_CUDA_CHECK(cudaMalloc(&workspace_, want));
    workspace_bytes_ = want;
  }
  *bytes = workspace_bytes_;
  return workspace_;
}

void* Context::arena(size_t bytes) {
  if (bytes > arena_bytes_) {
    // Stream-ordered so that work already queued on this stream may still use the old block.
    if (arena_) ST_CUDA_CHECK(cudaFreeAsync(arena_, stream_));
    arena_ = nullptr;
    arena_bytes_ = 0;
    ST_CUDA_CHECK(cudaMallocAsync(&arena_, bytes, stream_));
    arena_bytes_ = bytes;
  }
  return arena_;
}

namespace {
std::mutex g_mu;
std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Context>> g_contexts;
std::atomic<uint64_t> g_generation{1};

struct Memo {
  uint64_t generation = 0;
  int device = -1;
  cudaStream_t stream = nullptr;
  Context* ctx = nullptr;
};
thread_local Memo t_memo;
}  // namespace

Context& context_for(cudaStream_t stream) {
  const int dev = current_device();
  Memo& m = t_memo;
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  if (m.ctx && m.generation == gen && m.device == dev && m.stream == stream) return *m.ctx;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = g_contexts[{dev, stream}];
  if (!slot) slot = std::make_unique<Context>(dev, stream);
  m = Memo{gen, dev, stream, slot.get()};
  return *slot;
}

namespace {
// Plans kept per context and kind; 0: not read yet (STITCHCUDA_PLAN_CACHE, else the defaults).
std::atomic<size_t> g_gemm_capacity{0}, g_conv_capacity{0};
constexpr size_t kDefaultGemmPlans = 2048, kDefaultConvPlans = 256;

size_t capacity_of(std::atomic<size_t>& slot, size_t fallback) {
  size_t v = slot.load();
  if (v) return v;
  const char* env = std::getenv("STITCHCUDA_PLAN_CACHE");
  const long long n = env ? std::atoll(env) : 0;
  v = n > 0 ? static_cast<size_t>(n) : fallback;
  size_t expected = 0;
  slot.compare_exchange_strong(expected, v);
  return slot.load();
}
}  // namespace

size_t gemm_plan_capacity() { return capacity_of(g_gemm_capacity, kDefaultGemmPlans); }
size_t conv_plan_capacity() { return capacity_of(g_conv_capacity, kDefaultConvPlans); }

void set_plan_capacity(size_t gemm_plans, size_t conv_plans) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (gemm_plans) g_gemm_capacity.store(gemm_plans);
  if (conv_plans) g_conv_capacity.store(conv_plans);
  for (auto& kv : g_contexts) {  // no context lock here: a thread holding one may be waiting for g_mu
    if (gemm_plans) kv.second->plans.set_capacity(gemm_plans);
    if (conv_plans) kv.second->conv_plans.set_capacity(conv_plans);
  }
}

void release_all_contexts() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  for (auto& kv : g_contexts) {
    cudaSetDevice(kv.first.first);
    cudaDeviceSynchronize();
  }
  g_contexts.clear();
}

}  // namespace st
