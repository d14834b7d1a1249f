// rt_module.cpp — stitchcuda._rt: the runtime's C ABI for Python, tensors in and out through
// DLPack. Argument checks that need names (shapes, dtypes, layouts, devices) live in the binding,
// once; the runtime below re-checks what it needs and reports its own failures as typed errors.
// One file per concern (rt_errors, rt_device, rt_gemm, rt_conv, rt_dlpack, rt_host, rt_programs); this one
// only registers them, in the order their types are needed.
#include "rt_internal.hpp"

PYBIND11_MODULE(_rt, m) {
  m.doc() = "stitchcuda native runtime: GEMM plans, fused epilogues, cuDNN convolutions, pinned transfers, program ABI (DLPack in and out)";
  strt::register_errors(m);
  strt::register_device(m);
  strt::register_gemm(m);
  strt::register_conv(m);
  strt::register_dlpack(m);
  strt::register_host(m);
  strt::register_programs(m);
}
