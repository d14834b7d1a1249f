// Test harness for stitch/reduce.cuh: extern "C" launchers over raw pointers, loaded by ctypes
// from tests/gpu/test_templates_gpu.py. dtype codes: 0 float, 1 __half, 2 __nv_bfloat16.
// op codes follow RowOp / AxisOp. Every function returns the cudaError_t of the launch.
#include "stitch/reduce.cuh"

using namespace stitch;

namespace {

using ProHook = EpHook<Scale>;    // x * 0.5 on every input element
using EpiHook = EpHook<GeluErf>;  // erf-GELU on every output value

template <RowOp OP, class Tin, class Tout, class TW>
int run_row(const void* in, int64_t ldi, void* out, int64_t ldo, const void* w, const void* b,
            int64_t rows, int64_t cols, float eps, int unbiased, int hooks, cudaStream_t s) {
  RowParams<Tin, Tout, TW> p{static_cast<const Tin*>(in), ldi, static_cast<Tout*>(out), ldo,
                             static_cast<const TW*>(w), static_cast<const TW*>(b), rows, cols,
                             eps, unbiased != 0};
  // Hooks are instantiated for a few ops only, to keep the harness build short.
  constexpr bool with_hooks = OP == RowOp::Softmax || OP == RowOp::LayerNorm ||
                              OP == RowOp::Sum || OP == RowOp::Max;
  if (hooks) {
    if constexpr (with_hooks) return launch_row_reduce<OP>(p, s, ProHook{{0.5f}}, EpiHook{});
    else return cudaErrorNotSupported;
  }
  return launch_row_reduce<OP>(p, s);
}

// A layer (op 2) / rms (op 3) norm given a workspace: few, long rows split over blocks.
template <class T>
int run_norm_ws(int op, const void* in, int64_t ldi, void* out, int64_t ldo, const void* w,
                const void* b, int64_t rows, int64_t cols, float eps, void* ws, int64_t ws_floats,
                int hooks, cudaStream_t s) {
  RowParams<T, T, T> p{static_cast<const T*>(in), ldi, static_cast<T*>(out), ldo,
                       static_cast<const T*>(w), static_cast<const T*>(b), rows, cols, eps, false,
                       static_cast<float*>(ws), ws_floats};
  if (op == 2) {
    if (hooks) return launch_row_reduce<RowOp::LayerNorm>(p, s, ProHook{{0.5f}}, EpiHook{});
    return launch_row_reduce<RowOp::LayerNorm>(p, s);
  }
  if (op == 3 && !hooks) return launch_row_reduce<RowOp::RmsNorm>(p, s);
  return cudaErrorInvalidValue;
}

template <class Tin, class Tout, class TW>
int row_dispatch(int op, const void* in, int64_t ldi, void* out, int64_t ldo, const void* w,
                 const void* b, int64_t rows, int64_t cols, float eps, int unbiased, int hooks,
                 cudaStream_t s) {
#define ROW_CASE(I, OP) \
  case I: return run_row<OP, Tin, Tout, TW>(in, ldi, out, ldo, w, b, rows, cols, eps, unbiased, hooks, s);
  switch (op) {
    ROW_CASE(0, RowOp::Softmax)
    ROW_CASE(1, RowOp::LogSoftmax)
    ROW_CASE(2, RowOp::LayerNorm)
    ROW_CASE(3, RowOp::RmsNorm)
    ROW_CASE(4, RowOp::Sum)
    ROW_CASE(5, RowOp::Mean)
    ROW_CASE(6, RowOp::Max)
    ROW_CASE(7, RowOp::Min)
    ROW_CASE(8, RowOp::LogSumExp)
    ROW_CASE(9, RowOp::Var)
    default: return cudaErrorInvalidValue;
  }
#undef ROW_CASE
}

template <class T>
int axis_dispatch(int op, const void* in, int64_t outer, int64_t red, int64_t inner, int64_t so,
                  int64_t sr, int64_t si, void* out, int64_t oso, int64_t osi, void* ws,
                  int64_t ws_floats, cudaStream_t s) {
  AxisParams<T, T> p{static_cast<const T*>(in), outer, red, inner, so, sr, si,
                     static_cast<T*>(out), oso, osi, static_cast<float*>(ws), ws_floats};
  switch (op) {
    case 0: return launch_reduce_axis<AxisOp::Sum>(p, s);
    case 1: return launch_reduce_axis<AxisOp::Mean>(p, s);
    case 2: return launch_reduce_axis<AxisOp::Max>(p, s);
    case 3: return launch_reduce_axis<AxisOp::Min>(p, s);
    default: return cudaErrorInvalidValue;
  }
}

template <class T>
int64_t axis_ws(const void* in, int64_t outer, int64_t red, int64_t inner, int64_t so, int64_t sr,
                int64_t si) {
  AxisParams<T, T> p{static_cast<const T*>(in), outer, red, inner, so, sr, si, nullptr, 0, 0};
  return reduce_axis_workspace_floats(p);
}

template <class T>
int axis_row_dispatch(int op, const void* in, int64_t outer, int64_t red, int64_t inner, int64_t so,
                      int64_t sr, int64_t si, void* out, int64_t oso, int64_t osr, int64_t osi,
                      int hooks, cudaStream_t s) {
  AxisRowParams<T, T> p{static_cast<const T*>(in), outer, red, inner, so, sr, si,
                        static_cast<T*>(out), oso, osr, osi};
  switch (op) {
    case 0:
      return hooks ? launch_softmax_axis<RowOp::Softmax>(p, s, ProHook{{0.5f}}, EpiHook{})
                   : launch_softmax_axis<RowOp::Softmax>(p, s);
    case 1: return launch_softmax_axis<RowOp::LogSoftmax>(p, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" {

// in, out, weight and bias all of storage `dtype`.
int row_reduce(int op, int dtype, const void* in, int64_t ldi, void* out, int64_t ldo,
               const void* weight, const void* bias, int64_t rows, int64_t cols, float eps,
               int unbiased, int hooks, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return row_dispatch<float, float, float>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, unbiased, hooks, s);
    case 1: return row_dispatch<__half, __half, __half>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, unbiased, hooks, s);
    case 2: return row_dispatch<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, unbiased, hooks, s);
    default: return cudaErrorInvalidValue;
  }
}

// Layer / rms norm with a workspace of row_reduce_workspace_floats(rows, cols) floats.
int row_norm_ws(int op, int dtype, const void* in, int64_t ldi, void* out, int64_t ldo,
                const void* weight, const void* bias, int64_t rows, int64_t cols, float eps,
                void* ws, int64_t ws_floats, int hooks, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return run_norm_ws<float>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, ws, ws_floats, hooks, s);
    case 1: return run_norm_ws<__half>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, ws, ws_floats, hooks, s);
    case 2: return run_norm_ws<__nv_bfloat16>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, ws, ws_floats, hooks, s);
    default: return cudaErrorInvalidValue;
  }
}

int row_workspace_floats(int64_t rows, int64_t cols) { return int(row_reduce_workspace_floats(rows, cols)); }

// 16-bit input (dtype 1 or 2), float output, float weight / bias; ops softmax, layer norm, mean.
int row_reduce_mixed(int op, int dtype, const void* in, int64_t ldi, void* out, int64_t ldo,
                     const void* weight, const void* bias, int64_t rows, int64_t cols, float eps,
                     void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (op != 0 && op != 2 && op != 5) return cudaErrorInvalidValue;
  switch (dtype) {
    case 1: return row_dispatch<__half, float, float>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, 0, 0, s);
    case 2: return row_dispatch<__nv_bfloat16, float, float>(op, in, ldi, out, ldo, weight, bias, rows, cols, eps, 0, 0, s);
    default: return cudaErrorInvalidValue;
  }
}

// workspace: null, or ws_floats fp32 elements (reduce_axis_workspace_floats).
int reduce_axis(int op, int dtype, const void* in, int64_t outer, int64_t red, int64_t inner,
                int64_t so, int64_t sr, int64_t si, void* out, int64_t oso, int64_t osi,
                void* workspace, int64_t ws_floats, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return axis_dispatch<float>(op, in, outer, red, inner, so, sr, si, out, oso, osi, workspace, ws_floats, s);
    case 1: return axis_dispatch<__half>(op, in, outer, red, inner, so, sr, si, out, oso, osi, workspace, ws_floats, s);
    case 2: return axis_dispatch<__nv_bfloat16>(op, in, outer, red, inner, so, sr, si, out, oso, osi, workspace, ws_floats, s);
    default: return cudaErrorInvalidValue;
  }
}

int64_t reduce_axis_ws_floats(int dtype, const void* in, int64_t outer, int64_t red,
                              int64_t inner, int64_t so, int64_t sr, int64_t si) {
  switch (dtype) {
    case 0: return axis_ws<float>(in, outer, red, inner, so, sr, si);
    case 1: return axis_ws<__half>(in, outer, red, inner, so, sr, si);
    case 2: return axis_ws<__nv_bfloat16>(in, outer, red, inner, so, sr, si);
    default: return -1;
  }
}

// Softmax (op 0, with hooks when `hooks`) / log-softmax (op 1) over the middle axis of in and out,
// both [outer, red, inner] with their own strides.
int softmax_axis(int op, int dtype, const void* in, int64_t outer, int64_t red, int64_t inner,
                 int64_t so, int64_t sr, int64_t si, void* out, int64_t oso, int64_t osr, int64_t osi,
                 int hooks, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return axis_row_dispatch<float>(op, in, outer, red, inner, so, sr, si, out, oso, osr, osi, hooks, s);
    case 1: return axis_row_dispatch<__half>(op, in, outer, red, inner, so, sr, si, out, oso, osr, osi, hooks, s);
    case 2: return axis_row_dispatch<__nv_bfloat16>(op, in, outer, red, inner, so, sr, si, out, oso, osr, osi, hooks, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // extern "C"
