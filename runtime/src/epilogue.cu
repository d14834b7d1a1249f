// epilogue.cu — the runtime's entry to the fused epilogue template, with a chain chosen at
// run time (stitch::RuntimeChain), and GEMM + epilogue.
#include "context.hpp"
#include "error.hpp"
#include "gemm.hpp"
#include "stitch/epilogue.cuh"

namespace st {

namespace {

template <class T>
void run_chain(const st_epilogue_args& e, cudaStream_t stream) {
  stitch::EpilogueParams<T> p;
  p.x = static_cast<const T*>(e.x);
  p.ldx = e.ldx;
  p.out = static_cast<T*>(e.out);
  p.ldo = e.ldo;
  p.residual = static_cast<const T*>(e.residual);
  p.ldr = e.ldr;
  p.bias = static_cast<const T*>(e.bias);
  p.rows = e.rows;
  p.cols = e.cols;
  stitch::RuntimeChain chain{};
  chain.n = e.n_ops;
  for (int i = 0; i < e.n_ops; ++i) chain.ops[i] = e.ops[i];
  ST_CUDA_CHECK(stitch::launch_epilogue(p, chain, stream));
}

bool needs_residual(const st_ep_op* ops, int n) {
  for (int i = 0; i < n; ++i)
    if (ops[i].kind == ST_EP_RESIDUAL_ADD) return true;
  return false;
}
bool needs_bias(const st_ep_op* ops, int n) {
  for (int i = 0; i < n; ++i)
    if (ops[i].kind == ST_EP_BIAS_ADD) return true;
  return false;
}

}  // namespace

void epilogue_apply(const st_epilogue_args& e, cudaStream_t stream) {
  ST_REQUIRE(e.rows >= 0 && e.cols >= 0, "epilogue: rows and cols must be >= 0");
  ST_REQUIRE(e.n_ops >= 0 && e.n_ops <= ST_MAX_EPILOGUE_OPS, "epilogue: n_ops must be in [0, ",
             ST_MAX_EPILOGUE_OPS, "], got ", e.n_ops);
  ST_REQUIRE(e.n_ops == 0 || e.ops, "epilogue: ops is null");
  for (int i = 0; i < e.n_ops; ++i)
    ST_REQUIRE(e.ops[i].kind >= ST_EP_SCALE && e.ops[i].kind <= ST_EP_SQUARE, "epilogue: op ", i,
               " has unknown kind ", int(e.ops[i].kind));
  ST_REQUIRE(e.x && e.out, "epilogue: x and out must be non-null");
  ST_REQUIRE(e.ldx >= e.cols && e.ldo >= e.cols, "epilogue: ldx/ldo smaller than cols");
  if (needs_residual(e.ops, e.n_ops)) {
    ST_REQUIRE(e.residual, "epilogue: a residual_add op needs a residual tensor");
    ST_REQUIRE(e.ldr >= e.cols, "epilogue: ldr smaller than cols");
  }
  if (needs_bias(e.ops, e.n_ops)) ST_REQUIRE(e.bias, "epilogue: a bias_add op needs a bias tensor");
  st_epilogue_args a = e;
  if (!needs_residual(e.ops, e.n_ops)) a.residual = nullptr;
  if (!needs_bias(e.ops, e.n_ops)) a.bias = nullptr;
  const size_t es = st_dtype_size(e.dtype);
  auto aligned = [&](const void* p) { return !p || reinterpret_cast<uintptr_t>(p) % es == 0; };
  ST_REQUIRE(aligned(a.x) && aligned(a.out) && aligned(a.residual) && aligned(a.bias),
             "epilogue: a pointer is not aligned to its element size (", es, " bytes)");
  switch (e.dtype) {
    case ST_FLOAT32: run_chain<float>(a, stream); break;
    case ST_FLOAT16: run_chain<__half>(a, stream); break;
    case ST_BFLOAT16: run_chain<__nv_bfloat16>(a, stream); break;
    default:
      throw Error(ST_ERR_INVALID_ARGUMENT,
                  cat("epilogue: dtype ", st_dtype_name(e.dtype), " is not a storage type (float32, float16, bfloat16)"));
  }
}

}  // namespace st
