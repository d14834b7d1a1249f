// rt_programs.cpp — compiled programs through their C ABI: ProgramLibrary (dlopen, manifest,
// create), ProgramInstance (run, bind) and BoundRun (a run with its tensors resolved once).
#include <dlfcn.h>

#include "rt_internal.hpp"

namespace strt {

namespace {

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

void register_programs(py::module_& m) {
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
}

}  // namespace strt
