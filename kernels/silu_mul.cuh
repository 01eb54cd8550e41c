// silu_mul — out = silu(gate) * up element-wise (the SwiGLU feed-forward activation).
#pragma once
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// out, gate, up: (n) f32, device. out may equal gate or up. Returns cudaSuccess or the launch
// error.
cudaError_t silu_mul_f32(float *out, const float *gate, const float *up, long long n,
			 cudaStream_t stream);

#ifdef __cplusplus
}
#endif
