// add — see add.cuh.
#include "add.cuh"
#include "kv_dtype.cuh"

static __global__ void add_kernel(float *y,	  // (n)
				  const float *x, // (n)
				  long long n)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x)
		y[i] += x[i];
}

template <typename T>
static __global__ void add_bias_kernel(float *y,    // (rows, cols)
				       const T *b,  // (cols)
				       long long n, int cols)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x)
		y[i] += kv_to_f32(b[i % cols]);
}

static unsigned add_grid(long long n)
{
	unsigned blocks = kv_blocks(n, 256);
	return blocks > 65535u * 8u ? 65535u * 8u : blocks;
}

extern "C" cudaError_t add_f32(float *y, const float *x, long long n, cudaStream_t stream)
{
	if (n <= 0)
		return cudaSuccess;
	add_kernel<<<add_grid(n), 256, 0, stream>>>(y, x, n);
	return cudaGetLastError();
}

extern "C" cudaError_t add_bias_rows(float *y, const void *b, enum fkv_dtype dt, long long rows,
				     int cols, cudaStream_t stream)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	const long long n = rows * cols;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		add_bias_kernel<T><<<add_grid(n), 256, 0, stream>>>(y, (const T *)b, n, cols);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
