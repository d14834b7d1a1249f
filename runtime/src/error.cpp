#include "error.hpp"

#include <cudnn_graph.h>
#include <dlfcn.h>

namespace st {

namespace {
thread_local std::string g_last_error;

const char* base_name(const char* file) {
  const char* slash = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/' || *p == '\\') slash = p + 1;
  return slash;
}
}  // namespace

void set_last_error(st_status status, const std::string& msg) {
  g_last_error = std::string(st_status_name(status)) + ": " + msg;
}

const char* last_error() { return g_last_error.c_str(); }

const char* cublas_status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

// cudart says "driver version is insufficient" also when there is no driver at all; which of
// the two it is decides the fix (install one, or update it), so the message says which.
bool driver_loadable() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

void throw_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear a sticky non-fatal error so the next call starts clean
  st_status status = ST_ERR_CUDA;
  if (err == cudaErrorMemoryAllocation) status = ST_ERR_OUT_OF_MEMORY;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) status = ST_ERR_NO_DEVICE;
  if (err == cudaErrorInsufficientDriver && !driver_loadable())
    throw Error(status, cat("no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded) in ", expr, " at ",
                            base_name(file), ":", line));
  throw Error(status, cat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", expr,
                          " at ", base_name(file), ":", line));
}

void throw_cublas(cublasStatus_t err, const char* expr, const char* file, int line) {
  st_status status = err == CUBLAS_STATUS_NOT_SUPPORTED ? ST_ERR_NOT_SUPPORTED
                     : err == CUBLAS_STATUS_ALLOC_FAILED ? ST_ERR_OUT_OF_MEMORY
                                                         : ST_ERR_CUBLAS;
  throw Error(status, cat(cublas_status_string(err), " in ", expr, " at ", base_name(file), ":", line));
}

void throw_cudnn(int err, const char* expr, const char* file, int line) {
  const auto status = static_cast<cudnnStatus_t>(err);
  const int category = err / 1000 * 1000;
  const st_status st = category == CUDNN_STATUS_NOT_SUPPORTED ? ST_ERR_NOT_SUPPORTED
                       : (err == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                          err == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) ? ST_ERR_OUT_OF_MEMORY
                                                                                        : ST_ERR_CUDNN;
  // cuDNN's own account of the failure (which attribute, which check), when it kept one.
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw Error(st, cat(cudnnGetErrorString(status), " in ", expr, " at ", base_name(file), ":", line,
                      detail[0] ? cat(" (", detail, ")") : std::string()));
}

}  // namespace st
