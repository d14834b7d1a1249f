// conv.cpp — convolutions (forward, transposed, grouped, depthwise; 1-d, 2-d, 3-d) through cuDNN,
// with cached plans.
//
// Why the graph (backend) API and not the legacy one: cuDNN 9 marks the whole legacy convolution
// API deprecated (cudnnConvolutionForward, cudnnConvolutionBiasActivationForward,
// cudnnFindConvolutionForwardAlgorithmEx and their descriptors all carry CUDNN_DEPRECATED in
// cudnn_cnn_v9.h) and NVIDIA's documentation recommends the graph API; the legacy fused entry
// takes only ReLU or identity, while a graph takes bias + any pointwise activation and lets the
// heuristics pick a runtime-fusion engine for it; and the graph API states each engine's
// numerics (tensor cores, down-converted inputs, reduced-precision reductions, non-determinism),
// which is how the fp32 policy keeps TF32 out (PyTorch filters on the same notes). It is used
// through its C entry points (cudnn_graph.h): the C++ frontend is a header library of its own
// that would add a build dependency for a few hundred lines of descriptors.
//
// A plan is chosen once per key (every argument but the pointers, plus their alignment):
//   1. build the operation graph: convolution (forward, or backward-data for a transposed one),
//      then, when asked, pointwise add (bias) and the activation, the intermediates virtual in
//      fp32 — the "fused" graph; and the convolution alone — the "plain" graph, which the runtime's
//      bias/activation kernel follows;
//   2. ask cuDNN's heuristics (mode A, then the fallback list) for engine configurations, drop
//      those whose numerics the policy forbids, rank the rest (non-deterministic engines last),
//      finalize execution plans until enough work (when timing, non-deterministic ones beside them);
//   3. time the candidates on the real operands (warm-up, L2 flushed, median of 5) and keep the
//      fastest (a non-deterministic one only kNondetMargin times faster than the best other), or
//      take the first when not tuning.
// A later call with the same key does no descriptor work: it finds the plan and the variant pack
// of its addresses and calls cudnnBackendExecute.
#include "conv.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "context.hpp"
#include "error.hpp"
#include "gemm.hpp"
#include "memory.hpp"
#include "tuning.hpp"

// The handle attributes of the operation graph and execution plan are marked deprecated from
// cuDNN 9.x on but are still required by every 9.x release this builds against.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace st {

Desc::Desc(cudnnBackendDescriptorType_t type) { ST_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }

void Desc::reset() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
  d_ = nullptr;
}

namespace {

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4, kUidConv = 5, kUidBiased = 6;
constexpr int kMaxCandidates = 6;   // plans finalized per graph when tuning
constexpr int kMaxAttempts = 24;    // engine configurations tried per graph
constexpr int kMaxCompiled = 2;     // runtime-compiled (NVRTC) plans per graph: each costs a compile
// A non-deterministic engine (its sums in atomics' order: the last bits change between identical runs,
// far inside every policy's tolerance) is kept only this many times faster than the best deterministic
// one. PyTorch lets cuDNN take them by default: 2:2's fp32 transposed convolution runs cuDNN's
// dgrad_engine (non-deterministic) in 12.9 ms, the best deterministic engine 25.9 ms (H200). A margin,
// not parity: a result that differs run to run can be amplified downstream (a batch norm over two
// samples of 1x1 pixels made 1e-7 into 1 in 3:24), which the Verifier's determinism check then fails;
// STITCHCUDA_CONV_DETERMINISTIC=1 keeps them out whenever a deterministic engine works.
constexpr float kNondetMargin = 1.5f;
constexpr size_t kPacksPerPlan = 8;

const char* act_name(st_activation a) {
  switch (a) {
    case ST_ACT_NONE: return "none";
    case ST_ACT_RELU: return "relu";
    case ST_ACT_GELU_ERF: return "gelu";
    case ST_ACT_GELU_TANH: return "gelu_tanh";
    case ST_ACT_SILU: return "silu";
    case ST_ACT_SIGMOID: return "sigmoid";
    case ST_ACT_TANH: return "tanh";
    case ST_ACT_RELU6: return "relu6";
  }
  return nullptr;
}

// ------------------------------------------------------------------ arguments

int64_t output_extent(const st_conv_args& a, int i) {
  const int64_t in = a.in_size[i], k = a.kernel_size[i], s = a.stride[i], p = a.padding[i], d = a.dilation[i];
  if (a.transposed) return (in - 1) * s - 2 * p + d * (k - 1) + a.output_padding[i] + 1;
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

std::string dims_str(const int64_t* v, int n) {
  std::string s = "(";
  for (int i = 0; i < n; ++i) s += cat(i ? ", " : "", v[i]);
  return s + (n == 1 ? ",)" : ")");
}

}  // namespace

void check_conv_shape(const st_conv_args& a) {
  ST_REQUIRE(a.spatial_dims >= 1 && a.spatial_dims <= ST_CONV_MAX_SPATIAL,
             "conv: spatial_dims must be 1, 2 or 3, got ", a.spatial_dims);
  policy_storage(a.policy);  // names a bad policy
  ST_REQUIRE(act_name(a.activation), "conv: activation ", int(a.activation), " is not one of st_activation");
  ST_REQUIRE(a.batch >= 1, "conv: batch must be >= 1, got ", a.batch);
  ST_REQUIRE(a.groups >= 1, "conv: groups must be >= 1, got ", a.groups);
  ST_REQUIRE(a.in_channels >= 1 && a.out_channels >= 1, "conv: in_channels and out_channels must be >= 1, got ",
             a.in_channels, " and ", a.out_channels);
  ST_REQUIRE(a.in_channels % a.groups == 0, "conv: groups=", a.groups, " does not divide in_channels=", a.in_channels);
  ST_REQUIRE(a.out_channels % a.groups == 0, "conv: groups=", a.groups, " does not divide out_channels=",
             a.out_channels);
  const int d = a.spatial_dims;
  for (int i = 0; i < d; ++i) {
    ST_REQUIRE(a.in_size[i] >= 1, "conv: input spatial size ", dims_str(a.in_size, d), " has a dim < 1");
    ST_REQUIRE(a.kernel_size[i] >= 1, "conv: kernel size ", dims_str(a.kernel_size, d), " has a dim < 1");
    ST_REQUIRE(a.stride[i] >= 1, "conv: stride ", dims_str(a.stride, d), " has a value < 1");
    ST_REQUIRE(a.dilation[i] >= 1, "conv: dilation ", dims_str(a.dilation, d), " has a value < 1");
    ST_REQUIRE(a.padding[i] >= 0, "conv: padding ", dims_str(a.padding, d), " has a negative value");
    if (a.transposed) {
      ST_REQUIRE(a.output_padding[i] >= 0 && a.output_padding[i] < a.stride[i], "conv: output_padding ",
                 dims_str(a.output_padding, d), " must be >= 0 and smaller than stride ", dims_str(a.stride, d));
    } else {
      ST_REQUIRE(a.output_padding[i] == 0, "conv: output_padding ", dims_str(a.output_padding, d),
                 " is for transposed convolutions only");
    }
    const int64_t out = output_extent(a, i);
    ST_REQUIRE(out >= 1, "conv: the output would be empty: input ", dims_str(a.in_size, d), ", kernel ",
               dims_str(a.kernel_size, d), ", stride ", dims_str(a.stride, d), ", padding ", dims_str(a.padding, d),
               ", dilation ", dims_str(a.dilation, d));
  }
}

void conv_output_size(const st_conv_args& a, int64_t* out) {
  check_conv_shape(a);
  for (int i = 0; i < a.spatial_dims; ++i) out[i] = output_extent(a, i);
}

namespace {

int64_t numel(const st_conv_args& a, const int64_t* spatial, int64_t channels) {
  int64_t n = a.batch * channels;
  for (int i = 0; i < a.spatial_dims; ++i) n *= spatial[i];
  return n;
}

int64_t weight_numel(const st_conv_args& a) {
  int64_t n = a.transposed ? a.in_channels * (a.out_channels / a.groups) : a.out_channels * (a.in_channels / a.groups);
  for (int i = 0; i < a.spatial_dims; ++i) n *= a.kernel_size[i];
  return n;
}

bool overlaps(const void* p, int64_t p_bytes, const void* q, int64_t q_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return a < b + static_cast<uintptr_t>(q_bytes) && b < a + static_cast<uintptr_t>(p_bytes);
}

void check_conv_args(const st_conv_args& a) {
  check_conv_shape(a);
  const st_dtype want = policy_storage(a.policy);
  const char* pol = st_policy_name(a.policy);
  ST_REQUIRE(a.x_dtype == want, "conv: x has dtype ", st_dtype_name(a.x_dtype), ", policy ", pol, " expects ",
             st_dtype_name(want));
  ST_REQUIRE(a.w_dtype == want, "conv: w has dtype ", st_dtype_name(a.w_dtype), ", policy ", pol, " expects ",
             st_dtype_name(want));
  ST_REQUIRE(a.y_dtype == want, "conv: y has dtype ", st_dtype_name(a.y_dtype), ", policy ", pol, " expects ",
             st_dtype_name(want));
  if (a.bias)
    ST_REQUIRE(a.bias_dtype == want, "conv: bias has dtype ", st_dtype_name(a.bias_dtype), ", policy ", pol,
               " expects ", st_dtype_name(want));
  ST_REQUIRE(a.x && a.w && a.y, "conv: x, w and y must be non-null device pointers");
  const int64_t es = static_cast<int64_t>(st_dtype_size(want));
  auto aligned = [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % es == 0; };
  ST_REQUIRE(aligned(a.x), "conv: x is not aligned to its element size (", es, " bytes)");
  ST_REQUIRE(aligned(a.w), "conv: w is not aligned to its element size (", es, " bytes)");
  ST_REQUIRE(aligned(a.y), "conv: y is not aligned to its element size (", es, " bytes)");
  ST_REQUIRE(!a.bias || aligned(a.bias), "conv: bias is not aligned to its element size (", es, " bytes)");
  int64_t out[ST_CONV_MAX_SPATIAL] = {1, 1, 1};
  for (int i = 0; i < a.spatial_dims; ++i) out[i] = output_extent(a, i);
  const int64_t y_bytes = numel(a, out, a.out_channels) * es;
  ST_REQUIRE(!overlaps(a.y, y_bytes, a.x, numel(a, a.in_size, a.in_channels) * es), "conv: y overlaps x");
  ST_REQUIRE(!overlaps(a.y, y_bytes, a.w, weight_numel(a) * es), "conv: y overlaps w");
}

// Largest power of two <= 16 dividing the address: cuDNN engines are chosen for an alignment.
int64_t alignment(const void* p) {
  const uint64_t v = reinterpret_cast<uintptr_t>(p) | 16u;
  return static_cast<int64_t>(v & (~v + 1));
}

ConvKey make_key(const st_conv_args& a, bool exact_products) {
  ConvKey k;
  std::memset(&k, 0, sizeof(k));
  k.policy = a.policy;
  k.spatial_dims = a.spatial_dims;
  k.transposed = a.transposed ? 1 : 0;
  k.channels_last = a.channels_last ? 1 : 0;
  k.batch = a.batch;
  k.in_channels = a.in_channels;
  k.out_channels = a.out_channels;
  k.groups = a.groups;
  for (int i = 0; i < a.spatial_dims; ++i) {
    k.in_size[i] = a.in_size[i];
    k.kernel_size[i] = a.kernel_size[i];
    k.stride[i] = a.stride[i];
    k.padding[i] = a.padding[i];
    k.dilation[i] = a.dilation[i];
    k.output_padding[i] = a.transposed ? a.output_padding[i] : 0;
  }
  k.dtype = policy_storage(a.policy);
  k.has_bias = a.bias ? 1 : 0;
  k.activation = a.activation;
  k.align_x = alignment(a.x);
  k.align_w = alignment(a.w);
  k.align_bias = a.bias ? alignment(a.bias) : 0;
  k.align_y = alignment(a.y);
  k.exact_products = exact_products ? 1 : 0;
  return k;
}

std::string describe(const st_conv_args& a) {
  const int d = a.spatial_dims;
  return cat(a.transposed ? "conv_transpose" : "conv", d, "d x[", a.batch, ", ", a.in_channels, ", ",
             dims_str(a.in_size, d), "] out_channels=", a.out_channels, " kernel=", dims_str(a.kernel_size, d),
             " stride=", dims_str(a.stride, d), " padding=", dims_str(a.padding, d), " dilation=",
             dims_str(a.dilation, d), " groups=", a.groups, " policy=", st_policy_name(a.policy),
             a.channels_last ? " channels-last" : " channels-first", a.bias ? " bias" : "", " activation=",
             act_name(a.activation));
}

// ------------------------------------------------------------------ the problem as cuDNN sees it

// Dims in logical N C spatial... order, with a 1-d problem as 2-d (a unit leading spatial dim),
// as PyTorch hands 1-d convolutions to cuDNN.
struct Geometry {
  int nd = 2;  // spatial dims for cuDNN: 2 or 3
  int64_t x[5] = {}, w[5] = {}, y[5] = {}, b[5] = {};
  int64_t xs[5] = {}, ws[5] = {}, ys[5] = {}, bs[5] = {};
  int64_t stride[3] = {}, pad[3] = {}, dilation[3] = {};
  int dims() const { return nd + 2; }
};

// Dense strides: channels-first (row-major) or channels-last (dim 1 innermost, then the spatial
// dims from the last, then dim 0), the layouts of PyTorch's contiguous and channels_last formats.
void dense_strides(const int64_t* dims, int n, bool channels_last, int64_t* strides) {
  int64_t s = 1;
  if (!channels_last) {
    for (int i = n - 1; i >= 0; --i) { strides[i] = s; s *= dims[i]; }
    return;
  }
  strides[1] = s;
  s *= dims[1];
  for (int i = n - 1; i >= 2; --i) { strides[i] = s; s *= dims[i]; }
  strides[0] = s;
}

Geometry geometry(const st_conv_args& a) {
  Geometry g;
  const int d = a.spatial_dims;
  g.nd = d == 1 ? 2 : d;
  const int lead = g.nd - d;  // 1 for a 1-d problem: the unit dim comes first
  int64_t in[3], k[3], out[3];
  for (int i = 0; i < g.nd; ++i) {
    const int j = i - lead;
    const bool unit = j < 0;
    in[i] = unit ? 1 : a.in_size[j];
    k[i] = unit ? 1 : a.kernel_size[j];
    out[i] = unit ? 1 : output_extent(a, j);
    g.stride[i] = unit ? 1 : a.stride[j];
    g.pad[i] = unit ? 0 : a.padding[j];
    g.dilation[i] = unit ? 1 : a.dilation[j];
  }
  g.x[0] = g.y[0] = a.batch;
  g.x[1] = a.in_channels;
  g.y[1] = a.out_channels;
  // PyTorch's weight layouts: [out, in / groups, k...] and, transposed, [in, out / groups, k...].
  g.w[0] = a.transposed ? a.in_channels : a.out_channels;
  g.w[1] = a.transposed ? a.out_channels / a.groups : a.in_channels / a.groups;
  g.b[0] = 1;
  g.b[1] = a.out_channels;
  for (int i = 0; i < g.nd; ++i) {
    g.x[2 + i] = in[i];
    g.w[2 + i] = k[i];
    g.y[2 + i] = out[i];
    g.b[2 + i] = 1;
  }
  const int n = g.dims();
  const bool cl = a.channels_last != 0;
  dense_strides(g.x, n, cl, g.xs);
  dense_strides(g.w, n, cl, g.ws);
  dense_strides(g.y, n, cl, g.ys);
  dense_strides(g.b, n, true, g.bs);
  return g;
}

cudnnDataType_t cudnn_type(st_dtype t) {
  switch (t) {
    case ST_FLOAT32: return CUDNN_DATA_FLOAT;
    case ST_FLOAT16: return CUDNN_DATA_HALF;
    case ST_BFLOAT16: return CUDNN_DATA_BFLOAT16;
    default: throw Error(ST_ERR_INVALID_ARGUMENT, cat("conv: dtype ", st_dtype_name(t), " has no cuDNN convolution"));
  }
}

cudnnPointwiseMode_t pointwise_mode(st_activation a) {
  switch (a) {
    case ST_ACT_RELU:
    case ST_ACT_RELU6: return CUDNN_POINTWISE_RELU_FWD;  // (with an upper clip: add_pointwise)
    case ST_ACT_GELU_ERF: return CUDNN_POINTWISE_GELU_FWD;
    case ST_ACT_GELU_TANH: return CUDNN_POINTWISE_GELU_APPROX_TANH_FWD;
    case ST_ACT_SILU: return CUDNN_POINTWISE_SWISH_FWD;
    case ST_ACT_SIGMOID: return CUDNN_POINTWISE_SIGMOID_FWD;
    case ST_ACT_TANH: return CUDNN_POINTWISE_TANH_FWD;
    default: break;
  }
  throw Error(ST_ERR_INTERNAL, "conv: no pointwise mode for this activation");
}

// ------------------------------------------------------------------ descriptors

void set_attr(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
              const void* value, const char* what) {
  const cudnnStatus_t s = cudnnBackendSetAttribute(d.get(), name, type, n, value);
  if (s != CUDNN_STATUS_SUCCESS) throw_cudnn(s, cat("cudnnBackendSetAttribute(", what, ")").c_str(), __FILE__, __LINE__);
}

void finalize(const Desc& d, const char* what) {
  const cudnnStatus_t s = cudnnBackendFinalize(d.get());
  if (s != CUDNN_STATUS_SUCCESS) throw_cudnn(s, cat("cudnnBackendFinalize(", what, ")").c_str(), __FILE__, __LINE__);
}

cudnnBackendDescriptor_t add_tensor(ConvGraph& g, int64_t uid, cudnnDataType_t type, int n, const int64_t* dims,
                                    const int64_t* strides, int64_t align, bool is_virtual, const char* what) {
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  set_attr(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
  set_attr(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims, what);
  set_attr(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides, what);
  set_attr(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
  set_attr(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
  const bool v = is_virtual;
  set_attr(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, what);
  finalize(d, what);
  g.parts.push_back(std::move(d));
  return g.parts.back().get();
}

// upper_clip > 0: a ReLU's upper clip (ReLU6), in the math precision's type as cuDNN asks.
cudnnBackendDescriptor_t add_pointwise(ConvGraph& g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y, const char* what,
                                       float upper_clip = 0.f) {
  Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  set_attr(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
  set_attr(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
  if (upper_clip > 0.f) set_attr(pw, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_FLOAT, 1, &upper_clip, what);
  finalize(pw, what);
  Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  cudnnBackendDescriptor_t pwd = pw.get();
  set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pwd, what);
  set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
  if (b) set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
  set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
  finalize(op, what);
  g.parts.push_back(std::move(pw));
  g.parts.push_back(std::move(op));
  return g.parts.back().get();
}

// The operation graph: the convolution, then (fused) bias and activation. Throws what cuDNN says
// when it refuses the graph (ST_ERR_NOT_SUPPORTED for a graph it cannot fuse).
std::shared_ptr<ConvGraph> build_graph(cudnnHandle_t handle, const st_conv_args& a, const Geometry& geo,
                                       const ConvKey& key, bool fused) {
  auto g = std::make_shared<ConvGraph>();
  g->parts.reserve(16);
  g->fused = fused;
  const int n = geo.dims();
  const cudnnDataType_t io = cudnn_type(policy_storage(a.policy));
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const bool has_bias = fused && a.bias;
  const bool has_act = fused && a.activation != ST_ACT_NONE;
  auto x = add_tensor(*g, kUidX, io, n, geo.x, geo.xs, key.align_x, false, "tensor x");
  auto w = add_tensor(*g, kUidW, io, n, geo.w, geo.ws, key.align_w, false, "tensor w");
  auto y = add_tensor(*g, kUidY, io, n, geo.y, geo.ys, key.align_y, false, "tensor y");
  // The convolution writes y directly, or an fp32 intermediate the pointwise ops read.
  cudnnBackendDescriptor_t conv_out = y;
  if (has_bias || has_act) conv_out = add_tensor(*g, kUidConv, f32, n, geo.y, geo.ys, 16, true, "tensor conv_out");

  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;  // fp32 accumulation under every policy
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // what PyTorch calls convolution
  const int64_t nd = geo.nd;
  set_attr(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "convolution");
  set_attr(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "convolution");
  set_attr(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nd, "convolution");
  set_attr(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, nd, geo.dilation, "convolution");
  set_attr(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, nd, geo.stride, "convolution");
  set_attr(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, nd, geo.pad, "convolution");
  set_attr(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, nd, geo.pad, "convolution");
  finalize(conv, "convolution");
  cudnnBackendDescriptor_t convd = conv.get();
  g->parts.push_back(std::move(conv));

  const float alpha = 1.f, beta = 0.f;
  std::vector<cudnnBackendDescriptor_t> ops;
  if (!a.transposed) {
    Desc op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    const char* what = "convolution forward";
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv_out, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &convd, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta, what);
    finalize(op, what);
    g->parts.push_back(std::move(op));
  } else {
    // A transposed convolution is the gradient of a convolution with respect to its input: x is
    // that convolution's dy, y its dx, and the weights are used as they are.
    Desc op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
    const char* what = "convolution backward data";
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv_out, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &convd, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha, what);
    set_attr(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta, what);
    finalize(op, what);
    g->parts.push_back(std::move(op));
  }
  ops.push_back(g->parts.back().get());

  cudnnBackendDescriptor_t last = conv_out;
  if (has_bias) {
    auto b = add_tensor(*g, kUidBias, io, n, geo.b, geo.bs, key.align_bias, false, "tensor bias");
    auto out = has_act ? add_tensor(*g, kUidBiased, f32, n, geo.y, geo.ys, 16, true, "tensor biased") : y;
    ops.push_back(add_pointwise(*g, CUDNN_POINTWISE_ADD, last, b, out, "bias add"));
    last = out;
  }
  if (has_act)
    ops.push_back(add_pointwise(*g, pointwise_mode(a.activation), last, nullptr, y, "activation",
                                a.activation == ST_ACT_RELU6 ? 6.f : 0.f));

  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
  set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
           ops.data(), "operation graph");
  finalize(graph, fused ? "fused operation graph" : "operation graph");
  g->graph = graph.get();
  g->parts.push_back(std::move(graph));
  return g;
}

// ------------------------------------------------------------------ engines and plans

std::vector<Desc> engine_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
  std::vector<Desc> out;
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (cudnnBackendSetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &graph) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendSetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS)
    return out;  // no engine in this mode for this graph
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS || count <= 0)
    return out;
  for (int64_t i = 0; i < count; ++i) out.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto& d : out) raw.push_back(d.get());
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  out.resize(static_cast<size_t>(std::max<int64_t>(0, std::min(got, count))));
  return out;
}

struct EngineNotes {
  int64_t index = -1;
  bool tensor_core = false, down_convert = false, reduced_reduction = false, fft = false, winograd = false,
       nondeterministic = false, compiled = false;
  bool ok = false;
};

EngineNotes engine_notes(cudnnBackendDescriptor_t config) {
  EngineNotes e;
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t eng = engine.get();
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) !=
      CUDNN_STATUS_SUCCESS)
    return e;
  cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &e.index);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  n = 0;
  if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return e;  // numerics unknown: not usable under any policy
  for (int64_t i = 0; i < std::min<int64_t>(n, CUDNN_NUMERICAL_NOTE_TYPE_COUNT); ++i) {
    switch (notes[i]) {
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: e.tensor_core = true; break;
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: e.down_convert = true; break;
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: e.reduced_reduction = true; break;
      case CUDNN_NUMERICAL_NOTE_FFT: e.fft = true; break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: e.nondeterministic = true; break;
      case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13: e.winograd = true; break;
      default: break;
    }
  }
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  n = 0;
  if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, behavior) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < std::min<int64_t>(n, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT); ++i)
      if (behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) e.compiled = true;
  e.ok = true;
  return e;
}

// -1: the policy forbids the engine. Otherwise its rank: 0 preferred; non-deterministic engines
// (results that change between identical runs, in the last bits: sums in atomics' order) rank 2,
// and when timing they compete with the preferred ones but are kept only kNondetMargin times faster
// (make_plan); without timing, only when nothing else works. FFT and Winograd engines compete under
// fp32 as PyTorch lets them (its engine filter drops down-converted inputs always and tensor-core
// engines when TF32 is off, nothing else; ours drops reduced-precision sums too): their
// transforms round in fp32, far inside the policy's
// tolerance, and on 1:65 (a 3x7 transposed convolution) cuDNN's FFT engine is what PyTorch runs,
// 9.1-11.8 ms against 14.9 for the best implicit GEMM (H100). `exact_products` forbids them: the
// split-TF32 convolution's operands are exact in TF32 only as given; a transform of them is rounded
// to TF32 again.
// Engines that down-convert their inputs are forbidden under tf32 too (PyTorch drops them under
// every setting): they convert fp32 operands to a 16-bit type, whose range is not fp32's (values
// below 6e-8 flush to zero in fp16, above 65504 overflow) and, in bf16, whose mantissa is not
// TF32's. The tf32 policy promises fp32 storage and range with TF32 products; such an engine
// computes below that claim, which the Verifier's precision check reads as bf16-grade error.
int policy_rank(const EngineNotes& e, st_policy policy, bool exact_products) {
  if (!e.ok || e.reduced_reduction) return -1;  // accumulation stays fp32 under every policy
  const bool fp32_operands = policy == ST_POLICY_FP32 || policy == ST_POLICY_TF32;
  if (fp32_operands && e.down_convert) return -1;  // fp32 range and at least TF32's mantissa
  if (policy == ST_POLICY_FP32 && e.tensor_core) return -1;  // no TF32
  if (exact_products && (e.fft || e.winograd)) return -1;
  return e.nondeterministic ? 2 : 0;
}

size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (end && *end == '\0') ? static_cast<size_t>(n) : fallback;
}

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return std::strcmp(v, "0") != 0;
}

// Why an engine the heuristics offered did not compete, for STITCHCUDA_CONV_LOG.
std::string left_out_why(const EngineNotes& e, int rank) {
  if (rank >= 0) return "non-deterministic";
  if (!e.ok) return "notes unreadable";
  if (e.reduced_reduction) return "reduced-precision sums";
  if (e.down_convert) return "down-converts fp32 inputs";
  if (e.tensor_core) return "tensor cores under fp32";
  return "a transform of split operands";
}

// `e` added to the log's list of engines left out, once: the heuristics offer an engine in several
// configurations, and the fused and plain graphs both (2:2's log named engine 76 seven times).
void note_left_out(std::string& left_out, const EngineNotes& e, int rank) {
  const std::string item = cat(" E", e.index, " (", left_out_why(e, rank), ")");
  if (left_out.find(item) == std::string::npos) left_out += item;
}

// Execution plans for the graph's engine configurations, best ranked first, at most `want`.
// `why` keeps cuDNN's last refusal for the error when nothing works; `left_out` (for the log) gains
// the engines offered that did not compete, and why.
void collect(cudnnHandle_t handle, const std::shared_ptr<ConvGraph>& graph, st_policy policy, bool exact_products,
             int want, size_t ws_limit, std::vector<std::unique_ptr<ConvPlan>>& out, std::string& why,
             std::string& left_out) {
  std::vector<Desc> configs = engine_configs(graph->graph, CUDNN_HEUR_MODE_A);
  std::vector<int64_t> seen;
  struct Ranked { Desc config; EngineNotes notes; int rank; };
  std::vector<Ranked> ranked;
  for (auto& c : configs) {
    const EngineNotes e = engine_notes(c.get());
    const int r = policy_rank(e, policy, exact_products);
    seen.push_back(e.index);
    if (r >= 0) ranked.push_back({std::move(c), e, r});
    else note_left_out(left_out, e, r);
  }
  for (auto& c : engine_configs(graph->graph, CUDNN_HEUR_MODE_FALLBACK)) {
    const EngineNotes e = engine_notes(c.get());
    const int r = policy_rank(e, policy, exact_products);
    if (std::find(seen.begin(), seen.end(), e.index) != seen.end()) continue;
    seen.push_back(e.index);
    if (r >= 0) ranked.push_back({std::move(c), e, r});
    else note_left_out(left_out, e, r);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) { return a.rank < b.rank; });
  if (ranked.empty() && why.empty())
    why = cat(graph->fused ? "fused graph" : "graph", ": no engine configuration allowed by policy ",
              st_policy_name(policy));
  // Up to `want` plans with tensor cores and `want` without: for channels-first fp32 data cuDNN's
  // heuristics list its SIMT implicit GEMMs first, and the six plans once timed were all SIMT —
  // 2.5x slower than the TF32 engine PyTorch gets for 2:35 on an H100, while for 1:54 (3 input
  // channels) the SIMT engine was the faster one (BENCHMARKS.md, "Convolution engines"). So both
  // kinds are timed, and the fastest is kept.
  // When timing (want > 1), non-deterministic plans are collected too, up to `want` of them beside the
  // others (make_plan holds them to kNondetMargin); otherwise only the best rank that works.
  const bool nondet_compete = want > 1 && !env_flag("STITCHCUDA_CONV_DETERMINISTIC", false);
  int attempts = 0, found = 0, best_rank = -1, compiled = 0, found_nondet = 0;
  int found_of[2] = {0, 0};  // without, with tensor cores
  for (auto& r : ranked) {
    if (attempts >= kMaxAttempts) break;
    const bool nondet = r.rank == 2 && nondet_compete && best_rank == 0;
    if (best_rank >= 0 && r.rank > best_rank && !nondet) {  // keep only the best rank that works
      for (auto& rest : ranked)
        if (rest.rank > best_rank) note_left_out(left_out, rest.notes, rest.rank);
      break;
    }
    if (nondet ? found_nondet >= want : (found >= 2 * want || found_of[r.notes.tensor_core ? 1 : 0] >= want))
      continue;
    if (r.notes.compiled && compiled >= kMaxCompiled) continue;
    ++attempts;
    if (r.notes.compiled) ++compiled;
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t cfg = r.config.get();
    cudnnStatus_t s = cudnnBackendSetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                               &handle);
    if (s == CUDNN_STATUS_SUCCESS)
      s = cudnnBackendSetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(plan.get());
    int64_t ws = 0, n = 0;
    if (s == CUDNN_STATUS_SUCCESS)
      s = cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
    if (s != CUDNN_STATUS_SUCCESS) {
      char detail[256] = {0};
      cudnnGetLastErrorString(detail, sizeof(detail));
      why = cat("engine ", r.notes.index, ": ", cudnnGetErrorString(s), detail[0] ? cat(" (", detail, ")") : "");
      continue;
    }
    if (ws < 0 || static_cast<size_t>(ws) > ws_limit) {
      why = cat("engine ", r.notes.index, " needs ", ws, " bytes of workspace, over the limit of ", ws_limit);
      continue;
    }
    auto p = std::make_unique<ConvPlan>();
    p->graph = graph;
    p->config = std::move(r.config);
    p->plan = std::move(plan);
    p->workspace = ws;
    p->fused = graph->fused;
    p->engine = r.notes.index;
    p->rank = r.rank;
    out.push_back(std::move(p));
    if (nondet) {
      ++found_nondet;
      continue;
    }
    best_rank = r.rank;
    ++found;
    ++found_of[r.notes.tensor_core ? 1 : 0];
  }
}

// ------------------------------------------------------------------ execution

cudnnBackendDescriptor_t variant_pack(ConvPlan& p, const st_conv_args& a, void* ws) {
  const void* ptr[5] = {a.x, a.w, a.y, p.fused ? a.bias : nullptr, ws};
  for (auto& pk : p.packs) {
    if (std::equal(ptr, ptr + 5, pk.ptr)) {
      pk.last_use = ++p.tick;
      return pk.desc.get();
    }
  }
  Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* data[4] = {const_cast<void*>(a.x), const_cast<void*>(a.w), a.y, const_cast<void*>(a.bias)};
  const int64_t uids[4] = {kUidX, kUidW, kUidY, kUidBias};
  const int64_t n = (p.fused && a.bias) ? 4 : 3;
  set_attr(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids, "variant pack");
  set_attr(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data, "variant pack");
  set_attr(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "variant pack");
  finalize(vp, "variant pack");
  if (p.packs.size() >= kPacksPerPlan) {
    auto oldest = std::min_element(p.packs.begin(), p.packs.end(),
                                   [](const ConvPlan::Pack& l, const ConvPlan::Pack& r) { return l.last_use < r.last_use; });
    p.packs.erase(oldest);
  }
  p.packs.push_back(ConvPlan::Pack{{ptr[0], ptr[1], ptr[2], ptr[3], ptr[4]}, std::move(vp), ++p.tick});
  return p.packs.back().desc.get();
}

int64_t spatial_numel(const st_conv_args& a) {
  int64_t s = 1;
  for (int i = 0; i < a.spatial_dims; ++i) s *= output_extent(a, i);
  return s;
}

// `scratch`: a workspace of at least p.workspace bytes to run in instead of the context's (timing).
void run_plan(Context& ctx, ConvPlan& p, const st_conv_args& a, cudaStream_t stream, void* scratch = nullptr) {
  void* ws = scratch ? scratch : ctx.workspace_at_least(static_cast<size_t>(p.workspace), nullptr);
  cudnnBackendDescriptor_t vp = variant_pack(p, a, ws);
  ST_CUDNN_CHECK(cudnnBackendExecute(ctx.cudnn(), p.plan.get(), vp));
  if (p.post)
    conv_bias_act(policy_storage(a.policy), a.y, a.bias, a.batch, a.out_channels, spatial_numel(a),
                  a.channels_last != 0, a.activation, stream);
}

// Times candidates on the real operands: warm-up first (clocks ramp up), then the median of
// `reps` runs, each after an L2 flush (a memset of twice its size outside the timed region).
class Timer {
 public:
  Timer(Context& ctx, cudaStream_t stream) : stream_(stream) {
    ST_CUDA_CHECK(cudaEventCreate(&e0_));
    ST_CUDA_CHECK(cudaEventCreate(&e1_));
    int l2 = 0;
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, ctx.device()));
    flush_bytes_ = 2 * static_cast<size_t>(l2);
    if (flush_bytes_ && cudaMallocAsync(&flush_, flush_bytes_, stream_) != cudaSuccess) {
      cudaGetLastError();  // no room for the flush buffer: time without flushing
      flush_ = nullptr;
    }
  }
  ~Timer() {
    if (flush_) cudaFreeAsync(flush_, stream_);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }

  template <class Run>
  void warm(Run&& run) {
    for (int i = 0; i < 3; ++i) {
      const float ms = once(run);
      if (ms < 0.f) return;
      const int more = std::min(50, static_cast<int>(2.f / std::max(ms, 1e-3f)));
      for (int j = 0; j < more; ++j) run();
    }
    cudaStreamSynchronize(stream_);
  }

  // Median in ms, or -1 when a run fails (the candidate is dropped).
  template <class Run>
  float median(Run&& run, int reps = 5) {
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      const float ms = once(run);
      if (ms < 0.f) return -1.f;
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[reps / 2];
  }

 private:
  template <class Run>
  float once(Run&& run) {
    if (flush_) ST_CUDA_CHECK(cudaMemsetAsync(flush_, 0, flush_bytes_, stream_));
    ST_CUDA_CHECK(cudaEventRecord(e0_, stream_));
    bool ok = true;
    try {
      run();
    } catch (const Error&) {
      ok = false;
    }
    ST_CUDA_CHECK(cudaEventRecord(e1_, stream_));
    ST_CUDA_CHECK(cudaEventSynchronize(e1_));
    float ms = 0.f;
    ST_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
    return ok ? ms : -1.f;
  }

  cudaStream_t stream_;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

bool log_enabled() {
  static const bool on = env_flag("STITCHCUDA_CONV_LOG", false);
  return on;
}

// Whether `stream` is capturing a CUDA graph (unknown: as if it were): nothing may be allocated
// or timed then.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (stream && cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return capture != cudaStreamCaptureStatusNone;
}

std::unique_ptr<ConvPlan> make_plan(Context& ctx, const st_conv_args& a, const ConvKey& key, cudaStream_t stream) {
  cudnnHandle_t handle = ctx.cudnn();
  const Geometry geo = geometry(a);
  const bool capturing = st::capturing(stream);
  const bool tune = env_flag("STITCHCUDA_CONV_AUTOTUNE", true) && !capturing;
  size_t ws_now = 0;
  ctx.workspace(&ws_now);
  // Under capture no memory may be allocated: only plans that fit the workspace there is. Otherwise an
  // engine may take up to 256 MiB, or as much as the convolution's own operands (x and y) where that is
  // more: cuDNN's fast engines for channels-first data convert the input channels-last inside the call,
  // into the workspace. Held to 256 MiB, a 16x16x1024x1024 input's (268 MB) left only a SIMT engine:
  // 17.4 ms, against 6.2 ms for the converting engine and PyTorch's 6.7 (H200, tf32; BENCHMARKS.md,
  // "The cause: a channels-first engine was held to 256 MiB of workspace").
  const size_t operands =
      static_cast<size_t>(numel(a, a.in_size, a.in_channels) * static_cast<int64_t>(st_dtype_size(a.x_dtype)) +
                          a.batch * a.out_channels * spatial_numel(a) * static_cast<int64_t>(st_dtype_size(a.y_dtype)));
  const size_t ws_limit =
      capturing ? ws_now
                : std::max(ws_now, env_bytes("STITCHCUDA_CONV_WORKSPACE_LIMIT", std::max<size_t>(256u << 20, operands)));
  const int want = tune ? kMaxCandidates : 1;
  const bool extra = a.bias || a.activation != ST_ACT_NONE;
  const bool exact = key.exact_products != 0;

  std::vector<std::unique_ptr<ConvPlan>> cands;
  std::string why, left_out;
  if (extra) {
    try {
      collect(handle, build_graph(handle, a, geo, key, true), a.policy, exact, want, ws_limit, cands, why, left_out);
    } catch (const Error& e) {
      why = e.what();  // cuDNN cannot fuse this graph: the plain graph and the runtime's pass serve it
    }
  }
  size_t n_fused = cands.size();
  if (tune || cands.empty() || cands[0]->rank > 0) {
    collect(handle, build_graph(handle, a, geo, key, false), a.policy, exact, want, ws_limit, cands, why, left_out);
    for (size_t i = n_fused; i < cands.size(); ++i) cands[i]->post = extra;
  }
  if (cands.empty() && !capturing) {
    // The limit ranks plans, it does not forbid them: when every engine wants more workspace
    // (large transposed convolutions), take up to half of the device memory free now.
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && free_b / 2 > ws_limit) {
      why.clear();
      if (extra) {
        try {
          collect(handle, build_graph(handle, a, geo, key, true), a.policy, exact, want, free_b / 2, cands, why, left_out);
        } catch (const Error& e) {
          why = e.what();
        }
      }
      n_fused = cands.size();
      collect(handle, build_graph(handle, a, geo, key, false), a.policy, exact, want, free_b / 2, cands, why, left_out);
      for (size_t i = n_fused; i < cands.size(); ++i) cands[i]->post = extra;
    } else {
      cudaGetLastError();
    }
  }
  if (cands.empty())
    throw Error(ST_ERR_NOT_SUPPORTED, cat("conv: cuDNN has no usable engine for ", describe(a), ": ", why));
  // Fused or not, only the best-ranked numerics compete, and beside preferred ones (rank 0) the
  // non-deterministic (rank 2) that timing collected, listed after them.
  int best_rank = cands[0]->rank;
  for (auto& c : cands) best_rank = std::min(best_rank, c->rank);
  n_fused = 0;
  std::vector<std::unique_ptr<ConvPlan>> kept, nondet;
  for (auto& c : cands) {
    if (c->rank != best_rank && !(best_rank == 0 && c->rank == 2)) continue;
    n_fused += c->fused ? 1 : 0;
    (c->rank == best_rank ? kept : nondet).push_back(std::move(c));
  }
  for (auto& c : nondet) kept.push_back(std::move(c));
  cands = std::move(kept);

  size_t best = 0;
  size_t n_words = 0;
  const int64_t* words = key_words(key, &n_words);
  TunedChoice known;
  // A choice carried from another process (stitchrt/tuning.h) instead of timing, when the ranked
  // list it indexes is as long as it was (an index past its end: timed as without it).
  if (tune && cands.size() > 1 && tuning_lookup('c', words, n_words, &known) &&
      known.index < static_cast<int64_t>(cands.size())) {
    best = static_cast<size_t>(known.index);
  } else if (tune && cands.size() > 1) {
    // Candidates that want more workspace than the context has run in a block of their own, freed
    // after timing: the context's workspace grows only to what the chosen plan needs (the real call
    // below), in this process as in one that imports the choice. Growing it for every candidate kept
    // the largest (up to the operands' bytes) for the life of the stream.
    struct Scratch {  // freed however timing ends (cudaFree waits for the work queued on it)
      void* p = nullptr;
      ~Scratch() { if (p) cudaFree(p); }
    } scratch;
    int64_t ws_max = 0;
    for (auto& c : cands) ws_max = std::max(ws_max, c->workspace);
    bool all = true;  // every candidate timed: the choice indexes the list another process ranks too
    if (static_cast<size_t>(ws_max) > ws_now && cudaMalloc(&scratch.p, static_cast<size_t>(ws_max)) != cudaSuccess) {
      cudaGetLastError();  // no room to time them: those that fit the context's workspace compete
      scratch.p = nullptr;
      std::vector<std::unique_ptr<ConvPlan>> fit;
      for (auto& c : cands)
        if (static_cast<size_t>(c->workspace) <= ws_now) fit.push_back(std::move(c));
      // (none fits: the first, as untimed, and the real call below grows the workspace or says why)
      if (!fit.empty()) {
        cands = std::move(fit);
        all = false;
      }
    }
    Timer timer(ctx, stream);
    timer.warm([&] { run_plan(ctx, *cands[0], a, stream, scratch.p); });
    for (size_t i = 0; i < cands.size(); ++i)
      cands[i]->ms = timer.median([&] { run_plan(ctx, *cands[i], a, stream, scratch.p); });
    // The fastest preferred plan, unless the fastest non-deterministic one is kNondetMargin times
    // faster (or no preferred one ran); every timed run failed: the first, and the real call below
    // reports why.
    int det = -1, nondet = -1;  // the fastest of each that ran
    for (size_t i = 0; i < cands.size(); ++i) {
      if (cands[i]->ms < 0.f) continue;
      int& fastest = cands[i]->rank == best_rank ? det : nondet;
      if (fastest < 0 || cands[i]->ms < cands[fastest]->ms) fastest = static_cast<int>(i);
    }
    const bool take_nondet = nondet >= 0 && (det < 0 || kNondetMargin * cands[nondet]->ms <= cands[det]->ms);
    best = static_cast<size_t>(take_nondet ? nondet : std::max(det, 0));
    if (all) tuning_record('c', words, n_words, TunedChoice{static_cast<int64_t>(best), 0});
  }
  if (log_enabled()) {
    std::string times;
    for (auto& c : cands) times += cat(" ", c->fused ? "F" : "P", c->engine, c->rank == 2 ? "(nd)" : "", "=", c->ms);
    std::fprintf(stderr, "stitchcuda conv plan %s: %zu fused + %zu plain candidates;%s; left out:%s; chose %s engine %lld (%.4f ms, workspace %lld)\n",
                 describe(a).c_str(), n_fused, cands.size() - n_fused, times.c_str(), left_out.empty() ? " none" : left_out.c_str(),
                 cands[best]->fused ? "fused" : (cands[best]->post ? "plain + bias/activation pass" : "plain"),
                 static_cast<long long>(cands[best]->engine), cands[best]->ms,
                 static_cast<long long>(cands[best]->workspace));
  }
  return std::move(cands[best]);
}

}  // namespace

void conv(const st_conv_args& a, cudaStream_t stream, bool exact_products) {
  check_conv_args(a);
  Context& ctx = context_for(stream);
  const ConvKey key = make_key(a, exact_products);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  ConvPlan* plan = ctx.conv_plans.find(key);
  if (plan) {
    ++ctx.conv_hits;
  } else {
    plan = ctx.conv_plans.insert(key, make_plan(ctx, a, key, stream));
    ++ctx.conv_misses;
  }
  run_plan(ctx, *plan, a, stream);
}

namespace {

// The split-TF32 convolution itself: the split operands in stream-ordered scratch, then one TF32
// convolution over three times the input channels, on engines that multiply them as given.
void run_split(const st_conv_args& a, cudaStream_t stream) {
  const int64_t xn = numel(a, a.in_size, a.in_channels), wn = weight_numel(a);
  StreamScratch scratch(size_t(3 * (xn + wn)), stream);
  float* buf = scratch.get();
  split_conv_operands(a, buf, buf + 3 * xn, stream);
  st_conv_args t = a;
  t.policy = ST_POLICY_TF32;
  t.in_channels = 3 * a.in_channels;
  t.x = buf;
  t.w = buf + 3 * xn;
  conv(t, stream, /*exact_products=*/true);
}

// A channels-last 1x1 convolution (stride 1, no padding, one group, not transposed) is a GEMM on
// the data as it lies: y[P, Cout] = x[P, Cin] . w^T with w [Cout, Cin] and P the batch's pixels, the
// bias one per column. cuDNN's fp32 engines for channels-last data convert the input channels-first
// and the result back inside the call: on an H200, mobilenet_v1's raised 32 -> 64 one at 112x112
// (batch 32) ran those two copies beside the product, about 175 us of its 237 against a floor of
// 36 us (bytes at the copy bandwidth). cuBLASLt's fp32 GEMM reads x once and writes y once.
bool pointwise(const st_conv_args& a) {
  if (!a.channels_last || a.transposed || a.groups != 1) return false;
  for (int i = 0; i < a.spatial_dims; ++i)
    if (a.kernel_size[i] != 1 || a.stride[i] != 1 || a.padding[i] != 0 || a.dilation[i] != 1) return false;
  return a.x_dtype == ST_FLOAT32 && a.w_dtype == ST_FLOAT32 && a.y_dtype == ST_FLOAT32;
}

// The fp32 GEMM of a pointwise() convolution: ReLU in cuBLASLt's epilogue with the bias, any other
// activation by the runtime's bias/activation pass after it.
void run_pointwise_gemm(const st_conv_args& a, cudaStream_t stream) {
  st_gemm_args g{};
  g.policy = ST_POLICY_FP32;
  const bool relu = a.activation == ST_ACT_RELU;
  g.epilogue = a.bias ? (relu ? ST_EPI_BIAS_RELU : ST_EPI_BIAS) : (relu ? ST_EPI_RELU : ST_EPI_NONE);
  g.m = a.batch * spatial_numel(a);
  g.n = a.out_channels;
  g.k = a.in_channels;
  g.batch = 1;
  g.a = a.x; g.lda = a.in_channels; g.a_dtype = ST_FLOAT32;
  g.b = a.w; g.ldb = a.in_channels; g.trans_b = 1; g.b_dtype = ST_FLOAT32;
  g.out = a.y; g.ldo = a.out_channels; g.out_dtype = ST_FLOAT32;
  g.bias = a.bias;
  g.alpha = 1.f;
  g.beta = 0.f;
  gemm(g, stream);
  if (a.activation != ST_ACT_NONE && !relu)
    conv_bias_act(ST_FLOAT32, a.y, nullptr, a.batch, a.out_channels, spatial_numel(a), true, a.activation, stream);
}

// What conv_split_tf32 runs for a shape: the values of its tuning choice (kind 's'; 0 and 1 as
// files written before the GEMM was a candidate read them).
enum SplitChoice : int { kFp32Conv = 0, kSplitConv = 1, kFp32Gemm = 2 };

void run_choice(int choice, const st_conv_args& a, cudaStream_t stream) {
  if (choice == kSplitConv)
    run_split(a, stream);
  else if (choice == kFp32Gemm)
    run_pointwise_gemm(a, stream);
  else
    conv(a, stream);
}

}  // namespace

// Three TF32 products cost three times the TF32 FLOPs and the split operands three times x's
// bytes twice over: for a convolution whose few FLOPs per input byte made it memory-bound (a 1x1
// on few channels) that is slower than cuDNN's fp32 engines. So the first call of a shape times
// the fp32 convolution, the split one and, for a channels-last 1x1 convolution, the fp32 GEMM
// (pointwise() above), on the real operands: the faster fp32 one is kept unless the split one is
// 10 % faster than it (the split one is the less accurate; a tuning choice, kind 's', carried
// across processes like the engines'). Under graph capture, where nothing may be timed, it takes the
// GEMM for a 1x1 convolution and the split one otherwise, without keeping the choice.
// STITCHCUDA_CONV_SPLIT=always / never / gemm takes one without timing (tests of each path; a user
// who wants the exact fp32 convolution): gemm is the fp32 GEMM where pointwise() holds, else the fp32
// convolution.
void conv_split_tf32(const st_conv_args& a, cudaStream_t stream) {
  ST_REQUIRE(a.policy == ST_POLICY_FP32, "conv_split_tf32: the policy must be fp32 (the precision it stands in "
             "for), got ", st_policy_name(a.policy));
  check_conv_args(a);
  const bool gemm_ok = pointwise(a);
  const char* forced = std::getenv("STITCHCUDA_CONV_SPLIT");
  if (forced && std::strcmp(forced, "always") == 0) return run_split(a, stream);
  if (forced && std::strcmp(forced, "never") == 0) return conv(a, stream);
  if (forced && std::strcmp(forced, "gemm") == 0) return gemm_ok ? run_pointwise_gemm(a, stream) : conv(a, stream);
  Context& ctx = context_for(stream);
  const ConvKey key = make_key(a, true);
  int choice = -1;
  {
    std::lock_guard<std::mutex> lock(ctx.mutex());
    auto it = ctx.conv_split.find(key);
    if (it != ctx.conv_split.end()) choice = it->second;
  }
  if (choice < 0 && !capturing(stream)) {
    size_t n_words = 0;
    const int64_t* words = key_words(key, &n_words);
    TunedChoice known;
    if (tuning_lookup('s', words, n_words, &known) && known.index >= kFp32Conv && known.index <= kFp32Gemm &&
        (known.index != kFp32Gemm || gemm_ok)) {
      choice = static_cast<int>(known.index);
    } else if (env_flag("STITCHCUDA_CONV_AUTOTUNE", true)) {
      Timer timer(ctx, stream);
      timer.warm([&] { run_split(a, stream); });
      const float split_ms = timer.median([&] { run_split(a, stream); });
      timer.warm([&] { conv(a, stream); });
      const float conv_ms = timer.median([&] { conv(a, stream); });
      float gemm_ms = -1.f;
      if (gemm_ok) {
        timer.warm([&] { run_pointwise_gemm(a, stream); });
        gemm_ms = timer.median([&] { run_pointwise_gemm(a, stream); });
      }
      // the faster of the exact fp32 two (a failed timing, < 0, never wins)
      const bool by_gemm = gemm_ms >= 0.f && (conv_ms < 0.f || gemm_ms < conv_ms);
      const float fp32_ms = by_gemm ? gemm_ms : conv_ms;
      // The split one is the less accurate (7-13x fp32's error on an H200): it must win by 10 %.
      const bool split = fp32_ms < 0.f || (split_ms >= 0.f && 1.1f * split_ms <= fp32_ms);
      choice = split ? kSplitConv : by_gemm ? kFp32Gemm : kFp32Conv;
      tuning_record('s', words, n_words, TunedChoice{choice, 0});
      if (log_enabled())
        std::fprintf(stderr, "stitchcuda conv split-tf32 %s: split %.4f ms, fp32 %.4f ms, fp32 GEMM %.4f ms: %s\n",
                     describe(a).c_str(), split_ms, conv_ms, gemm_ms,
                     choice == kSplitConv ? "split" : choice == kFp32Gemm ? "fp32 GEMM" : "fp32");
    } else {
      choice = gemm_ok ? kFp32Gemm : kSplitConv;
    }
    std::lock_guard<std::mutex> lock(ctx.mutex());
    ctx.conv_split[key] = choice;
  }
  if (choice < 0) choice = gemm_ok ? kFp32Gemm : kSplitConv;  // captured before any choice: untimed
  run_choice(choice, a, stream);
}

void conv_plan_cache_clear(cudaStream_t stream) {
  Context& ctx = context_for(stream);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  ctx.conv_plans.clear();
  ctx.conv_split.clear();
  ctx.conv_hits = ctx.conv_misses = 0;
}

}  // namespace st
