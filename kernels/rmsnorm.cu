// rmsnorm — see rmsnorm.cuh.
#include "kv_dtype.cuh"
#include "rmsnorm.cuh"

template <typename W>
static __global__ void rmsnorm_kernel(float *y,			  // (rows, n)
				      const float *x,		  // (rows, n)
				      const W *__restrict__ w,	  // (n)
				      int n, float eps)
{
	__shared__ float partial[32];
	const float *xr = x + (size_t)blockIdx.x * n;
	float *yr = y + (size_t)blockIdx.x * n;
	float ss = 0.0f;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	for (int off = 16; off > 0; off >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, off);
	if ((threadIdx.x & 31) == 0)
		partial[threadIdx.x >> 5] = ss;
	__syncthreads();
	if (threadIdx.x < 32) {
		int nwarps = (blockDim.x + 31) >> 5;
		ss = threadIdx.x < nwarps ? partial[threadIdx.x] : 0.0f;
		for (int off = 16; off > 0; off >>= 1)
			ss += __shfl_xor_sync(0xffffffffu, ss, off);
		if (threadIdx.x == 0)
			partial[0] = ss;
	}
	__syncthreads();
	float scale = rsqrtf(partial[0] / (float)n + eps);
	// y may alias x: every read of xr above happened before the barrier, and each element
	// below is read and written by the same thread.
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = xr[i] * scale * kv_to_f32(w[i]);
}

extern "C" cudaError_t rmsnorm_rows(float *y, const float *x, const void *w, enum fkv_dtype dt,
				    int rows, int n, float eps, cudaStream_t stream)
{
	if (rows <= 0 || n <= 0)
		return cudaSuccess;
	int threads = n >= 1024 ? 1024 : ((n + 31) / 32) * 32;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using W = decltype(tag);
		rmsnorm_kernel<W><<<rows, threads, 0, stream>>>(y, x, (const W *)w, n, eps);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}

extern "C" cudaError_t rmsnorm_f32(float *y, const float *x, const float *w, int rows, int n,
				   float eps, cudaStream_t stream)
{
	return rmsnorm_rows(y, x, w, FKV_F32, rows, n, eps, stream);
}
