#pragma once
#include <cuda_runtime.h>

#include "stitchrt/stitchrt.h"

namespace st {
st_dtype policy_storage(st_policy p);
void check_gemm_args(const st_gemm_args& g);
void gemm(const st_gemm_args& g, cudaStream_t stream);
void gemm_split_tf32(const st_gemm_args& g, cudaStream_t stream);  // split_tf32.cu
void gemm_split_bf16(const st_gemm_args& g, cudaStream_t stream);  // split_tf32.cu
void epilogue_apply(const st_epilogue_args& e, cudaStream_t stream);
void split_gelu_apply(const st_gemm_args& g, cudaStream_t stream);
// ops applied in place on a GEMM's out, viewed as (m * batch) x n rows (batch contiguous);
// bias is g.bias, residual has out's shape with leading dimension ldr.
void apply_ops_to_out(const st_gemm_args& g, const st_ep_op* ops, int32_t n_ops, const void* residual, int64_t ldr,
                      cudaStream_t stream);
}  // namespace st
