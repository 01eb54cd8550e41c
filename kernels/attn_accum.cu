// attn_accum — see attn_accum.cuh. One block per query head, one thread per output dimension
// (strided past the block size), keys in order: each output element is one sequential sum, so
// chained calls over consecutive key ranges equal one call (same order, same rounding).
#include "attn_accum.cuh"
#include "kv_dtype.cuh"

#define ACCUM_THREADS 128

template <typename T>
static __global__ void attn_accum_kernel(float *out,			 // (n_heads, d)
					 const float *p,		 // (n_heads, ld)
					 long long ld,
					 const struct span_desc *spans,	 // (n_spans)
					 const int32_t *first,		 // (n_kv + 1)
					 int accumulate, int group, int d)
{
	const int h = blockIdx.x, kvh = h / group;
	const float *ph = p + (long long)h * ld;
	for (int c = threadIdx.x; c < d; c += ACCUM_THREADS) {
		float acc = accumulate ? out[(long long)h * d + c] : 0.0f;
		long long key = 0;
		for (int sp = first[kvh]; sp < first[kvh + 1]; sp++) {
			const struct span_desc d_sp = spans[sp];
			const T *vb = (const T *)d_sp.v + (long long)kvh * d + c;
			for (long long t = 0; t < d_sp.n; t++, key++)
				acc += ph[key] * kv_to_f32(vb[t * d_sp.row_stride]);
		}
		out[(long long)h * d + c] = acc;
	}
}

extern "C" cudaError_t attn_accum(float *out, const float *p, long long ld,
				  const struct span_desc *spans, const int32_t *first,
				  int accumulate, enum fkv_dtype dt, int n_heads, int n_kv, int d,
				  cudaStream_t stream)
{
	if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv || d <= 0 || ld < 0)
		return cudaErrorInvalidValue;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		attn_accum_kernel<T><<<n_heads, ACCUM_THREADS, 0, stream>>>(
			out, p, ld, spans, first, accumulate, n_heads / n_kv, d);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
