// error.hpp — typed runtime errors with their call site, and the checks that raise them.
//
// Inside the runtime a failure is a C++ exception (st::Error); at the C ABI boundary (capi.cpp)
// it becomes an st_status plus a thread-local message. Nothing calls abort().
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include "stitchrt/stitchrt.h"

namespace st {

class Error : public std::runtime_error {
 public:
  Error(st_status status, const std::string& msg) : std::runtime_error(msg), status_(status) {}
  st_status status() const { return status_; }

 private:
  st_status status_;
};

// Whether the NVIDIA driver library can be loaded (cudart reports no driver as an old one).
bool driver_loadable();
[[noreturn]] void throw_cuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t err, const char* expr, const char* file, int line);
// A cudnnStatus_t as int, so that only the files that call cuDNN include its headers.
[[noreturn]] void throw_cudnn(int err, const char* expr, const char* file, int line);
const char* cublas_status_string(cublasStatus_t s);

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Thread-local last error, shared by the C ABI and programs.
void set_last_error(st_status status, const std::string& msg);
const char* last_error();

// Run f; turn any exception into a status and the thread's last error. Used at every C entry.
template <class F>
st_status guarded(F&& f) noexcept {
  try {
    f();
    return ST_OK;
  } catch (const Error& e) {
    set_last_error(e.status(), e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(ST_ERR_OUT_OF_MEMORY, "host allocation failed");
    return ST_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(ST_ERR_INTERNAL, e.what());
    return ST_ERR_INTERNAL;
  } catch (...) {
    set_last_error(ST_ERR_INTERNAL, "unknown exception");
    return ST_ERR_INTERNAL;
  }
}

}  // namespace st

#define ST_CUDA_CHECK(expr)                                                  \
  do {                                                                       \
    cudaError_t st_err_ = (expr);                                            \
    if (st_err_ != cudaSuccess) ::st::throw_cuda(st_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define ST_CUBLAS_CHECK(expr)                                                \
  do {                                                                       \
    cublasStatus_t st_err_ = (expr);                                         \
    if (st_err_ != CUBLAS_STATUS_SUCCESS) ::st::throw_cublas(st_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define ST_CUDNN_CHECK(expr)                                                 \
  do {                                                                       \
    const int st_err_ = static_cast<int>(expr);                              \
    if (st_err_ != 0) ::st::throw_cudnn(st_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Argument checks: ST_REQUIRE(cond, "what", ...) -> ST_ERR_INVALID_ARGUMENT naming the argument.
#define ST_REQUIRE(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) throw ::st::Error(ST_ERR_INVALID_ARGUMENT, ::st::cat(__VA_ARGS__)); \
  } while (0)
