// rt_device.cpp — devices and the per-(device, stream) contexts: discovery, selection,
// workspaces, GEMM plan-cache counters, release and stream synchronisation.
#include <algorithm>

#include "rt_internal.hpp"

namespace strt {

void register_device(py::module_& m) {
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

  m.def("plan_cache_stats", [](uintptr_t stream) {
    uint64_t h = 0, mi = 0, sz = 0;
    uint64_t cap = 0, ev = 0;
    check(st_plan_cache_stats(reinterpret_cast<void*>(stream), &h, &mi, &sz));
    check(st_plan_cache_bounds(reinterpret_cast<void*>(stream), &cap, &ev, nullptr, nullptr));
    py::dict d;
    d["hits"] = h;
    d["misses"] = mi;
    d["size"] = sz;
    d["capacity"] = cap;
    d["evictions"] = ev;
    return d;
  }, py::arg("stream") = 0, "GEMM plan-cache counters of the (current device, stream) context: hits, misses, "
     "size, capacity (plans kept at most) and evictions (least recently used plans given up).");
  m.def("set_plan_cache_capacity", [](size_t gemm, size_t conv) { check(st_set_plan_cache_capacity(gemm, conv)); },
        py::arg("gemm") = 0, py::arg("conv") = 0,
        "Keep at most so many GEMM / convolution plans per context (0 keeps a kind's bound); every context.");
  m.def("plan_cache_clear", [](uintptr_t stream) { check(st_plan_cache_clear(reinterpret_cast<void*>(stream))); },
        py::arg("stream") = 0);

  // A text the runtime writes into a caller's buffer: asked its length first (stitchrt/tuning.h).
  auto text_of = [](st_status (*fn)(char*, size_t, size_t*)) {
    size_t len = 0;
    check(fn(nullptr, 0, &len));
    std::string text(len + 1, '\0');
    check(fn(text.data(), text.size(), &len));
    text.resize(std::min(len, text.size() - 1));
    return text;
  };
  m.def("tuning_export", [text_of] { return text_of(st_tuning_export); }, "The GEMM algorithms and convolution engines this process chose by timing (or imported), as text "
     "(stitchrt/tuning.h).");
  m.def("tuning_import", [](const std::string& text) {
    size_t taken = 0;
    check(st_tuning_import(text.c_str(), &taken));
    return taken;
  }, py::arg("text"), "Take choices exported by another process: plans of those keys skip timing. Returns how many.");
  m.def("tuning_clear", [] { check(st_tuning_clear()); }, "Forget every imported and recorded choice.");
  m.def("tuning_identity", [text_of] { return text_of(st_tuning_identity); }, "What the current device's choices are valid for: device, library versions, workspace (one line).");

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
}

}  // namespace strt
