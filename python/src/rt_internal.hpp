// rt_internal.hpp — what the concerns of stitchcuda._rt share: error translation, dtype and
// policy names, borrowed DLPack views, and runtime-owned device tensors. Each concern lives in
// its own rt_*.cpp and registers its part of the module through one register_* function.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dlpack_abi.h"
#include "stitchrt/program.h"
#include "stitchrt/stitchrt.h"
#include "stitchrt/tuning.h"

namespace py = pybind11;

namespace strt {

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// ------------------------------------------------------------------ errors (rt_errors.cpp)

// Raise the Python exception of a failed status, with the runtime's last error as message.
[[noreturn]] void raise_status(st_status s, const std::string& context = "");
void check(st_status s);
[[noreturn]] void arg_error(const std::string& msg);

// ------------------------------------------------------------------ dtypes and policies (rt_dlpack.cpp)

bool dl_to_st(DLDataType t, st_dtype* out);
DLDataType st_to_dl(st_dtype t);
st_dtype parse_dtype(const std::string& s);
st_policy parse_policy(const std::string& s);
st_dtype policy_storage(st_policy p);

// ------------------------------------------------------------------ tensors in (rt_dlpack.cpp)

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

const char* device_name(int type);
View view_of(py::handle obj, const char* name, uintptr_t stream);
int current_device();
void require_cuda(const View& v, const char* name, int device);
void require_dtype(const View& v, const char* name, st_dtype want, const char* why);

// ------------------------------------------------------------------ tensors out (rt_dlpack.cpp)

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
  DeviceTensor(std::vector<int64_t> shape, st_dtype dtype, uintptr_t stream);
  // A dense tensor in another order of its dims in memory (e.g. channels-last): strides are a
  // permutation of the contiguous ones.
  DeviceTensor(std::vector<int64_t> shape, std::vector<int64_t> strides, st_dtype dtype, uintptr_t stream);
  void* data() const { return block_->ptr; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  st_dtype dtype() const { return dtype_; }
  int device() const { return block_->device; }
  size_t nbytes() const { return block_->bytes; }
  py::capsule dlpack(py::object stream) const;

 private:
  std::vector<int64_t> shape_, strides_;
  st_dtype dtype_;
  std::shared_ptr<DeviceBlock> block_;
};

// ------------------------------------------------------------------ registration, in module order

void register_errors(py::module_& m);    // StitchError and its subclasses
void register_device(py::module_& m);    // devices, contexts, workspaces, plan-cache counters
void register_gemm(py::module_& m);      // gemm, bind_gemm, epilogue
void register_conv(py::module_& m);      // conv (cuDNN)
void register_dlpack(py::module_& m);    // DeviceTensor
void register_host(py::module_& m);      // pinned pool, h2d / d2h
void register_programs(py::module_& m);  // ProgramLibrary, ProgramInstance, BoundRun

}  // namespace strt
