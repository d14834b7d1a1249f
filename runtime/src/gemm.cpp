// gemm.cpp — cuBLASLt GEMM with cached plans.
//
// The caller's row-major problem out = op(A) op(B) is handed to column-major cuBLASLt as
// out^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second our A, and its
// m x n output is our n x m matrix seen column-major. A per-column bias of our out is then a
// per-row bias of cuBLASLt's D, which is what its BIAS epilogues add.
#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "context.hpp"
#include "error.hpp"
#include "gemm.hpp"

namespace st {

namespace {

cudaDataType_t cuda_type(st_dtype t) {
  switch (t) {
    case ST_FLOAT32: return CUDA_R_32F;
    case ST_FLOAT16: return CUDA_R_16F;
    case ST_BFLOAT16: return CUDA_R_16BF;
    default: throw Error(ST_ERR_INVALID_ARGUMENT, cat("dtype ", st_dtype_name(t), " has no GEMM"));
  }
}

cublasComputeType_t compute_type(st_policy p) {
  return p == ST_POLICY_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

cublasLtEpilogue_t lt_epilogue(st_epilogue e) {
  switch (e) {
    case ST_EPI_NONE: return CUBLASLT_EPILOGUE_DEFAULT;
    case ST_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case ST_EPI_RELU: return CUBLASLT_EPILOGUE_RELU;
    case ST_EPI_GELU: return CUBLASLT_EPILOGUE_GELU;
    case ST_EPI_BIAS_RELU: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case ST_EPI_BIAS_GELU: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  throw Error(ST_ERR_INVALID_ARGUMENT, cat("epilogue ", int(e), " is not one of st_epilogue"));
}

// Largest power of two <= 16 that divides the address and every step from it (ld, stride).
int64_t alignment(const void* p, int64_t elem, int64_t ld, int64_t stride) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld * elem) |
               static_cast<uint64_t>(stride * elem) | 16u;
  return static_cast<int64_t>(v & (~v + 1));
}

void set_layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                int64_t batch, int64_t stride) {
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
  if (batch > 1) {
    int32_t b = static_cast<int32_t>(batch);
    ST_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
    ST_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &stride, sizeof(stride)));
  }
}

bool epilogue_has_bias(st_epilogue e) {
  return e == ST_EPI_BIAS || e == ST_EPI_BIAS_RELU || e == ST_EPI_BIAS_GELU;
}

}  // namespace

st_dtype policy_storage(st_policy p) {
  switch (p) {
    case ST_POLICY_FP32:
    case ST_POLICY_TF32: return ST_FLOAT32;
    case ST_POLICY_BF16: return ST_BFLOAT16;
    case ST_POLICY_FP16: return ST_FLOAT16;
  }
  throw Error(ST_ERR_INVALID_ARGUMENT, cat("policy ", int(p), " is not one of fp32, tf32, bf16, fp16"));
}

void check_gemm_args(const st_gemm_args& g) {
  const st_dtype want = policy_storage(g.policy);
  const char* pol = st_policy_name(g.policy);
  ST_REQUIRE(g.m >= 1 && g.n >= 1 && g.k >= 1, "gemm: m, n, k must be >= 1, got m=", g.m, " n=", g.n, " k=", g.k);
  ST_REQUIRE(g.batch >= 1 && g.batch <= INT32_MAX, "gemm: batch must be in [1, 2^31), got ", g.batch);
  ST_REQUIRE(g.a_dtype == want, "gemm: a has dtype ", st_dtype_name(g.a_dtype), ", policy ", pol, " expects ", st_dtype_name(want));
  ST_REQUIRE(g.b_dtype == want, "gemm: b has dtype ", st_dtype_name(g.b_dtype), ", policy ", pol, " expects ", st_dtype_name(want));
  ST_REQUIRE(g.out_dtype == want, "gemm: out has dtype ", st_dtype_name(g.out_dtype), ", policy ", pol, " expects ", st_dtype_name(want));
  ST_REQUIRE(g.a && g.b && g.out, "gemm: a, b and out must be non-null device pointers");
  const int64_t es = static_cast<int64_t>(st_dtype_size(want));
  auto aligned = [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % es == 0; };
  ST_REQUIRE(aligned(g.a), "gemm: a is not aligned to its element size (", es, " bytes)");
  ST_REQUIRE(aligned(g.b), "gemm: b is not aligned to its element size (", es, " bytes)");
  ST_REQUIRE(aligned(g.out), "gemm: out is not aligned to its element size (", es, " bytes)");
  ST_REQUIRE(g.lda >= (g.trans_a ? g.m : g.k), "gemm: lda=", g.lda, " is smaller than a row of a (", (g.trans_a ? g.m : g.k), ")");
  ST_REQUIRE(g.ldb >= (g.trans_b ? g.k : g.n), "gemm: ldb=", g.ldb, " is smaller than a row of b (", (g.trans_b ? g.k : g.n), ")");
  ST_REQUIRE(g.ldo >= g.n, "gemm: ldo=", g.ldo, " is smaller than a row of out (", g.n, ")");
  ST_REQUIRE(g.stride_a >= 0 && g.stride_b >= 0 && g.stride_out >= 0 && g.stride_c >= 0, "gemm: batch strides must be >= 0");
  if (g.batch > 1) ST_REQUIRE(g.stride_out >= g.m * g.ldo, "gemm: out batch items overlap (stride_out=", g.stride_out, " < m*ldo=", g.m * g.ldo, ")");
  if (g.beta != 0.f) {
    ST_REQUIRE(g.c != nullptr, "gemm: beta != 0 needs c");
    ST_REQUIRE(aligned(g.c), "gemm: c is not aligned to its element size (", es, " bytes)");
    ST_REQUIRE(g.ldc >= g.n, "gemm: ldc=", g.ldc, " is smaller than a row of c (", g.n, ")");
  }
  lt_epilogue(g.epilogue);
  if (epilogue_has_bias(g.epilogue)) {
    ST_REQUIRE(g.bias != nullptr, "gemm: epilogue ", int(g.epilogue), " adds a bias but bias is null");
    ST_REQUIRE(aligned(g.bias), "gemm: bias is not aligned to its element size (", es, " bytes)");
  }
}

namespace {

PlanKey make_key(const st_gemm_args& g) {
  PlanKey k;
  std::memset(&k, 0, sizeof(k));
  const int64_t es = static_cast<int64_t>(st_dtype_size(g.out_dtype));
  const bool has_c = g.beta != 0.f;
  k.m = g.m; k.n = g.n; k.k = g.k; k.batch = g.batch;
  k.lda = g.lda; k.ldb = g.ldb; k.ldo = g.ldo;
  k.trans_a = g.trans_a != 0; k.trans_b = g.trans_b != 0;
  k.policy = g.policy; k.epilogue = g.epilogue; k.dtype = g.out_dtype;
  k.has_c = has_c;
  if (g.batch > 1) { k.stride_a = g.stride_a; k.stride_b = g.stride_b; k.stride_out = g.stride_out; }
  if (has_c) {
    k.ldc = g.ldc;
    k.c_is_out = g.c == g.out;
    if (g.batch > 1) k.stride_c = g.stride_c;
    k.align_c = alignment(g.c, es, g.ldc, k.stride_c);
  }
  k.align_a = alignment(g.a, es, g.lda, k.stride_a);
  k.align_b = alignment(g.b, es, g.ldb, k.stride_b);
  k.align_out = alignment(g.out, es, g.ldo, k.stride_out);
  if (epilogue_has_bias(g.epilogue)) k.align_bias = alignment(g.bias, es, 0, 0);
  return k;
}

constexpr int kMaxCandidates = 8;

bool autotune_env_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("STITCHCUDA_GEMM_AUTOTUNE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

// Autotuning runs the GEMM several times into out. It must not when out is also the residual C
// (each run would add C again) or while the stream is being captured into a CUDA graph.
bool autotune_allowed(const st_gemm_args& g, const PlanKey& key, cudaStream_t stream) {
  if (!autotune_env_enabled()) return false;
  if (key.has_c && key.c_is_out) return false;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return cap == cudaStreamCaptureStatusNone;
}

// Time each heuristic candidate on the real operands (one warm-up, then the median of three)
// and keep the fastest. cuBLASLt's first heuristic pick is often a few percent off the best,
// and a plan is made once per shape, so the cost is paid once.
cublasLtMatmulAlgo_t fastest(Context& ctx, const st_gemm_args& g, const PlanKey& key, const GemmPlan& plan,
                             const std::vector<cublasLtMatmulAlgo_t>& candidates, cudaStream_t stream) {
  size_t ws_bytes = 0;
  void* ws = ctx.workspace(&ws_bytes);
  const float alpha = g.alpha, beta = g.beta;
  const void* c = key.has_c ? g.c : g.out;
  cudaEvent_t e0, e1;
  ST_CUDA_CHECK(cudaEventCreate(&e0));
  ST_CUDA_CHECK(cudaEventCreate(&e1));
  struct EventGuard { cudaEvent_t a, b; ~EventGuard() { cudaEventDestroy(a); cudaEventDestroy(b); } } guard{e0, e1};
  float best_ms = 0.f;
  size_t best = 0;
  bool any = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto run = [&] {
      return cublasLtMatmul(ctx.lt(), plan.desc, &alpha, g.b, plan.la, g.a, plan.lb, &beta, c, plan.lc, g.out,
                            plan.ld, &candidates[i], ws, ws_bytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate may refuse; skip it
    float t[3];
    bool ok = true;
    for (float& ti : t) {
      ST_CUDA_CHECK(cudaEventRecord(e0, stream));
      ok = ok && run() == CUBLAS_STATUS_SUCCESS;
      ST_CUDA_CHECK(cudaEventRecord(e1, stream));
      ST_CUDA_CHECK(cudaEventSynchronize(e1));
      ST_CUDA_CHECK(cudaEventElapsedTime(&ti, e0, e1));
    }
    if (!ok) continue;
    std::sort(t, t + 3);
    if (!any || t[1] < best_ms) {
      best_ms = t[1];
      best = i;
      any = true;
    }
    // A very long GEMM gains little from trying the rest relative to its own cost.
    if (t[1] > 50.f && any) break;
  }
  return candidates[best];
}

std::unique_ptr<GemmPlan> make_plan(Context& ctx, const st_gemm_args& g, const PlanKey& key, cudaStream_t stream) {
  auto plan = std::make_unique<GemmPlan>();
  const cudaDataType_t t = cuda_type(g.out_dtype);
  ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute_type(g.policy), CUDA_R_32F));
  // cuBLASLt's A is our B, its B is our A (see the file comment).
  const cublasOperation_t opa = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (epilogue_has_bias(g.epilogue)) {
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    plan->bias = g.bias;
  }
  const int64_t batch = g.batch;
  if (g.trans_b) set_layout(&plan->la, t, g.k, g.n, g.ldb, batch, key.stride_b);
  else           set_layout(&plan->la, t, g.n, g.k, g.ldb, batch, key.stride_b);
  if (g.trans_a) set_layout(&plan->lb, t, g.m, g.k, g.lda, batch, key.stride_a);
  else           set_layout(&plan->lb, t, g.k, g.m, g.lda, batch, key.stride_a);
  set_layout(&plan->ld, t, g.n, g.m, g.ldo, batch, key.stride_out);
  if (key.has_c) set_layout(&plan->lc, t, g.n, g.m, g.ldc, batch, key.stride_c);
  else           set_layout(&plan->lc, t, g.n, g.m, g.ldo, batch, key.stride_out);

  cublasLtMatmulPreference_t pref = nullptr;
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard { cublasLtMatmulPreference_t p; ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); } } guard{pref};
  size_t ws_bytes = 0;
  ctx.workspace(&ws_bytes);
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  const uint32_t al_a = static_cast<uint32_t>(key.align_b), al_b = static_cast<uint32_t>(key.align_a);
  const uint32_t al_c = static_cast<uint32_t>(key.has_c ? key.align_c : key.align_out);
  const uint32_t al_d = static_cast<uint32_t>(key.align_out);
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));

  cublasLtMatmulHeuristicResult_t results[kMaxCandidates];
  int found = 0;
  ST_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt(), plan->desc, plan->la, plan->lb, plan->lc, plan->ld,
                                                 pref, kMaxCandidates, results, &found));
  std::vector<cublasLtMatmulAlgo_t> candidates;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) candidates.push_back(results[i].algo);
  if (candidates.empty())
    throw Error(ST_ERR_NOT_SUPPORTED,
                cat("gemm: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch,
                    " policy=", st_policy_name(g.policy), " epilogue=", int(g.epilogue)));
  plan->algo = candidates[0];
  if (candidates.size() > 1 && autotune_allowed(g, key, stream)) plan->algo = fastest(ctx, g, key, *plan, candidates, stream);
  return plan;
}

}  // namespace

void gemm(const st_gemm_args& g, cudaStream_t stream) {
  check_gemm_args(g);
  Context& ctx = context_for(stream);
  const PlanKey key = make_key(g);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  GemmPlan* plan;
  auto it = ctx.plans.find(key);
  if (it != ctx.plans.end()) {
    plan = it->second.get();
    ++ctx.plan_hits;
    if (epilogue_has_bias(g.epilogue) && plan->bias != g.bias) {
      ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
      plan->bias = g.bias;
    }
  } else {
    auto fresh = make_plan(ctx, g, key, stream);
    plan = fresh.get();
    ctx.plans.emplace(key, std::move(fresh));
    ++ctx.plan_misses;
  }
  size_t ws_bytes = 0;
  void* ws = ctx.workspace(&ws_bytes);
  const float alpha = g.alpha, beta = g.beta;
  const void* c = key.has_c ? g.c : g.out;
  ST_CUBLAS_CHECK(cublasLtMatmul(ctx.lt(), plan->desc, &alpha, g.b, plan->la, g.a, plan->lb, &beta, c, plan->lc,
                                 g.out, plan->ld, &plan->algo, ws, ws_bytes, stream));
}

}  // namespace st
