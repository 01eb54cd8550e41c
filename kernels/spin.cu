// spin — see spin.cuh.
#include "spin.cuh"

static __global__ void spin_kernel(long long cycles)
{
	const long long t0 = clock64();
	while (clock64() - t0 < cycles)
		;
}

extern "C" cudaError_t spin_cycles(long long cycles, cudaStream_t stream)
{
	if (cycles <= 0)
		return cudaSuccess;
	spin_kernel<<<1, 1, 0, stream>>>(cycles);
	return cudaGetLastError();
}
