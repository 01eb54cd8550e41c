// page_score — see page_score.cuh. Two kernels: raw bounds (a warp per (head, page)), then one
// block per KV head for the softmaxes and the group mean, so that any number of candidates fits.
#include <float.h>

#include "kv_dtype.cuh"
#include "page_score.cuh"

#define SCORE_WARPS 8

static __global__ void page_bound_kernel(float *__restrict__ raw,	  // (n_q, n_cand)
					 const float *__restrict__ q,	  // (n_q, d)
					 const float *__restrict__ kmin, // (n_kv, page_stride, d)
					 const float *__restrict__ kmax, // (n_kv, page_stride, d)
					 int page_stride, int cand_begin, int n_cand, int G, int d,
					 float inv_sqrt_d)
{
	const int h = blockIdx.y, lane = threadIdx.x & 31;
	const int j = blockIdx.x * SCORE_WARPS + (threadIdx.x >> 5);
	if (j >= n_cand)
		return;
	const int kv = h / G;
	const float *qh = q + (size_t)h * d;
	const size_t base = ((size_t)kv * page_stride + cand_begin + j) * d;
	float acc = 0.0f;
	for (int i = lane; i < d; i += 32) {
		float a = qh[i] * kmax[base + i], b = qh[i] * kmin[base + i];
		acc += a > b ? a : b;
	}
	for (int off = 16; off > 0; off >>= 1)
		acc += __shfl_xor_sync(0xffffffffu, acc, off);
	if (lane == 0)
		raw[(size_t)h * n_cand + j] = acc * inv_sqrt_d;
}

// Block-wide reduction of v with op; every thread gets the result. red: 32 floats of shared.
template <bool IsMax> static __device__ float block_reduce(float v, float *red)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int off = 16; off > 0; off >>= 1) {
		float o = __shfl_xor_sync(0xffffffffu, v, off);
		v = IsMax ? fmaxf(v, o) : v + o;
	}
	__syncthreads(); // red may still be read from the previous call
	if (lane == 0)
		red[w] = v;
	__syncthreads();
	v = red[0];
	for (int i = 1; i < nw; i++)
		v = IsMax ? fmaxf(v, red[i]) : v + red[i];
	return v;
}

static __global__ void page_softmax_mean_kernel(float *__restrict__ out,	     // (n_kv, n_cand)
						const float *__restrict__ raw,    // (n_q, n_cand)
						int n_cand, int G)
{
	__shared__ float red[32];
	const int kv = blockIdx.x;
	float *mean = out + (size_t)kv * n_cand;
	for (int gi = 0; gi < G; gi++) {
		const float *s = raw + (size_t)(kv * G + gi) * n_cand;
		float mx = -FLT_MAX;
		for (int j = threadIdx.x; j < n_cand; j += blockDim.x)
			mx = fmaxf(mx, s[j]);
		mx = block_reduce<true>(mx, red);
		float sum = 0.0f;
		for (int j = threadIdx.x; j < n_cand; j += blockDim.x)
			sum += expf(s[j] - mx);
		sum = block_reduce<false>(sum, red);
		// Each thread owns the same j at every gi, so the accumulation needs no barrier.
		for (int j = threadIdx.x; j < n_cand; j += blockDim.x) {
			float e = expf(s[j] - mx) / sum;
			mean[j] = gi == 0 ? e : mean[j] + e;
		}
	}
	for (int j = threadIdx.x; j < n_cand; j += blockDim.x)
		mean[j] /= (float)G;
}

extern "C" cudaError_t page_score(float *out, float *scratch, const float *q, const float *kmin,
				  const float *kmax, int page_stride, int cand_begin, int n_cand,
				  int n_q, int n_kv, int d, cudaStream_t stream)
{
	if (n_q <= 0 || n_kv <= 0 || n_q % n_kv || d <= 0 || cand_begin < 0 || n_cand < 0 ||
	    cand_begin + n_cand > page_stride || n_q > 65535)
		return cudaErrorInvalidValue;
	if (n_cand == 0)
		return cudaSuccess;
	const int G = n_q / n_kv;
	const dim3 grid(kv_blocks(n_cand, SCORE_WARPS), n_q);
	page_bound_kernel<<<grid, SCORE_WARPS * 32, 0, stream>>>(
		scratch, q, kmin, kmax, page_stride, cand_begin, n_cand, G, d,
		1.0f / sqrtf((float)d));
	page_softmax_mean_kernel<<<n_kv, 256, 0, stream>>>(out, scratch, n_cand, G);
	return cudaGetLastError();
}
