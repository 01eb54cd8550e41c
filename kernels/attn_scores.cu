// attn_scores — see attn_scores.cuh. Grid (n_heads, key tiles): a block walks its KV head's
// spans to the keys of its tile, one thread per key, q staged in shared memory.
#include "attn_scores.cuh"
#include "kv_dtype.cuh"

#define SCORES_THREADS 128

template <typename T>
static __global__ void attn_scores_kernel(float *s,			// (n_heads, ld)
					  long long ld,
					  const float *q,		// (n_heads, d)
					  const struct span_desc *spans, // (n_spans)
					  const int32_t *first,		// (n_kv + 1)
					  int group, int d, float scale)
{
	extern __shared__ float qs[]; // (d)
	const int h = blockIdx.x, kvh = h / group;
	for (int i = threadIdx.x; i < d; i += SCORES_THREADS)
		qs[i] = q[(long long)h * d + i];
	__syncthreads();
	const long long j = (long long)blockIdx.y * SCORES_THREADS + threadIdx.x; // key of h
	long long key0 = 0;
	for (int sp = first[kvh]; sp < first[kvh + 1]; sp++) {
		const struct span_desc d_sp = spans[sp];
		if (j >= key0 && j < key0 + d_sp.n) {
			const T *kr = (const T *)d_sp.k + (j - key0) * d_sp.row_stride +
				      (long long)kvh * d;
			float dot = 0.0f;
			for (int i = 0; i < d; i++)
				dot += qs[i] * kv_to_f32(kr[i]);
			s[(long long)h * ld + j] = dot * scale;
			return;
		}
		key0 += d_sp.n;
	}
}

extern "C" cudaError_t attn_scores(float *s, long long ld, const float *q,
				   const struct span_desc *spans, const int32_t *first,
				   long long max_keys, enum fkv_dtype dt, int n_heads, int n_kv,
				   int d, float scale, cudaStream_t stream)
{
	if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv || d <= 0 || d > SPAN_ATTN_MAX_D ||
	    max_keys < 0 || max_keys > ld)
		return cudaErrorInvalidValue;
	if (max_keys == 0)
		return cudaSuccess;
	const long long tiles = (max_keys + SCORES_THREADS - 1) / SCORES_THREADS;
	if (tiles > 65535)
		return cudaErrorInvalidValue;
	const dim3 grid((unsigned)n_heads, (unsigned)tiles);
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		attn_scores_kernel<T><<<grid, SCORES_THREADS, (size_t)d * sizeof(float), stream>>>(
			s, ld, q, spans, first, n_heads / n_kv, d, scale);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
