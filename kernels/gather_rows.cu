// gather_rows — see gather_rows.cuh.
#include "gather_rows.cuh"
#include "kv_dtype.cuh"

static __global__ void gather_rows_kernel(float *dst,	       // (n, cols)
					  const float *src,    // (rows, cols)
					  const int32_t *idx,  // (n)
					  long long cols)
{
	const float *s = src + (long long)idx[blockIdx.x] * cols;
	float *d = dst + (long long)blockIdx.x * cols;
	for (long long i = threadIdx.x; i < cols; i += blockDim.x)
		d[i] = s[i];
}

extern "C" cudaError_t gather_rows_f32(float *dst, const float *src, long long cols,
				       const int32_t *idx, long long n, cudaStream_t stream)
{
	if (n <= 0 || cols <= 0)
		return cudaSuccess;
	if (n > 2147483647LL)
		return cudaErrorInvalidValue;
	gather_rows_kernel<<<(unsigned)n, 256, 0, stream>>>(dst, src, idx, cols);
	return cudaGetLastError();
}
