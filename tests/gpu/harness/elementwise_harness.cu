// Test harness for stitch/elementwise.cuh: extern "C" launchers over raw pointers, loaded by
// ctypes from tests/gpu/test_templates_gpu.py. dtype codes: 0 float, 1 __half,
// 2 __nv_bfloat16; for ew_add, 3 = (a __half, b float, out float). Layouts arrive as arrays of
// ndim int64 (shape, then one stride array per tensor). Every function returns the cudaError_t.
#include "stitch/elementwise.cuh"

using namespace stitch;

namespace {

template <int N>
EwLayout<N> make_layout(int ndim, const int64_t* shape, const int64_t* out_stride,
                        const int64_t* const* in_stride) {
  EwLayout<N> L{};
  L.ndim = ndim;
  for (int d = 0; d < ndim && d < kEwMaxDims; ++d) {
    L.shape[d] = shape[d];
    L.out_stride[d] = out_stride[d];
    for (int k = 0; k < N; ++k) L.in_stride[k][d] = in_stride[k][d];
  }
  return L;
}

// a * b + c - d
struct Fma4 {
  __device__ float operator()(float a, float b, float c, float d) const { return a * b + c - d; }
};

template <class T>
int ew_fma4_t(const void* a, const void* b, const void* c, const void* d, void* out,
              const EwLayout<4>& L, cudaStream_t s) {
  return launch_elementwise(Spread<4, Fma4>{}, static_cast<T*>(out), L, s, static_cast<const T*>(a),
                            static_cast<const T*>(b), static_cast<const T*>(c),
                            static_cast<const T*>(d));
}

template <class Tin, class Tout>
int copy_t(const void* in, void* out, const EwLayout<1>& L, cudaStream_t s) {
  return launch_strided_copy(static_cast<const Tin*>(in), static_cast<Tout*>(out), L, s);
}

}  // namespace

extern "C" {

int ew_add(int dtype, const void* a, const void* b, void* out, int ndim, const int64_t* shape,
           const int64_t* os, const int64_t* as, const int64_t* bs, void* stream) {
  const int64_t* in_st[2] = {as, bs};
  const EwLayout<2> L = make_layout<2>(ndim, shape, os, in_st);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return launch_elementwise(EwAdd{}, static_cast<float*>(out), L, s, static_cast<const float*>(a), static_cast<const float*>(b));
    case 1: return launch_elementwise(EwAdd{}, static_cast<__half*>(out), L, s, static_cast<const __half*>(a), static_cast<const __half*>(b));
    case 2: return launch_elementwise(EwAdd{}, static_cast<__nv_bfloat16*>(out), L, s, static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b));
    case 3: return launch_elementwise(EwAdd{}, static_cast<float*>(out), L, s, static_cast<const __half*>(a), static_cast<const float*>(b));
    default: return cudaErrorInvalidValue;
  }
}

int ew_fma4(int dtype, const void* a, const void* b, const void* c, const void* d, void* out,
            int ndim, const int64_t* shape, const int64_t* os, const int64_t* as,
            const int64_t* bs, const int64_t* cs, const int64_t* ds, void* stream) {
  const int64_t* in_st[4] = {as, bs, cs, ds};
  const EwLayout<4> L = make_layout<4>(ndim, shape, os, in_st);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return ew_fma4_t<float>(a, b, c, d, out, L, s);
    case 1: return ew_fma4_t<__half>(a, b, c, d, out, L, s);
    case 2: return ew_fma4_t<__nv_bfloat16>(a, b, c, d, out, L, s);
    default: return cudaErrorInvalidValue;
  }
}

// out = where(cond (torch.bool), x, y), x / y / out of `dtype`.
int ew_where(int dtype, const void* cond, const void* x, const void* y, void* out, int ndim,
             const int64_t* shape, const int64_t* os, const int64_t* cs, const int64_t* xs,
             const int64_t* ys, void* stream) {
  const int64_t* in_st[3] = {cs, xs, ys};
  const EwLayout<3> L = make_layout<3>(ndim, shape, os, in_st);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool* c = static_cast<const bool*>(cond);
  switch (dtype) {
    case 0: return launch_elementwise(EwWhere{}, static_cast<float*>(out), L, s, c, static_cast<const float*>(x), static_cast<const float*>(y));
    case 1: return launch_elementwise(EwWhere{}, static_cast<__half*>(out), L, s, c, static_cast<const __half*>(x), static_cast<const __half*>(y));
    case 2: return launch_elementwise(EwWhere{}, static_cast<__nv_bfloat16*>(out), L, s, c, static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(y));
    default: return cudaErrorInvalidValue;
  }
}

// out = gelu_erf(x) through a hook.
int ew_gelu(int dtype, const void* x, void* out, int ndim, const int64_t* shape,
            const int64_t* os, const int64_t* xs, void* stream) {
  const int64_t* in_st[1] = {xs};
  const EwLayout<1> L = make_layout<1>(ndim, shape, os, in_st);
  const auto s = static_cast<cudaStream_t>(stream);
  const EwUnary<EpHook<GeluErf>> f{};
  switch (dtype) {
    case 0: return launch_elementwise(f, static_cast<float*>(out), L, s, static_cast<const float*>(x));
    case 1: return launch_elementwise(f, static_cast<__half*>(out), L, s, static_cast<const __half*>(x));
    case 2: return launch_elementwise(f, static_cast<__nv_bfloat16*>(out), L, s, static_cast<const __nv_bfloat16*>(x));
    default: return cudaErrorInvalidValue;
  }
}

// Strided copy with conversion; (din, dout) in {(t, t)} and (0, 1), (1, 0), (2, 0).
int strided_copy(int din, int dout, const void* in, void* out, int ndim, const int64_t* shape,
                 const int64_t* in_stride, const int64_t* out_stride, void* stream) {
  const int64_t* in_st[1] = {in_stride};
  const EwLayout<1> L = make_layout<1>(ndim, shape, out_stride, in_st);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (din * 3 + dout) {
    case 0: return copy_t<float, float>(in, out, L, s);
    case 4: return copy_t<__half, __half>(in, out, L, s);
    case 8: return copy_t<__nv_bfloat16, __nv_bfloat16>(in, out, L, s);
    case 1: return copy_t<float, __half>(in, out, L, s);
    case 3: return copy_t<__half, float>(in, out, L, s);
    case 6: return copy_t<__nv_bfloat16, float>(in, out, L, s);
    default: return cudaErrorInvalidValue;
  }
}

// out (contiguous) = in.permute(perm).
int permute(int dtype, const void* in, int ndim, const int64_t* shape, const int64_t* stride,
            const int* perm, void* out, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return launch_permute(static_cast<const float*>(in), shape, stride, ndim, perm, static_cast<float*>(out), s);
    case 1: return launch_permute(static_cast<const __half*>(in), shape, stride, ndim, perm, static_cast<__half*>(out), s);
    case 2: return launch_permute(static_cast<const __nv_bfloat16*>(in), shape, stride, ndim, perm, static_cast<__nv_bfloat16*>(out), s);
    default: return cudaErrorInvalidValue;
  }
}

}  // extern "C"
