// convert — f32 values to a stored dtype (f32, f16, bf16; round to nearest even, like
// common/dtype.c): the KV append of the `full` policy; and f32 values rounded to a stored dtype
// in place (the f32 slot rows of the paged policies hold exactly what the pool blocks hold).
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
// x: (n) f32, device, rounded to dt and back in place. Same errors as convert_f32.
cudaError_t round_f32(float *x, enum fkv_dtype dt, long long n, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
