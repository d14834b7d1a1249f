// rt_host.cpp — host memory: HostBuffer from the runtime's pinned pool (pageable when pinning
// is unavailable) and asynchronous host <-> device copies.
#include "rt_internal.hpp"

namespace strt {

namespace {

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

}  // namespace

void register_host(py::module_& m) {
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
}

}  // namespace strt
