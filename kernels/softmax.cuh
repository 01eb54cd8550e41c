// softmax — row-wise softmax in place (max-subtracted, f32), one row per block.
#pragma once
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
// x: (rows, cols) f32, device, in place. Returns cudaSuccess or the launch error.
cudaError_t softmax_rows(float *x, long long rows, long long cols, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
