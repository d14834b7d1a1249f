/* stitchrt.h — the C ABI of the stitchcuda runtime (libstitchrt).
 *
 * Generated programs and the Python binding call the runtime only through this header.
 * It knows nothing of Python or PyTorch. Every entry point returns an st_status; on failure
 * st_last_error() gives a message naming the call site, valid until the next failing call on
 * the same thread. Nothing here aborts the process.
 *
 * Conventions
 *   - Matrices are row-major as a framework sees them: element (i, j) of a matrix with
 *     leading dimension ld lives at ptr[i * ld + j].
 *   - Streams are passed as void* (a cudaStream_t); NULL is the legacy default stream.
 *   - Every resource the runtime keeps (cuBLASLt handle, workspace, plan cache, arena) belongs
 *     to a context per (device, stream), created on first use.
 */
#ifndef STITCHRT_H
#define STITCHRT_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define ST_API __declspec(dllexport)
#else
#define ST_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define STITCHRT_VERSION_MAJOR 0
#define STITCHRT_VERSION_MINOR 1
#define STITCHRT_VERSION_PATCH 0

typedef enum st_status {
  ST_OK = 0,
  ST_ERR_INVALID_ARGUMENT = 1, /* bad shape, dtype, layout, alignment, pointer */
  ST_ERR_CUDA = 2,             /* a CUDA runtime call failed */
  ST_ERR_CUBLAS = 3,           /* a cuBLAS / cuBLASLt call failed */
  ST_ERR_NO_DEVICE = 4,        /* no usable CUDA device */
  ST_ERR_OUT_OF_MEMORY = 5,
  ST_ERR_NOT_SUPPORTED = 6,    /* valid request the runtime cannot serve (e.g. no cuBLASLt algorithm) */
  ST_ERR_INTERNAL = 7,
  ST_ERR_CUDNN = 8             /* a cuDNN call failed */
} st_status;

typedef enum st_dtype {
  ST_FLOAT32 = 0,
  ST_FLOAT16 = 1,
  ST_BFLOAT16 = 2,
  ST_FLOAT64 = 3,
  ST_INT32 = 4,
  ST_INT64 = 5,
  ST_UINT8 = 6,
  ST_BOOL = 7,
  ST_INT8 = 8
} st_dtype;

/* Precision policies. fp32: exact fp32 math (no TF32). tf32: fp32 storage, TF32 tensor cores.
 * bf16 / fp16: 16-bit storage, fp32 accumulation and epilogue math. */
typedef enum st_policy {
  ST_POLICY_FP32 = 0,
  ST_POLICY_TF32 = 1,
  ST_POLICY_BF16 = 2,
  ST_POLICY_FP16 = 3
} st_policy;

/* cuBLASLt's own epilogues. GELU is cuBLASLt's tanh approximation, not the erf form. */
typedef enum st_epilogue {
  ST_EPI_NONE = 0,
  ST_EPI_BIAS = 1,
  ST_EPI_RELU = 2,
  ST_EPI_GELU = 3,
  ST_EPI_BIAS_RELU = 4,
  ST_EPI_BIAS_GELU = 5
} st_epilogue;

ST_API int st_version(void);                 /* major*10000 + minor*100 + patch */
ST_API const char* st_last_error(void);      /* message of the last failure on this thread */
ST_API const char* st_status_name(st_status s);
ST_API const char* st_dtype_name(st_dtype t);
ST_API size_t st_dtype_size(st_dtype t);
ST_API const char* st_policy_name(st_policy p);

/* Device discovery: ST_ERR_NO_DEVICE when there is no driver or no GPU. */
ST_API st_status st_device_count(int* count);
ST_API st_status st_device_info(int device, int* cc_major, int* cc_minor, int* sm_count,
                                size_t* l2_bytes, size_t* global_mem_bytes);

ST_API st_status st_get_device(int* device);
ST_API st_status st_set_device(int device);
/* Which device a pointer's memory lives on; *is_device = 0 for host memory. */
ST_API st_status st_pointer_info(const void* ptr, int* is_device, int* device);

/* Stream-ordered device memory (cudaMallocAsync on the current device). */
ST_API st_status st_device_alloc(size_t bytes, void* stream, void** ptr);
ST_API st_status st_device_free(void* ptr, void* stream);
ST_API st_status st_memcpy_d2d(void* dst, const void* src, size_t bytes, void* stream);
ST_API st_status st_memset(void* dst, int value, size_t bytes, void* stream);

/* ---------------------------------------------------------------- contexts and memory */

/* Size of the persistent cuBLASLt workspace of the context for (current device, stream).
 * Default: 32 MiB on sm_90 and newer, 4 MiB before; STITCHCUDA_WORKSPACE_BYTES overrides. */
ST_API st_status st_workspace_info(void* stream, void** ptr, size_t* bytes);
ST_API st_status st_set_default_workspace_bytes(size_t bytes);

/* Arena: one growing device block per (device, stream) for a program's intermediates. A
 * program asks for the total its liveness plan needs; the block persists until st_release. */
ST_API st_status st_arena_reserve(void* stream, size_t bytes, void** base);

/* GEMM plan-cache counters of the context for (current device, stream). */
ST_API st_status st_plan_cache_stats(void* stream, uint64_t* hits, uint64_t* misses, uint64_t* size);
ST_API st_status st_plan_cache_clear(void* stream);

/* Plan caches are bounded: each context keeps at most so many GEMM and convolution plans, the
 * least recently used given up first (a program with dynamic dimensions meets new shapes at every
 * new size). Defaults 2048 and 256; STITCHCUDA_PLAN_CACHE sets both; 0 here keeps a kind's. Applies
 * to every context, now and later. */
ST_API st_status st_set_plan_cache_capacity(size_t gemm_plans, size_t conv_plans);
/* The bounds of the context for (current device, stream) and the plans given up under them. */
ST_API st_status st_plan_cache_bounds(void* stream, uint64_t* gemm_capacity, uint64_t* gemm_evictions,
                                      uint64_t* conv_capacity, uint64_t* conv_evictions);

/* Pinned host pool. Blocks are page-locked when possible; when pinning fails (or
 * STITCHCUDA_NO_PINNED=1) the pool hands out pageable memory and logs one warning.
 * *pinned says which one the caller got. */
ST_API st_status st_host_alloc(size_t bytes, void** ptr, int* pinned);
ST_API st_status st_host_free(void* ptr);
ST_API st_status st_host_pool_stats(size_t* cached_bytes, size_t* live_bytes, int* pinning_enabled);

/* Asynchronous copies on a stream. From pinned pool memory the copy is a direct DMA; from any
 * other host memory the runtime stages through pinned pool blocks in chunks. */
ST_API st_status st_copy_h2d(void* dst_device, const void* src_host, size_t bytes, void* stream);
ST_API st_status st_copy_d2h(void* dst_host, const void* src_device, size_t bytes, void* stream);
ST_API st_status st_stream_synchronize(void* stream);

/* Release every context, plan, workspace and arena of this process (all devices). */
ST_API st_status st_release(void);

/* ---------------------------------------------------------------- GEMM */

/* out[b] = alpha * op(A[b]) @ op(B[b]) (+ bias) (activation) + beta * C[b],  b < batch.
 *
 *  op(A) is m x k: A is stored m x k (trans_a = 0) or k x m (trans_a = 1), row-major with
 *  leading dimension lda; likewise op(B) is k x n. out and C are m x n with ldo / ldc.
 *  stride_* is the element distance between batch items (0 broadcasts one matrix).
 *  bias has n elements (one per output column), the dtype of out.
 *  beta * C is cuBLASLt's residual add; C may alias out. beta == 0 ignores C.
 *  Dtypes by policy: fp32/tf32 -> A, B, C, out float32; bf16 -> bfloat16; fp16 -> float16.
 *  All math and accumulation are fp32. Alpha and beta are host floats.
 *  Plans: the first call of a shape builds a plan (descriptors, layouts, algorithm) and times
 *  cuBLASLt's top heuristic candidates on the real operands to pick the fastest (not when C
 *  aliases out, not while the stream is captured; STITCHCUDA_GEMM_AUTOTUNE=0 turns it off).
 *  Later calls of the same key reuse the plan with no descriptor or heuristic work. */
typedef struct st_gemm_args {
  st_policy policy;
  st_epilogue epilogue;
  int64_t m, n, k, batch;
  const void* a; int64_t lda; int64_t stride_a; int32_t trans_a; st_dtype a_dtype;
  const void* b; int64_t ldb; int64_t stride_b; int32_t trans_b; st_dtype b_dtype;
  const void* c; int64_t ldc; int64_t stride_c;
  void* out;     int64_t ldo; int64_t stride_out; st_dtype out_dtype;
  const void* bias;
  float alpha, beta;
} st_gemm_args;

ST_API st_status st_gemm(const st_gemm_args* args, void* stream);

/* The same product at fp32-grade accuracy on TF32 tensor cores (split TF32, "3xTF32"): each
 * operand split into a TF32 big part and a TF32 remainder, and out = A_s B_b + A_b B_s + A_b B_b as
 * three TF32 GEMMs accumulated in fp32 (beta * C on the first, the epilogue on the last). args is
 * an fp32 GEMM (policy ST_POLICY_FP32, float32 operands); the split operands take
 * 3 x (|A| + |B|) floats of stream-ordered scratch per call.
 *
 * Also, bfloat16 operands with a float32 out under ST_POLICY_FP32 in st_gemm: bf16 products
 * accumulated in fp32. */
ST_API st_status st_gemm_split_tf32(const st_gemm_args* args, void* stream);

/* The same with bfloat16 parts ("3xBF16"): x = big + small + O(2^-18 |x|) in bf16, the three
 * products bf16 GEMMs (tensor cores at twice TF32's rate) accumulated in fp32: about 2^-16
 * relative error a product, well below TF32's. The split operands take 3 x (|A| + |B|) bf16 values
 * of scratch. */
ST_API st_status st_gemm_split_bf16(const st_gemm_args* args, void* stream);

/* ---------------------------------------------------------------- fused epilogue ops */

/* The operations of the mixed-precision epilogue kernel (templates/stitch/epilogue.cuh), for
 * what cuBLASLt lacks. A chain of up to ST_MAX_EPILOGUE_OPS is applied in order to each element
 * in fp32, reading the policy's storage type and writing it back. */
typedef enum st_ep_kind {
  ST_EP_SCALE = 0,        /* x * a */
  ST_EP_ADD_SCALAR = 1,   /* x + a */
  ST_EP_LEAKY_RELU = 2,   /* x >= 0 ? x : a * x */
  ST_EP_SILU = 3,         /* x * sigmoid(x) */
  ST_EP_SIGMOID = 4,
  ST_EP_TANH = 5,
  ST_EP_MISH = 6,         /* x * tanh(softplus(x)) */
  ST_EP_HARDTANH = 7,     /* clamp(x, a, b) with PyTorch's hardtanh defaults a = -1, b = 1 */
  ST_EP_CLAMP = 8,        /* clamp(x, a, b) */
  ST_EP_GELU_TANH = 9,    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  ST_EP_GELU_ERF = 10,    /* 0.5 x (1 + erf(x / sqrt(2))) */
  ST_EP_RELU = 11,
  ST_EP_RESIDUAL_ADD = 12,/* x + a * residual[i, j] */
  ST_EP_BIAS_ADD = 13,    /* x + bias[j] (one value per column) */
  ST_EP_MUL_SCALAR = ST_EP_SCALE,
  ST_EP_DIV_SCALAR = 14,  /* x / a */
  ST_EP_HARDSWISH = 15,   /* x * relu6(x + 3) / 6 */
  ST_EP_SOFTPLUS = 16,    /* log(1 + exp(x)) with PyTorch's threshold 20 */
  ST_EP_ELU = 17,         /* x > 0 ? x : a * (exp(x) - 1) */
  ST_EP_ABS = 18,
  ST_EP_EXP = 19,
  ST_EP_SQUARE = 20
} st_ep_kind;

#define ST_MAX_EPILOGUE_OPS 8

typedef struct st_ep_op {
  st_ep_kind kind;
  float a, b;
} st_ep_op;

/* out[i, j] = ops(x[i, j]) for an rows x cols matrix (row-major, leading dims ldx / ldo;
 * out may alias x). residual (ldr) and bias are used by RESIDUAL_ADD / BIAS_ADD and have the
 * storage dtype. Vectorised (16-byte accesses) when pointers, leading dims and cols allow. */
typedef struct st_epilogue_args {
  st_dtype dtype;
  int64_t rows, cols;
  const void* x; int64_t ldx;
  void* out; int64_t ldo;
  const void* residual; int64_t ldr;
  const void* bias;
  const st_ep_op* ops; int32_t n_ops;
} st_epilogue_args;

ST_API st_status st_epilogue_apply(const st_epilogue_args* args, void* stream);

/* GEMM followed by a fused epilogue chain: cuBLASLt absorbs what it can (bias, relu, gelu-tanh
 * at the head of the chain), the epilogue kernel applies the rest in place on out. */
ST_API st_status st_gemm_epilogue(const st_gemm_args* args, const st_ep_op* ops, int32_t n_ops,
                                  const void* residual, int64_t ldr, void* stream);

/* ---------------------------------------------------------------- convolutions (cuDNN) */

/* Activations a convolution can end with (after the optional bias). */
typedef enum st_activation {
  ST_ACT_NONE = 0,
  ST_ACT_RELU = 1,
  ST_ACT_GELU_ERF = 2,   /* 0.5 x (1 + erf(x / sqrt(2))): F.gelu's default */
  ST_ACT_GELU_TANH = 3,  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  ST_ACT_SILU = 4,       /* x * sigmoid(x) */
  ST_ACT_SIGMOID = 5,
  ST_ACT_TANH = 6,
  ST_ACT_RELU6 = 7       /* min(max(x, 0), 6): nn.ReLU6, hardtanh(x, 0, 6) */
} st_activation;

#define ST_CONV_MAX_SPATIAL 3

/* y = activation(conv(x, w) + bias), PyTorch's conv{1,2,3}d / conv_transpose{1,2,3}d.
 *
 *  spatial_dims d in {1, 2, 3}; only the first d entries of the per-dimension arrays are read.
 *  x is [batch, in_channels, in_size...]. w is [out_channels, in_channels / groups, kernel...]
 *  for a convolution and [in_channels, out_channels / groups, kernel...] for a transposed one
 *  (PyTorch's weight layouts). y is [batch, out_channels, out_size...] with
 *    convolution:  out = (in + 2 padding - dilation (kernel - 1) - 1) / stride + 1  (floor)
 *    transposed:   out = (in - 1) stride - 2 padding + dilation (kernel - 1) + output_padding + 1
 *  (st_conv_output_size computes it). groups divides both channel counts; groups = in_channels
 *  is a depthwise convolution. output_padding < stride, and 0 for a convolution.
 *  Layout: x, w and y are dense, all channels-first (channels_last = 0: N C [D] H W, weights
 *  K C/g [kD] kH kW) or all channels-last (channels_last = 1: N [D] H W C, weights
 *  K [kD] kH kW C/g); cuDNN's engines serve one layout per call, so convert before the call.
 *  bias (NULL for none) has out_channels elements. Dtypes by policy as for GEMM: fp32 / tf32 ->
 *  float32, bf16 -> bfloat16, fp16 -> float16 for x, w, bias and y; accumulation is fp32, and
 *  the fp32 policy uses no TF32 (no tensor-core engine); no fp32 or tf32 call runs an engine
 *  that down-converts its inputs to 16 bits (fp32's range would be lost). y must not
 *  overlap x or w.
 *  Plans: the first call of a key (every field but the pointers, plus the pointers' alignment)
 *  builds cuDNN operation graphs (the convolution with bias and activation fused where an
 *  engine takes them; the convolution alone, followed by the runtime's bias/activation kernel,
 *  otherwise), and times the candidate engines on the real operands to keep the fastest (not
 *  while the stream is captured; STITCHCUDA_CONV_AUTOTUNE=0 takes the heuristics' first pick).
 *  Later calls reuse the plan with no descriptor work (the variant pack of a set of addresses
 *  is kept too). The plan's workspace is the context's persistent workspace, grown when a plan
 *  needs more (up to STITCHCUDA_CONV_WORKSPACE_LIMIT bytes, default 256 MiB or the bytes of x and y
 *  where more: channels-first engines convert the input inside the call). */
typedef struct st_conv_args {
  st_policy policy;
  int32_t spatial_dims;
  int32_t transposed;
  int32_t channels_last;
  int64_t batch, in_channels, out_channels, groups;
  int64_t in_size[ST_CONV_MAX_SPATIAL];
  int64_t kernel_size[ST_CONV_MAX_SPATIAL];
  int64_t stride[ST_CONV_MAX_SPATIAL];
  int64_t padding[ST_CONV_MAX_SPATIAL];
  int64_t dilation[ST_CONV_MAX_SPATIAL];
  int64_t output_padding[ST_CONV_MAX_SPATIAL];
  const void* x; st_dtype x_dtype;
  const void* w; st_dtype w_dtype;
  const void* bias; st_dtype bias_dtype;
  void* y; st_dtype y_dtype;
  st_activation activation;
} st_conv_args;

ST_API st_status st_conv(const st_conv_args* args, void* stream);

/* The same convolution near fp32's accuracy on TF32 tensor cores (split TF32): x and w split into
 * a TF32 big part and a TF32 remainder, and y = x_b w_b + x_b w_s + x_s w_b (+ bias, activation) as
 * ONE TF32 convolution over three times the input channels ([x_b, x_b, x_s] against [w_b, w_s, w_b]
 * within each group), on engines without FFT / Winograd transforms. args is an fp32 convolution
 * (policy ST_POLICY_FP32, float32 operands); the split operands take 3 x (|x| + |w|) floats of
 * stream-ordered scratch per call. Its error on an H200: 7-13x fp32's, 10-40x below TF32's. The first
 * call of a shape times it against the fp32 convolution and, for a channels-last 1x1 one (stride 1,
 * no padding, one group), against the fp32 GEMM it is on that layout; it keeps the faster fp32 one
 * unless the split one is 10 % faster (STITCHCUDA_CONV_SPLIT=always / never / gemm: no timing, that
 * one; gemm the fp32 convolution where the GEMM does not apply). */
ST_API st_status st_conv_split_tf32(const st_conv_args* args, void* stream);

/* Checks every shape field of args (pointers and dtypes are not read) and writes the spatial
 * sizes of y to out_size[0..spatial_dims). No device work. */
ST_API st_status st_conv_output_size(const st_conv_args* args, int64_t* out_size);

/* Convolution plan-cache counters of the context for (current device, stream). */
ST_API st_status st_conv_plan_cache_stats(void* stream, uint64_t* hits, uint64_t* misses, uint64_t* size);
ST_API st_status st_conv_plan_cache_clear(void* stream);

#ifdef __cplusplus
}
#endif

#endif /* STITCHRT_H */
