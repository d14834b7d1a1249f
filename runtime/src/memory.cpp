// memory.cpp — the pinned host pool and host<->device copies through it.
//
// Freed blocks are kept, bucketed by size, and handed out again, so steady-state transfers do
// no cudaHostAlloc. When pinning fails (or STITCHCUDA_NO_PINNED=1), the pool clears the CUDA
// error, warns once on stderr and serves pageable memory: slower copies, never a failure.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "error.hpp"
#include "memory.hpp"

namespace st {

namespace {

struct Block {
  size_t bytes;
  bool pinned;
};

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_pinned;   // size -> block
  std::unordered_map<void*, Block> live;      // every block handed out
  std::unordered_map<void*, Block> all;       // every block owned, live or free
  size_t cached = 0, live_bytes = 0;
  bool warned = false;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: blocks may be freed during static teardown
  return *p;
}

bool pinning_enabled() {
  const char* v = std::getenv("STITCHCUDA_NO_PINNED");
  return !(v && *v && std::strcmp(v, "0") != 0);
}

size_t round_up(size_t bytes) {
  // Buckets of powers of two up to 1 MiB, then multiples of 1 MiB: reuse without much waste.
  if (bytes <= (1u << 20)) {
    size_t b = 4096;
    while (b < bytes) b <<= 1;
    return b;
  }
  return (bytes + (1u << 20) - 1) & ~size_t((1u << 20) - 1);
}

void warn_once(Pool& p, const char* why) {
  if (p.warned) return;
  p.warned = true;
  std::fprintf(stderr, "stitchcuda: warning: pinned host memory unavailable (%s); using pageable memory, "
                       "host<->device copies will be slower\n", why);
}

}  // namespace

void* host_alloc(size_t bytes, bool* pinned) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  const size_t size = round_up(bytes ? bytes : 1);
  if (pinning_enabled()) {
    auto it = p.free_pinned.lower_bound(size);
    if (it != p.free_pinned.end() && it->first <= size * 2) {
      void* ptr = it->second;
      p.free_pinned.erase(it);
      Block b = p.all[ptr];
      p.cached -= b.bytes;
      p.live[ptr] = b;
      p.live_bytes += b.bytes;
      *pinned = true;
      return ptr;
    }
    void* ptr = nullptr;
    cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (err == cudaSuccess) {
      Block b{size, true};
      p.all[ptr] = b;
      p.live[ptr] = b;
      p.live_bytes += size;
      *pinned = true;
      return ptr;
    }
    cudaGetLastError();
    warn_once(p, cudaGetErrorString(err));
  } else {
    warn_once(p, "STITCHCUDA_NO_PINNED is set");
  }
  void* ptr = std::malloc(size);
  if (!ptr) throw Error(ST_ERR_OUT_OF_MEMORY, cat("host_alloc: malloc of ", size, " bytes failed"));
  Block b{size, false};
  p.all[ptr] = b;
  p.live[ptr] = b;
  p.live_bytes += size;
  *pinned = false;
  return ptr;
}

void host_free(void* ptr) {
  if (!ptr) return;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.live.find(ptr);
  ST_REQUIRE(it != p.live.end(), "host_free: pointer was not allocated by st_host_alloc or is already freed");
  Block b = it->second;
  p.live.erase(it);
  p.live_bytes -= b.bytes;
  if (b.pinned) {
    p.free_pinned.emplace(b.bytes, ptr);
    p.cached += b.bytes;
  } else {
    p.all.erase(ptr);
    std::free(ptr);
  }
}

bool host_is_pool_pinned(const void* ptr, size_t bytes) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  // Exact block lookup covers the common case (a copy from the start of a pool block).
  auto it = p.live.find(const_cast<void*>(ptr));
  return it != p.live.end() && it->second.pinned && bytes <= it->second.bytes;
}

void host_pool_stats(size_t* cached, size_t* live, int* enabled) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  *cached = p.cached;
  *live = p.live_bytes;
  *enabled = pinning_enabled() ? 1 : 0;
}

namespace {

bool is_registered_or_pinned(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

constexpr size_t kStageChunk = 8u << 20;

}  // namespace

void copy_h2d(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  ST_REQUIRE(dst && src, "copy_h2d: null pointer");
  if (host_is_pool_pinned(src, bytes) || is_registered_or_pinned(src)) {
    ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  // Pageable source: stage through two pinned chunks so the host memcpy of one overlaps the
  // DMA of the other.
  bool pinned = false;
  char* stage[2] = {static_cast<char*>(host_alloc(kStageChunk, &pinned)), nullptr};
  if (!pinned) {
    host_free(stage[0]);
    ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  stage[1] = static_cast<char*>(host_alloc(kStageChunk, &pinned));
  cudaEvent_t done[2];
  ST_CUDA_CHECK(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming));
  ST_CUDA_CHECK(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming));
  bool used[2] = {false, false};
  size_t off = 0;
  int i = 0;
  try {
    while (off < bytes) {
      const size_t n = bytes - off < kStageChunk ? bytes - off : kStageChunk;
      if (used[i]) ST_CUDA_CHECK(cudaEventSynchronize(done[i]));
      std::memcpy(stage[i], static_cast<const char*>(src) + off, n);
      ST_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, stage[i], n, cudaMemcpyHostToDevice, stream));
      ST_CUDA_CHECK(cudaEventRecord(done[i], stream));
      used[i] = true;
      off += n;
      i ^= 1;
    }
    ST_CUDA_CHECK(cudaEventSynchronize(done[0]));
    ST_CUDA_CHECK(cudaEventSynchronize(done[1]));
  } catch (...) {
    cudaEventDestroy(done[0]);
    cudaEventDestroy(done[1]);
    host_free(stage[0]);
    host_free(stage[1]);
    throw;
  }
  cudaEventDestroy(done[0]);
  cudaEventDestroy(done[1]);
  host_free(stage[0]);
  host_free(stage[1]);
}

void copy_d2h(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  ST_REQUIRE(dst && src, "copy_d2h: null pointer");
  if (host_is_pool_pinned(dst, bytes) || is_registered_or_pinned(dst)) {
    ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    return;
  }
  // Pageable destination: synchronous by nature; stage in chunks through pinned memory.
  bool pinned = false;
  char* stage = static_cast<char*>(host_alloc(kStageChunk, &pinned));
  try {
    if (!pinned) {
      ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
      ST_CUDA_CHECK(cudaStreamSynchronize(stream));
    } else {
      for (size_t off = 0; off < bytes; off += kStageChunk) {
        const size_t n = bytes - off < kStageChunk ? bytes - off : kStageChunk;
        ST_CUDA_CHECK(cudaMemcpyAsync(stage, static_cast<const char*>(src) + off, n, cudaMemcpyDeviceToHost, stream));
        ST_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::memcpy(static_cast<char*>(dst) + off, stage, n);
      }
    }
  } catch (...) {
    host_free(stage);
    throw;
  }
  host_free(stage);
}

}  // namespace st
