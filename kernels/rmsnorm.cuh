// rmsnorm — y = x / sqrt(mean(x^2) + eps) * w, one row per block.
#pragma once
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// x, y: (rows, n) f32; w: (n) f32. Returns cudaSuccess or the launch error.
cudaError_t rmsnorm_f32(float *y, const float *x, const float *w, int rows, int n, float eps,
			cudaStream_t stream);

#ifdef __cplusplus
}
#endif
