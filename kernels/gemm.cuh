// gemm — linear layers through cuBLAS: Y (n, rows) = X (n, cols) · Wᵀ with W (rows, cols)
// row-major in its stored dtype (f32, f16, bf16), i.e. y = W x for each of the n rows of X.
// Accumulation is f32 (CUBLAS_COMPUTE_32F) and Y is f32.
//
// Activations: the engine keeps them f32. cublasGemmEx needs A and B of one type, so for 16-bit
// weights X is first rounded to W's dtype (round to nearest even) in a caller-provided
// workspace; the product of 16-bit inputs is then accumulated in f32. This costs one rounding of
// each activation (relative error 2^-9 for bf16, 2^-12 for f16) — the usual bf16/f16 inference
// contract — in exchange for reading W at its stored width, which is what decode is bound by.
// f32 weights use plain f32 inputs (no TF32).
#pragma once
#include <stddef.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bytes of workspace gemm_xwt needs for X of n rows of cols (0 for f32 weights).
size_t gemm_workspace_bytes(enum fkv_dtype w_dt, long long n, long long cols);

// y: (n, rows) f32; x: (n, cols) f32; w: (rows, cols) in w_dt; workspace: gemm_workspace_bytes()
// of device memory (may be NULL when that is 0). The handle is the caller's; it is bound to
// stream for this call. Returns 0 or a negative errno (the failing call is printed, see
// cuda_check.h).
int gemm_xwt(cublasHandle_t handle, float *y, const float *x, const void *w, enum fkv_dtype w_dt,
	     long long n, long long rows, long long cols, void *workspace, size_t workspace_bytes,
	     cudaStream_t stream);

#ifdef __cplusplus
}
#endif
