// rt_gemm.cpp — GEMM (rt.gemm, rt.bind_gemm) and the fused epilogue ops (rt.epilogue): operands
// through DLPack turned into the runtime's row-major descriptions, every argument checked by name.
#include <algorithm>
#include <cmath>

#include "rt_internal.hpp"

namespace strt {

namespace {

st_epilogue parse_epilogue(const std::string& s) {
  if (s == "none") return ST_EPI_NONE;
  if (s == "bias") return ST_EPI_BIAS;
  if (s == "relu") return ST_EPI_RELU;
  if (s == "gelu") return ST_EPI_GELU;
  if (s == "bias_relu") return ST_EPI_BIAS_RELU;
  if (s == "bias_gelu") return ST_EPI_BIAS_GELU;
  arg_error(cat("epilogue must be one of 'none', 'bias', 'relu', 'gelu', 'bias_relu', 'bias_gelu'; got '", s, "'"));
}

const std::vector<std::pair<std::string, st_ep_kind>>& ep_kinds() {
  static const std::vector<std::pair<std::string, st_ep_kind>> k = {
      {"scale", ST_EP_SCALE},         {"add", ST_EP_ADD_SCALAR},        {"leaky_relu", ST_EP_LEAKY_RELU},
      {"silu", ST_EP_SILU},           {"sigmoid", ST_EP_SIGMOID},       {"tanh", ST_EP_TANH},
      {"mish", ST_EP_MISH},           {"hardtanh", ST_EP_HARDTANH},     {"clamp", ST_EP_CLAMP},
      {"gelu_tanh", ST_EP_GELU_TANH}, {"gelu", ST_EP_GELU_ERF},         {"relu", ST_EP_RELU},
      {"residual_add", ST_EP_RESIDUAL_ADD}, {"bias_add", ST_EP_BIAS_ADD}, {"div", ST_EP_DIV_SCALAR},
      {"hardswish", ST_EP_HARDSWISH}, {"softplus", ST_EP_SOFTPLUS},     {"elu", ST_EP_ELU},
      {"abs", ST_EP_ABS},             {"exp", ST_EP_EXP},               {"square", ST_EP_SQUARE}};
  return k;
}

// An op is a name or a tuple (name, a[, b]). Defaults follow PyTorch: leaky_relu 0.01,
// hardtanh (-1, 1), elu 1.0, residual_add 1.0.
st_ep_op parse_op(py::handle h, size_t index) {
  std::string name;
  std::vector<float> params;
  if (py::isinstance<py::str>(h)) {
    name = h.cast<std::string>();
  } else if (py::isinstance<py::tuple>(h) || py::isinstance<py::list>(h)) {
    auto seq = h.cast<py::sequence>();
    if (seq.size() == 0) arg_error(cat("ops[", index, "] is empty"));
    name = seq[0].cast<std::string>();
    for (size_t i = 1; i < seq.size(); ++i) params.push_back(seq[i].cast<float>());
  } else {
    arg_error(cat("ops[", index, "] must be a name or a tuple (name, a, b)"));
  }
  st_ep_op op{ST_EP_SCALE, 0.f, 0.f};
  bool found = false;
  for (auto& k : ep_kinds())
    if (k.first == name) { op.kind = k.second; found = true; }
  if (!found) {
    std::string known;
    for (auto& k : ep_kinds()) known += (known.empty() ? "" : ", ") + k.first;
    arg_error(cat("ops[", index, "]: unknown op '", name, "'; known ops: ", known));
  }
  switch (op.kind) {
    case ST_EP_LEAKY_RELU: op.a = 0.01f; break;
    case ST_EP_HARDTANH: op.a = -1.f; op.b = 1.f; break;
    case ST_EP_ELU: op.a = 1.f; break;
    case ST_EP_RESIDUAL_ADD: op.a = 1.f; break;
    case ST_EP_CLAMP: op.a = -INFINITY; op.b = INFINITY; break;
    default: break;
  }
  const bool needs_a = op.kind == ST_EP_SCALE || op.kind == ST_EP_ADD_SCALAR || op.kind == ST_EP_DIV_SCALAR;
  if (needs_a && params.empty()) arg_error(cat("ops[", index, "]: '", name, "' needs a value, e.g. ('", name, "', 0.5)"));
  if (params.size() > 2) arg_error(cat("ops[", index, "]: '", name, "' takes at most two values"));
  if (params.size() >= 1) op.a = params[0];
  if (params.size() >= 2) op.b = params[1];
  return op;
}

std::vector<st_ep_op> parse_ops(const py::object& ops) {
  std::vector<st_ep_op> out;
  if (ops.is_none()) return out;
  size_t i = 0;
  for (auto h : ops) out.push_back(parse_op(h, i++));
  if (out.size() > ST_MAX_EPILOGUE_OPS) arg_error(cat("ops: at most ", ST_MAX_EPILOGUE_OPS, " ops, got ", out.size()));
  return out;
}

// ------------------------------------------------------------------ GEMM

// A logical matrix (rows x cols) of a view's last two dims, with an optional batch dim,
// turned into the runtime's row-major description: storage transposed or not, ld, batch stride.
struct Mat {
  const void* ptr;
  int64_t batch, rows, cols, batch_stride, ld;
  int trans;  // 1: stored as cols x rows row-major (a transposed view)
};

Mat as_matrix(const View& v, const char* name, bool transpose) {
  if (v.shape.size() != 2 && v.shape.size() != 3)
    arg_error(cat(name, ": expected a 2-D (m, k) or 3-D (batch, m, k) tensor, got shape ", v.shape_str()));
  const size_t nd = v.shape.size();
  Mat m{};
  m.ptr = v.data;
  m.batch = nd == 3 ? v.shape[0] : 1;
  m.batch_stride = nd == 3 ? v.strides[0] : 0;
  int64_t r = v.shape[nd - 2], c = v.shape[nd - 1], sr = v.strides[nd - 2], sc = v.strides[nd - 1];
  if (transpose) { std::swap(r, c); std::swap(sr, sc); }
  m.rows = r;
  m.cols = c;
  if (m.batch == 1) m.batch_stride = 0;
  const bool row_major = (sc == 1 || c == 1) && (r == 1 || sr >= c);
  const bool col_major = (sr == 1 || r == 1) && (c == 1 || sc >= r);
  if (row_major) {
    m.trans = 0;
    m.ld = r == 1 ? std::max<int64_t>(sr, c) : sr;
    if (m.ld < c) m.ld = c;
  } else if (col_major) {
    m.trans = 1;
    m.ld = c == 1 ? std::max<int64_t>(sc, r) : sc;
    if (m.ld < r) m.ld = r;
  } else {
    arg_error(cat(name, ": layout not handled: shape ", v.shape_str(), " strides ", v.strides_str(),
                  "; one of the last two dims must have stride 1 (make it .contiguous())"));
  }
  return m;
}

// A GEMM call with every argument checked and every pointer resolved: what rt.gemm launches
// once and what rt.bind_gemm keeps for repeated launches without DLPack or checks.
struct GemmCall {
  st_gemm_args g{};
  char split = 0;  // 't': st_gemm_split_tf32, 'b': st_gemm_split_bf16 (an fp32 GEMM on tensor cores)
  std::vector<st_ep_op> ops;
  const void* residual = nullptr;
  int64_t ldr = 0;
  std::vector<View> keep;  // the operands' capsules: their memory stays alive with the call
  py::object result;

  st_status launch(uintptr_t stream) const {
    void* s = reinterpret_cast<void*>(stream);
    py::gil_scoped_release nogil;
    if (split == 't') return st_gemm_split_tf32(&g, s);
    if (split == 'b') return st_gemm_split_bf16(&g, s);
    return ops.empty() ? st_gemm(&g, s)
                       : st_gemm_epilogue(&g, ops.data(), static_cast<int32_t>(ops.size()), residual, ldr, s);
  }
};

std::shared_ptr<GemmCall> prepare_gemm(py::object a_obj, py::object b_obj, py::object out_obj, const std::string& policy_s,
                                       bool trans_a, bool trans_b, const std::string& epilogue_s, py::object bias_obj,
                                       py::object c_obj, float alpha, float beta, py::object ops_obj,
                                       py::object residual_obj, uintptr_t stream) {
  const st_policy policy = parse_policy(policy_s);
  st_epilogue epi = parse_epilogue(epilogue_s);
  const st_dtype storage = policy_storage(policy);
  std::vector<st_ep_op> ops = parse_ops(ops_obj);
  const std::string why = cat("policy ", policy_s);

  // The arguments first, the device after: a shape or dtype mistake is named as that, also on a
  // machine with no GPU. Host tensors on such a machine meet the device check first: 'no CUDA
  // device' is the cause there, not where the tensor lives (as rt.conv does).
  View a = view_of(a_obj, "a", stream), b = view_of(b_obj, "b", stream);
  require_dtype(a, "a", storage, why.c_str());
  require_dtype(b, "b", storage, why.c_str());
  Mat A = as_matrix(a, "a", trans_a), B = as_matrix(b, "b", trans_b);
  if (A.cols != B.rows)
    arg_error(cat("a and b: inner dimensions differ: op(a) is ", A.rows, " x ", A.cols, ", op(b) is ", B.rows, " x ",
                  B.cols));
  if (A.batch != B.batch && A.batch != 1 && B.batch != 1)
    arg_error(cat("a and b: batch sizes differ (", A.batch, " vs ", B.batch, ") and neither is 1"));
  const int dev = current_device();
  require_cuda(a, "a", dev);
  require_cuda(b, "b", dev);
  const int64_t batch = std::max(A.batch, B.batch);
  const int64_t m = A.rows, n = B.cols, k = A.cols;

  std::vector<int64_t> out_shape = batch > 1 || a.shape.size() == 3 || b.shape.size() == 3
                                       ? std::vector<int64_t>{batch, m, n}
                                       : std::vector<int64_t>{m, n};
  py::object result;
  View o;
  if (out_obj.is_none()) {
    auto t = std::make_shared<DeviceTensor>(out_shape, storage, stream);
    result = py::cast(t);
    o.data = t->data();
    o.dtype = storage;
    o.device_type = kDLCUDA;
    o.device_id = dev;
    o.shape = out_shape;
    o.strides = t->strides();
  } else {
    o = view_of(out_obj, "out", stream);
    result = out_obj;
    require_cuda(o, "out", dev);
    require_dtype(o, "out", storage, why.c_str());
    bool ok = o.shape.size() == out_shape.size();
    for (size_t i = 0; ok && i < out_shape.size(); ++i) ok = o.shape[i] == out_shape[i];
    if (!ok) {
      View want;
      want.shape = out_shape;
      arg_error(cat("out: expected shape ", want.shape_str(), ", got ", o.shape_str()));
    }
  }
  Mat O = as_matrix(o, "out", false);
  if (O.trans) arg_error(cat("out: must be row-major (last dim stride 1), got strides ", o.strides_str()));

  st_gemm_args g{};
  g.policy = policy;
  g.epilogue = epi;
  g.m = m; g.n = n; g.k = k; g.batch = batch;
  g.a = A.ptr; g.lda = A.ld; g.stride_a = A.batch_stride; g.trans_a = A.trans; g.a_dtype = storage;
  g.b = B.ptr; g.ldb = B.ld; g.stride_b = B.batch_stride; g.trans_b = B.trans; g.b_dtype = storage;
  g.out = const_cast<void*>(O.ptr); g.ldo = O.ld; g.stride_out = O.batch_stride; g.out_dtype = storage;
  g.alpha = alpha;
  g.beta = beta;

  View bias, c, residual;
  const bool epi_bias = epi == ST_EPI_BIAS || epi == ST_EPI_BIAS_RELU || epi == ST_EPI_BIAS_GELU;
  bool ops_bias = false, ops_residual = false;
  for (auto& op : ops) {
    ops_bias |= op.kind == ST_EP_BIAS_ADD;
    ops_residual |= op.kind == ST_EP_RESIDUAL_ADD;
  }
  if (epi_bias || ops_bias) {
    if (bias_obj.is_none()) arg_error(cat("bias: epilogue '", epilogue_s, "' or a bias_add op needs a bias of shape (", n, ",)"));
    bias = view_of(bias_obj, "bias", stream);
    require_cuda(bias, "bias", dev);
    require_dtype(bias, "bias", storage, why.c_str());
    if (bias.shape.size() != 1 || bias.shape[0] != n)
      arg_error(cat("bias: expected shape (", n, ",), got ", bias.shape_str()));
    if (bias.strides[0] != 1 && n > 1) arg_error("bias: must be contiguous");
    g.bias = bias.data;
  } else if (!bias_obj.is_none()) {
    arg_error(cat("bias: given, but epilogue '", epilogue_s, "' adds no bias (use 'bias', 'bias_relu' or 'bias_gelu')"));
  }
  if (beta != 0.f) {
    if (c_obj.is_none()) arg_error("c: beta != 0 needs c, the residual of out's shape");
    c = view_of(c_obj, "c", stream);
    require_cuda(c, "c", dev);
    require_dtype(c, "c", storage, why.c_str());
    if (c.shape.size() < 2) arg_error(cat("c: expected shape (", m, ", ", n, ") or (batch, m, n), got ", c.shape_str()));
    Mat C = as_matrix(c, "c", false);
    if (C.rows != m || C.cols != n || (C.batch != batch && C.batch != 1))
      arg_error(cat("c: expected shape (", m, ", ", n, ") (or batched), got ", c.shape_str()));
    if (C.trans) arg_error(cat("c: must be row-major (last dim stride 1), got strides ", c.strides_str()));
    g.c = C.ptr; g.ldc = C.ld; g.stride_c = C.batch_stride;
  }
  int64_t ldr = 0;
  if (ops_residual) {
    if (residual_obj.is_none()) arg_error("residual: a residual_add op needs residual, a tensor of out's shape");
    residual = view_of(residual_obj, "residual", stream);
    require_cuda(residual, "residual", dev);
    require_dtype(residual, "residual", storage, why.c_str());
    if (residual.shape != o.shape) arg_error(cat("residual: expected shape ", o.shape_str(), ", got ", residual.shape_str()));
    if (!residual.contiguous() || !o.contiguous()) arg_error("residual and out: must be contiguous for residual_add");
    ldr = n;
  }
  auto call = std::make_shared<GemmCall>();
  call->g = g;
  call->ops = std::move(ops);
  call->residual = residual.data;
  call->ldr = ldr;
  call->result = result;
  for (View* v : {&a, &b, &o, &bias, &c, &residual})
    if (v->keep) call->keep.push_back(std::move(*v));
  return call;
}

py::object gemm(py::object a, py::object b, py::object out, const std::string& policy, bool trans_a, bool trans_b,
                const std::string& epilogue, py::object bias, py::object c, float alpha, float beta, py::object ops,
                py::object residual, uintptr_t stream) {
  auto call = prepare_gemm(a, b, out, policy, trans_a, trans_b, epilogue, bias, c, alpha, beta, ops, residual, stream);
  check(call->launch(stream));
  return call->result;
}

py::object gemm_split(char parts, py::object a, py::object b, py::object out, bool trans_a, bool trans_b,
                      const std::string& epilogue, py::object bias, py::object c, float alpha, float beta,
                      uintptr_t stream) {
  auto call = prepare_gemm(a, b, out, "fp32", trans_a, trans_b, epilogue, bias, c, alpha, beta, py::none(),
                           py::none(), stream);
  call->split = parts;
  check(call->launch(stream));
  return call->result;
}

py::object gemm_split_tf32(py::object a, py::object b, py::object out, bool trans_a, bool trans_b,
                           const std::string& epilogue, py::object bias, py::object c, float alpha, float beta,
                           uintptr_t stream) {
  return gemm_split('t', a, b, out, trans_a, trans_b, epilogue, bias, c, alpha, beta, stream);
}

py::object gemm_split_bf16(py::object a, py::object b, py::object out, bool trans_a, bool trans_b,
                           const std::string& epilogue, py::object bias, py::object c, float alpha, float beta,
                           uintptr_t stream) {
  return gemm_split('b', a, b, out, trans_a, trans_b, epilogue, bias, c, alpha, beta, stream);
}

py::object epilogue(py::object x_obj, py::object ops_obj, py::object out_obj, py::object residual_obj,
                    py::object bias_obj, uintptr_t stream) {
  std::vector<st_ep_op> ops = parse_ops(ops_obj);
  const int dev = current_device();
  View x = view_of(x_obj, "x", stream);
  require_cuda(x, "x", dev);
  if (x.dtype != ST_FLOAT32 && x.dtype != ST_FLOAT16 && x.dtype != ST_BFLOAT16)
    arg_error(cat("x: expected dtype float32, float16 or bfloat16, got ", st_dtype_name(x.dtype)));
  if (x.shape.empty()) arg_error("x: expected at least one dimension");
  if (!x.contiguous()) arg_error(cat("x: must be contiguous, got strides ", x.strides_str()));
  const int64_t cols = x.shape.back();
  const int64_t rows = cols ? x.numel() / cols : 0;
  py::object result;
  void* out_ptr;
  if (out_obj.is_none()) {
    auto t = std::make_shared<DeviceTensor>(x.shape, x.dtype, stream);
    out_ptr = t->data();
    result = py::cast(t);
  } else {
    View o = view_of(out_obj, "out", stream);
    require_cuda(o, "out", dev);
    if (o.dtype != x.dtype) arg_error(cat("out: expected dtype ", st_dtype_name(x.dtype), ", got ", st_dtype_name(o.dtype)));
    if (o.shape != x.shape) arg_error(cat("out: expected shape ", x.shape_str(), ", got ", o.shape_str()));
    if (!o.contiguous()) arg_error("out: must be contiguous");
    out_ptr = o.data;
    result = out_obj;
  }
  st_epilogue_args e{};
  e.dtype = x.dtype;
  e.rows = rows;
  e.cols = cols;
  e.x = x.data; e.ldx = cols;
  e.out = out_ptr; e.ldo = cols;
  View r, b;
  if (!residual_obj.is_none()) {
    r = view_of(residual_obj, "residual", stream);
    require_cuda(r, "residual", dev);
    if (r.dtype != x.dtype || r.shape != x.shape || !r.contiguous())
      arg_error(cat("residual: expected a contiguous ", st_dtype_name(x.dtype), " tensor of shape ", x.shape_str()));
    e.residual = r.data; e.ldr = cols;
  }
  if (!bias_obj.is_none()) {
    b = view_of(bias_obj, "bias", stream);
    require_cuda(b, "bias", dev);
    if (b.dtype != x.dtype || b.shape.size() != 1 || b.shape[0] != cols || (cols > 1 && b.strides[0] != 1))
      arg_error(cat("bias: expected a contiguous ", st_dtype_name(x.dtype), " tensor of shape (", cols, ",)"));
    e.bias = b.data;
  }
  e.ops = ops.data();
  e.n_ops = static_cast<int32_t>(ops.size());
  st_status st;
  {
    py::gil_scoped_release nogil;
    st = st_epilogue_apply(&e, reinterpret_cast<void*>(stream));
  }
  check(st);
  return result;
}

}  // namespace

void register_gemm(py::module_& m) {
  m.def("gemm", &gemm, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("policy") = "fp32", py::arg("trans_a") = false, py::arg("trans_b") = false,
        py::arg("epilogue") = "none", py::arg("bias") = py::none(), py::arg("c") = py::none(),
        py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::arg("ops") = py::none(),
        py::arg("residual") = py::none(), py::arg("stream") = 0,
        R"doc(out = epilogue(alpha * op(a) @ op(b) + bias) + beta * c, then the fused ops chain.

a: (m, k) or (batch, m, k); b: (k, n) or (batch, k, n); any strides with a unit stride in one of
the last two dims. trans_a / trans_b apply a transpose to the given tensor. Dtypes follow the
policy: fp32 / tf32 -> float32, bf16 -> bfloat16, fp16 -> float16; math in fp32.
epilogue: cuBLASLt's own ('none', 'bias', 'relu', 'gelu' (tanh form), 'bias_relu', 'bias_gelu').
ops: a chain for the fused epilogue kernel, e.g. [('scale', 2.0), 'mish'].
Returns out (a new DeviceTensor when out is None). Asynchronous on `stream`.)doc");

  m.def("gemm_split_tf32", &gemm_split_tf32, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("trans_a") = false, py::arg("trans_b") = false, py::arg("epilogue") = "none",
        py::arg("bias") = py::none(), py::arg("c") = py::none(), py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f,
        py::arg("stream") = 0,
        R"doc(gemm's fp32 product at fp32-grade accuracy on TF32 tensor cores (split TF32): each float32
operand as a TF32 big part plus a TF32 remainder, three TF32 products accumulated in fp32 (the one
of the two remainders, ~2^-22 of the product, left out). Arguments as gemm's with float32
operands (no ops chain). Returns out. Asynchronous on `stream`.)doc");

  m.def("gemm_split_bf16", &gemm_split_bf16, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("trans_a") = false, py::arg("trans_b") = false, py::arg("epilogue") = "none",
        py::arg("bias") = py::none(), py::arg("c") = py::none(), py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f,
        py::arg("stream") = 0,
        R"doc(gemm_split_tf32 with bfloat16 parts: three bf16 products (tensor cores at twice TF32's
rate) accumulated in fp32, about 2^-16 relative error a product (TF32's: 2^-10). Arguments as
gemm_split_tf32's. Returns out. Asynchronous on `stream`.)doc");

  py::class_<GemmCall, std::shared_ptr<GemmCall>>(m, "BoundGemm",
      "A GEMM with its operands bound: calling it launches with no DLPack exchange and no argument checks.")
      .def("__call__", [](const GemmCall& c, uintptr_t stream) {
             check(c.launch(stream));
             return c.result;
           }, py::arg("stream") = 0,
           "Launch on `stream`. The caller orders the operands' producers before it, as with cuBLAS.")
      .def_property_readonly("out", [](const GemmCall& c) { return c.result; });

  m.def("bind_gemm", &prepare_gemm, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("policy") = "fp32", py::arg("trans_a") = false, py::arg("trans_b") = false,
        py::arg("epilogue") = "none", py::arg("bias") = py::none(), py::arg("c") = py::none(),
        py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::arg("ops") = py::none(),
        py::arg("residual") = py::none(), py::arg("stream") = 0,
        "Check and bind a GEMM once (same arguments as gemm); returns a BoundGemm to launch many times.");

  m.def("epilogue", &epilogue, py::arg("x"), py::arg("ops"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("residual") = py::none(), py::arg("bias") = py::none(), py::arg("stream") = 0,
        "out = ops(x) elementwise over a contiguous tensor (last dim = columns for bias_add).");

  m.def("epilogue_ops", [] {
    std::vector<std::string> names;
    for (auto& k : ep_kinds()) names.push_back(k.first);
    return names;
  }, "Names of the fused epilogue ops.");
  m.attr("MAX_EPILOGUE_OPS") = ST_MAX_EPILOGUE_OPS;
}

}  // namespace strt
