// Test harness for stitch/attention.cuh: one extern "C" launcher over raw pointers, loaded by
// ctypes from tests/gpu/test_templates_gpu.py. dtype codes: 0 float, 1 __half, 2 __nv_bfloat16.
// Strides are arrays of 4 int64 ([B, H, L, D] for q / k / v / o, [B, H, Lq, Lk] for the mask).
#include "stitch/attention.cuh"

using namespace stitch;

namespace {

template <class T, int D>
int run(int simt, const AttnParams<T>& p, cudaStream_t s) {
  if (simt) return launch_attention_simt<T, D>(p, s);
  return launch_attention<T, D>(p, s);
}

template <class T>
int run_t(int D, int simt, const void* q, const int64_t* qs, const void* k, const int64_t* ks,
          const void* v, const int64_t* vs, void* o, const int64_t* os, int B, int H, int Lq,
          int Lk, int heads_per_kv, float scale, int causal, int64_t causal_offset,
          int mask_kind, const void* mask, const int64_t* ms, cudaStream_t s) {
  AttnParams<T> p{};
  p.q = static_cast<const T*>(q);
  p.k = static_cast<const T*>(k);
  p.v = static_cast<const T*>(v);
  p.o = static_cast<T*>(o);
  for (int d = 0; d < 4; ++d) {
    p.q_stride[d] = qs[d];
    p.k_stride[d] = ks[d];
    p.v_stride[d] = vs[d];
    p.o_stride[d] = os[d];
    p.mask_stride[d] = ms ? ms[d] : 0;
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
  switch (D) {
    case 32: return run<T, 32>(simt, p, s);
    case 64: return run<T, 64>(simt, p, s);
    case 128: return run<T, 128>(simt, p, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" int attention(int dtype, int D, int simt, const void* q, const int64_t* qs,
                         const void* k, const int64_t* ks, const void* v, const int64_t* vs,
                         void* o, const int64_t* os, int B, int H, int Lq, int Lk,
                         int heads_per_kv, float scale, int causal, int64_t causal_offset,
                         int mask_kind, const void* mask, const int64_t* ms, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return run_t<float>(D, simt, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal, causal_offset, mask_kind, mask, ms, s);
    case 1: return run_t<__half>(D, simt, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal, causal_offset, mask_kind, mask, ms, s);
    case 2: return run_t<__nv_bfloat16>(D, simt, q, qs, k, ks, v, vs, o, os, B, H, Lq, Lk, heads_per_kv, scale, causal, causal_offset, mask_kind, mask, ms, s);
    default: return cudaErrorInvalidValue;
  }
}
