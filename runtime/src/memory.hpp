#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "error.hpp"

namespace st {
// `n` floats of stream-ordered device scratch, given back (stream-ordered) when it goes out of
// scope, thrown or not: the split-TF32 GEMM's and convolution's split operands.
class StreamScratch {
 public:
  StreamScratch(size_t n, cudaStream_t stream) : stream_(stream) {
    ST_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(float), stream));
  }
  ~StreamScratch() { cudaFreeAsync(p_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  float* get() const { return p_; }

 private:
  float* p_ = nullptr;
  cudaStream_t stream_;
};

void* host_alloc(size_t bytes, bool* pinned);
void host_free(void* ptr);
void host_pool_stats(size_t* cached, size_t* live, int* enabled);
void copy_h2d(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void copy_d2h(void* dst, const void* src, size_t bytes, cudaStream_t stream);
}  // namespace st
