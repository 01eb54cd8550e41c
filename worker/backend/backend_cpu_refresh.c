/* backend_cpu_refresh — the CPU backend's ops for refreshkv's full step (docs/design.md §5):
 * attn_scores and attn_accum are attn_unit's two passes (backend_cpu.c) for one query, apart,
 * and gather_heads copies head slices of rows. The twins of kernels/attn_scores.cu,
 * attn_accum.cu and gather_heads.cu. */
#include "backend_cpu_priv.h"

#include <omp.h>
#include <stdlib.h>

/* refreshkv's full step: attn_unit's two passes, one query, split into two ops. A KV head's
 * G query rows go through scores4 and the same weighted sum in key order as attn_unit, so the
 * scores, softmax and sum give attn_decode's bits. accum false: scores into s (rows of ld);
 * true: out (+)= s . V. */
CPU_HOT static void head_pass(bool accum, float *s, int64_t ld, float *out, const float *q,
			      const struct attn_src *src, int kvh, int G, const struct backend_attn *a)
{
	const int d = a->head_dim, h0 = kvh * G;
	const size_t es = dtype_size(a->kv_dtype);
	float tmp[CPU_MAX_HEAD_DIM];
	for (int r0 = 0; r0 < G; r0 += CPU_ATTN_ROWS) {
		struct attn_rows u = { .n = G - r0 < CPU_ATTN_ROWS ? G - r0 : CPU_ATTN_ROWS };
		for (int r = 0; r < u.n; r++) {
			u.q[r] = q ? q + (size_t)(h0 + r0 + r) * d : NULL;
			u.o[r] = out ? out + (size_t)(h0 + r0 + r) * d : NULL;
			u.hi[r] = src->n;
		}
		float *sr = s + (size_t)(h0 + r0) * (size_t)ld;
		int64_t key = 0;
		for (int sp = 0; sp < src->n_spans; sp++) {
			const struct backend_kv_span *span = &src->spans[sp];
			const char *rows = (const char *)(accum ? span->v : span->k);
			for (int64_t t = 0; t < span->n; t++, key++) {
				const char *p = rows + (size_t)(t * span->row_stride +
								(int64_t)kvh * d) * es;
				const float *x = row_f32(tmp, p, a->kv_dtype, 0, d);
				if (!accum) {
					for (int r = 0; r < u.n; r += 4)
						scores4(sr + (size_t)r * ld + key, ld, &u, r, key, x,
							d, a->scale);
					continue;
				}
				for (int r = 0; r < u.n; r++) {
					float pr = sr[(size_t)r * ld + key], *o = u.o[r];
					#pragma omp simd
					for (int i = 0; i < d; i++)
						o[i] += pr * x[i];
				}
			}
		}
	}
}

int cpu_attn_scores(void *ctx, float *s, int64_t ld, const float *q,
			   const struct backend_kv_span *spans, const int *first,
			   const struct backend_attn *a)
{
	(void)ctx;
	struct attn_src *src;
	int ret = cpu_head_srcs(spans, first, a, &src);
	if (ret)
		return ret;
	const int G = a->n_heads / a->n_kv_heads;
	#pragma omp parallel for schedule(dynamic) if (src[0].n * a->n_heads * a->head_dim > CPU_PAR_MIN)
	for (int g = 0; g < a->n_kv_heads; g++)
		head_pass(false, s, ld, NULL, q, &src[g], g, G, a);
	free(src);
	return 0;
}

int cpu_attn_accum(void *ctx, float *out, const float *p, int64_t ld,
			  const struct backend_kv_span *spans, const int *first, bool accumulate,
			  const struct backend_attn *a)
{
	(void)ctx;
	struct attn_src *src;
	int ret = cpu_head_srcs(spans, first, a, &src);
	if (ret)
		return ret;
	if (!accumulate)
		memset(out, 0, (size_t)a->n_heads * a->head_dim * sizeof *out);
	const int G = a->n_heads / a->n_kv_heads;
	#pragma omp parallel for schedule(dynamic) if (src[0].n * a->n_heads * a->head_dim > CPU_PAR_MIN)
	for (int g = 0; g < a->n_kv_heads; g++)
		head_pass(true, (float *)p, ld, out, NULL, &src[g], g, G, a);
	free(src);
	return 0;
}

int cpu_gather_heads(void *ctx, float *dst, const float *src, const int32_t *map, int n,
			    int n_kv, int d)
{
	(void)ctx;
	if (n < 0 || n_kv <= 0 || d <= 0)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		const int32_t *m = map + (size_t)i * 3;
		if (m[0] < 0 || m[1] < 0 || m[2] < 0 || m[2] >= n_kv)
			return -EINVAL;
		memmove(dst + ((size_t)m[0] * n_kv + m[2]) * d, src + ((size_t)m[1] * n_kv + m[2]) * d,
			(size_t)d * sizeof *dst);
	}
	return 0;
}
