// convert — f32 values to a stored dtype (f32, f16, bf16; round to nearest even, like
// worker/dtype.c): the KV append of the `full` policy.
#pragma once
#include <cuda_runtime.h>
#include "dtype.h"
#ifdef __cplusplus
extern "C" {
#endif
// dst: (n) in dt; src: (n) f32, device. Returns cudaErrorInvalidValue for an unknown dtype,
// else the launch error.
cudaError_t convert_f32(void *dst, enum fkv_dtype dt, const float *src, long long n,
			cudaStream_t stream);
#ifdef __cplusplus
}
#endif
