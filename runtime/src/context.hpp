// context.hpp — one Context per (device, stream): cuBLASLt and cuDNN handles, persistent
// workspace, GEMM and convolution plan caches and buffer arena, all created on first use and kept
// until st_release().
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
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
  int64_t policy, epilogue, dtype;
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
  bool operator==(const ConvKey& o) const { return std::memcmp(this, &o, sizeof(ConvKey)) == 0; }
};

struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const { return hash_words(k); }
};

struct ConvPlan;  // conv.hpp

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
  std::unordered_map<PlanKey, std::unique_ptr<GemmPlan>, PlanKeyHash> plans;
  uint64_t plan_hits = 0, plan_misses = 0;
  std::unordered_map<ConvKey, std::unique_ptr<ConvPlan>, ConvKeyHash> conv_plans;
  uint64_t conv_hits = 0, conv_misses = 0;

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
