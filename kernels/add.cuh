// add — element-wise accumulation for the residual stream: y += x, and y += b per row (a bias
// in its stored dtype).
#pragma once
#include <cuda_runtime.h>
#include "dtype.h"
#ifdef __cplusplus
extern "C" {
#endif
// y, x: (n) f32, device. Returns cudaSuccess or the launch error.
cudaError_t add_f32(float *y, const float *x, long long n, cudaStream_t stream);
// y: (rows, cols) f32; b: (cols) in dt. Returns cudaSuccess or the launch error.
cudaError_t add_bias_rows(float *y, const void *b, enum fkv_dtype dt, long long rows, int cols,
			  cudaStream_t stream);
#ifdef __cplusplus
}
#endif
