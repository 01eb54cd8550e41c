// rmsnorm — y = x / sqrt(mean(x^2) + eps) * w, one row per block.
#pragma once
#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// x, y: (rows, n) f32; w: (n) f32. y may equal x. Returns cudaSuccess or the launch error.
cudaError_t rmsnorm_f32(float *y, const float *x, const float *w, int rows, int n, float eps,
			cudaStream_t stream);

// As rmsnorm_f32 with the weight w: (n) in its stored dtype dt (f32, f16 or bf16).
cudaError_t rmsnorm_rows(float *y, const float *x, const void *w, enum fkv_dtype dt, int rows,
			 int n, float eps, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
