// pool_topk — see pool_topk.cuh. A pooling kernel writes u; topk_pages (topk.cu: radix
// select, ties to the lower index, ascending) picks the positions; a last kernel reads their u.
#include "pool_topk.cuh"
#include "topk.cuh"

#define POOL_THREADS 256
#define POOL_RADIUS 3 // kernel 7, docs/design.md §5

static __global__ void refresh_pool_kernel(float *u,		 // (n_kv, T)
					   const float *probs,	 // (n_q, ld)
					   long long ld, int group, int T)
{
	const int h = blockIdx.y;
	const int j = blockIdx.x * POOL_THREADS + threadIdx.x;
	if (j >= T)
		return;
	const int a = j - POOL_RADIUS > 0 ? j - POOL_RADIUS : 0;
	const int b = j + POOL_RADIUS < T - 1 ? j + POOL_RADIUS : T - 1;
	float m = probs[(long long)h * group * ld + a];
	for (int g = 0; g < group; g++) {
		const float *r = probs + ((long long)h * group + g) * ld;
		for (int i = a; i <= b; i++)
			m = fmaxf(m, r[i]);
	}
	u[(long long)h * T + j] = m;
}

static __global__ void refresh_uval_kernel(float *uval,	    // (n_kv, B)
					   const int32_t *pos, // (n_kv, B)
					   const float *u,	    // (n_kv, T)
					   int T, int B)
{
	const int h = blockIdx.y, i = blockIdx.x * POOL_THREADS + threadIdx.x;
	if (i < B)
		uval[(long long)h * B + i] = u[(long long)h * T + pos[(long long)h * B + i]];
}

extern "C" cudaError_t pool_topk(int32_t *pos, float *uval, float *u, const float *probs,
				    long long ld, int n_q, int n_kv, int T, int B,
				    cudaStream_t stream)
{
	if (n_q <= 0 || n_kv <= 0 || n_q % n_kv || T <= 0 || B < 1 || B > T || ld < T ||
	    n_kv > 65535)
		return cudaErrorInvalidValue;
	const dim3 pg((unsigned)((T + POOL_THREADS - 1) / POOL_THREADS), (unsigned)n_kv);
	refresh_pool_kernel<<<pg, POOL_THREADS, 0, stream>>>(u, probs, ld, n_q / n_kv, T);
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		e = topk_pages(pos, u, n_kv, T, 0, B, stream);
	if (e != cudaSuccess)
		return e;
	const dim3 ug((unsigned)((B + POOL_THREADS - 1) / POOL_THREADS), (unsigned)n_kv);
	refresh_uval_kernel<<<ug, POOL_THREADS, 0, stream>>>(uval, pos, u, T, B);
	return cudaGetLastError();
}
