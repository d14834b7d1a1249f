// attention.cuh — fused scaled-dot-product attention, flash-attention style (online softmax).
//
// launch_attention<T, D>(AttnParams<T>, stream, allow_tf32 = false)
//   T   storage of q, k, v, o (float, __half, __nv_bfloat16); D head dim, a multiple of 16 in
//       [16, 128] (AttnHeadDim<D>::ok).
//   O = softmax(Q K^T * scale + mask) V per (batch, head), fp32 accumulation and softmax.
//   T = float runs the SIMT kernel (exact fp32 math), or with allow_tf32 the TF32 tensor-core
//   kernel (mma.sync m16n8k8 .tf32: q, k, v and P rounded to TF32 by cvt.rna, fp32 softmax and
//   accumulation; about 1e-3 from float64 on unit-scale inputs). __half / __nv_bfloat16 run the
//   tensor-core kernel (mma.sync m16n8k16, fp32 accumulators, P rounded to T before P V as in
//   FlashAttention-2). launch_attention_simt<T, D> runs the SIMT kernel for any T,
//   launch_attention_tf32<D> the TF32 kernel, launch_attention_split_tf32<D> its split-TF32 form
//   (three TF32 products each, about fp32's accuracy), launch_attention_mma<T, D> the 16-bit one.
// launch_attention_mask_blocks<T>(AttnParams<T>, blocks, stream)
//   Summarises p.mask in cells of kAttnMaskBlockQ query rows x kAttnMaskBlockK keys, one byte per
//   cell at blocks[b * s0 + h * s1 + qc * s2 + kc * s3] (s = p.mask_blocks_stride, in bytes; b / h
//   run over one value where s0 / s1 is 0, which needs the mask broadcast there too): bit 0 set
//   when some element of the cell attends, bit 1 when some element is masked (bool: zero;
//   additive: nonzero), bit 2 when some element differs from the causal mask (key j attends query
//   i iff j <= i; additive: 0 there and -inf elsewhere). Given that summary in p.mask_blocks,
//   every kernel skips the key tiles whose cells all lack bit 0, reads the mask only in tiles
//   with bits 1 and 2, and computes it (j > i is masked) in tiles with bit 1 but not bit 2 — a
//   causal mask held as data then costs what is_causal costs, whatever its strides. Run it once
//   when the mask is a constant; the summary is stale as soon as the mask changes.
// Contract
//   - q [B, H, Lq, D], k / v [B, H / heads_per_kv, Lk, D], o [B, H, Lq, D], each given by four
//     element strides (any view: transposes of [B, L, H, D], slices of a fused QKV); the last
//     stride must be 1. o must not overlap q, k or v. Query head h reads k / v head
//     h / heads_per_kv (1: plain multi-head attention; > 1: grouped-query attention).
//   - 16-byte loads (cp.async in the tensor-core kernels) when q, k, v, o are 16-byte aligned and
//     their batch / head / row strides are multiples of 8 elements; element loads otherwise.
//   - causal: key j is visible to query i iff j <= i + causal_offset. causal_offset = 0 is
//     PyTorch's is_causal (top-left aligned); Lk - Lq is the bottom-right alignment of
//     FlashAttention. Key tiles wholly above the diagonal are skipped.
//   - mask (optional): AttnMask::AddSame (additive, type T), AddF32 (additive, float) or Bool
//     (one byte per element, nonzero = attend, like torch.bool in F.scaled_dot_product_attention),
//     read at mask[b * s0 + h * s1 + i * s2 + j * s3]; zero strides broadcast. A bool mask whose
//     strides are multiples of 16 (last 1) and address 16-byte aligned is read 16 bytes at a time.
//   - mask_blocks (optional, only with a mask): launch_attention_mask_blocks' summary of the mask.
//   - A query row with no visible key gets O = 0 (PyTorch's math path returns NaN there).
//   - Returns cudaErrorInvalidValue for a bad stride / shape, else the launch status.
// Tiles
//   SIMT (256 threads): 64 query rows x 64 keys per step; Q^T, K^T, V and P in shared memory as
//   fp32 (64 * D * 12 + 17 KB: 113 KB at D = 128); each thread owns a 4 x 4 block of S and a
//   4 x D / 16 block of O (columns 16 * VW apart in runs of VW = 4, 2 or 1 as D allows),
//   computed as register outer products from vector shared loads.
//   Tensor core, 16-bit (128 threads = 4 warps): 128 query rows per block, 32 per warp as two m16
//   tiles so that each K / V fragment loaded by ldmatrix feeds 4 mma; key tiles of 64 (D <= 80)
//   or 32 (D > 80) double-buffered through cp.async into shared rows padded by 16 bytes
//   (conflict-free ldmatrix); Q as mma A-fragments in registers (D <= 64) or re-read from shared
//   memory; S, P and O in registers. D = 112 is computed as 128 with zero columns (its own tiling
//   spills). No instantiation spills on sm_90 (tests/test_templates_compile.py checks).
//   Tensor core, TF32 (128 threads): the same block shape; key tiles of 64 (D <= 64) or 32 (D >
//   64) so that two blocks fit an sm_90 SM up to D = 96 (108 KB of shared memory with a bool
//   mask at D = 96); rows padded by 16 bytes; Q re-read from shared memory. Q and K (for
//   S = Q K^T) load as 32-bit fragments by ldmatrix (a b16 8 x 8 matrix is an 8 x 4 block of
//   fp32, exactly the tf32 A / B fragment layout). For P V the keys of each 8-key step are
//   taken in the order (0, 2, 4, 6, 1, 3, 5, 7), which makes S's accumulator registers P's
//   A-fragment as they are, and the V columns of a 32-column group in the order (4 g + j) for
//   n-tile j, so that a thread's B-fragments for 4 n-tiles are one 16-byte shared load and its
//   O values 8 consecutive columns. Tiles are rounded to TF32 in shared memory, each thread
//   rounding what its own cp.async brought in.
//   Split TF32: as TF32 but tiles left unrounded in shared memory and every fragment split as it is
//   read; key tiles of 32, and one m-tile per warp (64 query rows a block) past D = 96, so that no
//   instantiation spills on sm_90.
//   Masks are staged per step into shared memory (bool as bytes, additive as fp32, taken into the
//   log2 domain where they are added), only for tiles that need them; an aligned bool or 4-byte
//   additive mask by 16-byte loads (cp.async for the additive one, in flight with the tile).
// Performance: benchmarks/bench_templates.py, results in benchmarks/templates.md. The
//   tensor-core kernels are bound by mma.sync issue and shared-memory traffic, well below what
//   wgmma-based kernels (FlashAttention-3, cuDNN) reach on Hopper; the SIMT kernel is bound by
//   FMA and shared-memory issue, at about half the fp32 FMA peak.
#pragma once

#include <climits>
#include <type_traits>

#include "stitch/common.cuh"
#include "stitch/mma.cuh"

namespace stitch {

enum class AttnMask : int { None = 0, AddSame = 1, AddF32 = 2, Bool = 3 };

// Cells of the mask summary (launch_attention_mask_blocks): query rows x keys per byte.
constexpr int kAttnMaskBlockQ = 64, kAttnMaskBlockK = 32;

// Head dims every kernel is built for.
template <int D>
struct AttnHeadDim {
  static constexpr bool ok = D % 16 == 0 && D >= 16 && D <= 128;
};

template <class T>
struct AttnParams {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  int64_t q_stride[4], k_stride[4], v_stride[4], o_stride[4];  // [B, H, L, D], elements
  int B, H, Lq, Lk, heads_per_kv;
  float scale;
  bool causal;
  int64_t causal_offset;
  AttnMask mask_kind;
  const void* mask;
  int64_t mask_stride[4];  // [B, H, Lq, Lk]
  const unsigned char* mask_blocks;  // optional: launch_attention_mask_blocks' summary of mask
  int64_t mask_blocks_stride[4];     // [B, H, query cell, key cell], bytes
};

namespace detail {

constexpr unsigned kTileVisible = 1u, kTileMasked = 2u, kTileNotCausal = 4u;

// A tile class (attn_tile_class) that must read the mask, and one masked exactly as the causal
// mask is (key j hidden from query i iff j > i): computed, not read.
__device__ __forceinline__ bool attn_tile_reads_mask(unsigned c) { return (c & kTileMasked) && (c & kTileNotCausal); }
__device__ __forceinline__ bool attn_tile_causal(unsigned c) { return (c & kTileMasked) && !(c & kTileNotCausal); }

// Where one (b, h) starts, for each tensor.
template <class T>
struct AttnBase {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  const unsigned char* mask;
  const unsigned char* blocks;  // mask summary of this (b, h), or null
};

template <class T>
__device__ __forceinline__ AttnBase<T> attn_base(const AttnParams<T>& p, int64_t b, int64_t h) {
  const int64_t hk = h / p.heads_per_kv;
  AttnBase<T> r;
  r.q = p.q + b * p.q_stride[0] + h * p.q_stride[1];
  r.k = p.k + b * p.k_stride[0] + hk * p.k_stride[1];
  r.v = p.v + b * p.v_stride[0] + hk * p.v_stride[1];
  r.o = p.o + b * p.o_stride[0] + h * p.o_stride[1];
  const int64_t esize = p.mask_kind == AttnMask::AddSame ? int64_t(sizeof(T))
                        : p.mask_kind == AttnMask::AddF32 ? 4
                                                          : 1;
  const bool has_mask = p.mask_kind != AttnMask::None && p.mask;
  r.mask = has_mask ? static_cast<const unsigned char*>(p.mask) +
                          (b * p.mask_stride[0] + h * p.mask_stride[1]) * esize
                    : nullptr;
  r.blocks = has_mask && p.mask_blocks
                 ? p.mask_blocks + b * p.mask_blocks_stride[0] + h * p.mask_blocks_stride[1]
                 : nullptr;
  return r;
}

// What the mask does to query rows [q0, q0 + bq) x keys [k0, k0 + bk) (q0, k0 multiples of the
// summary's cells): kTileVisible if a key may be visible there, kTileMasked if some key is
// masked, kTileNotCausal if that masking is not the causal mask's. Without a summary every tile
// may be all three; without a mask every tile is plain.
template <class T>
__device__ __forceinline__ unsigned attn_tile_class(const AttnParams<T>& p, const unsigned char* blocks,
                                                    int64_t q0, int bq, int64_t k0, int bk) {
  if (p.mask_kind == AttnMask::None) return kTileVisible;
  if (!blocks) return kTileVisible | kTileMasked | kTileNotCausal;
  const int64_t qe = q0 + bq < p.Lq ? q0 + bq : p.Lq;
  const int64_t ke = k0 + bk < p.Lk ? k0 + bk : p.Lk;
  unsigned c = 0;
  for (int64_t qc = q0 / kAttnMaskBlockQ; qc * kAttnMaskBlockQ < qe; ++qc)
    for (int64_t kc = k0 / kAttnMaskBlockK; kc * kAttnMaskBlockK < ke; ++kc)
      c |= blocks[qc * p.mask_blocks_stride[2] + kc * p.mask_blocks_stride[3]];
  return c;
}

// The first key tile t' >= t (of n, bk keys each) that the summary does not rule out.
template <class T>
__device__ __forceinline__ int attn_next_tile(const AttnParams<T>& p, const unsigned char* blocks, int64_t q0,
                                              int bq, int bk, int t, int n) {
  if (blocks)
    while (t < n && !(attn_tile_class(p, blocks, q0, bq, int64_t(t) * bk, bk) & kTileVisible)) ++t;
  return t;
}

// A score in the log2 domain (already times scale * log2 e) after causal / mask / bounds.
template <class T>
__device__ __forceinline__ float attn_mask_score(const AttnParams<T>& p, const unsigned char* mb, bool use_mask,
                                                 bool tile_causal, float x, int64_t i, int64_t j) {
  if (j >= p.Lk || i >= p.Lq) return -CUDART_INF_F;
  if (p.causal && j > i + p.causal_offset) return -CUDART_INF_F;
  if (tile_causal && j > i) return -CUDART_INF_F;
  if (!use_mask) return x;
  const int64_t off = i * p.mask_stride[2] + j * p.mask_stride[3];
  switch (p.mask_kind) {
    case AttnMask::AddSame: return x + to_float(reinterpret_cast<const T*>(mb)[off]) * kLog2e;
    case AttnMask::AddF32: return x + reinterpret_cast<const float*>(mb)[off] * kLog2e;
    case AttnMask::Bool: return mb[off] ? x : -CUDART_INF_F;
    default: return x;
  }
}

// N consecutive elements as floats (one N-element access when vec).
template <class T, int N>
__device__ __forceinline__ void loadN(float (&v)[N], const T* p, bool vec) {
  if (vec) {
    const Pack<T, N> pk = load_pack<T, N>(p);
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = to_float(pk.v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = to_float(p[e]);
  }
}

template <class T, int N>
__device__ __forceinline__ void storeN(T* p, const float (&v)[N], bool vec) {
  if (vec) {
    Pack<T, N> pk;
#pragma unroll
    for (int e = 0; e < N; ++e) pk.v[e] = from_float<T>(v[e]);
    store_pack<T, N>(p, pk);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) p[e] = from_float<T>(v[e]);
  }
}

// Last key index + 1 that any query row in [q0, q0 + rows) can see.
template <class T>
__device__ __forceinline__ int64_t attn_kv_end(const AttnParams<T>& p, int64_t q0, int rows) {
  int64_t end = p.Lk;
  if (p.causal) {
    int64_t last = q0 + rows - 1;
    if (last > p.Lq - 1) last = p.Lq - 1;
    const int64_t lim = last + p.causal_offset + 1;
    if (lim < end) end = lim;
    if (end < 0) end = 0;
  }
  return end;
}

// ---- mask summary ------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(256) attn_mask_blocks_kernel(AttnParams<T> p, unsigned char* out, int64_t nh,
                                                               int64_t nq, int64_t nk, int64_t cells) {
  const int64_t esize = p.mask_kind == AttnMask::AddSame ? int64_t(sizeof(T))
                        : p.mask_kind == AttnMask::AddF32 ? 4
                                                          : 1;
  const unsigned char* mask = static_cast<const unsigned char*>(p.mask);
  for (int64_t cell = blockIdx.x; cell < cells; cell += gridDim.x) {
    int64_t rest = cell;
    const int64_t kc = rest % nk;
    rest /= nk;
    const int64_t qc = rest % nq;
    rest /= nq;
    const int64_t h = rest % nh, b = rest / nh;
    const unsigned char* mb = mask + (b * p.mask_stride[0] + h * p.mask_stride[1]) * esize;
    int vis = 0, masked = 0, not_causal = 0;
    for (int idx = threadIdx.x; idx < kAttnMaskBlockQ * kAttnMaskBlockK; idx += blockDim.x) {
      const int64_t i = qc * kAttnMaskBlockQ + idx / kAttnMaskBlockK;
      const int64_t j = kc * kAttnMaskBlockK + idx % kAttnMaskBlockK;
      if (i >= p.Lq || j >= p.Lk) continue;
      const int64_t off = i * p.mask_stride[2] + j * p.mask_stride[3];
      if (p.mask_kind == AttnMask::Bool) {
        const bool a = mb[off] != 0;
        vis |= a;
        masked |= !a;
        not_causal |= a != (j <= i);
      } else {
        const float x = p.mask_kind == AttnMask::AddF32 ? reinterpret_cast<const float*>(mb)[off]
                                                        : to_float(reinterpret_cast<const T*>(mb)[off]);
        vis |= x != -CUDART_INF_F;
        masked |= x != 0.f;
        not_causal |= j <= i ? x != 0.f : x != -CUDART_INF_F;
      }
    }
    vis = __syncthreads_or(vis);
    masked = __syncthreads_or(masked);
    not_causal = __syncthreads_or(not_causal);
    if (threadIdx.x == 0)
      out[b * p.mask_blocks_stride[0] + h * p.mask_blocks_stride[1] + qc * p.mask_blocks_stride[2] +
          kc * p.mask_blocks_stride[3]] = static_cast<unsigned char>(
          (vis ? kTileVisible : 0u) | (masked ? kTileMasked : 0u) | (not_causal ? kTileNotCausal : 0u));
  }
}

// ---- SIMT kernel (fp32 math; any storage type) -------------------------------------------------

template <int D>
struct SimtAttnCfg {
  static constexpr int BQ = 64, BK = 64, THREADS = 256;
  static constexpr int TD = D / 16;                                 // O columns per thread
  static constexpr int VW = D % 64 == 0 ? 4 : D % 32 == 0 ? 2 : 1;  // ... per vector access
  static constexpr int PLD = BK + 4;                                // P row pitch (floats)
  // Blocks per SM the registers are held to: 2 (128 registers) while O fits, else 1 (no spills).
  static constexpr int MIN_BLOCKS = D <= 80 ? 2 : 1;
  static constexpr size_t smem_bytes = sizeof(float) * (size_t(D) * BQ + size_t(D) * BK + size_t(BK) * D + size_t(BQ) * PLD);
  // Column of a thread's c-th O value; tc is its column lane (0..15): runs of VW, 16 VW apart.
  __host__ __device__ static constexpr int col(int c, int tc) { return (c / VW) * (16 * VW) + tc * VW + c % VW; }
};

template <class T, int D>
__global__ void __launch_bounds__(256, SimtAttnCfg<D>::MIN_BLOCKS) attn_simt_kernel(AttnParams<T> p, bool vec) {
  using C = SimtAttnCfg<D>;
  constexpr int BQ = C::BQ, BK = C::BK, TD = C::TD, PLD = C::PLD, VW = C::VW;
  extern __shared__ float4 smem_f4[];
  float* Qs = reinterpret_cast<float*>(smem_f4);  // [D][BQ], pre-scaled by scale * log2 e
  float* Ks = Qs + D * BQ;                        // [D][BK]
  float* Vs = Ks + D * BK;                        // [BK][D]
  float* Ps = Vs + BK * D;                        // [BQ][PLD]

  const int tid = threadIdx.x, tr = tid >> 4, tc = tid & 15;
  const int64_t nqt = ceil_div<int64_t>(p.Lq, BQ);
  const int64_t bh = blockIdx.x / nqt;
  const int64_t q0 = (blockIdx.x - bh * nqt) * BQ;
  const AttnBase<T> base = attn_base(p, bh / p.H, bh % p.H);
  const float qscale = p.scale * kLog2e;

  for (int idx = tid; idx < BQ * D / 4; idx += C::THREADS) {
    const int r = idx % BQ, d4 = (idx / BQ) * 4;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (q0 + r < p.Lq) loadN<T, 4>(v, base.q + (q0 + r) * p.q_stride[2] + d4, vec);
#pragma unroll
    for (int e = 0; e < 4; ++e) Qs[(d4 + e) * BQ + r] = v[e] * qscale;
  }

  float o[4][TD];
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -CUDART_INF_F;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < TD; ++c) o[i][c] = 0.f;
  }

  const int64_t kv_end = attn_kv_end(p, q0, BQ);
  for (int64_t k0 = 0; k0 < kv_end; k0 += BK) {
    const unsigned cls = attn_tile_class(p, base.blocks, q0, BQ, k0, BK);
    if (!(cls & kTileVisible)) continue;  // the mask hides every key of the tile (uniform)
    const bool use_mask = attn_tile_reads_mask(cls), tile_causal = attn_tile_causal(cls);
    __syncthreads();  // the previous step is done with Ks, Vs, Ps (and Qs is in place)
    for (int idx = tid; idx < BK * D / 4; idx += C::THREADS) {
      const int r = idx % BK, d4 = (idx / BK) * 4;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if (k0 + r < p.Lk) loadN<T, 4>(v, base.k + (k0 + r) * p.k_stride[2] + d4, vec);
#pragma unroll
      for (int e = 0; e < 4; ++e) Ks[(d4 + e) * BK + r] = v[e];
    }
    for (int idx = tid; idx < BK * D / 4; idx += C::THREADS) {
      const int r = idx / (D / 4), d4 = (idx % (D / 4)) * 4;
      float v[4] = {0.f, 0.f, 0.f, 0.f};  // keys past Lk: V = 0 so that 0 * V stays finite
      if (k0 + r < p.Lk) loadN<T, 4>(v, base.v + (k0 + r) * p.v_stride[2] + d4, vec);
      *reinterpret_cast<float4*>(Vs + r * D + d4) = make_float4(v[0], v[1], v[2], v[3]);
    }
    __syncthreads();

    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      const float4 qv = *reinterpret_cast<const float4*>(Qs + d * BQ + tr * 4);
      const float4 kv = *reinterpret_cast<const float4*>(Ks + d * BK + tc * 4);
      const float qa[4] = {qv.x, qv.y, qv.z, qv.w}, ka[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = fmaf(qa[i], ka[j], s[i][j]);
    }

    const bool need_mask = use_mask || tile_causal || k0 + BK > p.Lk ||
                           (p.causal && k0 + BK - 1 > q0 + p.causal_offset) || q0 + BQ > p.Lq;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t qi = q0 + tr * 4 + i;
      if (need_mask) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = attn_mask_score(p, base.mask, use_mask, tile_causal, s[i][j], qi, k0 + tc * 4 + j);
      }
      float mx = fmaxf(fmaxf(s[i][0], s[i][1]), fmaxf(s[i][2], s[i][3]));
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, shfl_xor(mx, off));
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;
      const float alpha = fast_exp2(m[i] - m_use);
      m[i] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = fast_exp2(s[i][j] - m_use);
        rs += s[i][j];
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) rs += shfl_xor(rs, off);
      l[i] = l[i] * alpha + rs;
#pragma unroll
      for (int c = 0; c < TD; ++c) o[i][c] *= alpha;
      *reinterpret_cast<float4*>(Ps + (tr * 4 + i) * PLD + tc * 4) = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    }
    __syncthreads();

#pragma unroll 2
    for (int kk = 0; kk < BK; kk += 4) {
      float pa[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 pv = *reinterpret_cast<const float4*>(Ps + (tr * 4 + i) * PLD + kk);
        pa[i][0] = pv.x; pa[i][1] = pv.y; pa[i][2] = pv.z; pa[i][3] = pv.w;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float* vrow = Vs + (kk + u) * D;
        float vv[TD];
#pragma unroll
        for (int c = 0; c < TD; c += VW) {
          const float* src = vrow + C::col(c, tc);
          if constexpr (VW == 4) {
            const float4 x = *reinterpret_cast<const float4*>(src);
            vv[c] = x.x; vv[c + 1] = x.y; vv[c + 2] = x.z; vv[c + 3] = x.w;
          } else if constexpr (VW == 2) {
            const float2 x = *reinterpret_cast<const float2*>(src);
            vv[c] = x.x; vv[c + 1] = x.y;
          } else {
            vv[c] = *src;
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int c = 0; c < TD; ++c) o[i][c] = fmaf(pa[i][u], vv[c], o[i][c]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t qi = q0 + tr * 4 + i;
    if (qi >= p.Lq) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    T* orow = base.o + qi * p.o_stride[2];
#pragma unroll
    for (int c = 0; c < TD; c += VW) {
      float v[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) v[e] = o[i][c + e] * inv;
      storeN<T, VW>(orow + C::col(c, tc), v, vec);
    }
  }
}

// ---- tensor-core kernels: shared pieces ---------------------------------------------------------

// The per-step mask tile of the tensor-core kernels: bool as bytes (nonzero = attend), additive
// masks as log2-domain fp32; both conflict-free for the 2-element reads of an accumulator pair.
template <int BQ, int BK>
struct AttnMaskTile {
  static constexpr int BLD = BK + 16;  // bool tile pitch, bytes
  static constexpr int FLD = BK + 8;   // additive tile pitch, floats
  static constexpr size_t bytes(AttnMask kind) {
    return kind == AttnMask::None ? 0 : kind == AttnMask::Bool ? size_t(BQ) * BLD : sizeof(float) * size_t(BQ) * FLD;
  }
};

// Mask rows [q0, q0 + BQ) x keys [k0, k0 + BK) into shared memory (coalesced global reads; 16
// bytes at a time for an aligned bool or 4-byte additive mask: mvec). Entries out of range are
// left to the bounds test.
template <class T, int BQ, int BK, int THREADS>
__device__ __forceinline__ void attn_stage_mask(const AttnParams<T>& p, const unsigned char* mb, int64_t q0,
                                                int64_t k0, void* dst, bool mvec) {
  using MC = AttnMaskTile<BQ, BK>;
  if (p.mask_kind == AttnMask::Bool) {
    unsigned char* Mb = static_cast<unsigned char*>(dst);
    constexpr int CPR = BK / 16;
    for (int idx = threadIdx.x; idx < BQ * CPR; idx += THREADS) {
      const int r = idx / CPR, c = (idx % CPR) * 16;
      const int64_t i = q0 + r, j = k0 + c;
      unsigned char* d = Mb + r * MC::BLD + c;
      if (i < p.Lq && mvec && j + 16 <= p.Lk) {
        *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(mb + i * p.mask_stride[2] + j);
      } else {
#pragma unroll
        for (int e = 0; e < 16; ++e)
          d[e] = (i < p.Lq && j + e < p.Lk) ? mb[i * p.mask_stride[2] + (j + e) * p.mask_stride[3]] : 0;
      }
    }
  } else if (mvec) {
    // A 4-byte additive mask, rows 16-byte aligned: cp.async, 16 bytes at a time, straight into
    // shared memory (element loads one after another cost T5's [B, H, L, L] position bias ten
    // times the kernel's own work). The caller commits the group and waits for it with the tile.
    float* Mf = static_cast<float*>(dst);
    constexpr int PER_ROW = BK / 4;
#pragma unroll 1
    for (int idx = threadIdx.x; idx < BQ * PER_ROW; idx += THREADS) {
      const int r = idx / PER_ROW, c = (idx % PER_ROW) * 4;
      const int64_t i = q0 + r, j = k0 + c;
      const float* src = reinterpret_cast<const float*>(mb) + (i < p.Lq ? i : 0) * p.mask_stride[2] + j;
      if (j + 4 <= p.Lk || i >= p.Lq) {
        cp_async16(Mf + r * MC::FLD + c, i < p.Lq ? src : reinterpret_cast<const float*>(mb), i < p.Lq);
      } else {
        for (int e = 0; e < 4; ++e) Mf[r * MC::FLD + c + e] = j + e < p.Lk ? src[e] : 0.f;
      }
    }
  } else if (sizeof(T) == 4) {
    // fp32 storage (the TF32 and SIMT kernels), an additive mask in any strides (Swin's windows: 49
    // keys a row): cp.async, one element each, all of them in flight at once; the caller commits
    // and waits as above. (Not in the 16-bit kernels: its registers spill the D = 64 one.)
    float* Mf = static_cast<float*>(dst);
#pragma unroll 1
    for (int idx = threadIdx.x; idx < BQ * BK; idx += THREADS) {
      const int r = idx / BK, c = idx % BK;
      const int64_t i = q0 + r, j = k0 + c;
      const bool in = i < p.Lq && j < p.Lk;
      const float* src = reinterpret_cast<const float*>(mb) + (in ? i * p.mask_stride[2] + j * p.mask_stride[3] : 0);
      cp_async4(Mf + r * MC::FLD + c, src, in);
    }
  } else {
    float* Mf = static_cast<float*>(dst);
    for (int idx = threadIdx.x; idx < BQ * BK; idx += THREADS) {
      const int r = idx / BK, c = idx % BK;
      const int64_t i = q0 + r, j = k0 + c;
      float x = 0.f;
      if (i < p.Lq && j < p.Lk) {
        const int64_t off = i * p.mask_stride[2] + j * p.mask_stride[3];
        x = p.mask_kind == AttnMask::AddF32 ? reinterpret_cast<const float*>(mb)[off]
                                            : to_float(reinterpret_cast<const T*>(mb)[off]);
      }
      Mf[r * MC::FLD + c] = x;
    }
  }
}

// One step of the online softmax over a warp's scores s (MT m-tiles x NT n-tiles of 16 x 8 mma
// accumulators, keys k0 + 8 n + 2 tig + {0, 1}): scale into the log2 domain, mask (the staged
// tile when use_mask; bounds and causality), update the running max m and per-thread partial row
// sums l, rescale O, and leave P = exp2(s - m) in s.
template <class T, int MT, int NT, int DT, int BQ, int BK>
__device__ __forceinline__ void mma_softmax_step(const AttnParams<T>& p, float (&s)[MT][NT][4], float (&m)[MT][2],
                                                 float (&l)[MT][2], float (&o)[MT][DT][4], const void* mtile,
                                                 bool use_mask, bool tile_causal, int64_t q0, int64_t k0, int wrow,
                                                 int g, int tig, float sl2) {
  using MC = AttnMaskTile<BQ, BK>;
  const bool need_bounds = tile_causal || k0 + BK > p.Lk || (p.causal && k0 + BK - 1 > q0 + p.causal_offset) ||
                           q0 + BQ > p.Lq;
  const bool mbool = use_mask && p.mask_kind == AttnMask::Bool;
  const bool madd = use_mask && !mbool;
  const unsigned char* Mb = static_cast<const unsigned char*>(mtile);
  const float* Mf = static_cast<const float*>(mtile);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int ra = wrow + mt * 16 + g;  // row within the block; rb = ra + 8
    // Keys k0 + c with c < lim[r] are visible to row r (bounds and causality).
    int lim[2] = {BK, BK};
    if (need_bounds) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t i = q0 + ra + 8 * r;
        int64_t e = p.Lk;
        if (p.causal && i + p.causal_offset + 1 < e) e = i + p.causal_offset + 1;
        if (tile_causal && i + 1 < e) e = i + 1;
        if (i >= p.Lq) e = 0;
        e -= k0;
        lim[r] = e < 0 ? 0 : e > BK ? BK : int(e);
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int c = n * 8 + tig * 2, row = ra + 8 * r;
        float x0 = s[mt][n][2 * r] * sl2, x1 = s[mt][n][2 * r + 1] * sl2;
        if (madd) {
          const float2 a = *reinterpret_cast<const float2*>(Mf + row * MC::FLD + c);  // (staged unscaled)
          x0 = fmaf(a.x, kLog2e, x0);
          x1 = fmaf(a.y, kLog2e, x1);
        } else if (mbool) {
          const uchar2 b = *reinterpret_cast<const uchar2*>(Mb + row * MC::BLD + c);
          x0 = b.x ? x0 : -CUDART_INF_F;
          x1 = b.y ? x1 : -CUDART_INF_F;
        }
        s[mt][n][2 * r] = c < lim[r] ? x0 : -CUDART_INF_F;
        s[mt][n][2 * r + 1] = c + 1 < lim[r] ? x1 : -CUDART_INF_F;
      }
    }
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      mx[0] = fmaxf(mx[0], fmaxf(s[mt][n][0], s[mt][n][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[mt][n][2], s[mt][n][3]));
    }
    float mu[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], shfl_xor(mx[r], 1));
      mx[r] = fmaxf(mx[r], shfl_xor(mx[r], 2));
      const float m_new = fmaxf(m[mt][r], mx[r]);
      mu[r] = m_new == -CUDART_INF_F ? 0.f : m_new;
      alpha[r] = fast_exp2(m[mt][r] - mu[r]);
      m[mt][r] = m_new;
      l[mt][r] *= alpha[r];  // per-thread partial row sums; the quad is summed at the end
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[mt][n][e] = fast_exp2(s[mt][n][e] - mu[e >> 1]);
        l[mt][e >> 1] += s[mt][n][e];
      }
    }
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      o[mt][n][0] *= alpha[0]; o[mt][n][1] *= alpha[0];
      o[mt][n][2] *= alpha[1]; o[mt][n][3] *= alpha[1];
    }
  }
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix from a shared-space address (32-bit; constant offsets fold into the instruction).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// rows x D elements from src (row stride rs, rows at or past `limit` and columns in [D, DP)
// zero-filled) into dst (row pitch LDS elements), in 16-byte chunks: chunk idx of the tile is this
// thread's iff idx % THREADS == threadIdx.x (tf32_round_tile relies on it).
template <class T, int D, int DP, int LDS, int THREADS>
__device__ __forceinline__ void mma_load_tile(T* dst, const T* src, int64_t rs, int64_t row0,
                                              int64_t limit, int rows, bool vec) {
  constexpr int EPC = 16 / int(sizeof(T)), CPR = DP / EPC;  // elements per chunk, chunks per row
  static_assert(D % EPC == 0 && DP % EPC == 0 && D <= DP, "whole chunks");
  for (int idx = threadIdx.x; idx < rows * CPR; idx += THREADS) {
    const int r = idx / CPR, c = (idx % CPR) * EPC;
    const int64_t row = row0 + r;
    const bool ok = row < limit && (DP == D || c < D);
    T* d = dst + r * LDS + c;
    if (vec) {
      cp_async16(d, ok ? src + row * rs + c : src, ok);
    } else {
#pragma unroll
      for (int e = 0; e < EPC; ++e) d[e] = ok ? src[row * rs + c + e] : from_float<T>(0.f);
    }
  }
}

// Round the chunks of a rows x D fp32 tile that this thread loaded (mma_load_tile) to tf32, in
// place: after this thread's cp.async.wait, before the barrier that publishes the tile.
template <int D, int LDS, int THREADS>
__device__ __forceinline__ void tf32_round_tile(float* t, int rows) {
  constexpr int CPR = D / 4;
  for (int idx = threadIdx.x; idx < rows * CPR; idx += THREADS) {
    float4* x = reinterpret_cast<float4*>(t + (idx / CPR) * LDS + (idx % CPR) * 4);
    float4 v = *x;
    v.x = __uint_as_float(tf32_bits(v.x));
    v.y = __uint_as_float(tf32_bits(v.y));
    v.z = __uint_as_float(tf32_bits(v.z));
    v.w = __uint_as_float(tf32_bits(v.w));
    *x = v;
  }
}

// ---- tensor-core kernel (half / bf16 storage) --------------------------------------------------

template <int D>
struct MmaAttnCfg {
  // The head dim computed: D itself, but 112 as 128 with zero columns (tiled at 112, the kernel spills).
  static constexpr int DP = D == 112 ? 128 : D;
  static constexpr int MT = 2;                 // 16-row m-tiles per warp: each K / V fragment feeds 2 * MT mma
  static constexpr int WARPS = 4, THREADS = 128;
  static constexpr int BQ = 16 * MT * WARPS;   // 128 query rows per block
  static constexpr int BK = DP <= 80 ? 64 : 32;  // S (BK) + O (DP) accumulators within 160 registers: no spills
  static constexpr bool Q_IN_REGS = DP <= 64;  // else A-fragments re-read from shared memory
  static constexpr int LDS = DP + 8;           // shared row pitch in elements: +16 B keeps ldmatrix conflict-free
  template <class T>
  static constexpr size_t smem_bytes(AttnMask kind) {
    return sizeof(T) * size_t(LDS) * (BQ + 4 * BK) + AttnMaskTile<BQ, BK>::bytes(kind);
  }
};

template <class T, int D>
__global__ void __launch_bounds__(128, 2) attn_mma_kernel(AttnParams<T> p, bool vec, bool mvec) {
  using C = MmaAttnCfg<D>;
  constexpr int DP = C::DP, MT = C::MT, BQ = C::BQ, BK = C::BK, LDS = C::LDS, NT = BK / 8, DT = DP / 8;
  constexpr bool QR = C::Q_IN_REGS;
  static_assert(BQ % kAttnMaskBlockQ == 0 && BK % kAttnMaskBlockK == 0, "tiles are whole summary cells");
  extern __shared__ float4 smem_f4[];
  T* Qs = reinterpret_cast<T*>(smem_f4);  // [BQ][LDS]
  T* Ks = Qs + BQ * LDS;                  // [2][BK][LDS]
  T* Vs = Ks + 2 * BK * LDS;              // [2][BK][LDS]
  void* Mt = Vs + 2 * BK * LDS;           // the step's mask tile (AttnMaskTile), only with a mask

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int64_t nqt = ceil_div<int64_t>(p.Lq, BQ);
  const int64_t bh = blockIdx.x / nqt;
  const int64_t q0 = (blockIdx.x - bh * nqt) * BQ;
  const AttnBase<T> base = attn_base(p, bh / p.H, bh % p.H);
  const float sl2 = p.scale * kLog2e;
  const int64_t kv_end = attn_kv_end(p, q0, BQ);
  const int n_tiles = int(ceil_div<int64_t>(kv_end, BK));
  int t = attn_next_tile(p, base.blocks, q0, BQ, BK, 0, n_tiles);
  const int wrow = warp * 16 * MT;  // first row of this warp within the block
  // Per-lane ldmatrix addresses (bytes, shared space); tile / k-step offsets are constants.
  constexpr uint32_t ROWB = LDS * sizeof(T), KVB = BK * ROWB;
  const uint32_t q_addr = smem_u32(Qs) + (wrow + (lane & 15)) * ROWB + (lane >> 4) * 16;
  const uint32_t k_addr = smem_u32(Ks) + ((lane & 7) + ((lane >> 4) << 3)) * ROWB + ((lane >> 3) & 1) * 16;
  const uint32_t v_addr = smem_u32(Vs) + ((lane & 7) + ((lane >> 3) & 1) * 8) * ROWB + (lane >> 4) * 16;

  mma_load_tile<T, D, DP, LDS, 128>(Qs, base.q, p.q_stride[2], q0, p.Lq, BQ, vec);
  if (t < n_tiles) {
    mma_load_tile<T, D, DP, LDS, 128>(Ks, base.k, p.k_stride[2], int64_t(t) * BK, p.Lk, BK, vec);
    mma_load_tile<T, D, DP, LDS, 128>(Vs, base.v, p.v_stride[2], int64_t(t) * BK, p.Lk, BK, vec);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[QR ? MT : 1][QR ? DP / 16 : 1][4];
  if constexpr (QR) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < DP / 16; ++kk)
        ldmatrix_x4(qf[mt][kk], q_addr + mt * 16 * ROWB + kk * 32);
  }

  float o[MT][DT][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -CUDART_INF_F;
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int n = 0; n < DT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }

  int st = 0;
  while (t < n_tiles) {
    const int64_t k0 = int64_t(t) * BK;
    const int tn = attn_next_tile(p, base.blocks, q0, BQ, BK, t + 1, n_tiles);
    // The mask of tile t first, its own cp.async group (waited for below with tile t), then the
    // prefetch of tile tn.
    const unsigned cls = attn_tile_class(p, base.blocks, q0, BQ, k0, BK);
    const bool use_mask = attn_tile_reads_mask(cls), tile_causal = attn_tile_causal(cls);
    if (use_mask) attn_stage_mask<T, BQ, BK, 128>(p, base.mask, q0, k0, Mt, mvec);
    cp_async_commit();
    if (tn < n_tiles) {
      mma_load_tile<T, D, DP, LDS, 128>(Ks + (st ^ 1) * BK * LDS, base.k, p.k_stride[2], int64_t(tn) * BK, p.Lk, BK, vec);
      mma_load_tile<T, D, DP, LDS, 128>(Vs + (st ^ 1) * BK * LDS, base.v, p.v_stride[2], int64_t(tn) * BK, p.Lk, BK, vec);
    }
    cp_async_commit();
    cp_async_wait<1>();  // everything but the prefetch just issued: tile t is in place
    __syncthreads();
    const uint32_t kt_addr = k_addr + st * KVB, vt_addr = v_addr + st * KVB;

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (QR) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[mt][r] = qf[mt][kk][r];
        } else {
          ldmatrix_x4(a[mt], q_addr + mt * 16 * ROWB + kk * 32);
        }
      }
#pragma unroll
      for (int nn = 0; nn < BK / 16; ++nn) {
        uint32_t b[4];
        ldmatrix_x4(b, kt_addr + nn * 16 * ROWB + kk * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * nn], a[mt], b[0], b[1]);
          mma_16816<T>(s[mt][2 * nn + 1], a[mt], b[2], b[3]);
        }
      }
    }

    mma_softmax_step<T, MT, NT, DT, BQ, BK>(p, s, m, l, o, Mt, use_mask, tile_causal, q0, k0, wrow, g, tig, sl2);

    // P (accumulator layout of two n-tiles) is exactly the A-fragment of one k-step of P V.
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dd = 0; dd < DP / 16; ++dd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vt_addr + kk * 16 * ROWB + dd * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dd], pa[mt], b[0], b[1]);
          mma_16816<T>(o[mt][2 * dd + 1], pa[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next step's prefetch and mask overwrite this step's buffers
    t = tn;
    st ^= 1;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += shfl_xor(lr, 1);
      lr += shfl_xor(lr, 2);
      const float inv = lr > 0.f ? 1.f / lr : 0.f;
      const int64_t row = q0 + wrow + mt * 16 + g + r * 8;
      if (row >= p.Lq) continue;
      T* orow = base.o + row * p.o_stride[2];
#pragma unroll
      for (int n = 0; n < DT; ++n) {
        if (n * 8 >= D) continue;  // padding columns (DP > D)
        const int col = n * 8 + tig * 2;
        const T lo = from_float<T>(o[mt][n][2 * r] * inv), hi = from_float<T>(o[mt][n][2 * r + 1] * inv);
        if (vec) {
          Pack<T, 2> pk;
          pk.v[0] = lo;
          pk.v[1] = hi;
          store_pack<T, 2>(orow + col, pk);
        } else {
          orow[col] = lo;
          orow[col + 1] = hi;
        }
      }
    }
  }
}

// ---- tensor-core kernel, TF32 (fp32 storage) ---------------------------------------------------

template <int D, bool SPLIT = false>
struct Tf32AttnCfg {
  // Split TF32 holds each fragment's two parts: one m-tile per warp past D = 96 and key tiles of 32
  // keep its instantiations within 255 registers without spills (tests/test_templates_compile.py).
  static constexpr int MT = SPLIT && D > 96 ? 1 : 2, WARPS = 4, THREADS = 128;
  static constexpr int BQ = 16 * MT * WARPS;   // 128 query rows per block (64 for split TF32 past D = 96)
  static constexpr int BK = D <= 64 && !SPLIT ? 64 : 32;  // two blocks per SM on sm_90 (with a bool mask too)
  static constexpr int LDS = D + 4;            // floats: rows an odd number of 16 B apart (ldmatrix), and
                                               // 2 LDS = 8 mod 32 words (P V's 16-byte loads): conflict-free
  static constexpr int G4 = D / 32, G2 = (D % 32) / 16;  // P V column groups of 32 and of 16
  static constexpr size_t smem_bytes(AttnMask kind) {
    return sizeof(float) * size_t(LDS) * (BQ + 4 * BK) + AttnMaskTile<BQ, BK>::bytes(kind);
  }
};

// o[mt][n] += P x V for every m-tile of the warp: P's A-fragments pa (and with SPLIT their small
// parts ps), one B-fragment (b0, b1) of V, split here with SPLIT.
template <bool SPLIT, int MT, int DT>
__device__ __forceinline__ void tf32_pv_mma(float (&o)[MT][DT][4], int n, const uint32_t (&pa)[MT][4],
                                            const uint32_t (&ps)[MT][4], uint32_t b0, uint32_t b1) {
  if constexpr (SPLIT) {
    uint32_t b0b, b0s, b1b, b1s;
    tf32_split(b0, b0b, b0s);
    tf32_split(b1, b1b, b1s);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma_1688_tf32x3(o[mt][n], pa[mt], ps[mt], b0b, b1b, b0s, b1s);
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma_1688_tf32(o[mt][n], pa[mt], b0, b1);
  }
}

// SPLIT: fp32-grade products (split TF32: each operand as a TF32 big part and a TF32 small part,
// three mma per product, big x big + big x small + small x big); tiles stay fp32 in shared memory
// and every fragment is split as it is read.
template <int D, bool SPLIT = false>
__global__ void __launch_bounds__(128, 2) attn_tf32_kernel(AttnParams<float> p, bool vec, bool mvec) {
  using C = Tf32AttnCfg<D, SPLIT>;
  constexpr int MT = C::MT, BQ = C::BQ, BK = C::BK, LDS = C::LDS, NT = BK / 8, DT = D / 8;
  constexpr int G4 = C::G4, G2 = C::G2;
  static_assert(BQ % kAttnMaskBlockQ == 0 && BK % kAttnMaskBlockK == 0, "tiles are whole summary cells");
  extern __shared__ float4 smem_f4[];
  float* Qs = reinterpret_cast<float*>(smem_f4);  // [BQ][LDS]
  float* Ks = Qs + BQ * LDS;                      // [2][BK][LDS]
  float* Vs = Ks + 2 * BK * LDS;                  // [2][BK][LDS]
  void* Mt = Vs + 2 * BK * LDS;                   // the step's mask tile (AttnMaskTile), only with a mask

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int64_t nqt = ceil_div<int64_t>(p.Lq, BQ);
  const int64_t bh = blockIdx.x / nqt;
  const int64_t q0 = (blockIdx.x - bh * nqt) * BQ;
  const AttnBase<float> base = attn_base(p, bh / p.H, bh % p.H);
  const float sl2 = p.scale * kLog2e;
  const int64_t kv_end = attn_kv_end(p, q0, BQ);
  const int n_tiles = int(ceil_div<int64_t>(kv_end, BK));
  int t = attn_next_tile(p, base.blocks, q0, BQ, BK, 0, n_tiles);
  const int wrow = warp * 16 * MT;
  // ldmatrix addresses as in the 16-bit kernel: a k-step is 8 fp32 = 32 bytes there too. A-fragment
  // (Q rows r, fp32 columns c): a0 (g, tig), a1 (g + 8, tig), a2 (g, tig + 4), a3 (g + 8, tig + 4);
  // B-fragment (keys n, columns k): b0 (n = g, k = tig), b1 (g, tig + 4) — each an 8 x 16-byte block.
  constexpr uint32_t ROWB = LDS * sizeof(float), KVB = BK * ROWB;
  const uint32_t q_addr = smem_u32(Qs) + (wrow + (lane & 15)) * ROWB + (lane >> 4) * 16;
  const uint32_t k_addr = smem_u32(Ks) + ((lane & 7) + ((lane >> 4) << 3)) * ROWB + ((lane >> 3) & 1) * 16;
  // P V B-fragments of this lane: V rows 8 n + 2 tig (b0) and + 1 (b1); columns 32 q + 4 g + j of
  // n-tile 4 q + j, and 32 G4 + 2 g + j of the 16-column group's n-tile 4 G4 + j.
  const int v_lane = 2 * tig * LDS;

  mma_load_tile<float, D, D, LDS, 128>(Qs, base.q, p.q_stride[2], q0, p.Lq, BQ, vec);
  if (t < n_tiles) {
    mma_load_tile<float, D, D, LDS, 128>(Ks, base.k, p.k_stride[2], int64_t(t) * BK, p.Lk, BK, vec);
    mma_load_tile<float, D, D, LDS, 128>(Vs, base.v, p.v_stride[2], int64_t(t) * BK, p.Lk, BK, vec);
  }
  cp_async_commit();
  cp_async_wait<0>();
  if constexpr (!SPLIT) tf32_round_tile<D, LDS, 128>(Qs, BQ);  // K / V of the first tile: rounded in the loop

  float o[MT][DT][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -CUDART_INF_F;
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int n = 0; n < DT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }

  int st = 0;
  while (t < n_tiles) {
    const int64_t k0 = int64_t(t) * BK;
    const int tn = attn_next_tile(p, base.blocks, q0, BQ, BK, t + 1, n_tiles);
    // The mask of tile t first, its own cp.async group (waited for below with tile t), then the
    // prefetch of tile tn.
    const unsigned cls = attn_tile_class(p, base.blocks, q0, BQ, k0, BK);
    const bool use_mask = attn_tile_reads_mask(cls), tile_causal = attn_tile_causal(cls);
    if (use_mask) attn_stage_mask<float, BQ, BK, 128>(p, base.mask, q0, k0, Mt, mvec);
    cp_async_commit();
    if (tn < n_tiles) {
      mma_load_tile<float, D, D, LDS, 128>(Ks + (st ^ 1) * BK * LDS, base.k, p.k_stride[2], int64_t(tn) * BK, p.Lk, BK, vec);
      mma_load_tile<float, D, D, LDS, 128>(Vs + (st ^ 1) * BK * LDS, base.v, p.v_stride[2], int64_t(tn) * BK, p.Lk, BK, vec);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this thread's part of tile t is in place: round it, then publish it
    if constexpr (!SPLIT) {
      tf32_round_tile<D, LDS, 128>(Ks + st * BK * LDS, BK);
      tf32_round_tile<D, LDS, 128>(Vs + st * BK * LDS, BK);
    }
    __syncthreads();
    const uint32_t kt_addr = k_addr + st * KVB;
    const float* vt = Vs + st * BK * LDS + v_lane;

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 8; ++kk) {
      uint32_t a[MT][4], as[MT][4];  // as: the small parts (SPLIT)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        ldmatrix_x4(a[mt], q_addr + mt * 16 * ROWB + kk * 32);
        if constexpr (SPLIT)
#pragma unroll
          for (int e = 0; e < 4; ++e) tf32_split(a[mt][e], a[mt][e], as[mt][e]);
      }
#pragma unroll
      for (int nn = 0; nn < BK / 16; ++nn) {
        uint32_t b[4], bs[4];
        ldmatrix_x4(b, kt_addr + nn * 16 * ROWB + kk * 32);
        if constexpr (SPLIT)
#pragma unroll
          for (int e = 0; e < 4; ++e) tf32_split(b[e], b[e], bs[e]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (SPLIT) {
            mma_1688_tf32x3(s[mt][2 * nn], a[mt], as[mt], b[0], b[1], bs[0], bs[1]);
            mma_1688_tf32x3(s[mt][2 * nn + 1], a[mt], as[mt], b[2], b[3], bs[2], bs[3]);
          } else {
            mma_1688_tf32(s[mt][2 * nn], a[mt], b[0], b[1]);
            mma_1688_tf32(s[mt][2 * nn + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }

    mma_softmax_step<float, MT, NT, DT, BQ, BK>(p, s, m, l, o, Mt, use_mask, tile_causal, q0, k0, wrow, g, tig, sl2);

    // P V, one 8-key step per S n-tile. With keys in the order (0, 2, 4, 6, 1, 3, 5, 7) the
    // A-fragment (row, k): (g, tig) = key 2 tig -> s[0], (g + 8, tig) -> s[2], (g, tig + 4) = key
    // 2 tig + 1 -> s[1], (g + 8, tig + 4) -> s[3]; B rows k = tig / tig + 4 are V rows 2 tig / 2 tig + 1.
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t pa[MT][4], ps[MT][4];  // ps: the small parts (SPLIT)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float pv[4] = {s[mt][n][0], s[mt][n][2], s[mt][n][1], s[mt][n][3]};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (SPLIT) tf32_split(__float_as_uint(pv[e]), pa[mt][e], ps[mt][e]);
          else pa[mt][e] = tf32_bits(pv[e]);
        }
      }
      const float* v0 = vt + 8 * n * LDS;  // V row 8 n + 2 tig; v0 + LDS: row 8 n + 2 tig + 1
#pragma unroll
      for (int q = 0; q < G4; ++q) {
        const float4 x0 = *reinterpret_cast<const float4*>(v0 + 32 * q + 4 * g);
        const float4 x1 = *reinterpret_cast<const float4*>(v0 + LDS + 32 * q + 4 * g);
        const uint32_t b0[4] = {__float_as_uint(x0.x), __float_as_uint(x0.y), __float_as_uint(x0.z), __float_as_uint(x0.w)};
        const uint32_t b1[4] = {__float_as_uint(x1.x), __float_as_uint(x1.y), __float_as_uint(x1.z), __float_as_uint(x1.w)};
#pragma unroll
        for (int j = 0; j < 4; ++j) tf32_pv_mma<SPLIT>(o, 4 * q + j, pa, ps, b0[j], b1[j]);
      }
      if constexpr (G2 > 0) {
        const float2 x0 = *reinterpret_cast<const float2*>(v0 + 32 * G4 + 2 * g);
        const float2 x1 = *reinterpret_cast<const float2*>(v0 + LDS + 32 * G4 + 2 * g);
        const uint32_t c0[2] = {__float_as_uint(x0.x), __float_as_uint(x0.y)};
        const uint32_t c1[2] = {__float_as_uint(x1.x), __float_as_uint(x1.y)};
#pragma unroll
        for (int j = 0; j < 2; ++j) tf32_pv_mma<SPLIT>(o, 4 * G4 + j, pa, ps, c0[j], c1[j]);
      }
    }
    __syncthreads();  // the next step's prefetch and mask overwrite this step's buffers
    t = tn;
    st ^= 1;
  }
  cp_async_wait<0>();

  // O accumulators: n-tile 4 q + j holds (row, n = 2 tig + e) = column 32 q + 4 (2 tig + e) + j, so
  // a thread's 8 values of a 32-column group are the consecutive columns 32 q + 8 tig + [0, 8).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += shfl_xor(lr, 1);
      lr += shfl_xor(lr, 2);
      const float inv = lr > 0.f ? 1.f / lr : 0.f;
      const int64_t row = q0 + wrow + mt * 16 + g + r * 8;
      if (row >= p.Lq) continue;
      float* orow = base.o + row * p.o_stride[2];
#pragma unroll
      for (int q = 0; q < G4; ++q) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          v[j] = o[mt][4 * q + j][2 * r] * inv;
          v[4 + j] = o[mt][4 * q + j][2 * r + 1] * inv;
        }
        float* dst = orow + 32 * q + 8 * tig;
        if (vec) {
          *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
          *reinterpret_cast<float4*>(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) dst[e] = v[e];
        }
      }
      if constexpr (G2 > 0) {
        const float v[4] = {o[mt][4 * G4][2 * r] * inv, o[mt][4 * G4 + 1][2 * r] * inv,
                            o[mt][4 * G4][2 * r + 1] * inv, o[mt][4 * G4 + 1][2 * r + 1] * inv};
        float* dst = orow + 32 * G4 + 4 * tig;
        if (vec) {
          *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) dst[e] = v[e];
        }
      }
    }
  }
}

template <class T>
inline cudaError_t attn_check(const AttnParams<T>& p, int64_t& blocks, int bq, bool& vec, bool& mvec) {
  if (p.B < 0 || p.H < 0 || p.Lq < 0 || p.Lk < 0 || p.heads_per_kv < 1 || p.H % p.heads_per_kv)
    return cudaErrorInvalidValue;
  if (p.q_stride[3] != 1 || p.k_stride[3] != 1 || p.v_stride[3] != 1 || p.o_stride[3] != 1)
    return cudaErrorInvalidValue;
  if (!p.q || !p.k || !p.v || !p.o || (p.mask_kind != AttnMask::None && !p.mask))
    return cudaErrorInvalidValue;
  blocks = int64_t(p.B) * p.H * ceil_div<int64_t>(p.Lq, bq);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  vec = true;
  const void* ptrs[4] = {p.q, p.k, p.v, p.o};
  const int64_t* strides[4] = {p.q_stride, p.k_stride, p.v_stride, p.o_stride};
  for (int t = 0; t < 4; ++t) {
    vec = vec && aligned_to(ptrs[t], 16);
    for (int d = 0; d < 3; ++d) vec = vec && strides[t][d] % 8 == 0;
  }
  // The mask 16 bytes at a time: 16 bools, or 4 floats of an additive mask (not 16-bit ones).
  const int mask_bytes = p.mask_kind == AttnMask::Bool ? 1 : p.mask_kind == AttnMask::AddF32 ? 4 : int(sizeof(T));
  mvec = p.mask_kind != AttnMask::None && (mask_bytes == 1 || mask_bytes == 4) && aligned_to(p.mask, 16) &&
         p.mask_stride[3] == 1;
  for (int d = 0; d < 3; ++d) mvec = mvec && p.mask_stride[d] % (16 / mask_bytes) == 0;
  return cudaSuccess;
}

}  // namespace detail

// SIMT flash attention, any storage type; fp32 math throughout.
template <class T, int D>
cudaError_t launch_attention_simt(const AttnParams<T>& p, cudaStream_t stream) {
  static_assert(AttnHeadDim<D>::ok, "head dim a multiple of 16 in [16, 128]");
  using C = detail::SimtAttnCfg<D>;
  int64_t blocks;
  bool vec, mvec;
  const cudaError_t err = detail::attn_check(p, blocks, C::BQ, vec, mvec);
  if (err != cudaSuccess || blocks == 0) return err;
  auto kernel = detail::attn_simt_kernel<T, D>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::smem_bytes));
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(blocks), C::THREADS, C::smem_bytes, stream>>>(p, vec);
  return cudaGetLastError();
}

// Tensor-core flash attention (mma.sync, sm_80+), T = __half or __nv_bfloat16.
template <class T, int D>
cudaError_t launch_attention_mma(const AttnParams<T>& p, cudaStream_t stream) {
  static_assert(AttnHeadDim<D>::ok, "head dim a multiple of 16 in [16, 128]");
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "half or bf16");
  using C = detail::MmaAttnCfg<D>;
  int64_t blocks;
  bool vec, mvec;
  const cudaError_t err = detail::attn_check(p, blocks, C::BQ, vec, mvec);
  if (err != cudaSuccess || blocks == 0) return err;
  const size_t smem = C::template smem_bytes<T>(p.mask_kind);
  auto kernel = detail::attn_mma_kernel<T, D>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(blocks), C::THREADS, smem, stream>>>(p, vec, mvec);
  return cudaGetLastError();
}

// TF32 tensor-core flash attention (mma.sync m16n8k8, sm_80+) over fp32 storage; with SPLIT its
// products in split TF32 (three mma each, about fp32's accuracy).
template <int D, bool SPLIT = false>
cudaError_t launch_attention_tf32(const AttnParams<float>& p, cudaStream_t stream) {
  static_assert(AttnHeadDim<D>::ok, "head dim a multiple of 16 in [16, 128]");
  using C = detail::Tf32AttnCfg<D, SPLIT>;
  int64_t blocks;
  bool vec, mvec;
  const cudaError_t err = detail::attn_check(p, blocks, C::BQ, vec, mvec);
  if (err != cudaSuccess || blocks == 0) return err;
  const size_t smem = C::smem_bytes(p.mask_kind);
  auto kernel = detail::attn_tf32_kernel<D, SPLIT>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(blocks), C::THREADS, smem, stream>>>(p, vec, mvec);
  return cudaGetLastError();
}

// The split-TF32 kernel: fp32 storage, fp32-grade products on TF32 tensor cores — each operand of
// both products (q, k; P, v) as a TF32 big part and a TF32 small part, three mma per product
// (small x big, big x small, big x big): the arithmetic of PyTorch's fp32 memory-efficient
// attention (CUTLASS's OpMultiplyAddFastF32).
template <int D>
cudaError_t launch_attention_split_tf32(const AttnParams<float>& p, cudaStream_t stream) {
  return launch_attention_tf32<D, true>(p, stream);
}

// Scaled dot-product attention, O = softmax(Q K^T * scale + mask) V: tensor cores for half / bf16;
// for float the exact SIMT kernel, or the TF32 tensor-core kernel when allow_tf32.
template <class T, int D>
cudaError_t launch_attention(const AttnParams<T>& p, cudaStream_t stream, bool allow_tf32 = false) {
  if constexpr (std::is_same_v<T, float>) {
    return allow_tf32 ? launch_attention_tf32<D>(p, stream) : launch_attention_simt<T, D>(p, stream);
  } else {
    (void)allow_tf32;
    return launch_attention_mma<T, D>(p, stream);
  }
}

// The mask summary of launch_attention_mask_blocks (see the top of this file) into `blocks`, at
// p.mask_blocks_stride; the result is what p.mask_blocks should then point at.
template <class T>
cudaError_t launch_attention_mask_blocks(const AttnParams<T>& p, unsigned char* blocks, cudaStream_t stream) {
  if (p.mask_kind == AttnMask::None || !p.mask || !blocks || p.B < 0 || p.H < 0 || p.Lq < 0 || p.Lk < 0)
    return cudaErrorInvalidValue;
  for (int d = 0; d < 2; ++d)  // one summary for many b (h) needs the mask broadcast over them
    if (p.mask_stride[d] != 0 && p.mask_blocks_stride[d] == 0 && (d == 0 ? p.B : p.H) > 1)
      return cudaErrorInvalidValue;
  const int64_t nb = p.mask_blocks_stride[0] ? p.B : 1, nh = p.mask_blocks_stride[1] ? p.H : 1;
  const int64_t nq = ceil_div<int64_t>(p.Lq, kAttnMaskBlockQ), nk = ceil_div<int64_t>(p.Lk, kAttnMaskBlockK);
  const int64_t cells = nb * nh * nq * nk;
  if (cells == 0) return cudaSuccess;
  const unsigned grid = unsigned(cells < (int64_t(1) << 20) ? cells : (int64_t(1) << 20));
  detail::attn_mask_blocks_kernel<T><<<grid, 256, 0, stream>>>(p, blocks, nh, nq, nk, cells);
  return cudaGetLastError();
}

}  // namespace stitch
