// rt_errors.cpp — the exception types of stitchcuda._rt and the translation of a failed
// st_status (with the runtime's last error as message) into the matching Python exception.
#include "rt_internal.hpp"

namespace strt {

namespace {

struct Exceptions {
  py::object base, argument, cuda, cublas, cudnn, no_device, oom, not_supported;
};
Exceptions* g_exc = nullptr;

}  // namespace

[[noreturn]] void raise_status(st_status s, const std::string& context) {
  std::string msg = st_last_error();
  if (!context.empty()) msg = context + ": " + msg;
  py::object type;
  switch (s) {
    case ST_ERR_INVALID_ARGUMENT: type = g_exc->argument; break;
    case ST_ERR_CUDA: type = g_exc->cuda; break;
    case ST_ERR_CUBLAS: type = g_exc->cublas; break;
    case ST_ERR_CUDNN: type = g_exc->cudnn; break;
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

void register_errors(py::module_& m) {
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
  exc.cudnn = make("CudnnError", py::make_tuple(exc.base), "A cuDNN call failed; the message has the call site.");
  exc.no_device = make("NoDeviceError", py::make_tuple(exc.base), "No usable CUDA device (no GPU, or no driver).");
  exc.oom = make("OutOfMemoryError", py::make_tuple(exc.base, mem_err), "Device or host memory ran out.");
  exc.not_supported = make("NotSupportedError", py::make_tuple(exc.base), "A valid request the runtime cannot serve.");
  g_exc = &exc;
}

}  // namespace strt
