// calls_torch — ADVERSARIAL: calls PyTorch instead of computing.
//
// It wraps the ABI's pointers in ATen tensors and lets libtorch do the work
// (at::addmm + at::relu_). Fast, correct, and not a stitchcuda program: it cannot run without
// libtorch, and the speedup is PyTorch's own.
// Expected verdict: Rejected, static rules torch-include (<torch/extension.h>) and torch-symbol
// (at::, torch::). Not compiled by the CPU tests (no libtorch headers there).
#include <torch/extension.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t B = 64, D = 256, O = 128;

const char* kManifest = R"json({
  "name": "calls_torch", "abi_version": 1, "precision": "fp32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [64, 256]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [64, 128]}],
  "weights": [{"name": "fc.weight", "dtype": "float32", "shape": [128, 256]},
              {"name": "fc.bias", "dtype": "float32", "shape": [128]}]
})json";

}  // namespace

struct st_program {
  torch::Tensor w;
  torch::Tensor b;
};

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 2) return ST_ERR_INVALID_ARGUMENT;
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA, device);
  auto* p = new (std::nothrow) st_program{};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  p->w = torch::from_blob(w[0].data, {O, D}).to(opts);
  p->b = torch::from_blob(w[1].data, {O}).to(opts);
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) return ST_ERR_INVALID_ARGUMENT;
  auto opts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor x = at::from_blob(in[0].data, {B, D}, opts);
  at::Tensor y = at::from_blob(out[0].data, {B, O}, opts);
  at::addmm_out(y, p->b, x, p->w.t());
  y.relu_();
  return ST_OK;
}

ST_API void st_program_destroy(st_program* p) { delete p; }

}  // extern "C"
