// rt_module.cpp — stitchcuda._rt: the runtime's C ABI for Python, tensors in and out through
// DLPack. Argument checks that need names (shapes, dtypes, layouts, devices) live here, once;
// the runtime below re-checks what it needs and reports its own failures as typed errors.
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dlpack_abi.h"
#include "stitchrt/program.h"
#include "stitchrt/stitchrt.h"

namespace py = pybind11;

namespace {

// ------------------------------------------------------------------ errors

struct Exceptions {
  py::object base, argument, cuda, cublas, no_device, oom, not_supported;
};
Exceptions* g_exc = nullptr;

[[noreturn]] void raise_status(st_status s, const std::string& context = "") {
  std::string msg = st_last_error();
  if (!context.empty()) msg = context + ": " + msg;
  py::object type;
  switch (s) {
    case ST_ERR_INVALID_ARGUMENT: type = g_exc->argument; break;
    case ST_ERR_CUDA: type = g_exc->cuda; break;
    case ST_ERR_CUBLAS: type = g_exc->cublas; break;
    case ST_ERR_NO_DEVICE: type = g_exc->no_device; break;
    case ST_ERR_OUT_OF_MEMORY: type = g_exc->oom; break;
    case ST_ERR_NOT_SUPPORTED: type = g_exc->not_supported; break;
    default: type = g_exc->base; break;
  }
  PyErr_SetString(type.ptr(), msg.c_str());
  throw py::error_already_set();
}

void check(st_status s) {
  if (s != ST_OK) raise_status(s);
}

[[noreturn]] void arg_error(const std::string& msg) {
  PyErr_SetString(g_exc->argument.ptr(), msg.c_str());
  throw py::error_already_set();
}

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// ------------------------------------------------------------------ dtypes

bool dl_to_st(DLDataType t, st_dtype* out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) { *out = ST_FLOAT32; return true; }
      if (t.bits == 16) { *out = ST_FLOAT16; return true; }
      if (t.bits == 64) { *out = ST_FLOAT64; return true; }
      return false;
    case kDLBfloat:
      if (t.bits == 16) { *out = ST_BFLOAT16; return true; }
      return false;
    case kDLInt:
      if (t.bits == 32) { *out = ST_INT32; return true; }
      if (t.bits == 64) { *out = ST_INT64; return true; }
      if (t.bits == 8) { *out = ST_INT8; return true; }
      return false;
    case kDLUInt:
      if (t.bits == 8) { *out = ST_UINT8; return true; }
      return false;
    case kDLBool:
      *out = ST_BOOL;
      return true;
  }
  return false;
}

DLDataType st_to_dl(st_dtype t) {
  switch (t) {
    case ST_FLOAT32: return {kDLFloat, 32, 1};
    case ST_FLOAT16: return {kDLFloat, 16, 1};
    case ST_BFLOAT16: return {kDLBfloat, 16, 1};
    case ST_FLOAT64: return {kDLFloat, 64, 1};
    case ST_INT32: return {kDLInt, 32, 1};
    case ST_INT64: return {kDLInt, 64, 1};
    case ST_UINT8: return {kDLUInt, 8, 1};
    case ST_BOOL: return {kDLBool, 8, 1};
    case ST_INT8: return {kDLInt, 8, 1};
  }
  return {kDLFloat, 32, 1};
}

st_dtype parse_dtype(const std::string& s) {
  static const std::pair<const char*, st_dtype> names[] = {
      {"float32", ST_FLOAT32}, {"float16", ST_FLOAT16}, {"bfloat16", ST_BFLOAT16}, {"float64", ST_FLOAT64},
      {"int32", ST_INT32},     {"int64", ST_INT64},     {"uint8", ST_UINT8},       {"bool", ST_BOOL},
      {"int8", ST_INT8}};
  for (auto& n : names)
    if (s == n.first) return n.second;
  arg_error(cat("dtype must be one of float32, float16, bfloat16, float64, int32, int64, uint8, int8, bool; got '", s, "'"));
}

st_policy parse_policy(const std::string& s) {
  if (s == "fp32") return ST_POLICY_FP32;
  if (s == "tf32") return ST_POLICY_TF32;
  if (s == "bf16") return ST_POLICY_BF16;
  if (s == "fp16") return ST_POLICY_FP16;
  arg_error(cat("policy must be one of 'fp32', 'tf32', 'bf16', 'fp16'; got '", s, "'"));
}

st_dtype policy_storage(st_policy p) {
  return p == ST_POLICY_BF16 ? ST_BFLOAT16 : p == ST_POLICY_FP16 ? ST_FLOAT16 : ST_FLOAT32;
}

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

// ------------------------------------------------------------------ tensors in (DLPack)

// A borrowed view of a DLPack tensor; keeps the producer's capsule alive while it lives.
struct View {
  py::object keep;
  void* data = nullptr;
  st_dtype dtype = ST_FLOAT32;
  int device_type = 0, device_id = 0;
  std::vector<int64_t> shape, strides;
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  std::string shape_str() const {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
  }
  std::string strides_str() const {
    std::string s = "(";
    for (size_t i = 0; i < strides.size(); ++i) s += cat(i ? ", " : "", strides[i]);
    return s + (strides.size() == 1 ? ",)" : ")");
  }
  bool contiguous() const {
    int64_t expect = 1;
    for (int i = int(shape.size()) - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
};

const char* device_name(int type) {
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
  }
  return "an unsupported device";
}

// The DLPack stream argument for a CUDA producer: 1 is the legacy default stream.
py::object dlpack_stream_arg(uintptr_t stream) { return py::int_(stream == 0 ? 1 : stream); }

View view_of(py::handle obj, const char* name, uintptr_t stream) {
  View v;
  py::object capsule;
  if (PyCapsule_CheckExact(obj.ptr())) {
    capsule = py::reinterpret_borrow<py::object>(obj);
  } else if (py::hasattr(obj, "__dlpack__")) {
    // One call: CUDA producers order their pending work before our stream; host producers
    // (NumPy) refuse a stream argument, so ask those again without one.
    try {
      capsule = obj.attr("__dlpack__")(py::arg("stream") = dlpack_stream_arg(stream));
    } catch (py::error_already_set& e) {
      // Only a host producer may be asked again without a stream: a CUDA one that failed
      // must not be consumed unordered.
      py::object dev = py::hasattr(obj, "__dlpack_device__") ? obj.attr("__dlpack_device__")() : py::none();
      if (!dev.is_none() && dev.cast<py::tuple>()[0].cast<int>() == kDLCUDA) throw;
      capsule = obj.attr("__dlpack__")();
    }
  } else {
    arg_error(cat(name, ": expected a tensor supporting DLPack (__dlpack__), got ",
                  py::str(py::type::of(obj)).cast<std::string>()));
  }
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    arg_error(cat(name, ": __dlpack__ did not return an unconsumed 'dltensor' capsule"));
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  const DLTensor& t = m->dl_tensor;
  v.keep = capsule;
  if (!dl_to_st(t.dtype, &v.dtype))
    arg_error(cat(name, ": dtype (code ", int(t.dtype.code), ", ", int(t.dtype.bits), " bits, ", t.dtype.lanes,
                  " lanes) is not supported"));
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  v.device_type = t.device.device_type;
  v.device_id = t.device.device_id;
  v.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides) {
    v.strides.assign(t.strides, t.strides + t.ndim);
  } else {
    v.strides.resize(t.ndim);
    int64_t s = 1;
    for (int i = t.ndim - 1; i >= 0; --i) { v.strides[i] = s; s *= t.shape[i]; }
  }
  return v;
}

int current_device() {
  int d = 0;
  check(st_get_device(&d));
  return d;
}

void require_cuda(const View& v, const char* name, int device) {
  if (v.device_type != kDLCUDA)
    arg_error(cat(name, ": expected a CUDA tensor on cuda:", device, ", got a tensor on ", device_name(v.device_type)));
  if (v.device_id != device)
    arg_error(cat(name, ": expected a tensor on cuda:", device, " (the current device), got cuda:", v.device_id));
}

void require_dtype(const View& v, const char* name, st_dtype want, const char* why) {
  if (v.dtype != want)
    arg_error(cat(name, ": expected dtype ", st_dtype_name(want), " (", why, "), got ", st_dtype_name(v.dtype)));
}

// ------------------------------------------------------------------ tensors out (DLPack)

// Device memory owned by the runtime (stream-ordered alloc/free), handed to any DLPack consumer.
struct DeviceBlock {
  void* ptr = nullptr;
  size_t bytes = 0;
  uintptr_t stream = 0;
  int device = 0;
  ~DeviceBlock() {
    if (ptr) {
      int prev = -1;
      st_get_device(&prev);
      st_set_device(device);
      st_device_free(ptr, reinterpret_cast<void*>(stream));
      if (prev >= 0) st_set_device(prev);
    }
  }
};

class DeviceTensor {
 public:
  DeviceTensor(std::vector<int64_t> shape, st_dtype dtype, uintptr_t stream) : shape_(std::move(shape)), dtype_(dtype) {
    for (auto s : shape_)
      if (s < 0) arg_error("DeviceTensor: negative dimension");
    strides_.resize(shape_.size());
    int64_t s = 1;
    for (int i = int(shape_.size()) - 1; i >= 0; --i) { strides_[i] = s; s *= shape_[i]; }
    block_ = std::make_shared<DeviceBlock>();
    block_->bytes = static_cast<size_t>(s) * st_dtype_size(dtype);
    block_->stream = stream;
    block_->device = current_device();
    check(st_device_alloc(block_->bytes, reinterpret_cast<void*>(stream), &block_->ptr));
  }
  void* data() const { return block_->ptr; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  st_dtype dtype() const { return dtype_; }
  int device() const { return block_->device; }
  size_t nbytes() const { return block_->bytes; }

  py::capsule dlpack(py::object stream) const {
    // The consumer's stream must see our writes: they were queued on block_->stream, and a
    // consumer on another stream synchronises with it here.
    if (!stream.is_none()) {
      uintptr_t s = stream.cast<uintptr_t>();
      uintptr_t ours = block_->stream;
      uintptr_t theirs = s == 1 ? 0 : s;
      if (s != static_cast<uintptr_t>(-1) && theirs != ours) check(st_stream_synchronize(reinterpret_cast<void*>(ours)));
    }
    struct Holder {
      DLManagedTensor m;
      std::shared_ptr<DeviceBlock> block;
      std::vector<int64_t> shape, strides;
    };
    auto* h = new Holder{};
    h->block = block_;
    h->shape = shape_;
    h->strides = strides_;
    h->m.dl_tensor.data = block_->ptr;
    h->m.dl_tensor.device = {kDLCUDA, block_->device};
    h->m.dl_tensor.ndim = static_cast<int32_t>(shape_.size());
    h->m.dl_tensor.dtype = st_to_dl(dtype_);
    h->m.dl_tensor.shape = h->shape.data();
    h->m.dl_tensor.strides = h->strides.data();
    h->m.dl_tensor.byte_offset = 0;
    h->m.manager_ctx = h;
    h->m.deleter = [](DLManagedTensor* self) { delete static_cast<Holder*>(self->manager_ctx); };
    return py::capsule(&h->m, "dltensor", [](PyObject* cap) {
      // Called when the capsule dies: delete only if no consumer took ownership (renamed it).
      if (PyCapsule_IsValid(cap, "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
        if (m && m->deleter) m->deleter(m);
      } else {
        PyErr_Clear();
      }
    });
  }

 private:
  std::vector<int64_t> shape_, strides_;
  st_dtype dtype_;
  std::shared_ptr<DeviceBlock> block_;
};

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
  std::vector<st_ep_op> ops;
  const void* residual = nullptr;
  int64_t ldr = 0;
  std::vector<View> keep;  // the operands' capsules: their memory stays alive with the call
  py::object result;

  st_status launch(uintptr_t stream) const {
    void* s = reinterpret_cast<void*>(stream);
    py::gil_scoped_release nogil;
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
  const int dev = current_device();
  const std::string why = cat("policy ", policy_s);

  View a = view_of(a_obj, "a", stream), b = view_of(b_obj, "b", stream);
  require_cuda(a, "a", dev);
  require_cuda(b, "b", dev);
  require_dtype(a, "a", storage, why.c_str());
  require_dtype(b, "b", storage, why.c_str());
  Mat A = as_matrix(a, "a", trans_a), B = as_matrix(b, "b", trans_b);
  if (A.cols != B.rows)
    arg_error(cat("a and b: inner dimensions differ: op(a) is ", A.rows, " x ", A.cols, ", op(b) is ", B.rows, " x ",
                  B.cols));
  if (A.batch != B.batch && A.batch != 1 && B.batch != 1)
    arg_error(cat("a and b: batch sizes differ (", A.batch, " vs ", B.batch, ") and neither is 1"));
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

// ------------------------------------------------------------------ pinned host memory

class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    int pinned = 0;
    check(st_host_alloc(bytes, &ptr_, &pinned));
    pinned_ = pinned != 0;
  }
  ~HostBuffer() { close(); }
  void close() {
    if (ptr_) st_host_free(ptr_);
    ptr_ = nullptr;
  }
  void* ptr() const {
    if (!ptr_) arg_error("HostBuffer is closed");
    return ptr_;
  }
  size_t nbytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
  bool pinned_ = false;
};

// A host source or destination: a HostBuffer or anything with the buffer protocol.
struct HostSpan {
  void* ptr;
  size_t bytes;
  py::object keep;
};

HostSpan host_span(py::handle h, const char* name, bool writable) {
  if (py::isinstance<HostBuffer>(h)) {
    auto& hb = h.cast<HostBuffer&>();
    return {hb.ptr(), hb.nbytes(), py::reinterpret_borrow<py::object>(h)};
  }
  if (!PyObject_CheckBuffer(h.ptr()))
    arg_error(cat(name, ": expected a HostBuffer or an object with the buffer protocol (bytearray, numpy array)"));
  auto buf = std::make_shared<Py_buffer>();
  if (PyObject_GetBuffer(h.ptr(), buf.get(), (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    arg_error(cat(name, writable ? ": must be a writable C-contiguous buffer" : ": must be a C-contiguous buffer"));
  }
  HostSpan s{buf->buf, static_cast<size_t>(buf->len), py::none()};
  s.keep = py::capsule(new std::shared_ptr<Py_buffer>(buf), [](void* p) {
    auto* sp = static_cast<std::shared_ptr<Py_buffer>*>(p);
    PyBuffer_Release(sp->get());
    delete sp;
  });
  return s;
}

View device_dense(py::handle obj, const char* name, uintptr_t stream) {
  View v = view_of(obj, name, stream);
  require_cuda(v, name, current_device());
  if (!v.contiguous()) arg_error(cat(name, ": must be contiguous"));
  return v;
}

void h2d(py::object dst, py::object src, uintptr_t stream) {
  View d = device_dense(dst, "dst", stream);
  HostSpan s = host_span(src, "src", false);
  const size_t bytes = static_cast<size_t>(d.numel()) * st_dtype_size(d.dtype);
  if (s.bytes < bytes) arg_error(cat("src: holds ", s.bytes, " bytes, dst needs ", bytes));
  st_status st;
  {
    py::gil_scoped_release nogil;
    st = st_copy_h2d(d.data, s.ptr, bytes, reinterpret_cast<void*>(stream));
  }
  check(st);
}

void d2h(py::object dst, py::object src, uintptr_t stream) {
  View sv = device_dense(src, "src", stream);
  HostSpan d = host_span(dst, "dst", true);
  const size_t bytes = static_cast<size_t>(sv.numel()) * st_dtype_size(sv.dtype);
  if (d.bytes < bytes) arg_error(cat("dst: holds ", d.bytes, " bytes, src has ", bytes));
  st_status st;
  {
    py::gil_scoped_release nogil;
    st = st_copy_d2h(d.ptr, sv.data, bytes, reinterpret_cast<void*>(stream));
  }
  check(st);
}

// ------------------------------------------------------------------ programs (the C ABI)

st_tensor to_st_tensor(const View& v) {
  st_tensor t{};
  if (v.shape.size() > ST_MAX_DIMS) arg_error(cat("tensor has ", v.shape.size(), " dims, at most ", ST_MAX_DIMS));
  t.data = v.data;
  t.dtype = v.dtype;
  t.ndim = static_cast<int32_t>(v.shape.size());
  for (size_t i = 0; i < v.shape.size(); ++i) { t.shape[i] = v.shape[i]; t.strides[i] = v.strides[i]; }
  t.device_type = v.device_type == kDLCUDA ? ST_DEVICE_CUDA : ST_DEVICE_HOST;
  t.device_id = v.device_id;
  if (v.device_type != kDLCUDA && v.device_type != kDLCPU && v.device_type != kDLCUDAHost)
    arg_error(cat("tensor on ", device_name(v.device_type), " cannot cross the program ABI"));
  return t;
}

class ProgramLibrary;

class ProgramInstance : public std::enable_shared_from_this<ProgramInstance> {
 public:
  ProgramInstance(std::shared_ptr<ProgramLibrary> lib, st_program* p, int device) : lib_(std::move(lib)), p_(p), device_(device) {}
  ~ProgramInstance() { close(); }
  void run(py::list inputs, py::list outputs, uintptr_t stream);
  py::object bind(py::list inputs, py::list outputs, uintptr_t stream);
  void close();
  st_status launch(const st_tensor* in, int32_t n_in, const st_tensor* out, int32_t n_out, uintptr_t stream);

 private:
  std::shared_ptr<ProgramLibrary> lib_;
  st_program* p_;
  int device_;
};

class ProgramLibrary : public std::enable_shared_from_this<ProgramLibrary> {
 public:
  explicit ProgramLibrary(const std::string& path) : path_(path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* e = dlerror();
      arg_error(cat("cannot load program '", path, "': ", e ? e : "dlopen failed"));
    }
    abi_ = sym<st_program_abi_version_fn>("st_program_abi_version");
    manifest_ = sym<st_program_manifest_fn>("st_program_manifest");
    create_ = sym<st_program_create_fn>("st_program_create");
    run_ = sym<st_program_run_fn>("st_program_run");
    destroy_ = sym<st_program_destroy_fn>("st_program_destroy");
    if (abi_() != ST_PROGRAM_ABI_VERSION)
      arg_error(cat("program '", path, "' has ABI version ", abi_(), ", this runtime speaks ", ST_PROGRAM_ABI_VERSION));
  }
  ~ProgramLibrary() {
    if (handle_) dlclose(handle_);
  }
  std::string manifest() const { return manifest_(); }
  int abi_version() const { return abi_(); }
  const std::string& path() const { return path_; }

  std::shared_ptr<ProgramInstance> create(py::list weights, int device) {
    std::vector<View> views;
    std::vector<st_tensor> ts;
    for (size_t i = 0; i < weights.size(); ++i) {
      std::string name = cat("weights[", i, "]");
      views.push_back(view_of(weights[i], name.c_str(), 0));
      ts.push_back(to_st_tensor(views.back()));
    }
    int prev = current_device();
    check(st_set_device(device));
    st_program* p = nullptr;
    st_status st;
    {
      py::gil_scoped_release nogil;
      st = create_(ts.data(), static_cast<int32_t>(ts.size()), device, &p);
    }
    st_set_device(prev);
    if (st != ST_OK) raise_status(st, cat("program '", path_, "' create"));
    return std::make_shared<ProgramInstance>(shared_from_this(), p, device);
  }

  st_program_run_fn run_fn() const { return run_; }
  st_program_destroy_fn destroy_fn() const { return destroy_; }

 private:
  template <class F>
  F sym(const char* name) {
    void* s = dlsym(handle_, name);
    if (!s) arg_error(cat("program '", path_, "' does not export ", name, " (not a stitchcuda program?)"));
    return reinterpret_cast<F>(s);
  }
  std::string path_;
  void* handle_ = nullptr;
  st_program_abi_version_fn abi_ = nullptr;
  st_program_manifest_fn manifest_ = nullptr;
  st_program_create_fn create_ = nullptr;
  st_program_run_fn run_ = nullptr;
  st_program_destroy_fn destroy_ = nullptr;
};

// Descriptors of a run's tensors, resolved through DLPack; the views keep the memory alive.
struct RunArgs {
  std::vector<View> views;
  std::vector<st_tensor> in, out;
};

RunArgs resolve_run_args(py::list inputs, py::list outputs, uintptr_t stream) {
  RunArgs a;
  a.views.reserve(inputs.size() + outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = cat("inputs[", i, "]");
    a.views.push_back(view_of(inputs[i], name.c_str(), stream));
    a.in.push_back(to_st_tensor(a.views.back()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string name = cat("outputs[", i, "]");
    a.views.push_back(view_of(outputs[i], name.c_str(), stream));
    a.out.push_back(to_st_tensor(a.views.back()));
  }
  return a;
}

st_status ProgramInstance::launch(const st_tensor* in, int32_t n_in, const st_tensor* out, int32_t n_out,
                                  uintptr_t stream) {
  if (!p_) arg_error("program instance is closed");
  int prev = current_device();
  if (prev != device_) check(st_set_device(device_));
  st_status st;
  {
    py::gil_scoped_release nogil;
    st = lib_->run_fn()(p_, in, n_in, out, n_out, reinterpret_cast<void*>(stream));
  }
  if (prev != device_) st_set_device(prev);
  return st;
}

void ProgramInstance::run(py::list inputs, py::list outputs, uintptr_t stream) {
  if (!p_) arg_error("program instance is closed");
  RunArgs a = resolve_run_args(inputs, outputs, stream);
  st_status st = launch(a.in.data(), static_cast<int32_t>(a.in.size()), a.out.data(),
                        static_cast<int32_t>(a.out.size()), stream);
  if (st != ST_OK) raise_status(st, cat("program '", lib_->path(), "' run"));
}

// A run with its tensors bound: calling it launches with no DLPack exchange, as a deployed
// program is called from C or C++. The caller orders the tensors' producers before `stream`.
struct BoundRun {
  std::shared_ptr<ProgramInstance> instance;
  RunArgs args;
  std::string path;
  void operator()(uintptr_t stream) {
    st_status st = instance->launch(args.in.data(), static_cast<int32_t>(args.in.size()), args.out.data(),
                                    static_cast<int32_t>(args.out.size()), stream);
    if (st != ST_OK) raise_status(st, cat("program '", path, "' run"));
  }
};

py::object ProgramInstance::bind(py::list inputs, py::list outputs, uintptr_t stream) {
  if (!p_) arg_error("program instance is closed");
  auto b = std::make_shared<BoundRun>();
  b->instance = shared_from_this();
  b->args = resolve_run_args(inputs, outputs, stream);
  b->path = lib_->path();
  return py::cast(b);
}

void ProgramInstance::close() {
  if (p_) lib_->destroy_fn()(p_);
  p_ = nullptr;
}

}  // namespace

PYBIND11_MODULE(_rt, m) {
  m.doc() = "stitchcuda native runtime: GEMM plans, fused epilogues, pinned transfers, program ABI (DLPack in and out)";

  static Exceptions exc;
  py::object rt_err = py::module_::import("builtins").attr("RuntimeError");
  py::object val_err = py::module_::import("builtins").attr("ValueError");
  py::object mem_err = py::module_::import("builtins").attr("MemoryError");
  auto make = [&](const char* name, py::tuple bases, const char* doc) {
    py::dict ns;
    ns["__doc__"] = doc;
    ns["__module__"] = "stitchcuda._rt";
    py::object t = py::reinterpret_borrow<py::object>((PyObject*)&PyType_Type)(name, bases, ns);
    m.attr(name) = t;
    return t;
  };
  exc.base = make("StitchError", py::make_tuple(rt_err), "Base of every error the runtime raises.");
  exc.argument = make("ArgumentError", py::make_tuple(exc.base, val_err),
                      "A bad argument: shape, dtype, layout, alignment or device. The message names it.");
  exc.cuda = make("CudaError", py::make_tuple(exc.base), "A CUDA runtime call failed; the message has the call site.");
  exc.cublas = make("CublasError", py::make_tuple(exc.base), "A cuBLASLt call failed; the message has the call site.");
  exc.no_device = make("NoDeviceError", py::make_tuple(exc.base), "No usable CUDA device (no GPU, or no driver).");
  exc.oom = make("OutOfMemoryError", py::make_tuple(exc.base, mem_err), "Device or host memory ran out.");
  exc.not_supported = make("NotSupportedError", py::make_tuple(exc.base), "A valid request the runtime cannot serve.");
  g_exc = &exc;

  m.def("version", [] {
    int v = st_version();
    return cat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
  }, "Runtime version as 'major.minor.patch'.");

  m.def("device_count", [] {
    int n = 0;
    st_status s = st_device_count(&n);
    if (s == ST_ERR_NO_DEVICE) return 0;
    check(s);
    return n;
  }, "Number of usable CUDA devices; 0 without a GPU or driver.");

  m.def("device_info", [](int device) {
    int ma = 0, mi = 0, sms = 0;
    size_t l2 = 0, mem = 0;
    check(st_device_info(device, &ma, &mi, &sms, &l2, &mem));
    py::dict d;
    d["compute_capability"] = py::make_tuple(ma, mi);
    d["sm_count"] = sms;
    d["l2_bytes"] = l2;
    d["memory_bytes"] = mem;
    return d;
  }, py::arg("device") = 0, "Compute capability, SM count, L2 and memory size of a device.");

  m.def("require_device", [] {
    int n = 0;
    check(st_device_count(&n));
  }, "Raise NoDeviceError unless a CUDA device is usable.");

  m.def("set_device", [](int d) { check(st_set_device(d)); }, py::arg("device"));
  m.def("get_device", [] { return current_device(); });

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

  m.def("plan_cache_stats", [](uintptr_t stream) {
    uint64_t h = 0, mi = 0, sz = 0;
    check(st_plan_cache_stats(reinterpret_cast<void*>(stream), &h, &mi, &sz));
    py::dict d;
    d["hits"] = h;
    d["misses"] = mi;
    d["size"] = sz;
    return d;
  }, py::arg("stream") = 0, "GEMM plan-cache counters of the (current device, stream) context.");
  m.def("plan_cache_clear", [](uintptr_t stream) { check(st_plan_cache_clear(reinterpret_cast<void*>(stream))); },
        py::arg("stream") = 0);

  m.def("workspace_info", [](uintptr_t stream) {
    void* p = nullptr;
    size_t b = 0;
    check(st_workspace_info(reinterpret_cast<void*>(stream), &p, &b));
    return py::make_tuple(reinterpret_cast<uintptr_t>(p), b);
  }, py::arg("stream") = 0, "(pointer, bytes) of the persistent cuBLASLt workspace of the stream's context.");
  m.def("set_default_workspace_bytes", [](size_t b) { check(st_set_default_workspace_bytes(b)); }, py::arg("bytes"),
        "Workspace size for contexts created from now on.");
  m.def("release", [] { check(st_release()); }, "Free every context, plan, workspace and arena.");
  m.def("synchronize", [](uintptr_t stream) {
    st_status s;
    {
      py::gil_scoped_release nogil;
      s = st_stream_synchronize(reinterpret_cast<void*>(stream));
    }
    check(s);
  }, py::arg("stream") = 0);

  py::class_<DeviceTensor, std::shared_ptr<DeviceTensor>>(m, "DeviceTensor",
      "Device memory owned by the runtime, exported through DLPack (torch.from_dlpack(t) shares it).")
      .def(py::init([](std::vector<int64_t> shape, const std::string& dtype, uintptr_t stream) {
             return std::make_shared<DeviceTensor>(shape, parse_dtype(dtype), stream);
           }), py::arg("shape"), py::arg("dtype") = "float32", py::arg("stream") = 0)
      .def_property_readonly("shape", [](const DeviceTensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("strides", [](const DeviceTensor& t) { return py::tuple(py::cast(t.strides())); })
      .def_property_readonly("dtype", [](const DeviceTensor& t) { return std::string(st_dtype_name(t.dtype())); })
      .def_property_readonly("device", &DeviceTensor::device)
      .def_property_readonly("nbytes", &DeviceTensor::nbytes)
      .def_property_readonly("data_ptr", [](const DeviceTensor& t) { return reinterpret_cast<uintptr_t>(t.data()); })
      .def("__dlpack__", [](const DeviceTensor& t, py::object stream, py::kwargs) { return t.dlpack(stream); },
           py::kw_only(), py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const DeviceTensor& t) { return py::make_tuple(int(kDLCUDA), t.device()); })
      .def("__repr__", [](const DeviceTensor& t) {
        View v;
        v.shape = t.shape();
        return cat("DeviceTensor(shape=", v.shape_str(), ", dtype=", st_dtype_name(t.dtype()), ", device=cuda:", t.device(), ")");
      });

  py::class_<HostBuffer>(m, "HostBuffer", py::buffer_protocol(),
      "Host memory from the runtime's pinned pool (pageable if pinning is unavailable); supports the buffer protocol.")
      .def(py::init<size_t>(), py::arg("nbytes"))
      .def_property_readonly("nbytes", &HostBuffer::nbytes)
      .def_property_readonly("pinned", &HostBuffer::pinned)
      .def_property_readonly("address", [](const HostBuffer& h) { return reinterpret_cast<uintptr_t>(h.ptr()); })
      .def("close", &HostBuffer::close, "Return the memory to the pool now.")
      .def_buffer([](HostBuffer& h) {
        return py::buffer_info(h.ptr(), 1, py::format_descriptor<uint8_t>::format(), 1, {h.nbytes()}, {1});
      });

  m.def("h2d", &h2d, py::arg("dst"), py::arg("src"), py::kw_only(), py::arg("stream") = 0,
        "Copy host bytes (HostBuffer: direct DMA; other buffers: staged through the pinned pool) into a contiguous device tensor.");
  m.def("d2h", &d2h, py::arg("dst"), py::arg("src"), py::kw_only(), py::arg("stream") = 0,
        "Copy a contiguous device tensor into host memory (HostBuffer or a writable buffer).");
  m.def("host_pool_stats", [] {
    size_t c = 0, l = 0;
    int e = 0;
    check(st_host_pool_stats(&c, &l, &e));
    py::dict d;
    d["cached_bytes"] = c;
    d["live_bytes"] = l;
    d["pinning_enabled"] = e != 0;
    return d;
  });

  py::class_<BoundRun, std::shared_ptr<BoundRun>>(m, "BoundRun", "A program run with its tensors bound.")
      .def("__call__", &BoundRun::operator(), py::arg("stream") = 0);

  py::class_<ProgramInstance, std::shared_ptr<ProgramInstance>>(m, "ProgramInstance",
      "A created program: weights uploaded, ready to run.")
      .def("run", &ProgramInstance::run, py::arg("inputs"), py::arg("outputs"), py::kw_only(), py::arg("stream") = 0,
           "Run on a stream: inputs and outputs are DLPack tensors in manifest order; outputs are written in place.")
      .def("bind", &ProgramInstance::bind, py::arg("inputs"), py::arg("outputs"), py::kw_only(), py::arg("stream") = 0,
           "Resolve the tensors once; the returned BoundRun(stream) launches with no DLPack exchange.")
      .def("close", &ProgramInstance::close);

  py::class_<ProgramLibrary, std::shared_ptr<ProgramLibrary>>(m, "ProgramLibrary",
      "A compiled stitchcuda program (.so) loaded through its C ABI.")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def_property_readonly("manifest", &ProgramLibrary::manifest)
      .def_property_readonly("abi_version", &ProgramLibrary::abi_version)
      .def_property_readonly("path", &ProgramLibrary::path)
      .def("create", &ProgramLibrary::create, py::arg("weights"), py::kw_only(), py::arg("device") = 0,
           "Create an instance from weights (DLPack tensors, host or device, in manifest order).");

  m.attr("PROGRAM_ABI_VERSION") = ST_PROGRAM_ABI_VERSION;
  m.attr("MAX_EPILOGUE_OPS") = ST_MAX_EPILOGUE_OPS;
}
