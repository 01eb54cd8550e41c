// span_attention — see span_attention.cuh.
#include <math.h>

#include "kv_dtype.cuh"
#include "span_attention.cuh"

#define SPAN_THREADS 128
#define SPAN_DIMS (SPAN_ATTN_MAX_D / SPAN_THREADS) // output dims per thread

static __device__ float span_block_max(float v, float *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (lane == 0)
		sh[warp] = v;
	__syncthreads();
	v = sh[0];
	for (int w = 1; w < SPAN_THREADS / 32; w++)
		v = fmaxf(v, sh[w]);
	__syncthreads();
	return v;
}

template <typename T>
static __global__ void span_attention_kernel(float *out,		   // (n_heads, d)
					     const float *q,		   // (n_heads, d)
					     const struct span_desc *spans, // (n_spans)
					     const int32_t *first,	   // (n_kv + 1)
					     int group, int d, float scale)
{
	extern __shared__ float sm[]; // q (d), p (SPAN_THREADS), reduction (SPAN_THREADS / 32)
	float *qs = sm, *ps = sm + d, *red = ps + SPAN_THREADS;
	const int h = blockIdx.x, kvh = h / group, t = threadIdx.x;
	for (int i = t; i < d; i += SPAN_THREADS)
		qs[i] = q[(long long)h * d + i];
	__syncthreads();
	float acc[SPAN_DIMS];
#pragma unroll
	for (int i = 0; i < SPAN_DIMS; i++)
		acc[i] = 0.0f;
	float m = -INFINITY, l = 0.0f;
	for (int s = first[kvh]; s < first[kvh + 1]; s++) {
		const struct span_desc sp = spans[s];
		const T *kb = (const T *)sp.k + (long long)kvh * d;
		const T *vb = (const T *)sp.v + (long long)kvh * d;
		for (long long base = 0; base < sp.n; base += SPAN_THREADS) {
			const long long j = base + t;
			float sc = -INFINITY;
			if (j < sp.n) {
				const T *kr = kb + j * sp.row_stride;
				float dot = 0.0f;
				for (int i = 0; i < d; i++)
					dot += qs[i] * kv_to_f32(kr[i]);
				sc = dot * scale;
			}
			const float tile_max = span_block_max(sc, red);
			const float m_new = fmaxf(m, tile_max);
			const float corr = expf(m - m_new); // 0 on the first tile (m = -inf)
			ps[t] = j < sp.n ? expf(sc - m_new) : 0.0f;
			__syncthreads();
			const int n_tile = sp.n - base < SPAN_THREADS ? (int)(sp.n - base) : SPAN_THREADS;
			float psum = 0.0f;
			for (int jj = 0; jj < n_tile; jj++)
				psum += ps[jj];
			l = l * corr + psum;
#pragma unroll
			for (int i = 0; i < SPAN_DIMS; i++) {
				const int c = t + i * SPAN_THREADS;
				if (c >= d)
					break;
				float a = acc[i] * corr;
				for (int jj = 0; jj < n_tile; jj++)
					a += ps[jj] * kv_to_f32(vb[(base + jj) * sp.row_stride + c]);
				acc[i] = a;
			}
			m = m_new;
			__syncthreads();
		}
	}
	const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
	for (int i = 0; i < SPAN_DIMS; i++) {
		const int c = t + i * SPAN_THREADS;
		if (c < d)
			out[(long long)h * d + c] = acc[i] * inv;
	}
}

extern "C" cudaError_t span_attention(float *out, const float *q, const struct span_desc *spans,
				      const int32_t *first, enum fkv_dtype dt, int n_heads,
				      int n_kv, int d, float scale, cudaStream_t stream)
{
	if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv || d <= 0 || d > SPAN_ATTN_MAX_D)
		return cudaErrorInvalidValue;
	const size_t shmem = ((size_t)d + SPAN_THREADS + SPAN_THREADS / 32) * sizeof(float);
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		span_attention_kernel<T><<<n_heads, SPAN_THREADS, shmem, stream>>>(
			out, q, spans, first, n_heads / n_kv, d, scale);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
