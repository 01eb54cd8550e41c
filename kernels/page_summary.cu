// page_summary — see page_summary.cuh.
#include "kv_dtype.cuh"
#include "page_summary.cuh"

// Block (page i, head h); thread per dimension, walking the p rows (coalesced across threads).
template <typename T>
static __global__ void page_summary_kernel(float *__restrict__ kmin,	 // (n_kv, page_stride, d)
					   float *__restrict__ kmax,	 // (n_kv, page_stride, d)
					   int page_stride,
					   const T *__restrict__ k,	 // pages of (p, n_kv, d) rows
					   long long k_page_stride,
					   const int32_t *__restrict__ src, // (n)
					   const int32_t *__restrict__ dst, // (n)
					   int n_kv, int p, int d)
{
	const int i = blockIdx.x, h = blockIdx.y;
	const T *page = k + (size_t)src[i] * k_page_stride + (size_t)h * d;
	const size_t row = (size_t)n_kv * d;
	const size_t out = ((size_t)h * page_stride + dst[i]) * d;
	for (int c = threadIdx.x; c < d; c += blockDim.x) {
		float lo = kv_to_f32(page[c]), hi = lo;
		for (int t = 1; t < p; t++) {
			float x = kv_to_f32(page[t * row + c]);
			lo = fminf(lo, x);
			hi = fmaxf(hi, x);
		}
		kmin[out + c] = lo;
		kmax[out + c] = hi;
	}
}

extern "C" cudaError_t page_summary(float *kmin, float *kmax, int page_stride, const void *k,
				    enum fkv_dtype dt, long long k_page_stride,
				    const int32_t *src, const int32_t *dst, int n, int n_kv,
				    int p, int d, cudaStream_t stream)
{
	if (n_kv <= 0 || n_kv > 65535 || p <= 0 || d <= 0 || page_stride <= 0)
		return cudaErrorInvalidValue;
	if (n <= 0)
		return cudaSuccess;
	const int threads = d >= 128 ? 128 : ((d + 31) / 32) * 32;
	const dim3 grid(n, n_kv);
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		page_summary_kernel<T><<<grid, threads, 0, stream>>>(
			kmin, kmax, page_stride, (const T *)k, k_page_stride, src, dst, n_kv, p,
			d);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
