// elementwise.cuh — N-ary elementwise kernels with broadcasting, and strided copy / permute.
//
// launch_elementwise<F, TOut, TIn...>(f, out, layout, stream, in...)
//   F      functor `__device__ float operator()(const float* a) const`; a[k] is input k's
//          element as fp32 (Spread<N, G> adapts a functor taking N floats);
//   TOut   storage of out; TIn... storage of each input, 1 to 8 inputs. Storage types are
//          float, __half, __nv_bfloat16, and also bool / uint8_t / int32_t / int64_t (read as
//          their value in fp32; written as the truncated fp32 result, bool as result != 0).
//   layout EwLayout<N>: output shape (ndim <= 6, row-major dims), the output's element strides,
//          and each input's element strides over the output shape (0 where it broadcasts).
// Contract
//   - out[idx . out_stride] = f({in_k[idx . in_stride[k]]}) for every index of the shape.
//   - out must not overlap an input unless it is that input with the same strides.
//   - Math in fp32, one rounding to TOut.
//   - Before launch, dims are put in the output's memory order (largest stride first), size-1
//     dims are dropped and dims that are contiguous in every tensor are merged, so a caller may
//     pass the unfolded view in any dim order.
//   - Fast path when out is contiguous and every input is either contiguous with the output's
//     shape or a single broadcast scalar (all strides 0): no index math, and 16-byte accesses
//     (VEC = 16 / largest element size) when every such pointer is aligned to its pack; a
//     scalar tail covers n % VEC. Otherwise a strided path: per chunk div/mod over at most 6
//     dims, in 32-bit arithmetic when every offset fits in 31 bits, else 64-bit; a chunk is VEC
//     elements of the innermost dim when out and each input are contiguous along it or broadcast
//     along it (bias / per-channel operands), with aligned pointers and strides, else 1 element.
//   - Tiled path when out is contiguous along one dim (a) and an input, not broadcast along a,
//     along another (b), both spanning >= 8 elements (a layout change: channels-last in,
//     channels-first out, or back; a per-channel operand is not one): tiles of 2048 elements
//     over (a, b), each side a power of two >= 8 that follows its extent (8 channels make a
//     side of 8); every such input goes through shared memory (read along b), the others are
//     read directly, and out is written along a — reads and writes both coalesced, where the
//     strided path would stride every warp's loads by the other layout. Accesses are packs of 4
//     elements (16 bytes of float32) wherever the extents and strides are multiples of 4 and the
//     pointers aligned to a pack (per tensor: staged reads along b, the write along a, the other
//     inputs along a), else one element each.
//
// launch_elementwise_once(...): the same contract, one kernel (the strided path, element by
//   element): for work a program does once, at create, where compiling seven kernels costs more
//   than the path saves.
//
// launch_strided_copy<Tin, Tout>(in, out, EwLayout<1>, stream): out[idx . out_stride] =
//   in[idx . in_stride[0]] with conversion: launch_elementwise of the identity (a layout change
//   takes the tiled path above).
// launch_permute(in, in_shape, in_stride, ndim, perm, out, stream): out = in.permute(perm)
//   materialised contiguous (out shape[i] = in_shape[perm[i]]).
#pragma once

#include <climits>
#include <type_traits>
#include <utility>

#include "stitch/common.cuh"

namespace stitch {

constexpr int kEwMaxDims = 6;
constexpr int kEwMaxInputs = 8;

template <int NIN>
struct EwLayout {
  int ndim;
  int64_t shape[kEwMaxDims];
  int64_t out_stride[kEwMaxDims];
  int64_t in_stride[NIN][kEwMaxDims];
};

// ---- ready-made functors ----------------------------------------------------------------------

struct EwAdd { __device__ float operator()(const float* a) const { return a[0] + a[1]; } };
struct EwSub { __device__ float operator()(const float* a) const { return a[0] - a[1]; } };
struct EwMul { __device__ float operator()(const float* a) const { return a[0] * a[1]; } };
struct EwDiv { __device__ float operator()(const float* a) const { return a[0] / a[1]; } };
struct EwMax { __device__ float operator()(const float* a) const { return fmaxf(a[0], a[1]); } };
struct EwMin { __device__ float operator()(const float* a) const { return fminf(a[0], a[1]); } };
// where(cond, x, y): a[0] != 0 selects a[1], else a[2].
struct EwWhere {
  __device__ float operator()(const float* a) const { return a[0] != 0.f ? a[1] : a[2]; }
};
// A hook (`float(float)`, see common.cuh) on input 0.
template <class H>
struct EwUnary {
  H h;
  __device__ float operator()(const float* a) const { return h(a[0]); }
};
// A functor taking N floats, used where an array is passed: Spread<2, G>{g}(a) == g(a[0], a[1]).
template <int N, class G>
struct Spread {
  G g;
  template <size_t... K>
  __device__ __forceinline__ float call(const float* a, std::index_sequence<K...>*) const {
    return g(a[K]...);
  }
  __device__ float operator()(const float* a) const {
    return call(a, static_cast<std::make_index_sequence<N>*>(nullptr));
  }
};

namespace detail {

template <class T>
__device__ __forceinline__ float ew_to_float(T x) {
  if constexpr (std::is_integral_v<T>) return float(x);
  else return to_float<T>(x);
}
template <class T>
__device__ __forceinline__ T ew_from_float(float x) {
  if constexpr (std::is_same_v<T, bool>) return x != 0.f;
  else if constexpr (std::is_integral_v<T>) return T(x);
  else return from_float<T>(x);
}

template <int NIN>
struct EwPtrs {
  void* out;
  const void* in[NIN];
};

template <class... T> struct MaxSize;
template <class T> struct MaxSize<T> { static constexpr int value = sizeof(T); };
template <class T, class... R> struct MaxSize<T, R...> {
  static constexpr int value = sizeof(T) > MaxSize<R...>::value ? sizeof(T) : MaxSize<R...>::value;
};

// ---- contiguous fast path ---------------------------------------------------------------------

// VEC elements of input p at element offset off; `bcast`: one element repeated VEC times.
template <int VEC, class T, class Idx>
__device__ __forceinline__ void ew_load_chunk(float* v, const void* p, Idx off, bool bcast) {
  const T* q = static_cast<const T*>(p) + off;
  if (VEC == 1 || bcast) {
    const float s = ew_to_float(q[0]);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = s;
  } else {
    const Pack<T, VEC> pk = load_pack<T, VEC>(q);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = ew_to_float(pk.v[e]);
  }
}

template <int VEC, class... TIn, size_t... K>
__device__ __forceinline__ void ew_load_chunks(float (&v)[sizeof...(TIn)][VEC], const void* const* in,
                                               int64_t base, unsigned scalar_mask,
                                               std::index_sequence<K...>*) {
  ((((scalar_mask >> K) & 1u) ? ew_load_chunk<VEC, TIn>(v[K], in[K], int64_t(0), true)
                               : ew_load_chunk<VEC, TIn>(v[K], in[K], base, false)),
   ...);
}

template <class F, int VEC, class TOut, class... TIn>
__global__ void __launch_bounds__(256)
ew_contig_kernel(F f, EwPtrs<sizeof...(TIn)> ptr, int64_t n, unsigned scalar_mask) {
  constexpr int NIN = sizeof...(TIn);
  using Seq = std::make_index_sequence<NIN>;
  TOut* out = static_cast<TOut*>(ptr.out);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / VEC;
  for (int64_t c = tid; c < nvec; c += stride) {
    float v[NIN][VEC];
    ew_load_chunks<VEC, TIn...>(v, ptr.in, c * VEC, scalar_mask, static_cast<Seq*>(nullptr));
    Pack<TOut, VEC> o;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      float a[NIN];
#pragma unroll
      for (int k = 0; k < NIN; ++k) a[k] = v[k][e];
      o.v[e] = ew_from_float<TOut>(f(a));
    }
    store_pack<TOut, VEC>(out + c * VEC, o);
  }
  if constexpr (VEC > 1) {
    for (int64_t i = nvec * VEC + tid; i < n; i += stride) {
      float v[NIN][1];
      ew_load_chunks<1, TIn...>(v, ptr.in, i, scalar_mask, static_cast<Seq*>(nullptr));
      float a[NIN];
#pragma unroll
      for (int k = 0; k < NIN; ++k) a[k] = v[k][0];
      out[i] = ew_from_float<TOut>(f(a));
    }
  }
}

// ---- strided path -----------------------------------------------------------------------------

// Dims innermost first (d = 0 is the fastest-moving), after coalescing.
template <int NIN, class Idx>
struct EwDevLayout {
  int ndim;
  Idx shape[kEwMaxDims];
  Idx out_stride[kEwMaxDims];
  Idx in_stride[NIN][kEwMaxDims];
};

// Chunk i of VEC elements along the innermost dim (whose out / input strides are VEC, or 0 for
// an input broadcast along it: bit k of bcast_mask).
template <class F, class Idx, int VEC, class TOut, class... TIn, size_t... K>
__device__ __forceinline__ void ew_strided_body(const F& f, const EwPtrs<sizeof...(TIn)>& ptr,
                                                const EwDevLayout<sizeof...(TIn), Idx>& L, Idx i,
                                                unsigned bcast_mask, std::index_sequence<K...>*) {
  constexpr int NIN = sizeof...(TIn);
  Idx rem = i, off_out = 0;
  Idx off[NIN];
#pragma unroll
  for (int k = 0; k < NIN; ++k) off[k] = 0;
#pragma unroll
  for (int d = 0; d < kEwMaxDims; ++d) {
    if (d < L.ndim) {
      const Idx q = rem / L.shape[d];
      const Idx c = rem - q * L.shape[d];
      rem = q;
      off_out += c * L.out_stride[d];
#pragma unroll
      for (int k = 0; k < NIN; ++k) off[k] += c * L.in_stride[k][d];
    }
  }
  float v[NIN][VEC];
  (ew_load_chunk<VEC, TIn>(v[K], ptr.in[K], off[K], (bcast_mask >> K) & 1u), ...);
  Pack<TOut, VEC> o;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float a[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) a[k] = v[k][e];
    o.v[e] = ew_from_float<TOut>(f(a));
  }
  store_pack<TOut, VEC>(static_cast<TOut*>(ptr.out) + off_out, o);
}

template <class F, class Idx, int VEC, class TOut, class... TIn>
__global__ void __launch_bounds__(256)
ew_strided_kernel(F f, EwPtrs<sizeof...(TIn)> ptr, EwDevLayout<sizeof...(TIn), Idx> L, Idx n,
                  unsigned bcast_mask) {
  using Seq = std::make_index_sequence<sizeof...(TIn)>;
  const Idx stride = Idx(gridDim.x) * blockDim.x;
  for (Idx i = Idx(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    ew_strided_body<F, Idx, VEC, TOut, TIn...>(f, ptr, L, i, bcast_mask, static_cast<Seq*>(nullptr));
}

// Drops size-1 dims and merges dims contiguous in all NT tensors (stride[t][d] ==
// stride[t][d + 1] * shape[d + 1]). Input and output dims row-major (outermost first).
template <int NT>
inline int ew_coalesce(int ndim, const int64_t* shape, const int64_t* const* stride,
                       int64_t* shape_out, int64_t (*stride_out)[kEwMaxDims]) {
  int m = 0;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 1) continue;
    bool merge = m > 0;
    for (int t = 0; t < NT && merge; ++t)
      merge = stride_out[t][m - 1] == stride[t][d] * shape[d];
    if (merge) {
      shape_out[m - 1] *= shape[d];
      for (int t = 0; t < NT; ++t) stride_out[t][m - 1] = stride[t][d];
    } else {
      shape_out[m] = shape[d];
      for (int t = 0; t < NT; ++t) stride_out[t][m] = stride[t][d];
      ++m;
    }
  }
  return m;
}

constexpr int kEwThreads = 256;

inline unsigned ew_blocks(int64_t work) {
  const int64_t b = ceil_div<int64_t>(work, kEwThreads);
  const int64_t cap = int64_t(1) << 16;  // grid-stride beyond: fills any current GPU
  return unsigned(b < 1 ? 1 : b < cap ? b : cap);
}

// Strided launch over coalesced dims (row-major); VEC > 1: the innermost dim is walked in
// chunks of VEC (its size a multiple of VEC, stride 1 in out and in every input but those
// broadcast along it).
template <class F, class Idx, int VEC, class TOut, class... TIn>
cudaError_t ew_launch_strided(const F& f, const EwPtrs<sizeof...(TIn)>& ptr, int m,
                              const int64_t* shape, const int64_t (*st)[kEwMaxDims], int64_t n,
                              unsigned bcast_mask, cudaStream_t stream) {
  constexpr int NIN = sizeof...(TIn);
  EwDevLayout<NIN, Idx> L{};
  L.ndim = m;
  for (int d = 0; d < m; ++d) {  // innermost first
    const int s = m - 1 - d;
    const int64_t w = d == 0 ? VEC : 1;
    L.shape[d] = Idx(shape[s] / w);
    L.out_stride[d] = Idx(st[0][s] * w);
    for (int k = 0; k < NIN; ++k) L.in_stride[k][d] = Idx(st[k + 1][s] * w);
  }
  const int64_t chunks = n / VEC;
  ew_strided_kernel<F, Idx, VEC, TOut, TIn...>
      <<<ew_blocks(chunks), kEwThreads, 0, stream>>>(f, ptr, L, Idx(chunks), bcast_mask);
  return cudaGetLastError();
}

// ---- tiled path (a layout change) --------------------------------------------------------------

// Tiles of ta x tb elements (ta * tb == kEwTile, each a power of two >= 8) over (a, b): out has
// stride 1 along a; each input has strides in_sa / in_sb along them; bit k of `staged`: input k
// has stride 1 along b and is read through shared memory. The tile's sides follow the extents, so
// a side of 8 channels fills its lanes (a 32 x 32 tile over 8 channels left three quarters of the
// block idle). Blocks walk tiles as (x: along a, y: along b, z: batch), so a tile's place needs no
// division; the batch dims (innermost first) are decomposed once a tile, in 32 bits.
constexpr int kEwTile = 2048;
constexpr int kEwTileThreads = 256;
constexpr int kEwTileSmem = 2304;  // floats per staged input: ta * row stride, at most 256 * 9

template <int NIN>
struct EwTileParams {
  int64_t na, nb;
  int64_t out_sb;
  int64_t in_sa[NIN], in_sb[NIN];
  int nbatch;
  uint32_t bshape[kEwMaxDims];
  int64_t bout[kEwMaxDims], bin[NIN][kEwMaxDims];
  int64_t batch, tiles_a, tiles_b;
  int lta, ltb;     // log2 of the tile's sides
  int row;          // shared row stride (floats): conflict-free in both phases
  unsigned staged;
  // Packs of 4 (kEwPack): bit k of vec_in, staged input k read 4 along b a load; vec_out, the
  // output written 4 along a a store, and then each other input read as amode[k] says.
  unsigned vec_in;
  bool vec_out;
  unsigned char amode[NIN];  // kEwBcastA: one value for the 4 (stride 0 along a), kEwPackA: a pack, else 4 loads
};

// STITCH_EW_TILE_PACK 0 (defined before this header) keeps the tiled path to one element an
// access: the form before packs, for measuring the two in one process (benchmarks/compare_programs.py).
#ifndef STITCH_EW_TILE_PACK
#define STITCH_EW_TILE_PACK 1
#endif
constexpr int kEwPack = 4;
constexpr unsigned char kEwBcastA = 0, kEwPackA = 1, kEwEachA = 2;

// A read through the read-only (non-coherent) path: the tiled path's inputs are never its output
// (a layout change cannot run in place), so these loads may be scheduled past the tile's stores.
template <class T>
__device__ __forceinline__ float ew_load_nc(const T* p) {
  return ew_to_float(load_nc(p));
}

// Input K's staging: its kPer elements of this thread loaded first, then stored to shared memory
// (kPer loads in flight a thread, not one). kFull: the tile lies inside the extents.
template <bool kFull, class T>
__device__ __forceinline__ void ew_tile_stage(float* slot, const T* src, int64_t step, int sa, int row,
                                              bool b_in, int64_t a_left) {
  constexpr int kPer = kEwTile / kEwTileThreads;
  float r[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    r[i] = kFull || (b_in && i * sa < a_left) ? ew_load_nc(src + i * step) : 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (kFull || (b_in && i * sa < a_left)) slot[i * sa * row] = r[i];
}

// Input K's staging in packs of kEwPack along b (its bit of vec_in): kPer / kEwPack loads a thread,
// each spread over kEwPack consecutive slots of a shared row.
template <bool kFull, class T>
__device__ __forceinline__ void ew_tile_stage4(float* slot, const T* src, int64_t step, int sa, int row,
                                               bool b_in, int64_t a_left) {
  constexpr int kPer = kEwTile / kEwTileThreads / kEwPack;
  if constexpr (sizeof(T) * kEwPack <= 16) {
    Pack<T, kEwPack> r[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (kFull || (b_in && i * sa < a_left)) r[i] = load_pack_nc<T, kEwPack>(src + i * step);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (kFull || (b_in && i * sa < a_left)) {
#pragma unroll
        for (int j = 0; j < kEwPack; ++j) slot[i * sa * row + j] = ew_to_float(r[i].v[j]);
      }
  }
}

// Input K's values at kEwPack consecutive a (one b) for the packed write phase: from the tile
// (staged: `t` at the first a), else as its amode says.
template <size_t K, int NIN, class T>
__device__ __forceinline__ void ew_tile_gather4(float (&v)[kEwPack][NIN], bool staged, const float* t, int row,
                                                const T* src, int64_t sa, unsigned char mode) {
  if (staged) {
#pragma unroll
    for (int j = 0; j < kEwPack; ++j) v[j][K] = t[j * row];
  } else if (mode == kEwBcastA) {
    const float x = ew_load_nc(src);
#pragma unroll
    for (int j = 0; j < kEwPack; ++j) v[j][K] = x;
  } else {
    if constexpr (sizeof(T) * kEwPack <= 16) {
      if (mode == kEwPackA) {
        const Pack<T, kEwPack> q = load_pack_nc<T, kEwPack>(src);
#pragma unroll
        for (int j = 0; j < kEwPack; ++j) v[j][K] = ew_to_float(q.v[j]);
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < kEwPack; ++j) v[j][K] = ew_load_nc(src + j * sa);
  }
}

// One tile: the staged inputs read along b into shared memory (e = lane order along b), then
// every element computed and written along a (e = lane order along a). A side is at most 256 and
// divides the block, so in either phase a thread keeps its place along one side for all its
// elements and steps along the other by (block / that side): addresses are a base and a step per
// input, added, not multiplied out per element. kFull (the tile inside the extents, all but the
// edge tiles): no bounds tests, so the compiler may overlap the elements' loads; every load is on
// the read-only path, which no store of the tile can alias.
template <bool kFull, class F, class TOut, class... TIn, size_t... K>
__device__ __forceinline__ void ew_tile_body(const F& f, const EwPtrs<sizeof...(TIn)>& ptr,
                                             const EwTileParams<sizeof...(TIn)>& p, float* tile,
                                             int64_t ta, int64_t tb, int64_t bi,
                                             std::index_sequence<K...>*) {
  constexpr int NIN = sizeof...(TIn);
  constexpr int kPer = kEwTile / kEwTileThreads;
  const int tid = threadIdx.x;
  const int mta = (1 << p.lta) - 1, mtb = (1 << p.ltb) - 1;
  int64_t out_off = 0;
  int64_t off[NIN];
#pragma unroll
  for (int k = 0; k < NIN; ++k) off[k] = 0;
  uint32_t rest = uint32_t(bi);
  for (int d = 0; d < p.nbatch; ++d) {
    const uint32_t q = rest / p.bshape[d];
    const uint32_t c = rest - q * p.bshape[d];
    rest = q;
    out_off += int64_t(c) * p.bout[d];
#pragma unroll
    for (int k = 0; k < NIN; ++k) off[k] += int64_t(c) * p.bin[k][d];
  }
  const int64_t a0 = ta << p.lta, b0 = tb << p.ltb;
  if (p.staged) {
    // read phase: lane order along b; this thread's b fixed, a stepping by block / tb
    const int lb = tid & mtb, la0 = tid >> p.ltb, sa = kEwTileThreads >> p.ltb;
    const bool b_in = b0 + lb < p.nb;
    const int64_t a_left = p.na - a0 - la0;
    // the same in packs: this thread's kEwPack consecutive b fixed, a stepping by block / (tb / kEwPack)
    const int lq = p.ltb - 2;
    const int lb4 = (tid & ((1 << lq) - 1)) * kEwPack, la4 = tid >> lq, sa4 = kEwTileThreads >> lq;
    const bool b4_in = b0 + lb4 < p.nb;
    const int64_t a4_left = p.na - a0 - la4;
    (((p.staged >> K) & 1u
          ? ((p.vec_in >> K) & 1u
                 ? ew_tile_stage4<kFull>(
                       tile + K * kEwTileSmem + la4 * p.row + lb4,
                       static_cast<const TIn*>(ptr.in[K]) + off[K] + (a0 + la4) * p.in_sa[K] + b0 + lb4,
                       int64_t(sa4) * p.in_sa[K], sa4, p.row, b4_in, a4_left)
                 : ew_tile_stage<kFull>(tile + K * kEwTileSmem + la0 * p.row + lb,
                                        static_cast<const TIn*>(ptr.in[K]) + off[K] + (a0 + la0) * p.in_sa[K] + b0 + lb,
                                        int64_t(sa) * p.in_sa[K], sa, p.row, b_in, a_left))
          : (void)0),
     ...);
    __syncthreads();
  }
  if (p.vec_out) {
    // write phase in packs: this thread's kEwPack consecutive a fixed, b stepping by block / (ta / kEwPack)
    const int lq = p.lta - 2;
    const int la = (tid & ((1 << lq) - 1)) * kEwPack, lb0 = tid >> lq, sb = kEwTileThreads >> lq;
    const int64_t a = a0 + la;
    const void* src[NIN] = {static_cast<const void*>(static_cast<const TIn*>(ptr.in[K]) + off[K] + a * p.in_sa[K] +
                                                     (b0 + lb0) * p.in_sb[K])...};
    const int64_t step[NIN] = {int64_t(sb) * p.in_sb[K]...};
    TOut* dst = static_cast<TOut*>(ptr.out) + out_off + a + (b0 + lb0) * p.out_sb;
    const int64_t dstep = int64_t(sb) * p.out_sb;
    const int64_t b_left = p.nb - b0 - lb0;
    if (kFull || a < p.na) {  // (na a multiple of the pack: the pack lies inside or outside)
#pragma unroll
      for (int i = 0; i < kPer / kEwPack; ++i) {
        if (kFull || i * sb < b_left) {
          const int lb = lb0 + i * sb;
          float v[kEwPack][NIN];
          (ew_tile_gather4<K, NIN>(v, (p.staged >> K) & 1u, tile + K * kEwTileSmem + la * p.row + lb, p.row,
                                   static_cast<const TIn*>(src[K]) + i * step[K],
                                   p.in_sa[K], p.amode[K]),
           ...);
          Pack<TOut, kEwPack> o;
#pragma unroll
          for (int j = 0; j < kEwPack; ++j) o.v[j] = ew_from_float<TOut>(f(v[j]));
          store_pack<TOut, kEwPack>(dst + i * dstep, o);
        }
      }
    }
    if (p.staged) __syncthreads();
    return;
  }
  // write phase: lane order along a; this thread's a fixed, b stepping by block / ta
  const int la = tid & mta, lb0 = tid >> p.lta, sb = kEwTileThreads >> p.lta;
  const int64_t a = a0 + la;
  const void* src[NIN] = {static_cast<const void*>(static_cast<const TIn*>(ptr.in[K]) + off[K] +
                                                   a * p.in_sa[K] + (b0 + lb0) * p.in_sb[K])...};
  const int64_t step[NIN] = {int64_t(sb) * p.in_sb[K]...};
  TOut* dst = static_cast<TOut*>(ptr.out) + out_off + a + (b0 + lb0) * p.out_sb;
  const int64_t dstep = int64_t(sb) * p.out_sb;
  const int64_t b_left = p.nb - b0 - lb0;
  if (kFull || a < p.na) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (kFull || i * sb < b_left) {
        const int lb = lb0 + i * sb;
        float v[NIN];
        ((v[K] = (p.staged >> K) & 1u ? tile[K * kEwTileSmem + la * p.row + lb]
                                      : ew_load_nc(static_cast<const TIn*>(src[K]) + i * step[K])),
         ...);
        dst[i * dstep] = ew_from_float<TOut>(f(v));
      }
    }
  }
  if (p.staged) __syncthreads();
}

template <class F, class TOut, class... TIn>
__global__ void __launch_bounds__(kEwTileThreads)
ew_tile_kernel(F f, EwPtrs<sizeof...(TIn)> ptr, EwTileParams<sizeof...(TIn)> p) {
  using Seq = std::make_index_sequence<sizeof...(TIn)>;
  extern __shared__ float tile[];
  for (int64_t bi = blockIdx.z; bi < p.batch; bi += gridDim.z)
    for (int64_t tb = blockIdx.y; tb < p.tiles_b; tb += gridDim.y)
      for (int64_t ta = blockIdx.x; ta < p.tiles_a; ta += gridDim.x) {
        if (((ta + 1) << p.lta) <= p.na && ((tb + 1) << p.ltb) <= p.nb)
          ew_tile_body<true, F, TOut, TIn...>(f, ptr, p, tile, ta, tb, bi, static_cast<Seq*>(nullptr));
        else
          ew_tile_body<false, F, TOut, TIn...>(f, ptr, p, tile, ta, tb, bi, static_cast<Seq*>(nullptr));
      }
}

inline int ew_log2_ceil(int64_t n) {
  int l = 0;
  while ((int64_t(1) << l) < n) ++l;
  return l;
}

// The tiled launch when out is contiguous along one dim and some input along another (both
// spanning >= 8); false when the layout is not such a change.
template <class F, class TOut, class... TIn>
bool ew_launch_tiled(const F& f, const EwPtrs<sizeof...(TIn)>& ptr, int m, const int64_t* shape,
                     const int64_t (*st)[kEwMaxDims], cudaStream_t stream) {
  constexpr int NIN = sizeof...(TIn);
  int da = -1, db = -1;
  for (int d = 0; d < m; ++d)
    if (st[0][d] == 1) da = d;
  if (da < 0 || shape[da] < 8) return false;
  // An input laid out otherwise: unit stride along another dim, not broadcast along da (a
  // per-channel operand, stride 1 along the channels and 0 along da, is no layout change).
  for (int k = 0; k < NIN && db < 0; ++k)
    for (int d = 0; d < m; ++d)
      if (d != da && st[k + 1][d] == 1 && st[k + 1][da] != 0 && shape[d] >= 8) db = d;
  if (db < 0) return false;
  EwTileParams<NIN> p{};
  p.na = shape[da];
  p.nb = shape[db];
  p.out_sb = st[0][db];
  for (int k = 0; k < NIN; ++k) {
    p.in_sa[k] = st[k + 1][da];
    p.in_sb[k] = st[k + 1][db];
    if (p.in_sb[k] == 1 && p.in_sa[k] != 0) p.staged |= 1u << k;
  }
  p.batch = 1;
  for (int d = m - 1; d >= 0; --d) {  // innermost first
    if (d == da || d == db) continue;
    p.bshape[p.nbatch] = uint32_t(shape[d]);
    p.bout[p.nbatch] = st[0][d];
    for (int k = 0; k < NIN; ++k) p.bin[k][p.nbatch] = st[k + 1][d];
    p.batch *= shape[d];
    ++p.nbatch;
  }
  if (p.batch >= (int64_t(1) << 32)) return false;  // batch index in 32 bits
  // Sides: a up to 64 (its extent rounded up), b the rest of the tile, unless b is the short
  // side (then b its extent, a the rest); a side of 8 channels is a side of 8.
  const int ltile = ew_log2_ceil(kEwTile);
  int lta = ew_log2_ceil(p.na);
  lta = lta < 3 ? 3 : lta > 6 ? 6 : lta;
  int ltb = ltile - lta;
  const int lnb = ew_log2_ceil(p.nb);
  if (lnb < ltb) {
    ltb = lnb < 3 ? 3 : lnb;
    lta = ltile - ltb;
  }
  p.lta = lta;
  p.ltb = ltb;
  const int ta = 1 << lta, tb = 1 << ltb;
  // Row stride: the write phase reads a column (lanes along a, 32 / ta rows of b when ta < 32),
  // the read phase a row (lanes along b): ta < 32 needs row == 32 / ta (mod 32), else odd.
  p.row = ta < 32 ? tb + 32 / ta : tb + 1;
  p.tiles_a = ceil_div<int64_t>(p.na, ta);
  p.tiles_b = ceil_div<int64_t>(p.nb, tb);
  const int64_t cap_x = int64_t(1) << 30, cap_yz = 65535;
  const dim3 grid(unsigned(p.tiles_a < cap_x ? p.tiles_a : cap_x),
                  unsigned(p.tiles_b < cap_yz ? p.tiles_b : cap_yz),
                  unsigned(p.batch < cap_yz ? p.batch : cap_yz));
  // Packs of kEwPack where whole packs lie inside the extents and on aligned addresses (every
  // stride but the packed dim's a multiple of the pack): 16-byte accesses for float32 in place of
  // 4-byte ones. The tile's traffic is load / store instructions as much as bytes: with one
  // element an access its throughput fell with every per-channel operand of the epilogue.
  constexpr size_t in_size[NIN > 0 ? NIN : 1] = {sizeof(TIn)...};
  auto packed = [&](int64_t s) { return s % kEwPack == 0; };
  auto batch_packed = [&](const int64_t* b) {
    for (int d = 0; d < p.nbatch; ++d)
      if (!packed(b[d])) return false;
    return true;
  };
  // (staged packs only on a side along b of at most 32: a wider row's packs meet in shared memory's banks)
  for (int k = 0; k < NIN; ++k)
    if (STITCH_EW_TILE_PACK && (p.staged >> k) & 1u && in_size[k] * kEwPack <= 16 && tb <= 32 && packed(p.nb) &&
        packed(p.in_sa[k]) && batch_packed(p.bin[k]) && aligned_to(ptr.in[k], int(in_size[k]) * kEwPack))
      p.vec_in |= 1u << k;
  p.vec_out = STITCH_EW_TILE_PACK && sizeof(TOut) * kEwPack <= 16 && packed(p.na) && packed(p.out_sb) &&
              batch_packed(p.bout) && aligned_to(ptr.out, int(sizeof(TOut)) * kEwPack);
  for (int k = 0; k < NIN; ++k)
    p.amode[k] = p.in_sa[k] == 0 ? kEwBcastA
                 : p.in_sa[k] == 1 && in_size[k] * kEwPack <= 16 && packed(p.in_sb[k]) && batch_packed(p.bin[k]) &&
                           aligned_to(ptr.in[k], int(in_size[k]) * kEwPack)
                       ? kEwPackA
                       : kEwEachA;
  int nstaged = 0;
  for (int k = 0; k < NIN; ++k) nstaged = (p.staged >> k) & 1u ? k + 1 : nstaged;
  const size_t smem = size_t(nstaged) * kEwTileSmem * sizeof(float);
  if (smem > 48 * 1024) {
    if (cudaFuncSetAttribute(ew_tile_kernel<F, TOut, TIn...>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(smem)) != cudaSuccess)
      return false;
  }
  ew_tile_kernel<F, TOut, TIn...><<<grid, kEwTileThreads, smem, stream>>>(f, ptr, p);
  return true;
}

}  // namespace detail

namespace detail {

// What both launchers check: a layout of at most kEwMaxDims non-negative dims and, when there is
// anything to do, non-null pointers. cudaSuccess with n the element count (0: nothing to launch),
// else cudaErrorInvalidValue.
template <int NIN>
inline cudaError_t ew_check(const EwLayout<NIN>& layout, const EwPtrs<NIN>& ptr, int64_t& n) {
  n = 0;
  if (layout.ndim < 0 || layout.ndim > kEwMaxDims) return cudaErrorInvalidValue;
  int64_t count = 1;
  for (int d = 0; d < layout.ndim; ++d) {
    if (layout.shape[d] < 0) return cudaErrorInvalidValue;
    count *= layout.shape[d];
  }
  if (count == 0) return cudaSuccess;
  for (int k = 0; k < NIN; ++k)
    if (!ptr.in[k]) return cudaErrorInvalidValue;
  if (!ptr.out) return cudaErrorInvalidValue;
  n = count;
  return cudaSuccess;
}

}  // namespace detail

// Launch out = f(in...) over `layout` on `stream`; returns the launch status.
template <class F, class TOut, class... TIn>
cudaError_t launch_elementwise(const F& f, TOut* out, const EwLayout<sizeof...(TIn)>& layout,
                               cudaStream_t stream, const TIn*... in) {
  constexpr int NIN = sizeof...(TIn);
  static_assert(NIN >= 1 && NIN <= kEwMaxInputs, "1 to 8 inputs");
  constexpr int NT = NIN + 1;
  const detail::EwPtrs<NIN> ptr{out, {static_cast<const void*>(in)...}};
  int64_t n = 0;
  if (const cudaError_t e = detail::ew_check(layout, ptr, n); e != cudaSuccess || n == 0) return e;

  // Dims in the output's memory order (largest stride first; a stable sort keeps ties in
  // place): a channels-last tensor described in logical NCHW order then walks its channels
  // innermost, so a channel slice (a join along channels) copies in runs, not one element per
  // lane at the channel stride.
  int order[kEwMaxDims];
  for (int d = 0; d < layout.ndim; ++d) {
    int j = d;
    while (j > 0 && layout.out_stride[order[j - 1]] < layout.out_stride[d]) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = d;
  }
  int64_t oshape[kEwMaxDims], ost[NT][kEwMaxDims];
  for (int d = 0; d < layout.ndim; ++d) {
    oshape[d] = layout.shape[order[d]];
    ost[0][d] = layout.out_stride[order[d]];
    for (int k = 0; k < NIN; ++k) ost[k + 1][d] = layout.in_stride[k][order[d]];
  }
  const int64_t* strides[NT];
  for (int t = 0; t < NT; ++t) strides[t] = ost[t];
  int64_t shape[kEwMaxDims];
  int64_t st[NT][kEwMaxDims];
  const int m = detail::ew_coalesce<NT>(layout.ndim, oshape, strides, shape, st);

  // Contiguous (one dim of stride 1, or none left) or a broadcast scalar (every stride 0).
  auto contiguous = [&](int t) { return m == 0 || (m == 1 && st[t][0] == 1); };
  auto scalar = [&](int t) {
    for (int d = 0; d < m; ++d)
      if (st[t][d] != 0) return false;
    return true;
  };
  bool fast = contiguous(0);
  unsigned scalar_mask = 0;
  for (int k = 0; k < NIN && fast; ++k) {
    if (m > 0 && scalar(k + 1)) scalar_mask |= 1u << k;
    else fast = contiguous(k + 1);
  }
  if (fast) {
    constexpr int VEC = 16 / detail::MaxSize<TOut, TIn...>::value;
    bool aligned = aligned_to(out, pack_align<TOut, VEC>());
    const bool in_aligned[NIN] = {aligned_to(in, pack_align<TIn, VEC>())...};
    for (int k = 0; k < NIN; ++k) aligned = aligned && ((scalar_mask >> k & 1u) || in_aligned[k]);
    if (aligned && VEC > 1 && n >= VEC)
      detail::ew_contig_kernel<F, VEC, TOut, TIn...>
          <<<detail::ew_blocks(n / VEC), detail::kEwThreads, 0, stream>>>(f, ptr, n, scalar_mask);
    else
      detail::ew_contig_kernel<F, 1, TOut, TIn...>
          <<<detail::ew_blocks(n), detail::kEwThreads, 0, stream>>>(f, ptr, n, scalar_mask);
    return cudaGetLastError();
  }

  if (detail::ew_launch_tiled<F, TOut, TIn...>(f, ptr, m, shape, st, stream)) return cudaGetLastError();

  // Innermost dim in 16-byte chunks when out and every input not broadcast along it are
  // contiguous there, its size and all other strides are multiples of VEC, pointers aligned.
  constexpr int VEC = 16 / detail::MaxSize<TOut, TIn...>::value;
  const int inner = m - 1;
  bool vec = VEC > 1 && m > 0 && shape[inner] % VEC == 0 && st[0][inner] == 1 &&
             aligned_to(out, pack_align<TOut, VEC>());
  unsigned bcast_mask = 0;
  const int aligns[NIN] = {pack_align<TIn, VEC>()...};
  for (int t = 0; t < NT && vec; ++t) {
    if (t > 0 && st[t][inner] == 0) {
      bcast_mask |= 1u << (t - 1);
      continue;
    }
    vec = st[t][inner] == 1 && (t == 0 || aligned_to(ptr.in[t - 1], aligns[t - 1]));
    for (int d = 0; d < inner && vec; ++d) vec = st[t][d] % VEC == 0;
  }
  bool small = n < INT_MAX;
  for (int t = 0; t < NT && small; ++t) {
    int64_t last = 0;
    for (int d = 0; d < m; ++d) last += (shape[d] - 1) * st[t][d];
    small = last < INT_MAX;
  }
  if (vec)
    return small ? detail::ew_launch_strided<F, uint32_t, VEC, TOut, TIn...>(f, ptr, m, shape, st, n, bcast_mask, stream)
                 : detail::ew_launch_strided<F, int64_t, VEC, TOut, TIn...>(f, ptr, m, shape, st, n, bcast_mask, stream);
  return small ? detail::ew_launch_strided<F, uint32_t, 1, TOut, TIn...>(f, ptr, m, shape, st, n, 0u, stream)
               : detail::ew_launch_strided<F, int64_t, 1, TOut, TIn...>(f, ptr, m, shape, st, n, 0u, stream);
}

// Launch out = f(in...) over `layout` for work done once (a program's create phase: weights
// folded, tables computed): the strided path alone, element by element in 64-bit index math, so
// one kernel is compiled where launch_elementwise compiles up to seven (each layout's best path).
// A net whose batch norms fold at create had 1,100 kernels to compile, nearly all of them these.
template <class F, class TOut, class... TIn>
cudaError_t launch_elementwise_once(const F& f, TOut* out, const EwLayout<sizeof...(TIn)>& layout,
                                    cudaStream_t stream, const TIn*... in) {
  constexpr int NIN = sizeof...(TIn);
  static_assert(NIN >= 1 && NIN <= kEwMaxInputs, "1 to 8 inputs");
  const detail::EwPtrs<NIN> ptr{out, {static_cast<const void*>(in)...}};
  int64_t n = 0;
  if (const cudaError_t e = detail::ew_check(layout, ptr, n); e != cudaSuccess || n == 0) return e;
  int64_t st[NIN + 1][kEwMaxDims];
  for (int d = 0; d < layout.ndim; ++d) {
    st[0][d] = layout.out_stride[d];
    for (int k = 0; k < NIN; ++k) st[k + 1][d] = layout.in_stride[k][d];
  }
  return detail::ew_launch_strided<F, int64_t, 1, TOut, TIn...>(f, ptr, layout.ndim, layout.shape, st, n, 0u, stream);
}

// ---- strided copy / permute -------------------------------------------------------------------

namespace detail {

struct Copy1 {
  __device__ float operator()(const float* a) const { return a[0]; }
};

}  // namespace detail

// out[idx . out_stride] = in[idx . in_stride[0]] over layout's shape, converting Tin -> Tout.
template <class Tin, class Tout>
cudaError_t launch_strided_copy(const Tin* in, Tout* out, const EwLayout<1>& layout,
                                cudaStream_t stream) {
  return launch_elementwise(detail::Copy1{}, out, layout, stream, in);
}

// out (contiguous, shape in_shape[perm[i]]) = in.permute(perm).
template <class Tin, class Tout>
cudaError_t launch_permute(const Tin* in, const int64_t* in_shape, const int64_t* in_stride,
                           int ndim, const int* perm, Tout* out, cudaStream_t stream) {
  if (ndim < 0 || ndim > kEwMaxDims) return cudaErrorInvalidValue;
  EwLayout<1> L{};
  L.ndim = ndim;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (perm[d] < 0 || perm[d] >= ndim) return cudaErrorInvalidValue;
    L.shape[d] = in_shape[perm[d]];
    L.in_stride[0][d] = in_stride[perm[d]];
    L.out_stride[d] = s;
    s *= L.shape[d];
  }
  return launch_strided_copy(in, out, L, stream);
}

}  // namespace stitch
