// convert — see convert.cuh.
#include "convert.cuh"
#include "kv_dtype.cuh"

template <typename T>
static __global__ void convert_kernel(T *dst,		// (n)
				      const float *src, // (n)
				      long long n)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x)
		dst[i] = kv_from_f32<T>(src[i]);
}

extern "C" cudaError_t convert_f32(void *dst, enum fkv_dtype dt, const float *src, long long n,
				   cudaStream_t stream)
{
	if (n <= 0)
		return cudaSuccess;
	unsigned blocks = kv_blocks(n, 256);
	if (blocks > 65535u * 8u)
		blocks = 65535u * 8u;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		convert_kernel<T><<<blocks, 256, 0, stream>>>((T *)dst, src, n);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}

template <typename T>
static __global__ void round_kernel(float *x, // (n)
				    long long n)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x)
		x[i] = kv_to_f32(kv_from_f32<T>(x[i]));
}

extern "C" cudaError_t round_f32(float *x, enum fkv_dtype dt, long long n, cudaStream_t stream)
{
	if (dt == FKV_F32 || n <= 0)
		return dt == FKV_F32 || dt == FKV_F16 || dt == FKV_BF16 ? cudaSuccess
									: cudaErrorInvalidValue;
	unsigned blocks = kv_blocks(n, 256);
	if (blocks > 65535u * 8u)
		blocks = 65535u * 8u;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		round_kernel<T><<<blocks, 256, 0, stream>>>(x, n);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
