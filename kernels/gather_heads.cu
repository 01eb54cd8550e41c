// gather_heads — see gather_heads.cuh. One block per entry, threads over the head dimension.
#include "gather_heads.cuh"

static __global__ void gather_heads_kernel(float *dst,		// (rows, n_kv, d)
					   const float *src,	// (rows, n_kv, d)
					   const int32_t *map,	// (n, 3)
					   int n_kv, int d)
{
	const int32_t *m = map + (long long)blockIdx.x * 3;
	float *o = dst + ((long long)m[0] * n_kv + m[2]) * d;
	const float *i = src + ((long long)m[1] * n_kv + m[2]) * d;
	for (int c = threadIdx.x; c < d; c += blockDim.x)
		o[c] = i[c];
}

extern "C" cudaError_t gather_heads(float *dst, const float *src, const int32_t *map, int n,
				    int n_kv, int d, cudaStream_t stream)
{
	if (n < 0 || n_kv <= 0 || d <= 0)
		return cudaErrorInvalidValue;
	if (n == 0)
		return cudaSuccess;
	gather_heads_kernel<<<(unsigned)n, d < 128 ? 32 : 128, 0, stream>>>(dst, src, map, n_kv, d);
	return cudaGetLastError();
}
