// rt_dlpack.cpp — tensors across the binding through DLPack: dtype and policy names, borrowed
// views of any producer's tensor (view_of), and DeviceTensor, device memory owned by the
// runtime and exported to any consumer.
#include "rt_internal.hpp"

namespace strt {

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

DeviceTensor::DeviceTensor(std::vector<int64_t> shape, st_dtype dtype, uintptr_t stream)
    : shape_(std::move(shape)), dtype_(dtype) {
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

DeviceTensor::DeviceTensor(std::vector<int64_t> shape, std::vector<int64_t> strides, st_dtype dtype, uintptr_t stream)
    : DeviceTensor(shape, dtype, stream) {
  if (strides.size() != shape_.size()) arg_error("DeviceTensor: strides and shape differ in length");
  strides_ = std::move(strides);
}

py::capsule DeviceTensor::dlpack(py::object stream) const {
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

void register_dlpack(py::module_& m) {
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
}

}  // namespace strt
