// rt_conv.cpp — convolutions (rt.conv): tensors through DLPack turned into st_conv_args, every
// argument checked by name before any device work, then the runtime's cuDNN plan.
#include "rt_internal.hpp"

namespace strt {

namespace {

st_activation parse_activation(const std::string& s) {
  static const std::pair<const char*, st_activation> names[] = {
      {"none", ST_ACT_NONE}, {"relu", ST_ACT_RELU},       {"gelu", ST_ACT_GELU_ERF}, {"gelu_tanh", ST_ACT_GELU_TANH},
      {"silu", ST_ACT_SILU}, {"sigmoid", ST_ACT_SIGMOID}, {"tanh", ST_ACT_TANH}, {"relu6", ST_ACT_RELU6}};
  for (auto& n : names)
    if (s == n.first) return n.second;
  arg_error(cat("activation must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu', 'sigmoid', 'tanh'; got '", s,
                "'"));
}

// An int for every spatial dim, or one per dim (PyTorch's int-or-tuple arguments).
void per_dim(py::handle h, const char* name, int spatial, int64_t* out) {
  if (py::isinstance<py::int_>(h)) {
    const int64_t v = h.cast<int64_t>();
    for (int i = 0; i < spatial; ++i) out[i] = v;
    return;
  }
  if (!py::isinstance<py::sequence>(h) || py::isinstance<py::str>(h))
    arg_error(cat(name, ": expected an int or a sequence of ", spatial, " ints"));
  auto seq = h.cast<py::sequence>();
  if (static_cast<int>(seq.size()) != spatial)
    arg_error(cat(name, ": expected ", spatial, " values (one per spatial dim), got ", seq.size()));
  for (int i = 0; i < spatial; ++i) out[i] = seq[i].cast<int64_t>();
}

// The strides of a dense tensor in channels-first (row-major) or channels-last order: dim 1
// innermost, then the spatial dims from the last, then dim 0 (PyTorch's channels_last formats).
std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape, bool channels_last) {
  const int n = static_cast<int>(shape.size());
  std::vector<int64_t> st(n);
  int64_t s = 1;
  if (!channels_last) {
    for (int i = n - 1; i >= 0; --i) { st[i] = s; s *= shape[i]; }
    return st;
  }
  st[1] = s;
  s *= shape[1];
  for (int i = n - 1; i >= 2; --i) { st[i] = s; s *= shape[i]; }
  st[0] = s;
  return st;
}

void require_layout(const View& v, const char* name, bool channels_last) {
  const auto want = dense_strides(v.shape, channels_last);
  for (size_t i = 0; i < v.shape.size(); ++i) {
    if (v.shape[i] != 1 && v.strides[i] != want[i]) {
      View w;
      w.strides = want;
      arg_error(cat(name, ": expected a dense ", channels_last ? "channels-last" : "channels-first (contiguous)",
                    " tensor since channels_last=", channels_last ? "True" : "False", ": strides ", w.strides_str(),
                    ", got ", v.strides_str(),
                    channels_last ? " (use .contiguous(memory_format=torch.channels_last) or channels_last=False)"
                                  : " (use .contiguous() or channels_last=True)"));
    }
  }
}

py::object conv(py::object x_obj, py::object w_obj, py::object bias_obj, py::object stride_obj, py::object padding_obj,
                py::object dilation_obj, int64_t groups, bool transposed, py::object output_padding_obj,
                const std::string& policy_s, const std::string& activation_s, bool channels_last, py::object out_obj,
                bool split_tf32, uintptr_t stream) {
  const st_policy policy = parse_policy(policy_s);
  if (split_tf32 && policy != ST_POLICY_FP32)
    arg_error(cat("split_tf32: the split product stands in for an fp32 convolution (policy='fp32'), got policy='",
                  policy_s, "'"));
  const st_activation act = parse_activation(activation_s);
  const st_dtype storage = policy_storage(policy);
  const std::string why = cat("policy ", policy_s);

  View x = view_of(x_obj, "x", stream), w = view_of(w_obj, "w", stream);
  const size_t nd = x.shape.size();
  if (nd < 3 || nd > 5)
    arg_error(cat("x: expected a 3-D, 4-D or 5-D tensor (batch, channels, spatial...), got shape ", x.shape_str()));
  if (w.shape.size() != nd)
    arg_error(cat("w: expected a ", nd, "-D weight like x, got shape ", w.shape_str()));
  const int spatial = static_cast<int>(nd) - 2;

  st_conv_args a{};
  a.policy = policy;
  a.spatial_dims = spatial;
  a.transposed = transposed ? 1 : 0;
  a.channels_last = channels_last ? 1 : 0;
  a.batch = x.shape[0];
  a.in_channels = x.shape[1];
  a.groups = groups;
  a.out_channels = transposed ? w.shape[1] * groups : w.shape[0];
  for (int i = 0; i < spatial; ++i) {
    a.in_size[i] = x.shape[2 + i];
    a.kernel_size[i] = w.shape[2 + i];
  }
  per_dim(stride_obj, "stride", spatial, a.stride);
  per_dim(padding_obj, "padding", spatial, a.padding);
  per_dim(dilation_obj, "dilation", spatial, a.dilation);
  per_dim(output_padding_obj, "output_padding", spatial, a.output_padding);
  a.activation = act;
  int64_t out_size[ST_CONV_MAX_SPATIAL] = {0, 0, 0};
  check(st_conv_output_size(&a, out_size));
  // The weight's channel dims, named: PyTorch's [out, in / groups, k...] or, transposed, [in, out / groups, k...].
  if (!transposed && w.shape[1] * groups != a.in_channels)
    arg_error(cat("w: expected shape (out_channels, in_channels / groups = ", a.in_channels / groups,
                  ", kernel...) for x with ", a.in_channels, " channels and groups=", groups, ", got ", w.shape_str()));
  if (transposed && w.shape[0] != a.in_channels)
    arg_error(cat("w: a transposed convolution's weight is (in_channels = ", a.in_channels,
                  ", out_channels / groups, kernel...), got ", w.shape_str()));

  require_dtype(x, "x", storage, why.c_str());
  require_dtype(w, "w", storage, why.c_str());
  View bias;
  if (!bias_obj.is_none()) {
    bias = view_of(bias_obj, "bias", stream);
    require_dtype(bias, "bias", storage, why.c_str());
    if (bias.shape.size() != 1 || bias.shape[0] != a.out_channels)
      arg_error(cat("bias: expected shape (", a.out_channels, ",), got ", bias.shape_str()));
    if (bias.strides[0] != 1 && a.out_channels > 1) arg_error("bias: must be contiguous");
  }
  require_layout(x, "x", channels_last);
  require_layout(w, "w", channels_last);

  const int dev = current_device();
  require_cuda(x, "x", dev);
  require_cuda(w, "w", dev);
  if (bias.keep) require_cuda(bias, "bias", dev);

  std::vector<int64_t> out_shape{a.batch, a.out_channels};
  for (int i = 0; i < spatial; ++i) out_shape.push_back(out_size[i]);
  py::object result;
  View o;
  if (out_obj.is_none()) {
    auto t = std::make_shared<DeviceTensor>(out_shape, dense_strides(out_shape, channels_last), storage, stream);
    result = py::cast(t);
    o.data = t->data();
  } else {
    o = view_of(out_obj, "out", stream);
    result = out_obj;
    require_cuda(o, "out", dev);
    require_dtype(o, "out", storage, why.c_str());
    if (o.shape != out_shape) {
      View want;
      want.shape = out_shape;
      arg_error(cat("out: expected shape ", want.shape_str(), ", got ", o.shape_str()));
    }
    require_layout(o, "out", channels_last);
  }

  a.x = x.data;
  a.x_dtype = x.dtype;
  a.w = w.data;
  a.w_dtype = w.dtype;
  a.bias = bias.keep ? bias.data : nullptr;
  a.bias_dtype = bias.keep ? bias.dtype : storage;
  a.y = o.data;
  a.y_dtype = storage;
  st_status st;
  {
    py::gil_scoped_release nogil;
    st = split_tf32 ? st_conv_split_tf32(&a, reinterpret_cast<void*>(stream))
                    : st_conv(&a, reinterpret_cast<void*>(stream));
  }
  check(st);
  return result;
}

}  // namespace

void register_conv(py::module_& m) {
  m.def("conv", &conv, py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::kw_only(),
        py::arg("stride") = 1, py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1,
        py::arg("transposed") = false, py::arg("output_padding") = 0, py::arg("policy") = "fp32",
        py::arg("activation") = "none", py::arg("channels_last") = false, py::arg("out") = py::none(),
        py::arg("split_tf32") = false, py::arg("stream") = 0,
        R"doc(y = activation(conv(x, w) + bias) through cuDNN: F.conv{1,2,3}d, or F.conv_transpose{1,2,3}d with transposed=True.

x: (batch, in_channels, *spatial) with 1 to 3 spatial dims; w: (out_channels, in_channels / groups,
*kernel), or (in_channels, out_channels / groups, *kernel) when transposed (PyTorch's layouts).
stride, padding, dilation, output_padding: an int or one per spatial dim. groups = in_channels is a
depthwise convolution. x, w and out are dense in one layout: channels-first (contiguous), or
channels-last (torch.channels_last / channels_last_3d) with channels_last=True.
Dtypes follow the policy: fp32 (no TF32) / tf32 -> float32, bf16 -> bfloat16, fp16 -> float16;
accumulation in fp32. activation: 'none', 'relu', 'gelu' (erf), 'gelu_tanh', 'silu', 'sigmoid', 'tanh'.
split_tf32=True (policy 'fp32'): near fp32's accuracy on TF32 tensor cores, one TF32 convolution over
the split operands [x_big, x_big, x_small] and [w_big, w_small, w_big] along the input channels, where
it beats the fp32 convolution by 10 % (timed on the first call of a shape; a channels-last 1x1 one also
against its fp32 GEMM; STITCHCUDA_CONV_SPLIT=always|never|gemm).
Returns out (a new DeviceTensor when out is None). Asynchronous on `stream`.)doc");

  m.def("conv_plan_cache_stats", [](uintptr_t stream) {
    uint64_t h = 0, mi = 0, sz = 0;
    uint64_t cap = 0, ev = 0;
    check(st_conv_plan_cache_stats(reinterpret_cast<void*>(stream), &h, &mi, &sz));
    check(st_plan_cache_bounds(reinterpret_cast<void*>(stream), nullptr, nullptr, &cap, &ev));
    py::dict d;
    d["hits"] = h;
    d["misses"] = mi;
    d["size"] = sz;
    d["capacity"] = cap;
    d["evictions"] = ev;
    return d;
  }, py::arg("stream") = 0, "Convolution plan-cache counters of the (current device, stream) context.");
  m.def("conv_plan_cache_clear", [](uintptr_t stream) { check(st_conv_plan_cache_clear(reinterpret_cast<void*>(stream))); },
        py::arg("stream") = 0);
}

}  // namespace strt
