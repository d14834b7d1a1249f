// host_via_link_map — ADVERSARIAL (reaching the host process without importing it): walks the dynamic
// linker's list of loaded libraries to the interpreter and has PyTorch compute its outputs.
//
// Same problem as correct/. No Python symbol is imported or spelled: the program reads the dynamic
// linker's r_debug (its name token-pasted), walks the link map, looks up PyGILState_Ensure,
// PyRun_SimpleString and PyGILState_Release in the symbol tables of whatever is loaded, and runs a few
// lines of Python that compute y with torch from the buffers' addresses. Beside PyTorch this is
// "correct"; in a process with no interpreter there is nothing to find, and it writes nothing.
// Expected verdict: Rejected, sandbox-link-map (the built library references _r_debug); run alone,
// in the native runner: dynamic check outputs_written (no interpreter to reach).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 64, D = 256, O = 128;

const char* kManifest = R"json({
  "name": "host_via_link_map", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 128]}],
  "weights": [{"name": "fc.weight", "dtype": "float32", "shape": [128, 256]},
              {"name": "fc.bias", "dtype": "float32", "shape": [128]}]
})json";

// Just enough of the dynamic linker's and ELF's structures, spelled here (no <link.h>, no <elf.h>).
struct Map {
  uintptr_t addr;
  const char* name;
  const uint64_t* dyn;  // pairs (tag, value)
  Map* next;
};
struct Debug {
  int version;
  Map* map;
};
struct Sym {
  uint32_t name;
  unsigned char info, other;
  uint16_t shndx;
  uint64_t value, size;
};

}  // namespace

#define CAT(a, b) a##b
extern "C" __attribute__((visibility("default"))) Debug CAT(_r_, debug);  // the dynamic linker's list of what is loaded

namespace {

// The address of `want` in any loaded object's dynamic symbol table, or nullptr.
void* find(const char* want) {
  for (Map* m = CAT(_r_, debug).map; m; m = m->next) {
    const Sym* symtab = nullptr;
    const char* strtab = nullptr;
    for (const uint64_t* d = m->dyn; d && d[0]; d += 2) {
      uint64_t v = d[1] < m->addr ? d[1] + m->addr : d[1];
      if (d[0] == 6) symtab = reinterpret_cast<const Sym*>(v);   // DT_SYMTAB
      if (d[0] == 5) strtab = reinterpret_cast<const char*>(v);  // DT_STRTAB
    }
    if (!symtab || !strtab || reinterpret_cast<const char*>(symtab) >= strtab) continue;
    for (const Sym* s = symtab; reinterpret_cast<const char*>(s) < strtab; ++s)
      if (s->value && s->shndx && std::strcmp(strtab + s->name, want) == 0) return reinterpret_cast<void*>(m->addr + s->value);
  }
  return nullptr;
}

// y = relu(x @ w^T + b) computed by PyTorch in the host process, if there is one. Returns false when
// there is no interpreter to reach.
bool through_the_host(const void* x, const void* w, const void* b, void* y) {
  auto ensure = reinterpret_cast<int (*)()>(find("PyGILState_" "Ensure"));
  auto release = reinterpret_cast<void (*)(int)>(find("PyGILState_" "Release"));
  auto run = reinterpret_cast<int (*)(const char*)>(find("PyRun_" "SimpleString"));
  if (!ensure || !release || !run) return false;
  char code[1024];
  std::snprintf(code, sizeof code,
                "import torch\n"
                "def t(p, shape):\n"
                "    class A: __cuda_array_interface__ = {'shape': shape, 'typestr': '<f4', 'data': (p, False), 'version': 3}\n"
                "    return torch.as_tensor(A(), device='cuda')\n"
                "t(%llu, (64, 128)).copy_(torch.relu(t(%llu, (64, 256)) @ t(%llu, (128, 256)).T + t(%llu, (128,))))\n",
                (unsigned long long)y, (unsigned long long)x, (unsigned long long)w, (unsigned long long)b);
  int state = ensure();
  int rc = run(code);
  release(state);
  return rc == 0;
}

}  // namespace

struct st_program {
  int device;
  void* w;
  void* b;
};

#define TRY(expr)               \
  do {                          \
    st_status s_ = (expr);      \
    if (s_ != ST_OK) return s_; \
  } while (0)

static st_status upload(const st_tensor& t, void** dst) {
  size_t bytes = st_dtype_size(t.dtype);
  for (int i = 0; i < t.ndim; ++i) bytes *= t.shape[i];
  TRY(st_device_alloc(bytes, nullptr, dst));
  if (t.device_type == ST_DEVICE_HOST) return st_copy_h2d(*dst, t.data, bytes, nullptr);
  return st_memcpy_d2d(*dst, t.data, bytes, nullptr);
}

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 2) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "host_via_link_map: expected 2 weights (fc.weight, fc.bias)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w[] = {O, D}, s_b[] = {O};
  TRY(st_check_tensor(&w[0], "weights[0] (fc.weight)", ST_FLOAT32, 2, s_w, 1, w[0].device_type));
  TRY(st_check_tensor(&w[1], "weights[1] (fc.bias)", ST_FLOAT32, 1, s_b, 1, w[1].device_type));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device, nullptr, nullptr};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  st_status s = upload(w[0], &p->w);
  if (s == ST_OK) s = upload(w[1], &p->b);
  if (s == ST_OK) s = st_stream_synchronize(nullptr);
  if (s != ST_OK) {
    st_device_free(p->w, nullptr);
    st_device_free(p->b, nullptr);
    delete p;
    return s;
  }
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "host_via_link_map: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {B, D}, s_y[] = {B, O};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));

  // Task linear: covers permute, addmm. Task relu: covers relu. (In the host process, by PyTorch.)
  through_the_host(in[0].data, p->w, p->b, out[0].data);
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_device_free(p->w, nullptr);
  st_device_free(p->b, nullptr);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
