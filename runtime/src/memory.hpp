#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace st {
void* host_alloc(size_t bytes, bool* pinned);
void host_free(void* ptr);
void host_pool_stats(size_t* cached, size_t* live, int* enabled);
void copy_h2d(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void copy_d2h(void* dst, const void* src, size_t bytes, cudaStream_t stream);
}  // namespace st
