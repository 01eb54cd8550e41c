// gather_rows — dst[i] = src[idx[i]] for rows of f32 (the engine picks the rows whose logits it
// needs).
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
// dst: (n, cols) f32; src: (rows, cols) f32; idx: (n) device int32, in range (the caller's
// invariant). Returns cudaSuccess or the launch error.
cudaError_t gather_rows_f32(float *dst, const float *src, long long cols, const int32_t *idx,
			    long long n, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
