// silu_mul — see silu_mul.cuh.
#include "kv_dtype.cuh"
#include "silu_mul.cuh"

static __global__ void silu_mul_kernel(float *out,	   // (n)
				       const float *gate,  // (n)
				       const float *up,	   // (n)
				       long long n)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		float g = gate[i];
		out[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

extern "C" cudaError_t silu_mul_f32(float *out, const float *gate, const float *up, long long n,
				    cudaStream_t stream)
{
	if (n <= 0)
		return cudaSuccess;
	unsigned blocks = kv_blocks(n, 256);
	if (blocks > 65535u * 8u)
		blocks = 65535u * 8u;
	silu_mul_kernel<<<blocks, 256, 0, stream>>>(out, gate, up, n);
	return cudaGetLastError();
}
