// conv.hpp — convolutions through cuDNN's graph API: argument checks, the cached plan, and the
// runtime's own bias/activation pass for what a cuDNN engine does not fuse.
#pragma once

#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "stitchrt/stitchrt.h"

namespace st {

// A cuDNN backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type);
  ~Desc() { reset(); }
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      reset();
      d_ = o.d_;
      o.d_ = nullptr;
    }
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  void reset();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// The descriptors of one operation graph (tensors, operations, the graph), kept alive as long as
// a plan built from it.
struct ConvGraph {
  std::vector<Desc> parts;
  cudnnBackendDescriptor_t graph = nullptr;
  bool fused = false;  // bias and activation are operations of this graph
};

struct ConvPlan {
  std::shared_ptr<ConvGraph> graph;
  Desc config;               // the engine configuration the plan was finalized from
  Desc plan;                 // the finalized execution plan
  int64_t workspace = 0;     // bytes the plan needs
  bool fused = false;        // bias and activation are inside the cuDNN graph
  bool post = false;         // the runtime's bias/activation kernel runs after the plan
  int64_t engine = -1;       // cuDNN's global engine index (for logs)
  int rank = 0;              // 0: preferred numerics; higher: kept only when nothing better works
  float ms = -1.f;           // autotuned time, -1 when not timed
  // Variant packs of the addresses seen (x, w, y, bias, workspace), least recently used replaced:
  // a call with addresses seen before does no descriptor work.
  struct Pack {
    const void* ptr[5];
    Desc desc;
    uint64_t last_use;
  };
  std::vector<Pack> packs;
  uint64_t tick = 0;
};

void check_conv_shape(const st_conv_args& a);
void conv_output_size(const st_conv_args& a, int64_t* out);
// exact_products: only engines that multiply the operands as given (no FFT or Winograd transform,
// which would round transformed TF32 values again): what the split-TF32 convolution needs.
void conv(const st_conv_args& a, cudaStream_t stream, bool exact_products = false);
// The fp32 convolution at fp32-grade accuracy on TF32 tensor cores: one TF32 convolution over the
// split operands, where it beats the fp32 one by 10 % (timed once per shape), else the fp32 one.
void conv_split_tf32(const st_conv_args& a, cudaStream_t stream);
// split_tf32.cu: x and w of an fp32 convolution as the TF32 one's operands, three times the input
// channels: xs (3 |x| floats) = [x_b, x_b, x_s], ws (3 |w|) = [w_b, w_s, w_b] within each group.
void split_conv_operands(const st_conv_args& a, float* xs, float* ws, cudaStream_t stream);
void conv_plan_cache_clear(cudaStream_t stream);

// conv_epilogue.cu: y = act(y + bias[channel]) in place over a dense y of n * c * spatial elements,
// channels-first ([n, c, spatial]) or channels-last ([n, spatial, c]); bias may be null. Math in fp32.
void conv_bias_act(st_dtype dtype, void* y, const void* bias, int64_t n, int64_t c, int64_t spatial,
                   bool channels_last, st_activation act, cudaStream_t stream);

}  // namespace st
