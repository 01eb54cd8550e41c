// softmax — see softmax.cuh.
#include <math.h>

#include "kv_dtype.cuh"
#include "softmax.cuh"

#define SOFTMAX_THREADS 256

// Block-wide reduction of v (max when is_max, else sum); every thread gets the result.
static __device__ float block_reduce(float v, bool is_max, float *sh)
{
	for (int o = 16; o > 0; o >>= 1) {
		float w = __shfl_xor_sync(0xffffffffu, v, o);
		v = is_max ? fmaxf(v, w) : v + w;
	}
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (lane == 0)
		sh[warp] = v;
	__syncthreads();
	if (warp == 0) {
		v = lane < SOFTMAX_THREADS / 32 ? sh[lane] : (is_max ? -INFINITY : 0.0f);
		for (int o = 16; o > 0; o >>= 1) {
			float w = __shfl_xor_sync(0xffffffffu, v, o);
			v = is_max ? fmaxf(v, w) : v + w;
		}
		if (lane == 0)
			sh[0] = v;
	}
	__syncthreads();
	v = sh[0];
	__syncthreads();
	return v;
}

static __global__ void softmax_kernel(float *x, // (rows, cols)
				      long long cols)
{
	__shared__ float sh[SOFTMAX_THREADS / 32];
	float *row = x + (long long)blockIdx.x * cols;
	float m = -INFINITY;
	for (long long i = threadIdx.x; i < cols; i += SOFTMAX_THREADS)
		m = fmaxf(m, row[i]);
	m = block_reduce(m, true, sh);
	float s = 0.0f;
	for (long long i = threadIdx.x; i < cols; i += SOFTMAX_THREADS) {
		float e = expf(row[i] - m);
		row[i] = e;
		s += e;
	}
	s = block_reduce(s, false, sh);
	const float inv = 1.0f / s;
	for (long long i = threadIdx.x; i < cols; i += SOFTMAX_THREADS)
		row[i] *= inv;
}

extern "C" cudaError_t softmax_rows(float *x, long long rows, long long cols, cudaStream_t stream)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	if (rows > 2147483647LL)
		return cudaErrorInvalidValue;
	softmax_kernel<<<(unsigned)rows, SOFTMAX_THREADS, 0, stream>>>(x, cols);
	return cudaGetLastError();
}
