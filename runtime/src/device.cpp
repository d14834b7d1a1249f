// device.cpp — device selection, pointer queries and stream-ordered device memory.
#include <cuda_runtime.h>

#include "error.hpp"
#include "stitchrt/stitchrt.h"

namespace {
using st::guarded;
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace

extern "C" {

st_status st_get_device(int* device) {
  return guarded([&] {
    ST_REQUIRE(device, "st_get_device: device is null");
    ST_CUDA_CHECK(cudaGetDevice(device));
  });
}

st_status st_set_device(int device) {
  return guarded([&] { ST_CUDA_CHECK(cudaSetDevice(device)); });
}

st_status st_pointer_info(const void* ptr, int* is_device, int* device) {
  return guarded([&] {
    cudaPointerAttributes attr{};
    ST_CUDA_CHECK(cudaPointerGetAttributes(&attr, ptr));
    const bool dev = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
    if (is_device) *is_device = dev ? 1 : 0;
    if (device) *device = dev ? attr.device : -1;
  });
}

st_status st_device_alloc(size_t bytes, void* stream, void** ptr) {
  return guarded([&] {
    ST_REQUIRE(ptr, "st_device_alloc: ptr is null");
    *ptr = nullptr;
    ST_CUDA_CHECK(cudaMallocAsync(ptr, bytes ? bytes : 1, as_stream(stream)));
  });
}

st_status st_device_free(void* ptr, void* stream) {
  return guarded([&] {
    if (ptr) ST_CUDA_CHECK(cudaFreeAsync(ptr, as_stream(stream)));
  });
}

st_status st_memcpy_d2d(void* dst, const void* src, size_t bytes, void* stream) {
  return guarded([&] {
    if (bytes) ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
  });
}

st_status st_memset(void* dst, int value, size_t bytes, void* stream) {
  return guarded([&] {
    if (bytes) ST_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, as_stream(stream)));
  });
}

}  // extern "C"
