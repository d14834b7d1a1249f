// Test harness for stitch/attention.cuh: extern "C" launchers over raw pointers, loaded by ctypes
// from tests/gpu/test_templates_gpu.py. dtype codes: 0 float, 1 __half, 2 __nv_bfloat16.
// Strides are arrays of 4 int64 ([B, H, L, D] for q / k / v / o, [B, H, Lq, Lk] for the mask,
// [B, H, query cell, key cell] in bytes for the mask summary). mode: 0 launch_attention (the
// default kernel of the type), 1 launch_attention_simt, 2 launch_attention with allow_tf32 (the
// TF32 kernel for float; the default kernel otherwise), 3 launch_attention_split_tf32 (float; the
// default kernel otherwise).
// attention: the launcher of tests/gpu/nvcc_util.py's SIGNATURES; attention_ex adds the mask
// summary (blocks, bs); attention_mask_blocks computes one (their argtypes: the test module).
#include "stitch/attention.cuh"

using namespace stitch;

namespace {

template <class T, int D>
int run(int mode, const AttnParams<T>& p, cudaStream_t s) {
  if (mode == 1) return launch_attention_simt<T, D>(p, s);
  if constexpr (std::is_same_v<T, float>)
    if (mode == 3) return launch_attention_split_tf32<D>(p, s);
  return launch_attention<T, D>(p, s, /*allow_tf32=*/mode == 2);
}

template <class T>
void fill(AttnParams<T>& p, const void* q, const int64_t* qs, const void* k, const int64_t* ks, const void* v,
          const int64_t* vs, void* o, const int64_t* os, int B, int H, int Lq, int Lk, int heads_per_kv,
          float scale, int causal, int64_t causal_offset, int mask_kind, const void* mask, const int64_t* ms,
          const void* blocks, const int64_t* bs) {
  p.q = static_cast<const T*>(q);
  p.k = static_cast<const T*>(k);
  p.v = static_cast<const T*>(v);
  p.o = static_cast<T*>(o);
  for (int d = 0; d < 4; ++d) {
    p.q_stride[d] = qs ? qs[d] : 0;
    p.k_stride[d] = ks ? ks[d] : 0;
    p.v_stride[d] = vs ? vs[d] : 0;
    p.o_stride[d] = os ? os[d] : 0;
    p.mask_stride[d] = ms ? ms[d] : 0;
    p.mask_blocks_stride[d] = bs ? bs[d] : 0;
  }
  p.B = B;
  p.H = H;
  p.Lq = Lq;
  p.Lk = Lk;
  p.heads_per_kv = heads_per_kv;
  p.scale = scale;
  p.causal = causal != 0;
  p.causal_offset = causal_offset;
  p.mask_kind = static_cast<AttnMask>(mask_kind);
  p.mask = mask;
  p.mask_blocks = static_cast<const unsigned char*>(blocks);
}

template <class T>
int run_t(int D, int mode, const void* q, const int64_t* qs, const void* k, const int64_t* ks,
          const void* v, const int64_t* vs, void* o, const int64_t* os, int B, int H, int Lq,
          int Lk, int heads_per_kv, float scale, int causal, int64_t causal_offset,
          int mask_kind, const void* mask, const int64_t* ms, const void* blocks, const int64_t* bs,
          cudaStream_t s) {
  AttnParams<T> p{};
  fill(p, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal, causal_offset, mask_kind, mask,
       ms, blocks, bs);
  switch (D) {
    case 16: return run<T, 16>(mode, p, s);
    case 32: return run<T, 32>(mode, p, s);
    case 48: return run<T, 48>(mode, p, s);
    case 64: return run<T, 64>(mode, p, s);
    case 80: return run<T, 80>(mode, p, s);
    case 96: return run<T, 96>(mode, p, s);
    case 112: return run<T, 112>(mode, p, s);
    case 128: return run<T, 128>(mode, p, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" int attention_ex(int dtype, int D, int mode, const void* q, const int64_t* qs,
                            const void* k, const int64_t* ks, const void* v, const int64_t* vs,
                            void* o, const int64_t* os, int B, int H, int Lq, int Lk,
                            int heads_per_kv, float scale, int causal, int64_t causal_offset,
                            int mask_kind, const void* mask, const int64_t* ms, const void* blocks,
                            const int64_t* bs, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return run_t<float>(D, mode, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal, causal_offset, mask_kind, mask, ms, blocks, bs, s);
    case 1: return run_t<__half>(D, mode, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal, causal_offset, mask_kind, mask, ms, blocks, bs, s);
    case 2: return run_t<__nv_bfloat16>(D, mode, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal, causal_offset, mask_kind, mask, ms, blocks, bs, s);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" int attention(int dtype, int D, int mode, const void* q, const int64_t* qs,
                         const void* k, const int64_t* ks, const void* v, const int64_t* vs,
                         void* o, const int64_t* os, int B, int H, int Lq, int Lk,
                         int heads_per_kv, float scale, int causal, int64_t causal_offset,
                         int mask_kind, const void* mask, const int64_t* ms, void* stream) {
  return attention_ex(dtype, D, mode, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal,
                      causal_offset, mask_kind, mask, ms, nullptr, nullptr, stream);
}

// The mask summary (launch_attention_mask_blocks) of a [B, H, Lq, Lk] mask into `blocks`.
extern "C" int attention_mask_blocks(int dtype, int B, int H, int Lq, int Lk, int mask_kind, const void* mask,
                                     const int64_t* ms, void* blocks, const int64_t* bs, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  auto go = [&](auto tag) {
    using T = decltype(tag);
    AttnParams<T> p{};
    fill(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, B, H, Lq, Lk, 1, 1.f, 0, 0,
         mask_kind, mask, ms, nullptr, bs);
    return int(launch_attention_mask_blocks<T>(p, static_cast<unsigned char*>(blocks), s));
  };
  switch (dtype) {
    case 0: return go(float{});
    case 1: return go(__half{});
    case 2: return go(__nv_bfloat16{});
    default: return cudaErrorInvalidValue;
  }
}
