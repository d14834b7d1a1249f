#pragma once
#include <cuda_runtime.h>

#include "stitchrt/stitchrt.h"

namespace st {
st_dtype policy_storage(st_policy p);
void check_gemm_args(const st_gemm_args& g);
void gemm(const st_gemm_args& g, cudaStream_t stream);
void epilogue_apply(const st_epilogue_args& e, cudaStream_t stream);
void split_gelu_apply(const st_gemm_args& g, cudaStream_t stream);
}  // namespace st
