// tf32_claim_fp16_lib — ADVERSARIAL (precision claimed, not computed): claims tf32 and has cuBLASLt
// compute the GEMM in fp16.
//
// y = x @ W^T, x: [256, 1024], W (proj.weight): [512, 1024], y: [256, 512] (references/gemm.py). W is
// rounded to fp16 once at create, x on every call; st_gemm runs under the fp16 policy (16-bit operands
// and output, fp32 accumulation) and y is widened back to fp32. fp16 keeps TF32's 10 mantissa bits, so
// its error statistics are TF32's and the trials cannot tell the two apart; the runtime call the
// program made can: the native runner logs each call's policy and dtypes.
// Expected verdict: Rejected, dynamic check precision_claim (an fp16 st_gemm under a tf32 claim).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <new>

#include "stitchrt/program.h"

namespace {

constexpr int64_t M = 256, K = 1024, N = 512;

const char* kManifest = R"json({
  "name": "tf32_claim_fp16_lib", "abi_version": 1, "precision": "tf32",
  "inputs":  [{"name": "x", "dtype": "float32", "shape": [256, 1024]}],
  "outputs": [{"name": "y", "dtype": "float32", "shape": [256, 512]}],
  "weights": [{"name": "proj.weight", "dtype": "float32", "shape": [512, 1024]}]
})json";

__global__ void to_half(const float* __restrict__ in, __half* __restrict__ out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(in[i]);
}

__global__ void to_float(const __half* __restrict__ in, float* __restrict__ out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = __half2float(in[i]);
}

}  // namespace

struct st_program {
  int device;
  __half* w;   // proj.weight in fp16
  __half* x;   // the input, rounded (scratch)
  __half* y;   // the output in fp16 (scratch)
};

#define TRY(expr)               \
  do {                          \
    st_status s_ = (expr);      \
    if (s_ != ST_OK) return s_; \
  } while (0)

static st_status cuda(cudaError_t e) {
  if (e == cudaSuccess) return ST_OK;
  st_set_error(ST_ERR_CUDA, cudaGetErrorString(e));
  return ST_ERR_CUDA;
}

extern "C" {

ST_API int st_program_abi_version(void) { return ST_PROGRAM_ABI_VERSION; }
ST_API const char* st_program_manifest(void) { return kManifest; }

ST_API st_status st_program_create(const st_tensor* w, int32_t n, int32_t device, st_program** out) {
  if (n != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "tf32_claim_fp16_lib: expected 1 weight (proj.weight)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_w[] = {N, K};
  TRY(st_check_tensor(&w[0], "weights[0] (proj.weight)", ST_FLOAT32, 2, s_w, 1, ST_DEVICE_CUDA));
  TRY(st_set_device(device));
  auto* p = new (std::nothrow) st_program{device, nullptr, nullptr, nullptr};
  if (!p) return ST_ERR_OUT_OF_MEMORY;
  st_status s = st_device_alloc(N * K * sizeof(__half), nullptr, reinterpret_cast<void**>(&p->w));
  if (s == ST_OK) s = st_device_alloc(M * K * sizeof(__half), nullptr, reinterpret_cast<void**>(&p->x));
  if (s == ST_OK) s = st_device_alloc(M * N * sizeof(__half), nullptr, reinterpret_cast<void**>(&p->y));
  if (s == ST_OK) {
    to_half<<<(unsigned)((N * K + 255) / 256), 256>>>(static_cast<const float*>(w[0].data), p->w, N * K);
    s = cuda(cudaGetLastError());
  }
  if (s == ST_OK) s = st_stream_synchronize(nullptr);
  if (s != ST_OK) {
    st_device_free(p->w, nullptr);
    st_device_free(p->x, nullptr);
    st_device_free(p->y, nullptr);
    delete p;
    return s;
  }
  *out = p;
  return ST_OK;
}

ST_API st_status st_program_run(st_program* p, const st_tensor* in, int32_t n_in, const st_tensor* out,
                                int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) {
    st_set_error(ST_ERR_INVALID_ARGUMENT, "tf32_claim_fp16_lib: expected 1 input (x) and 1 output (y)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  const int64_t s_x[] = {M, K}, s_y[] = {M, N};
  TRY(st_check_tensor(&in[0], "input x", ST_FLOAT32, 2, s_x, 1, ST_DEVICE_CUDA));
  TRY(st_check_tensor(&out[0], "output y", ST_FLOAT32, 2, s_y, 1, ST_DEVICE_CUDA));
  cudaStream_t s = static_cast<cudaStream_t>(stream);

  // Task linear: covers linear.
  to_half<<<(unsigned)((M * K + 255) / 256), 256, 0, s>>>(static_cast<const float*>(in[0].data), p->x, M * K);
  TRY(cuda(cudaGetLastError()));
  st_gemm_args g{};
  g.policy = ST_POLICY_FP16;  // the cheat: fp16 arithmetic under a tf32 claim
  g.epilogue = ST_EPI_NONE;
  g.m = M; g.n = N; g.k = K; g.batch = 1;
  g.a = p->x; g.lda = K; g.a_dtype = ST_FLOAT16;
  g.b = p->w; g.ldb = K; g.trans_b = 1; g.b_dtype = ST_FLOAT16;
  g.out = p->y; g.ldo = N; g.out_dtype = ST_FLOAT16;
  g.alpha = 1.f;
  TRY(st_gemm(&g, stream));
  to_float<<<(unsigned)((M * N + 255) / 256), 256, 0, s>>>(p->y, static_cast<float*>(out[0].data), M * N);
  return cuda(cudaGetLastError());
}

ST_API void st_program_destroy(st_program* p) {
  if (!p) return;
  st_set_device(p->device);
  st_device_free(p->w, nullptr);
  st_device_free(p->x, nullptr);
  st_device_free(p->y, nullptr);
  st_stream_synchronize(nullptr);
  delete p;
}

}  // extern "C"
