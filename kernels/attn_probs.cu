// attn_probs — see attn_probs.cuh. Three kernels: every score (one warp per (head, key), a
// shuffle sum over d), the max and the sum of exponentials per head (one block a head), then
// the group mean of exp(score - max) / sum per (KV head, key).
#include <math.h>

#include "attn_probs.cuh"
#include "kv_dtype.cuh"

#define PROBS_THREADS 256

static __global__ void scores_kernel(float *__restrict__ sc,	  // (n_heads, n_ctx + 2)
				     const float *__restrict__ q, // (n_heads, d)
				     const float *__restrict__ k, // (n_ctx, n_kv, d)
				     long long n_ctx, int n_heads, int n_kv, int d, float scale)
{
	const long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
	const int lane = threadIdx.x & 31;
	if (w >= n_ctx * n_heads)
		return;
	const int h = (int)(w % n_heads);
	const long long j = w / n_heads;
	const float *kr = k + ((size_t)j * n_kv + h / (n_heads / n_kv)) * d, *qh = q + (size_t)h * d;
	float s = 0.0f;
	for (int e = lane; e < d; e += 32)
		s += qh[e] * kr[e];
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	if (!lane)
		sc[(size_t)h * (n_ctx + 2) + j] = s * scale;
}

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
		v = lane < PROBS_THREADS / 32 ? sh[lane] : (is_max ? -INFINITY : 0.0f);
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

// One block per head: its max and sum of exponentials, after the scores in the scratch row.
static __global__ void norm_kernel(float *__restrict__ sc, // (n_heads, n_ctx + 2)
				   long long n_ctx)
{
	__shared__ float sh[PROBS_THREADS / 32];
	float *row = sc + (size_t)blockIdx.x * (n_ctx + 2);
	float m = -INFINITY;
	for (long long i = threadIdx.x; i < n_ctx; i += PROBS_THREADS)
		m = fmaxf(m, row[i]);
	m = block_reduce(m, true, sh);
	float s = 0.0f;
	for (long long i = threadIdx.x; i < n_ctx; i += PROBS_THREADS)
		s += expf(row[i] - m);
	s = block_reduce(s, false, sh);
	if (!threadIdx.x) {
		row[n_ctx] = m;
		row[n_ctx + 1] = s;
	}
}

static __global__ void mean_kernel(float *__restrict__ probs,	   // (n_kv, n_prob)
				   const float *__restrict__ sc, // (n_heads, n_ctx + 2)
				   long long n_ctx, long long n_prob, int n_heads, int n_kv)
{
	const long long id = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (id >= n_prob * n_kv)
		return;
	const int g = (int)(id / n_prob), G = n_heads / n_kv;
	const long long j = id % n_prob;
	float m = 0.0f;
	for (int i = 0; i < G; i++) {
		const float *row = sc + (size_t)(g * G + i) * (n_ctx + 2);
		m += expf(row[j] - row[n_ctx]) / row[n_ctx + 1];
	}
	probs[id] = m / (float)G;
}

extern "C" cudaError_t attn_probs(float *probs, float *scratch, const float *q, const float *k,
				  long long n_ctx, long long n_prob, int n_heads, int n_kv, int d,
				  float scale, cudaStream_t stream)
{
	if (n_ctx <= 0 || n_prob < 0 || n_prob > n_ctx || n_kv <= 0 || n_heads % n_kv || d <= 0)
		return cudaErrorInvalidValue;
	if (!n_prob)
		return cudaSuccess;
	scores_kernel<<<kv_blocks(n_ctx * n_heads * 32, PROBS_THREADS), PROBS_THREADS, 0, stream>>>(
		scratch, q, k, n_ctx, n_heads, n_kv, d, scale);
	norm_kernel<<<n_heads, PROBS_THREADS, 0, stream>>>(scratch, n_ctx);
	mean_kernel<<<kv_blocks(n_prob * n_kv, PROBS_THREADS), PROBS_THREADS, 0, stream>>>(
		probs, scratch, n_ctx, n_prob, n_heads, n_kv);
	return cudaGetLastError();
}
