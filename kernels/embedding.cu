// embedding — see embedding.cuh.
#include <math.h>

#include "embedding.cuh"
#include "kv_dtype.cuh"

template <typename T>
static __global__ void embedding_kernel(float *__restrict__ out,	  // (n, dim)
					const T *__restrict__ table,	  // (vocab, dim)
					const int32_t *__restrict__ ids,  // (n)
					int dim, int vocab)
{
	const int32_t id = ids[blockIdx.x];
	float *row = out + (size_t)blockIdx.x * dim;
	if (id < 0 || id >= vocab) {
		for (int i = threadIdx.x; i < dim; i += blockDim.x)
			row[i] = __int_as_float(0x7fc00000);
		return;
	}
	const T *src = table + (size_t)id * dim;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		row[i] = kv_to_f32(src[i]);
}

extern "C" cudaError_t embedding_rows(float *out, const void *table, enum fkv_dtype dt,
				      const int32_t *ids, int n, int dim, int vocab,
				      cudaStream_t stream)
{
	if (n <= 0 || dim <= 0)
		return cudaSuccess;
	if (vocab <= 0)
		return cudaErrorInvalidValue;
	const int threads = dim >= 256 ? 256 : ((dim + 31) / 32) * 32;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		embedding_kernel<T><<<n, threads, 0, stream>>>(out, (const T *)table, ids, dim,
								vocab);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
