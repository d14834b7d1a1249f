// common.cuh — small pieces shared by the reduction, elementwise and attention templates.
//
// Parameters
//   T  storage type (float, __half, __nv_bfloat16); V elements per access (a power of two).
// Contract
//   - Pack<T, V> is V consecutive elements accessed as one load/store of sizeof(T) * V bytes
//     (at most 16 bytes per instruction); its address must be aligned to pack_align<T, V>().
//   - Identity is the default prologue/epilogue hook of every template: a hook is any type with
//     `__device__ float operator()(float) const`; EpHook<Op> adapts epilogue.cuh's functors and
//     Then<A, B> chains two hooks.
//   - Group reductions: `group` threads (a power of two <= 32, lanes of one warp, aligned to a
//     multiple of `group`) or a whole block; every thread of the warp / block must call them.
//     cluster_allreduce: the same over a thread-block cluster (sm_90+).
//   - bulk_load_shared: a block's slice of global memory into its shared memory by the copy engine.
#pragma once

#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include <cooperative_groups.h>

#include "stitch/epilogue.cuh"
#include "stitch/numeric.cuh"

namespace stitch {

// The hook that does nothing: a prologue / epilogue slot left empty.
struct Identity {
  __device__ __forceinline__ float operator()(float x) const { return x; }
};

// An epilogue.cuh functor (`float(float, const EpCtx&)`, no residual or bias) used as a hook:
// EpHook<GeluErf>{} runs GELU after a layer norm, EpHook<Scale>{{0.125f}} scales before softmax.
template <class Op>
struct EpHook {
  Op op;
  __device__ __forceinline__ float operator()(float x) const { return op(x, EpCtx{0.f, 0.f}); }
};

// Hook composition, left to right: Then<A, B>{a, b}(x) == b(a(x)).
template <class A, class B>
struct Then {
  A a;
  B b;
  __device__ __forceinline__ float operator()(float x) const { return b(a(x)); }
};

template <class T> __host__ __device__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

__host__ __device__ constexpr int next_pow2(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

template <class T, int V>
__host__ __device__ constexpr int pack_align() {
  return sizeof(T) * V > 16 ? 16 : int(sizeof(T) * V);
}

template <class T, int V>
struct alignas(pack_align<T, V>()) Pack {
  T v[V];
};

template <class T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <class T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& x) {
  *reinterpret_cast<Pack<T, V>*>(p) = x;
}

// A pack through the read-only (non-coherent) path (load_nc below): packs of 4, 8 or 16 bytes.
template <class T, int V>
__device__ __forceinline__ Pack<T, V> load_pack_nc(const T* p) {
  constexpr int B = int(sizeof(T)) * V;
  static_assert(B == 4 || B == 8 || B == 16, "pack size");
  using Bits = std::conditional_t<B == 4, unsigned int, std::conditional_t<B == 8, uint2, uint4>>;
  const Bits bits = __ldg(reinterpret_cast<const Bits*>(p));
  Pack<T, V> x;
  memcpy(&x, &bits, B);
  return x;
}

// One element through the read-only (non-coherent) path, so that the compiler may schedule the
// load past stores: only for data the kernel never writes (an input that is not its output).
template <class T>
__device__ __forceinline__ T load_nc(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "element size");
  using Bits = std::conditional_t<sizeof(T) == 1, unsigned char,
               std::conditional_t<sizeof(T) == 2, unsigned short,
               std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>>>;
  const Bits bits = __ldg(reinterpret_cast<const Bits*>(p));
  T x;
  memcpy(&x, &bits, sizeof(T));
  return x;
}

// The current device's SM count, asked of the driver once per device.
inline cudaError_t sm_count(int& n) {
  static int sms[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int& c = sms[dev & 63];
  if (c == 0 && (e = cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
  n = c;
  return cudaSuccess;
}

__host__ __device__ inline bool aligned_to(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes)) == 0;
}

// 2^x by the special-function unit (ex2.approx: ~2 ulp; 0 for -inf). Callers scale by
// log2(e): exp(x - m) == fast_exp2((x - m) * kLog2e), relative error ~ |x - m| * 2^-24. Not the
// .ftz form: a result below 2^-126 (a softmax probability under 1e-38) stays subnormal, as in
// PyTorch, instead of flushing to zero.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- warp / block reductions over an arbitrary small value type -------------------------------

__device__ __forceinline__ float shfl_xor(float v, int off) {
  return __shfl_xor_sync(0xffffffffu, v, off);
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fminf(a, b); }
};

// Butterfly over `width` lanes (a power of two <= 32): every lane ends with the result.
template <class V, class Op>
__device__ __forceinline__ V warp_allreduce(V v, Op op, int width = 32) {
  for (int off = width >> 1; off > 0; off >>= 1) v = op(v, shfl_xor(v, off));
  return v;
}

// All threads of the block get the reduction of `v`. `smem` holds at least 33 V; the call
// synchronises the block twice and may be called back to back with the same buffer.
template <class V, class Op>
__device__ __forceinline__ V block_allreduce(V v, Op op, V identity, V* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = warp_allreduce(v, op);
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  if (wid == 0) {
    V w = lane < nwarps ? smem[lane] : identity;
    w = warp_allreduce(w, op);
    if (lane == 0) smem[32] = w;
  }
  __syncthreads();
  return smem[32];
}

// A reduction over every block of the thread-block cluster (sm_90+): each block's value from
// block_allreduce, exchanged through distributed shared memory and merged in rank order, so every
// thread of every block gets the same result. smem as for block_allreduce. Every thread of every
// block of the cluster must call it; compiled for an arch without clusters it is block_allreduce
// (launchers run cluster kernels only where the kernel's binary is sm_90+: kernel_binary_arch).
template <class V, class Op>
__device__ __forceinline__ V cluster_allreduce(V v, Op op, V identity, V* smem) {
  v = block_allreduce(v, op, identity, smem);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();  // every block's smem[32] written
  V r = identity;
  for (unsigned k = 0; k < cl.num_blocks(); ++k) r = op(r, *cl.map_shared_rank(smem + 32, k));
  cl.sync();  // every block has read them: smem may be written again, and the block may exit
  return r;
#else
  return v;
#endif
}

// Bytes [0, n) of global `src` into this block's shared `dst` by the copy engine (sm_90+:
// cp.async.bulk, issued by thread 0 in 16 KiB pieces), every thread of the block returning once
// they have landed: the whole slice in flight at once, no register round trip. `bar` is a shared
// 8-byte word of the caller's, used once as an mbarrier (phase 0). n a multiple of 16 below 2^20,
// both addresses 16-byte aligned. Every thread of the block must call it; false (nothing done) on
// an arch without the copy engine.
__device__ __forceinline__ bool bulk_load_shared(void* dst, const void* src, uint32_t n, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the barrier seen by the copy engine
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(n) : "memory");
    constexpr uint32_t kPiece = 1u << 14;
    for (uint32_t off = 0; off < n; off += kPiece)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d + off),
                   "l"(static_cast<const char*>(src) + off), "r"(n - off < kPiece ? n - off : kPiece), "r"(b)
                   : "memory");
  }
  __syncthreads();  // the barrier initialised before any thread waits on it
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(b)
                 : "memory");
  return true;
#else
  (void)dst, (void)src, (void)n, (void)bar;
  return false;
#endif
}

// This block's rank in its cluster and the cluster's size ({0, 1} without clusters).
__device__ __forceinline__ uint2 cluster_place() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  return {cl.block_rank(), cl.num_blocks()};
#else
  return {0u, 1u};
#endif
}

// The arch of the machine code `kernel` was built to (e.g. 90), or 0 when it cannot be read.
template <class K>
inline int kernel_binary_arch(K* kernel) {
  cudaFuncAttributes a{};
  return cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel)) == cudaSuccess ? a.binaryVersion : 0;
}

}  // namespace stitch
