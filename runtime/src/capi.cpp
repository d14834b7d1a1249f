// capi.cpp — the extern "C" surface of stitchrt.h: each entry turns exceptions into a status.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <cstdio>
#include <cstring>
#include <new>

#include "context.hpp"
#include "conv.hpp"
#include "error.hpp"
#include "gemm.hpp"
#include "memory.hpp"
#include "stitchrt/program.h"
#include "stitchrt/stitchrt.h"
#include "stitchrt/tuning.h"
#include "tuning.hpp"

namespace {
using st::guarded;


cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

void require_device() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    cudaGetLastError();
    throw st::Error(ST_ERR_NO_DEVICE, err == cudaErrorInsufficientDriver && !st::driver_loadable()
                                          ? std::string("no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)")
                                      : err != cudaSuccess
                                          ? st::cat("no usable CUDA device: ", cudaGetErrorString(err))
                                          : std::string("no CUDA device found"));
  }
}

}  // namespace

extern "C" {

int st_version(void) {
  return STITCHRT_VERSION_MAJOR * 10000 + STITCHRT_VERSION_MINOR * 100 + STITCHRT_VERSION_PATCH;
}

const char* st_last_error(void) { return st::last_error(); }

void st_set_error(st_status status, const char* message) {
  st::set_last_error(status, message ? message : "");
}

const char* st_status_name(st_status s) {
  switch (s) {
    case ST_OK: return "ok";
    case ST_ERR_INVALID_ARGUMENT: return "invalid argument";
    case ST_ERR_CUDA: return "CUDA error";
    case ST_ERR_CUBLAS: return "cuBLAS error";
    case ST_ERR_NO_DEVICE: return "no CUDA device";
    case ST_ERR_OUT_OF_MEMORY: return "out of memory";
    case ST_ERR_NOT_SUPPORTED: return "not supported";
    case ST_ERR_INTERNAL: return "internal error";
    case ST_ERR_CUDNN: return "cuDNN error";
  }
  return "unknown status";
}

const char* st_dtype_name(st_dtype t) {
  switch (t) {
    case ST_FLOAT32: return "float32";
    case ST_FLOAT16: return "float16";
    case ST_BFLOAT16: return "bfloat16";
    case ST_FLOAT64: return "float64";
    case ST_INT32: return "int32";
    case ST_INT64: return "int64";
    case ST_UINT8: return "uint8";
    case ST_BOOL: return "bool";
    case ST_INT8: return "int8";
  }
  return "unknown dtype";
}

size_t st_dtype_size(st_dtype t) {
  switch (t) {
    case ST_FLOAT32: case ST_INT32: return 4;
    case ST_FLOAT16: case ST_BFLOAT16: return 2;
    case ST_FLOAT64: case ST_INT64: return 8;
    case ST_UINT8: case ST_BOOL: case ST_INT8: return 1;
  }
  return 0;
}

const char* st_policy_name(st_policy p) {
  switch (p) {
    case ST_POLICY_FP32: return "fp32";
    case ST_POLICY_TF32: return "tf32";
    case ST_POLICY_BF16: return "bf16";
    case ST_POLICY_FP16: return "fp16";
  }
  return "unknown policy";
}

st_status st_device_count(int* count) {
  return guarded([&] {
    ST_REQUIRE(count, "st_device_count: count is null");
    *count = 0;
    require_device();
    ST_CUDA_CHECK(cudaGetDeviceCount(count));
  });
}

st_status st_device_info(int device, int* cc_major, int* cc_minor, int* sm_count, size_t* l2_bytes,
                         size_t* global_mem_bytes) {
  return guarded([&] {
    require_device();
    cudaDeviceProp prop{};
    ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (cc_major) *cc_major = prop.major;
    if (cc_minor) *cc_minor = prop.minor;
    if (sm_count) *sm_count = prop.multiProcessorCount;
    if (l2_bytes) *l2_bytes = static_cast<size_t>(prop.l2CacheSize);
    if (global_mem_bytes) *global_mem_bytes = prop.totalGlobalMem;
  });
}

st_status st_workspace_info(void* stream, void** ptr, size_t* bytes) {
  return guarded([&] {
    size_t b = 0;
    void* p = st::context_for(as_stream(stream)).workspace(&b);
    if (ptr) *ptr = p;
    if (bytes) *bytes = b;
  });
}

st_status st_set_default_workspace_bytes(size_t bytes) {
  return guarded([&] { st::set_default_workspace_bytes(bytes); });
}

st_status st_arena_reserve(void* stream, size_t bytes, void** base) {
  return guarded([&] {
    ST_REQUIRE(base, "st_arena_reserve: base is null");
    st::Context& ctx = st::context_for(as_stream(stream));
    std::lock_guard<std::mutex> lock(ctx.mutex());
    *base = ctx.arena(bytes);
  });
}

st_status st_plan_cache_stats(void* stream, uint64_t* hits, uint64_t* misses, uint64_t* size) {
  return guarded([&] {
    st::Context& ctx = st::context_for(as_stream(stream));
    std::lock_guard<std::mutex> lock(ctx.mutex());
    if (hits) *hits = ctx.plan_hits;
    if (misses) *misses = ctx.plan_misses;
    if (size) *size = ctx.plans.size();
  });
}

st_status st_set_plan_cache_capacity(size_t gemm_plans, size_t conv_plans) {
  return guarded([&] { st::set_plan_capacity(gemm_plans, conv_plans); });
}

st_status st_plan_cache_bounds(void* stream, uint64_t* gemm_capacity, uint64_t* gemm_evictions,
                               uint64_t* conv_capacity, uint64_t* conv_evictions) {
  return guarded([&] {
    st::Context& ctx = st::context_for(as_stream(stream));
    std::lock_guard<std::mutex> lock(ctx.mutex());
    if (gemm_capacity) *gemm_capacity = ctx.plans.capacity();
    if (gemm_evictions) *gemm_evictions = ctx.plans.evictions();
    if (conv_capacity) *conv_capacity = ctx.conv_plans.capacity();
    if (conv_evictions) *conv_evictions = ctx.conv_plans.evictions();
  });
}

namespace {
// A text handed to a caller's buffer (stitchrt/tuning.h): its length always, its bytes when they fit.
void give_text(const std::string& text, char* buf, size_t cap, size_t* len) {
  *len = text.size();
  if (buf && cap > text.size()) std::memcpy(buf, text.c_str(), text.size() + 1);
}
}  // namespace

st_status st_tuning_export(char* buf, size_t cap, size_t* len) {
  return guarded([&] {
    ST_REQUIRE(len, "st_tuning_export: len is null");
    give_text(st::tuning_export(), buf, cap, len);
  });
}

st_status st_tuning_import(const char* text, size_t* taken) {
  return guarded([&] {
    ST_REQUIRE(text, "st_tuning_import: text is null");
    const size_t n = st::tuning_import(text);
    if (taken) *taken = n;
  });
}

st_status st_tuning_clear(void) {
  return guarded([&] { st::tuning_clear(); });
}

st_status st_tuning_identity(char* buf, size_t cap, size_t* len) {
  return guarded([&] {
    ST_REQUIRE(len, "st_tuning_identity: len is null");
    int dev = 0;
    ST_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p{};
    ST_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    const size_t ws = st::default_workspace_bytes(p.major);
    const std::string text = st::cat("sm_", p.major, p.minor, " ", p.multiProcessorCount, " SMs ",
                                     p.totalGlobalMem >> 20, " MiB, cuBLASLt ", cublasLtGetVersion(), ", cuDNN ",
                                     cudnnGetVersion(), ", workspace ", ws);
    give_text(text, buf, cap, len);
  });
}

st_status st_plan_cache_clear(void* stream) {
  return guarded([&] {
    st::Context& ctx = st::context_for(as_stream(stream));
    std::lock_guard<std::mutex> lock(ctx.mutex());
    ctx.plans.clear();
    ctx.plan_hits = ctx.plan_misses = 0;
  });
}

st_status st_host_alloc(size_t bytes, void** ptr, int* pinned) {
  return guarded([&] {
    ST_REQUIRE(ptr, "st_host_alloc: ptr is null");
    bool p = false;
    *ptr = st::host_alloc(bytes, &p);
    if (pinned) *pinned = p ? 1 : 0;
  });
}

st_status st_host_free(void* ptr) {
  return guarded([&] { st::host_free(ptr); });
}

st_status st_host_pool_stats(size_t* cached_bytes, size_t* live_bytes, int* pinning_enabled) {
  return guarded([&] {
    size_t c = 0, l = 0;
    int e = 0;
    st::host_pool_stats(&c, &l, &e);
    if (cached_bytes) *cached_bytes = c;
    if (live_bytes) *live_bytes = l;
    if (pinning_enabled) *pinning_enabled = e;
  });
}

st_status st_copy_h2d(void* dst_device, const void* src_host, size_t bytes, void* stream) {
  return guarded([&] { st::copy_h2d(dst_device, src_host, bytes, as_stream(stream)); });
}

st_status st_copy_d2h(void* dst_host, const void* src_device, size_t bytes, void* stream) {
  return guarded([&] { st::copy_d2h(dst_host, src_device, bytes, as_stream(stream)); });
}

st_status st_stream_synchronize(void* stream) {
  return guarded([&] { ST_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream))); });
}

st_status st_release(void) {
  return guarded([&] { st::release_all_contexts(); });
}

st_status st_gemm(const st_gemm_args* args, void* stream) {
  return guarded([&] {
    ST_REQUIRE(args, "st_gemm: args is null");
    st::gemm(*args, as_stream(stream));
  });
}

st_status st_gemm_split_tf32(const st_gemm_args* args, void* stream) {
  return guarded([&] {
    ST_REQUIRE(args, "st_gemm_split_tf32: args is null");
    st::gemm_split_tf32(*args, as_stream(stream));
  });
}

st_status st_gemm_split_bf16(const st_gemm_args* args, void* stream) {
  return guarded([&] {
    ST_REQUIRE(args, "st_gemm_split_bf16: args is null");
    st::gemm_split_bf16(*args, as_stream(stream));
  });
}

st_status st_epilogue_apply(const st_epilogue_args* args, void* stream) {
  return guarded([&] {
    ST_REQUIRE(args, "st_epilogue_apply: args is null");
    st::epilogue_apply(*args, as_stream(stream));
  });
}

st_status st_gemm_epilogue(const st_gemm_args* args, const st_ep_op* ops, int32_t n_ops,
                           const void* residual, int64_t ldr, void* stream) {
  return guarded([&] {
    ST_REQUIRE(args, "st_gemm_epilogue: args is null");
    ST_REQUIRE(n_ops >= 0 && n_ops <= ST_MAX_EPILOGUE_OPS, "st_gemm_epilogue: n_ops out of range");
    st_gemm_args g = *args;
    // Let cuBLASLt absorb a leading bias (+ relu / gelu-tanh) into its own epilogue.
    int first = 0;
    if (g.epilogue == ST_EPI_NONE && n_ops > 0 && ops[0].kind == ST_EP_BIAS_ADD && g.bias) {
      first = 1;
      g.epilogue = ST_EPI_BIAS;
      if (n_ops > 1 && ops[1].kind == ST_EP_RELU) { g.epilogue = ST_EPI_BIAS_RELU; first = 2; }
      else if (n_ops > 1 && ops[1].kind == ST_EP_GELU_TANH) { g.epilogue = ST_EPI_BIAS_GELU; first = 2; }
    }
    st::check_gemm_args(g);
    const int rest = n_ops - first;
    if (rest > 0) {
      ST_REQUIRE(g.batch == 1 || g.stride_out == g.m * g.ldo,
                 "st_gemm_epilogue: a batched out must be contiguous across the batch (stride_out == m*ldo)");
    }
    st::gemm(g, as_stream(stream));
    if (rest == 0) return;
    // g is a copy of *args: g.bias is the caller's bias for a bias_add op cuBLASLt did not absorb.
    st::apply_ops_to_out(g, ops + first, rest, residual, ldr, as_stream(stream));
  });
}

st_status st_conv(const st_conv_args* args, void* stream) {
  return guarded([&] {
    ST_REQUIRE(args, "st_conv: args is null");
    st::conv(*args, as_stream(stream));
  });
}

st_status st_conv_split_tf32(const st_conv_args* args, void* stream) {
  return guarded([&] {
    ST_REQUIRE(args, "st_conv_split_tf32: args is null");
    st::conv_split_tf32(*args, as_stream(stream));
  });
}

st_status st_conv_output_size(const st_conv_args* args, int64_t* out_size) {
  return guarded([&] {
    ST_REQUIRE(args, "st_conv_output_size: args is null");
    ST_REQUIRE(out_size, "st_conv_output_size: out_size is null");
    st::conv_output_size(*args, out_size);
  });
}

st_status st_conv_plan_cache_stats(void* stream, uint64_t* hits, uint64_t* misses, uint64_t* size) {
  return guarded([&] {
    st::Context& ctx = st::context_for(as_stream(stream));
    std::lock_guard<std::mutex> lock(ctx.mutex());
    if (hits) *hits = ctx.conv_hits;
    if (misses) *misses = ctx.conv_misses;
    if (size) *size = ctx.conv_plans.size();
  });
}

st_status st_conv_plan_cache_clear(void* stream) {
  return guarded([&] { st::conv_plan_cache_clear(as_stream(stream)); });
}

st_status st_check_tensor(const st_tensor* t, const char* what, st_dtype dtype, int32_t ndim,
                          const int64_t* shape, int require_contiguous, st_device_type device) {
  return guarded([&] {
    const char* name = what ? what : "tensor";
    ST_REQUIRE(t, name, ": descriptor is null");
    auto spec = [&] {
      std::string s = st::cat(st_dtype_name(dtype), "[");
      for (int i = 0; i < ndim; ++i) s += st::cat(i ? ", " : "", shape[i]);
      return s + "]";
    };
    auto got = [&] {
      std::string s = st::cat(st_dtype_name(t->dtype), "[");
      for (int i = 0; i < t->ndim && i < ST_MAX_DIMS; ++i) s += st::cat(i ? ", " : "", t->shape[i]);
      return s + "]";
    };
    ST_REQUIRE(t->dtype == dtype && t->ndim == ndim, name, ": expected ", spec(), ", got ", got());
    for (int i = 0; i < ndim; ++i)
      ST_REQUIRE(t->shape[i] == shape[i], name, ": expected ", spec(), ", got ", got());
    ST_REQUIRE(t->data || [&] { for (int i = 0; i < ndim; ++i) if (shape[i] == 0) return true; return false; }(),
               name, ": data pointer is null");
    ST_REQUIRE(t->device_type == device, name, ": expected a ",
               device == ST_DEVICE_CUDA ? "CUDA" : "host", " tensor");
    if (require_contiguous) {
      int64_t expect = 1;
      for (int i = ndim - 1; i >= 0; --i) {
        ST_REQUIRE(shape[i] == 1 || t->strides[i] == expect, name, ": must be contiguous (row-major), dim ", i,
                   " has stride ", t->strides[i], ", expected ", expect);
        expect *= shape[i];
      }
    }
    const size_t es = st_dtype_size(dtype);
    ST_REQUIRE(reinterpret_cast<uintptr_t>(t->data) % es == 0, name, ": data is not aligned to ", es, " bytes");
  });
}

}  // extern "C"
