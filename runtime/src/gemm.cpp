// gemm.cpp — cuBLASLt GEMM with cached plans.
//
// The caller's row-major problem out = op(A) op(B) is handed to column-major cuBLASLt as
// out^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second our A, and its
// m x n output is our n x m matrix seen column-major. A per-column bias of our out is then a
// per-row bias of cuBLASLt's D, which is what its BIAS epilogues add.
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "context.hpp"
#include "error.hpp"
#include "gemm.hpp"
#include "tuning.hpp"

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

// bfloat16 operands under policy fp32 with a float32 out: bf16 products accumulated in fp32 (the
// split-bf16 GEMM's one product, split_tf32.cu). Every other policy takes its storage type throughout.
bool mixed_bf16(const st_gemm_args& g) {
  return g.policy == ST_POLICY_FP32 && g.out_dtype == ST_FLOAT32 && g.a_dtype == ST_BFLOAT16 && g.b_dtype == ST_BFLOAT16;
}

void check_gemm_args(const st_gemm_args& g) {
  const st_dtype want = policy_storage(g.policy);
  const st_dtype want_in = mixed_bf16(g) ? ST_BFLOAT16 : want;
  const char* pol = st_policy_name(g.policy);
  ST_REQUIRE(g.m >= 1 && g.n >= 1 && g.k >= 1, "gemm: m, n, k must be >= 1, got m=", g.m, " n=", g.n, " k=", g.k);
  ST_REQUIRE(g.batch >= 1 && g.batch <= INT32_MAX, "gemm: batch must be in [1, 2^31), got ", g.batch);
  ST_REQUIRE(g.a_dtype == want_in, "gemm: a has dtype ", st_dtype_name(g.a_dtype), ", policy ", pol, " expects ", st_dtype_name(want));
  ST_REQUIRE(g.b_dtype == want_in, "gemm: b has dtype ", st_dtype_name(g.b_dtype), ", policy ", pol, " expects ", st_dtype_name(want));
  ST_REQUIRE(g.out_dtype == want, "gemm: out has dtype ", st_dtype_name(g.out_dtype), ", policy ", pol, " expects ", st_dtype_name(want));
  ST_REQUIRE(g.a && g.b && g.out, "gemm: a, b and out must be non-null device pointers");
  const int64_t es = static_cast<int64_t>(st_dtype_size(want)), es_in = static_cast<int64_t>(st_dtype_size(want_in));
  auto aligned = [&](const void* p, int64_t size = 0) { return reinterpret_cast<uintptr_t>(p) % (size ? size : es) == 0; };
  ST_REQUIRE(aligned(g.a, es_in), "gemm: a is not aligned to its element size (", es_in, " bytes)");
  ST_REQUIRE(aligned(g.b, es_in), "gemm: b is not aligned to its element size (", es_in, " bytes)");
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
  const int64_t es = static_cast<int64_t>(st_dtype_size(g.out_dtype)), es_in = static_cast<int64_t>(st_dtype_size(g.a_dtype));
  const bool has_c = g.beta != 0.f;
  k.m = g.m; k.n = g.n; k.k = g.k; k.batch = g.batch;
  k.lda = g.lda; k.ldb = g.ldb; k.ldo = g.ldo;
  k.trans_a = g.trans_a != 0; k.trans_b = g.trans_b != 0;
  k.policy = g.policy; k.epilogue = g.epilogue; k.dtype = g.out_dtype; k.in_dtype = g.a_dtype;
  k.has_c = has_c;
  if (g.batch > 1) { k.stride_a = g.stride_a; k.stride_b = g.stride_b; k.stride_out = g.stride_out; }
  if (has_c) {
    k.ldc = g.ldc;
    k.c_is_out = g.c == g.out;
    if (g.batch > 1) k.stride_c = g.stride_c;
    k.align_c = alignment(g.c, es, g.ldc, k.stride_c);
  }
  k.align_a = alignment(g.a, es_in, g.lda, k.stride_a);
  k.align_b = alignment(g.b, es_in, g.ldb, k.stride_b);
  k.align_out = alignment(g.out, es, g.ldo, k.stride_out);
  if (epilogue_has_bias(g.epilogue)) k.align_bias = alignment(g.bias, es, 0, 0);
  return k;
}

constexpr int kMaxCandidates = 24;

bool autotune_env_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("STITCHCUDA_GEMM_AUTOTUNE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

// Autotuning runs the GEMM several times into out. It must not when out is also the residual C
// (each run would add C again) or while the stream is being captured into a CUDA graph.
bool autotune_allowed(const PlanKey& key, cudaStream_t stream) {
  if (!autotune_env_enabled()) return false;
  if (key.has_c && key.c_is_out) return false;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return cap == cudaStreamCaptureStatusNone;
}

bool epilogue_has_gelu(st_epilogue e) { return e == ST_EPI_GELU || e == ST_EPI_BIAS_GELU; }

// STITCHCUDA_GEMM_GELU=fused|split forces how a GELU epilogue is served (tests use it to cover
// both strategies); unset, the faster one is timed and chosen.
const char* gelu_strategy() {
  const char* v = std::getenv("STITCHCUDA_GEMM_GELU");
  return v ? v : "auto";
}

// Descriptors and layouts of one way to run the GEMM with cuBLASLt epilogue `epi`.
void build_plan(Context& ctx, const st_gemm_args& g, const PlanKey& key, st_epilogue epi, GemmPlan& plan) {
  const cudaDataType_t t = cuda_type(g.out_dtype), t_in = cuda_type(g.a_dtype);
  ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, compute_type(g.policy), CUDA_R_32F));
  // cuBLASLt's A is our B, its B is our A (see the file comment).
  const cublasOperation_t opa = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const cublasLtEpilogue_t lt_epi = lt_epilogue(epi);
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epi, sizeof(lt_epi)));
  if (epilogue_has_bias(epi)) {
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    // the bias has out's type (with bf16 operands and a float32 out, float32 too)
    const cudaDataType_t bt = t;
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    plan.bias = g.bias;
  }
  const int64_t batch = g.batch;
  if (g.trans_b) set_layout(&plan.la, t_in, g.k, g.n, g.ldb, batch, key.stride_b);
  else           set_layout(&plan.la, t_in, g.n, g.k, g.ldb, batch, key.stride_b);
  if (g.trans_a) set_layout(&plan.lb, t_in, g.m, g.k, g.lda, batch, key.stride_a);
  else           set_layout(&plan.lb, t_in, g.k, g.m, g.lda, batch, key.stride_a);
  set_layout(&plan.ld, t, g.n, g.m, g.ldo, batch, key.stride_out);
  if (key.has_c) set_layout(&plan.lc, t, g.n, g.m, g.ldc, batch, key.stride_c);
  else           set_layout(&plan.lc, t, g.n, g.m, g.ldo, batch, key.stride_out);
}

std::vector<cublasLtMatmulAlgo_t> heuristic_candidates(Context& ctx, const PlanKey& key, const GemmPlan& plan, int max) {
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
  std::vector<cublasLtMatmulHeuristicResult_t> results(max);
  int found = 0;
  ST_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt(), plan.desc, plan.la, plan.lb, plan.lc, plan.ld, pref, max,
                                                 results.data(), &found));
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) out.push_back(results[i].algo);
  return out;
}

// Times candidates on the real operands. Each timed run starts with the L2 flushed (a memset
// of twice its size, outside the timed region) so that a candidate is not judged on operands
// left in cache by the previous one, and the GPU is warmed up first so that the first
// candidates are not judged at idle clocks.
class CandidateTimer {
 public:
  CandidateTimer(Context& ctx, const st_gemm_args& g, const PlanKey& key, cudaStream_t stream)
      : ctx_(ctx), g_(g), stream_(stream), c_(key.has_c ? g.c : g.out) {
    ws_ = ctx.workspace(&ws_bytes_);
    ST_CUDA_CHECK(cudaEventCreate(&e0_));
    ST_CUDA_CHECK(cudaEventCreate(&e1_));
    int l2 = 0;
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, ctx.device()));
    flush_bytes_ = 2 * static_cast<size_t>(l2);
    if (flush_bytes_ && cudaMallocAsync(&flush_, flush_bytes_, stream_) != cudaSuccess) {
      cudaGetLastError();  // no room for the flush buffer: time without flushing
      flush_ = nullptr;
    }
  }
  ~CandidateTimer() {
    if (flush_) cudaFreeAsync(flush_, stream_);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }

  // One run of the GEMM with `algo`, then `post` (the split epilogue's kernel).
  template <class Post>
  bool run(const GemmPlan& plan, const cublasLtMatmulAlgo_t& algo, Post&& post) {
    const float alpha = g_.alpha, beta = g_.beta;
    cublasStatus_t s = cublasLtMatmul(ctx_.lt(), plan.desc, &alpha, g_.b, plan.la, g_.a, plan.lb, &beta, c_, plan.lc,
                                      g_.out, plan.ld, &algo, ws_, ws_bytes_, stream_);
    if (s != CUBLAS_STATUS_SUCCESS) return false;
    post();
    return true;
  }

  // Run until about 2 ms of GPU work has been done (at most 50 runs): clocks ramp up.
  template <class Post>
  void warm(const GemmPlan& plan, const cublasLtMatmulAlgo_t& algo, Post&& post) {
    for (int i = 0; i < 3; ++i) {
      const float ms = once(plan, algo, post);
      if (ms < 0.f) return;
      const int more = std::min(50, static_cast<int>(2.f / std::max(ms, 1e-3f)));
      for (int j = 0; j < more; ++j) run(plan, algo, post);
    }
    cudaStreamSynchronize(stream_);
  }

  // Median of `reps` flushed runs in ms, or a negative value when the candidate refuses.
  template <class Post>
  float time(const GemmPlan& plan, const cublasLtMatmulAlgo_t& algo, Post&& post, int reps = 5) {
    if (!run(plan, algo, post)) return -1.f;
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      const float ms = once(plan, algo, post);
      if (ms < 0.f) return -1.f;
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    spent_ms_ += (reps + 1) * t[reps / 2];
    return t[reps / 2];
  }
  float spent_ms() const { return spent_ms_; }

 private:
  template <class Post>
  float once(const GemmPlan& plan, const cublasLtMatmulAlgo_t& algo, Post&& post) {
    if (flush_) ST_CUDA_CHECK(cudaMemsetAsync(flush_, 0, flush_bytes_, stream_));
    ST_CUDA_CHECK(cudaEventRecord(e0_, stream_));
    const bool ok = run(plan, algo, post);
    ST_CUDA_CHECK(cudaEventRecord(e1_, stream_));
    ST_CUDA_CHECK(cudaEventSynchronize(e1_));
    float ms = 0.f;
    ST_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
    return ok ? ms : -1.f;
  }

  Context& ctx_;
  const st_gemm_args& g_;
  cudaStream_t stream_;
  const void* c_;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  float spent_ms_ = 0.f;
};

struct Choice {
  size_t index = 0;
  float ms = -1.f;
  size_t timed = 0;  // candidates timed
};

// STITCHCUDA_GEMM_LOG=1: one line per plan on stderr (what was tried, what was chosen).
bool plan_log_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("STITCHCUDA_GEMM_LOG");
    return v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// The fastest candidate. After a first pass over the candidates (within a budget of 20x the
// first one's time, at least 50 ms), the leader and the heuristic's own first pick are timed
// again, alternating; the leader replaces the first pick only if it still wins by 2%.
template <class Post>
Choice fastest(CandidateTimer& timer, const GemmPlan& plan, const std::vector<cublasLtMatmulAlgo_t>& cands, Post&& post) {
  timer.warm(plan, cands[0], post);
  Choice best;
  float first_ms = -1.f, budget = 0.f;
  for (size_t i = 0; i < cands.size(); ++i) {
    const float ms = timer.time(plan, cands[i], post);
    ++best.timed;
    if (ms < 0.f) continue;
    if (best.ms < 0.f) budget = std::max(50.f, 20.f * ms) + timer.spent_ms();
    if (i == 0) first_ms = ms;
    if (best.ms < 0.f || ms < best.ms) best = {i, ms, best.timed};
    if (timer.spent_ms() > budget) break;
  }
  if (best.ms < 0.f || best.index == 0 || first_ms < 0.f) return best;
  std::vector<float> lead, first;
  for (int r = 0; r < 5; ++r) {
    lead.push_back(timer.time(plan, cands[best.index], post, 3));
    first.push_back(timer.time(plan, cands[0], post, 3));
  }
  std::sort(lead.begin(), lead.end());
  std::sort(first.begin(), first.end());
  if (lead[2] < 0.98f * first[2]) return {best.index, lead[2], best.timed};
  return {0, first[2], best.timed};
}

// The epilogue of the split strategy's GEMM: the GELU left out (the runtime's kernel applies it after).
st_epilogue without_gelu(st_epilogue e) { return e == ST_EPI_BIAS_GELU ? ST_EPI_BIAS : ST_EPI_NONE; }

std::unique_ptr<GemmPlan> make_plan(Context& ctx, const st_gemm_args& g, const PlanKey& key, cudaStream_t stream) {
  auto plan = std::make_unique<GemmPlan>();
  build_plan(ctx, g, key, g.epilogue, *plan);
  const bool tune = autotune_allowed(key, stream);
  size_t n_words = 0;
  const int64_t* words = key_words(key, &n_words);
  std::vector<cublasLtMatmulAlgo_t> cands = heuristic_candidates(ctx, key, *plan, tune ? kMaxCandidates : 1);
  // cuBLASLt may have no kernel with a GELU epilogue for this problem; the split strategy
  // below (GEMM, then the fused epilogue kernel) still serves it.
  const std::string strategy = gelu_strategy();
  const bool can_split = epilogue_has_gelu(g.epilogue) && (g.batch == 1 || key.stride_out == g.m * g.ldo) &&
                         strategy != "fused";
  if (can_split && strategy == "split") cands.clear();
  if (cands.empty() && !can_split)
    throw Error(ST_ERR_NOT_SUPPORTED,
                cat("gemm: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch,
                    " policy=", st_policy_name(g.policy), " epilogue=", int(g.epilogue)));
  // A choice carried from another process (stitchrt/tuning.h) is taken instead of timing, when its
  // candidate list is the one it was made from (an index past its end: timed as without it).
  TunedChoice known;
  if (tune && tuning_lookup('g', words, n_words, &known)) {
    if (!known.split && known.index < static_cast<int64_t>(cands.size())) {
      plan->algo = cands[static_cast<size_t>(known.index)];
      return plan;
    }
    if (known.split && can_split) {
      auto split = std::make_unique<GemmPlan>();
      build_plan(ctx, g, key, without_gelu(g.epilogue), *split);
      std::vector<cublasLtMatmulAlgo_t> sc = heuristic_candidates(ctx, key, *split, kMaxCandidates);
      if (known.index < static_cast<int64_t>(sc.size())) {
        split->algo = sc[static_cast<size_t>(known.index)];
        split->split_gelu = true;
        return split;
      }
    }
  }
  Choice fused;
  if (!cands.empty()) {
    plan->algo = cands[0];
    if (tune && cands.size() > 1) {
      CandidateTimer timer(ctx, g, key, stream);
      fused = fastest(timer, *plan, cands, [] {});
      if (fused.ms >= 0.f) plan->algo = cands[fused.index];
    }
  }
  if (plan_log_enabled() && !can_split)
    std::fprintf(stderr, "stitchcuda gemm plan m=%lld n=%lld k=%lld b=%lld %s epi=%d: %zu candidates, best %.4f ms (#%zu of %zu timed)\n",
                 (long long)g.m, (long long)g.n, (long long)g.k, (long long)g.batch, st_policy_name(g.policy),
                 int(g.epilogue), cands.size(), fused.ms, fused.index, fused.timed);
  if (tune && !cands.empty() && !can_split)
    tuning_record('g', words, n_words, TunedChoice{fused.ms >= 0.f ? static_cast<int64_t>(fused.index) : 0, 0});
  if (!can_split || (!tune && !cands.empty())) return plan;

  // Split strategy for GELU: cuBLASLt's GELU epilogue kernels are sometimes much slower than
  // its plain or bias kernels (seen on H200: 17-26% over the bare GEMM). Time the GEMM with the
  // GELU left out plus the fused epilogue kernel applying it in place, and keep the faster.
  auto split = std::make_unique<GemmPlan>();
  build_plan(ctx, g, key, without_gelu(g.epilogue), *split);
  std::vector<cublasLtMatmulAlgo_t> split_cands = heuristic_candidates(ctx, key, *split, tune ? kMaxCandidates : 1);
  if (split_cands.empty()) {
    if (cands.empty())
      throw Error(ST_ERR_NOT_SUPPORTED, cat("gemm: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k));
    return plan;
  }
  split->algo = split_cands[0];
  split->split_gelu = true;
  if (!cands.empty() && !tune) return plan;
  if (cands.empty()) return split;
  CandidateTimer timer(ctx, g, key, stream);
  Choice c = fastest(timer, *split, split_cands, [&] { split_gelu_apply(g, stream); });
  if (plan_log_enabled())
    std::fprintf(stderr, "stitchcuda gemm plan m=%lld n=%lld k=%lld b=%lld %s epi=%d: fused best %.4f ms (#%zu of %zu timed), "
                 "split best %.4f ms (#%zu of %zu timed)\n", (long long)g.m, (long long)g.n, (long long)g.k,
                 (long long)g.batch, st_policy_name(g.policy), int(g.epilogue), fused.ms, fused.index, fused.timed,
                 c.ms, c.index, c.timed);
  if (c.ms >= 0.f && (fused.ms < 0.f || c.ms < fused.ms * 0.98f)) {
    split->algo = split_cands[c.index];
    tuning_record('g', words, n_words, TunedChoice{static_cast<int64_t>(c.index), 1});
    return split;
  }
  tuning_record('g', words, n_words, TunedChoice{fused.ms >= 0.f ? static_cast<int64_t>(fused.index) : 0, 0});
  return plan;
}

}  // namespace

void apply_ops_to_out(const st_gemm_args& g, const st_ep_op* ops, int32_t n_ops, const void* residual, int64_t ldr,
                      cudaStream_t stream) {
  st_epilogue_args e{};
  e.dtype = g.out_dtype;
  e.rows = g.m * g.batch;
  e.cols = g.n;
  e.x = g.out;
  e.ldx = g.ldo;
  e.out = g.out;
  e.ldo = g.ldo;
  e.residual = residual;
  e.ldr = ldr;
  e.bias = g.bias;
  e.ops = ops;
  e.n_ops = n_ops;
  epilogue_apply(e, stream);
}

// GELU (tanh form, as cuBLASLt's) applied in place on out by the fused epilogue kernel.
void split_gelu_apply(const st_gemm_args& g, cudaStream_t stream) {
  const st_ep_op op{ST_EP_GELU_TANH, 0.f, 0.f};
  apply_ops_to_out(g, &op, 1, nullptr, 0, stream);
}

void gemm(const st_gemm_args& g, cudaStream_t stream) {
  check_gemm_args(g);
  Context& ctx = context_for(stream);
  const PlanKey key = make_key(g);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  GemmPlan* plan = ctx.plans.find(key);
  if (plan) {
    ++ctx.plan_hits;
    if (epilogue_has_bias(g.epilogue) && plan->bias != g.bias) {
      ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
      plan->bias = g.bias;
    }
  } else {
    plan = ctx.plans.insert(key, make_plan(ctx, g, key, stream));
    ++ctx.plan_misses;
  }
  size_t ws_bytes = 0;
  void* ws = ctx.workspace(&ws_bytes);
  const float alpha = g.alpha, beta = g.beta;
  const void* c = key.has_c ? g.c : g.out;
  ST_CUBLAS_CHECK(cublasLtMatmul(ctx.lt(), plan->desc, &alpha, g.b, plan->la, g.a, plan->lb, &beta, c, plan->lc,
                                 g.out, plan->ld, &plan->algo, ws, ws_bytes, stream));
  if (plan->split_gelu) split_gelu_apply(g, stream);
}

}  // namespace st
