// context.hpp — one Context per (device, stream): cuBLASLt and cuDNN handles, persistent
// workspace, GEMM and convolution plan caches and buffer arena, all created on first use and kept
// until st_release().
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "stitchrt/stitchrt.h"

struct cudnnContext;  // cudnnHandle_t; cuDNN's headers stay in the files that call it

namespace st {

// FNV-1a over the 64-bit words of a key made only of int64 fields (no padding).
template <class Key>
size_t hash_words(const Key& k) {
  static_assert(sizeof(Key) % 8 == 0, "keys are made of int64 fields");
  const auto* w = reinterpret_cast<const uint64_t*>(&k);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof(Key) / 8; ++i) {
    h ^= w[i];
    h *= 1099511628211ull;
  }
  return static_cast<size_t>(h);
}

// Everything that decides a GEMM plan. Plain int64 fields so that the struct has no padding
// and can be hashed and compared as bytes.
struct PlanKey {
  int64_t m, n, k, batch;
  int64_t lda, ldb, ldc, ldo;
  int64_t stride_a, stride_b, stride_c, stride_out;
  int64_t trans_a, trans_b;
  int64_t policy, epilogue, dtype, in_dtype;  // dtype: out's (and c's, bias's); in_dtype: a's and b's
  int64_t has_c, c_is_out;
  int64_t align_a, align_b, align_c, align_out, align_bias;
  bool operator==(const PlanKey& o) const { return std::memcmp(this, &o, sizeof(PlanKey)) == 0; }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const { return hash_words(k); }
};

// Everything that decides a convolution plan (st_conv_args but the pointers, plus their
// alignment). int64 fields only, compared and hashed as bytes.
struct ConvKey {
  int64_t policy, spatial_dims, transposed, channels_last;
  int64_t batch, in_channels, out_channels, groups;
  int64_t in_size[ST_CONV_MAX_SPATIAL], kernel_size[ST_CONV_MAX_SPATIAL], stride[ST_CONV_MAX_SPATIAL];
  int64_t padding[ST_CONV_MAX_SPATIAL], dilation[ST_CONV_MAX_SPATIAL], output_padding[ST_CONV_MAX_SPATIAL];
  int64_t dtype, has_bias, activation;
  int64_t align_x, align_w, align_bias, align_y;
  int64_t exact_products;  // no engine whose transforms round its inputs (the split-TF32 convolution)
  bool operator==(const ConvKey& o) const { return std::memcmp(this, &o, sizeof(ConvKey)) == 0; }
};

struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const { return hash_words(k); }
};

struct ConvPlan;  // conv.hpp

// A plan cache holding at most `capacity` plans, the least recently used given up first. A
// program with dynamic dimensions meets a new GEMM / convolution shape at every new size; an
// unbounded cache would grow with every size a long-running server ever sees. Giving a plan up
// is safe at any time: a CUDA graph captured with it copied its kernels' parameters, and its
// workspace belongs to the context.
template <class Key, class Plan, class Hash>
class PlanCache {
 public:
  explicit PlanCache(size_t capacity = 1) : capacity_(capacity ? capacity : 1) {}

  Plan* find(const Key& k) {
    auto it = map_.find(k);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second.second);  // now the most recently used
    return it->second.first.get();
  }
  Plan* insert(const Key& k, std::unique_ptr<Plan> plan) {
    while (map_.size() >= capacity_.load()) {
      map_.erase(order_.back());
      order_.pop_back();
      ++evictions_;
    }
    order_.push_front(k);
    Plan* raw = plan.get();
    map_.emplace(k, std::make_pair(std::move(plan), order_.begin()));
    return raw;
  }
  void clear() {
    map_.clear();
    order_.clear();
  }
  size_t size() const { return map_.size(); }
  size_t capacity() const { return capacity_.load(); }
  uint64_t evictions() const { return evictions_; }
  // Any thread, without the context's lock (an atomic): the cache shrinks at its next insert.
  void set_capacity(size_t capacity) { capacity_.store(capacity ? capacity : 1); }

 private:
  std::atomic<size_t> capacity_;
  uint64_t evictions_ = 0;
  std::list<Key> order_;  // most recently used first
  std::unordered_map<Key, std::pair<std::unique_ptr<Plan>, typename std::list<Key>::iterator>, Hash> map_;
};

// The plans a context keeps of each kind (STITCHCUDA_PLAN_CACHE overrides both, read once;
// st_set_plan_cache_capacity for contexts made later).
size_t gemm_plan_capacity();
size_t conv_plan_capacity();
void set_plan_capacity(size_t gemm_plans, size_t conv_plans);  // 0 keeps a kind's; every context

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  const void* bias = nullptr;  // the bias pointer last written into desc
  bool split_gelu = false;     // GELU left out of desc and applied by the epilogue kernel
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan();
};

class Context {
 public:
  Context(int device, cudaStream_t stream);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  int cc_major() const { return cc_major_; }

  cublasLtHandle_t lt();                 // created on first use
  cudnnContext* cudnn();                 // created on first use, bound to the stream
  void* workspace(size_t* bytes);        // allocated on first use, kept
  // The workspace, grown to at least `bytes` first if needed. An outgrown block is kept until
  // st_release(): a CUDA graph captured earlier may still point at it.
  void* workspace_at_least(size_t bytes, size_t* got);
  void* arena(size_t bytes);             // grows (stream-ordered) to at least `bytes`

  std::mutex& mutex() { return mu_; }
  PlanCache<PlanKey, GemmPlan, PlanKeyHash> plans;  // bounded by gemm_plan_capacity()
  uint64_t plan_hits = 0, plan_misses = 0;
  PlanCache<ConvKey, ConvPlan, ConvKeyHash> conv_plans;  // bounded by conv_plan_capacity()
  uint64_t conv_hits = 0, conv_misses = 0;
  // Per fp32 convolution asked for split TF32: what conv.cpp runs (its SplitChoice: fp32, split, fp32 GEMM).
  std::unordered_map<ConvKey, int, ConvKeyHash> conv_split;

 private:
  int device_;
  cudaStream_t stream_;
  int cc_major_ = 0;
  cublasLtHandle_t lt_ = nullptr;
  cudnnContext* cudnn_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<void*> retired_workspaces_;
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  std::mutex mu_;
};

// The context of (current device, stream). Cheap on the hot path: a thread-local memo of the
// last context used, validated by a global generation bumped by st_release().
Context& context_for(cudaStream_t stream);
void release_all_contexts();
size_t default_workspace_bytes(int cc_major);
void set_default_workspace_bytes(size_t bytes);

// The device a stream belongs to is the current device; programs and the binding set it.
int current_device();

}  // namespace st
