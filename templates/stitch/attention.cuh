// attention.cuh — fused scaled-dot-product attention, flash-attention style (online softmax).
//
// launch_attention<T, D>(AttnParams<T>, stream)
//   T   storage of q, k, v, o (float, __half, __nv_bfloat16); D head dim, 32, 64 or 128.
//   O = softmax(Q K^T * scale + mask) V per (batch, head), fp32 accumulation and softmax.
//   T = float runs the SIMT kernel (exact fp32 math; no TF32); __half / __nv_bfloat16 run the
//   tensor-core kernel (mma.sync m16n8k16, fp32 accumulators, P rounded to T before P V as in
//   FlashAttention-2). launch_attention_simt<T, D> runs the SIMT kernel for any T.
// Contract
//   - q [B, H, Lq, D], k / v [B, H / heads_per_kv, Lk, D], o [B, H, Lq, D], each given by four
//     element strides (any view: transposes of [B, L, H, D], slices of a fused QKV); the last
//     stride must be 1. o must not overlap q, k or v. Query head h reads k / v head
//     h / heads_per_kv (1: plain multi-head attention; > 1: grouped-query attention).
//   - 16-byte loads (cp.async for T = half / bf16) when q, k, v, o are 16-byte aligned and their
//     batch / head / row strides are multiples of 8 elements; element loads otherwise.
//   - causal: key j is visible to query i iff j <= i + causal_offset. causal_offset = 0 is
//     PyTorch's is_causal (top-left aligned); Lk - Lq is the bottom-right alignment of
//     FlashAttention. Key tiles wholly above the diagonal are skipped.
//   - mask (optional): AttnMask::AddSame (additive, type T), AddF32 (additive, float) or Bool
//     (one byte per element, nonzero = attend, like torch.bool in F.scaled_dot_product_attention),
//     read at mask[b * s0 + h * s1 + i * s2 + j * s3]; zero strides broadcast.
//   - A query row with no visible key gets O = 0 (PyTorch's math path returns NaN there).
//   - Returns cudaErrorInvalidValue for a bad stride / shape, else the launch status.
// Tiles
//   SIMT (256 threads): 64 query rows x 64 keys per step; Q^T, K^T, V and P in shared memory as
//   fp32 (64 * D * 12 + 17 KB: 113 KB at D = 128); each thread owns a 4 x 4 block of S and a
//   4 x D / 16 block of O, computed as register outer products from 16-byte shared loads.
//   Tensor core (128 threads = 4 warps): 128 query rows per block, 32 per warp as two m16 tiles
//   so that each K / V fragment loaded by ldmatrix feeds 4 mma; key tiles of 64 (D <= 64) or 32
//   (D = 128) double-buffered through cp.async into shared rows padded by 16 bytes (conflict-free
//   ldmatrix); Q as mma A-fragments in registers (D <= 64) or re-read from shared memory
//   (D = 128); S, P and O in registers (no spills; 245-255 registers, 2 blocks per SM). A mask
//   is staged per step into shared memory as log2-domain fp32 (coalesced global reads).
// Performance: benchmarks/bench_templates.py, results in benchmarks/templates.md. The
//   tensor-core kernel is bound by mma.sync issue and ldmatrix traffic, well below what
//   wgmma-based kernels (FlashAttention-3, cuDNN) reach on Hopper; the SIMT kernel is bound by
//   FMA and shared-memory issue, at about half the fp32 FMA peak.
#pragma once

#include <climits>
#include <type_traits>

#include "stitch/common.cuh"

namespace stitch {

enum class AttnMask : int { None = 0, AddSame = 1, AddF32 = 2, Bool = 3 };

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
};

namespace detail {

// Where one (b, h) starts, for each tensor.
template <class T>
struct AttnBase {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  const unsigned char* mask;
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
  r.mask = p.mask ? static_cast<const unsigned char*>(p.mask) +
                        (b * p.mask_stride[0] + h * p.mask_stride[1]) * esize
                  : nullptr;
  return r;
}

// A score in the log2 domain (already times scale * log2 e) after causal / mask / bounds.
template <class T>
__device__ __forceinline__ float attn_mask_score(const AttnParams<T>& p, const unsigned char* mb,
                                                 float x, int64_t i, int64_t j) {
  if (j >= p.Lk || i >= p.Lq) return -CUDART_INF_F;
  if (p.causal && j > i + p.causal_offset) return -CUDART_INF_F;
  const int64_t off = i * p.mask_stride[2] + j * p.mask_stride[3];
  switch (p.mask_kind) {
    case AttnMask::AddSame: return x + to_float(reinterpret_cast<const T*>(mb)[off]) * kLog2e;
    case AttnMask::AddF32: return x + reinterpret_cast<const float*>(mb)[off] * kLog2e;
    case AttnMask::Bool: return mb[off] ? x : -CUDART_INF_F;
    default: return x;
  }
}

template <class T>
__device__ __forceinline__ void load4(float (&v)[4], const T* p, bool vec) {
  if (vec) {
    const Pack<T, 4> pk = load_pack<T, 4>(p);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = to_float(pk.v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = to_float(p[e]);
  }
}

template <class T>
__device__ __forceinline__ void store4(T* p, const float (&v)[4], bool vec) {
  if (vec) {
    Pack<T, 4> pk;
#pragma unroll
    for (int e = 0; e < 4; ++e) pk.v[e] = from_float<T>(v[e]);
    store_pack<T, 4>(p, pk);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = from_float<T>(v[e]);
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

// ---- SIMT kernel (fp32 math; any storage type) -------------------------------------------------

template <int D>
struct SimtAttnCfg {
  static constexpr int BQ = 64, BK = 64, THREADS = 256;
  static constexpr int TD = D / 16;       // O columns per thread
  static constexpr int PLD = BK + 4;      // P row pitch (floats)
  static constexpr size_t smem_bytes = sizeof(float) * (size_t(D) * BQ + size_t(D) * BK + size_t(BK) * D + size_t(BQ) * PLD);
};

template <class T, int D>
__global__ void __launch_bounds__(256) attn_simt_kernel(AttnParams<T> p, bool vec) {
  using C = SimtAttnCfg<D>;
  constexpr int BQ = C::BQ, BK = C::BK, TD = C::TD, PLD = C::PLD;
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
    if (q0 + r < p.Lq) load4(v, base.q + (q0 + r) * p.q_stride[2] + d4, vec);
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
    __syncthreads();  // the previous step is done with Ks, Vs, Ps
    for (int idx = tid; idx < BK * D / 4; idx += C::THREADS) {
      const int r = idx % BK, d4 = (idx / BK) * 4;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if (k0 + r < p.Lk) load4(v, base.k + (k0 + r) * p.k_stride[2] + d4, vec);
#pragma unroll
      for (int e = 0; e < 4; ++e) Ks[(d4 + e) * BK + r] = v[e];
    }
    for (int idx = tid; idx < BK * D / 4; idx += C::THREADS) {
      const int r = idx / (D / 4), d4 = (idx % (D / 4)) * 4;
      float v[4] = {0.f, 0.f, 0.f, 0.f};  // keys past Lk: V = 0 so that 0 * V stays finite
      if (k0 + r < p.Lk) load4(v, base.v + (k0 + r) * p.v_stride[2] + d4, vec);
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

    const bool need_mask = k0 + BK > p.Lk || p.mask_kind != AttnMask::None ||
                           (p.causal && k0 + BK - 1 > q0 + p.causal_offset) || q0 + BQ > p.Lq;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t qi = q0 + tr * 4 + i;
      if (need_mask) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = attn_mask_score(p, base.mask, s[i][j], qi, k0 + tc * 4 + j);
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
        if constexpr (D >= 64) {
#pragma unroll
          for (int c4 = 0; c4 < TD / 4; ++c4) {
            const float4 x = *reinterpret_cast<const float4*>(vrow + c4 * 64 + tc * 4);
            vv[c4 * 4 + 0] = x.x; vv[c4 * 4 + 1] = x.y; vv[c4 * 4 + 2] = x.z; vv[c4 * 4 + 3] = x.w;
          }
        } else {
          const float2 x = *reinterpret_cast<const float2*>(vrow + tc * 2);
          vv[0] = x.x; vv[1] = x.y;
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
    if constexpr (D >= 64) {
#pragma unroll
      for (int c4 = 0; c4 < TD / 4; ++c4) {
        const float v[4] = {o[i][c4 * 4] * inv, o[i][c4 * 4 + 1] * inv, o[i][c4 * 4 + 2] * inv, o[i][c4 * 4 + 3] * inv};
        store4(orow + c4 * 64 + tc * 4, v, vec);
      }
    } else {
      orow[tc * 2] = from_float<T>(o[i][0] * inv);
      orow[tc * 2 + 1] = from_float<T>(o[i][1] * inv);
    }
  }
}

// ---- tensor-core kernel (half / bf16 storage) --------------------------------------------------

template <int D>
struct MmaAttnCfg {
  static constexpr int MT = 2;                 // 16-row m-tiles per warp: each K / V fragment feeds 2 * MT mma
  static constexpr int WARPS = 4, THREADS = 128;
  static constexpr int BQ = 16 * MT * WARPS;   // 128 query rows per block
  static constexpr int BK = D >= 128 ? 32 : 64;  // keeps S + O within 255 registers, no spills
  static constexpr bool Q_IN_REGS = D <= 64;     // else A-fragments re-read from shared memory
  static constexpr int LDS = D + 8;            // shared row pitch in elements: +16 B keeps ldmatrix conflict-free
  static constexpr int MLD = BK + 8;           // mask tile pitch (floats)
  template <class T>
  static constexpr size_t smem_bytes(bool mask) {
    return sizeof(T) * size_t(LDS) * (BQ + 4 * BK) + (mask ? sizeof(float) * BQ * MLD : 0);
  }
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

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

// rows x D elements from src (row stride rs, rows at or past `limit` zero-filled) into dst.
template <class T, int D, int THREADS>
__device__ __forceinline__ void mma_load_tile(T* dst, const T* src, int64_t rs, int64_t row0,
                                              int64_t limit, int rows, bool vec) {
  constexpr int LDS = D + 8, CPR = D / 8;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < rows * CPR; idx += THREADS) {
    const int r = idx / CPR, c = (idx % CPR) * 8;
    const int64_t row = row0 + r;
    const bool ok = row < limit;
    T* d = dst + r * LDS + c;
    if (vec) {
      cp_async16(d, ok ? src + row * rs + c : src, ok);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) d[e] = ok ? src[row * rs + c + e] : from_float<T>(0.f);
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(128) attn_mma_kernel(AttnParams<T> p, bool vec) {
  using C = MmaAttnCfg<D>;
  constexpr int MT = C::MT, BQ = C::BQ, BK = C::BK, LDS = C::LDS, NT = BK / 8, DT = D / 8;
  constexpr bool QR = C::Q_IN_REGS;
  extern __shared__ float4 smem_f4[];
  T* Qs = reinterpret_cast<T*>(smem_f4);  // [BQ][LDS]
  T* Ks = Qs + BQ * LDS;                  // [2][BK][LDS]
  T* Vs = Ks + 2 * BK * LDS;              // [2][BK][LDS]
  // The mask tile of the step, as additive log2-domain fp32 (bool: 0 / -inf); only with a mask.
  float* Ms = reinterpret_cast<float*>(Vs + 2 * BK * LDS);  // [BQ][MLD]
  constexpr int MLD = C::MLD;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int64_t nqt = ceil_div<int64_t>(p.Lq, BQ);
  const int64_t bh = blockIdx.x / nqt;
  const int64_t q0 = (blockIdx.x - bh * nqt) * BQ;
  const AttnBase<T> base = attn_base(p, bh / p.H, bh % p.H);
  const float sl2 = p.scale * kLog2e;
  const int64_t kv_end = attn_kv_end(p, q0, BQ);
  const int n_tiles = int(ceil_div<int64_t>(kv_end, BK));
  const int wrow = warp * 16 * MT;  // first row of this warp within the block
  // Per-lane ldmatrix addresses (bytes, shared space); tile / k-step offsets are constants.
  constexpr uint32_t ROWB = LDS * sizeof(T), KVB = BK * ROWB;
  const uint32_t q_addr = smem_u32(Qs) + (wrow + (lane & 15)) * ROWB + (lane >> 4) * 16;
  const uint32_t k_addr = smem_u32(Ks) + ((lane & 7) + ((lane >> 4) << 3)) * ROWB + ((lane >> 3) & 1) * 16;
  const uint32_t v_addr = smem_u32(Vs) + ((lane & 7) + ((lane >> 3) & 1) * 8) * ROWB + (lane >> 4) * 16;

  mma_load_tile<T, D, 128>(Qs, base.q, p.q_stride[2], q0, p.Lq, BQ, vec);
  if (n_tiles > 0) {
    mma_load_tile<T, D, 128>(Ks, base.k, p.k_stride[2], 0, p.Lk, BK, vec);
    mma_load_tile<T, D, 128>(Vs, base.v, p.v_stride[2], 0, p.Lk, BK, vec);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[QR ? MT : 1][QR ? D / 16 : 1][4];
  if constexpr (QR) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
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

  for (int t = 0; t < n_tiles; ++t) {
    const int st = t & 1;
    const int64_t k0 = int64_t(t) * BK;
    if (t + 1 < n_tiles) {
      mma_load_tile<T, D, 128>(Ks + (st ^ 1) * BK * LDS, base.k, p.k_stride[2], k0 + BK, p.Lk, BK, vec);
      mma_load_tile<T, D, 128>(Vs + (st ^ 1) * BK * LDS, base.v, p.v_stride[2], k0 + BK, p.Lk, BK, vec);
    }
    cp_async_commit();
    const bool has_mask = p.mask_kind != AttnMask::None;
    if (has_mask) {
      for (int idx = tid; idx < BQ * BK; idx += C::THREADS) {
        const int r = idx / BK, c = idx % BK;
        const int64_t i = q0 + r, j = k0 + c;
        float x = 0.f;  // rows / keys out of range are cut by the bounds test below
        if (i < p.Lq && j < p.Lk) {
          const int64_t off = i * p.mask_stride[2] + j * p.mask_stride[3];
          if (p.mask_kind == AttnMask::Bool) x = base.mask[off] ? 0.f : -CUDART_INF_F;
          else if (p.mask_kind == AttnMask::AddF32) x = reinterpret_cast<const float*>(base.mask)[off] * kLog2e;
          else x = to_float(reinterpret_cast<const T*>(base.mask)[off]) * kLog2e;
        }
        Ms[r * MLD + c] = x;
      }
    }
    cp_async_wait<1>();  // everything but the prefetch just issued: tile t is in place
    __syncthreads();
    const uint32_t kt_addr = k_addr + st * KVB, vt_addr = v_addr + st * KVB;

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
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

    const bool need_bounds = k0 + BK > p.Lk || (p.causal && k0 + BK - 1 > q0 + p.causal_offset) ||
                             q0 + BQ > p.Lq;
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
          if (i >= p.Lq) e = 0;
          e -= k0;
          lim[r] = e < 0 ? 0 : e > BK ? BK : int(e);
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + tig * 2 + (e & 1);
          float x = s[mt][n][e] * sl2;
          if (has_mask) x += Ms[(ra + 8 * (e >> 1)) * MLD + c];
          s[mt][n][e] = c < lim[e >> 1] ? x : -CUDART_INF_F;
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
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vt_addr + kk * 16 * ROWB + dd * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dd], pa[mt], b[0], b[1]);
          mma_16816<T>(o[mt][2 * dd + 1], pa[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next step's prefetch overwrites this step's buffers
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

template <class T>
inline cudaError_t attn_check(const AttnParams<T>& p, int64_t& blocks, int bq, bool& vec) {
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
  return cudaSuccess;
}

}  // namespace detail

// SIMT flash attention, any storage type; fp32 math throughout.
template <class T, int D>
cudaError_t launch_attention_simt(const AttnParams<T>& p, cudaStream_t stream) {
  static_assert(D == 32 || D == 64 || D == 128, "head dim 32, 64 or 128");
  using C = detail::SimtAttnCfg<D>;
  int64_t blocks;
  bool vec;
  const cudaError_t err = detail::attn_check(p, blocks, C::BQ, vec);
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
  static_assert(D == 32 || D == 64 || D == 128, "head dim 32, 64 or 128");
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "half or bf16");
  using C = detail::MmaAttnCfg<D>;
  int64_t blocks;
  bool vec;
  const cudaError_t err = detail::attn_check(p, blocks, C::BQ, vec);
  if (err != cudaSuccess || blocks == 0) return err;
  const size_t smem = C::template smem_bytes<T>(p.mask_kind != AttnMask::None);
  auto kernel = detail::attn_mma_kernel<T, D>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(blocks), C::THREADS, smem, stream>>>(p, vec);
  return cudaGetLastError();
}

// O = softmax(Q K^T * scale + mask) V: tensor cores for half / bf16, SIMT fp32 for float.
template <class T, int D>
cudaError_t launch_attention(const AttnParams<T>& p, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) return launch_attention_simt<T, D>(p, stream);
  else return launch_attention_mma<T, D>(p, stream);
}

}  // namespace stitch
