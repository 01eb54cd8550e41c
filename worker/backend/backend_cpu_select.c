/* backend_cpu_select — the CPU twins of the selection ops (backend.h; docs/design.md §5
 * "Selection"): every op is select.c's function on the backend's buffers (host memory here),
 * so the CPU backend is the reference the CUDA kernels are tested against and the policies'
 * exactness tests (tau > 1 equals quest, B >= context equals full) keep their meaning. The
 * fences of download_async are trivial: the copy is done when the call returns. */
#include "backend_cpu_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "select.h"

int cpu_page_summary(void *ctx, float *kmin, float *kmax, int page_stride, int page,
		     const void *slot, enum fkv_dtype slot_dt, int p, int n_kv, int d)
{
	(void)ctx;
	if (p <= 0 || n_kv <= 0 || d <= 0 || page < 0 || page >= page_stride ||
	    (slot_dt != FKV_F32 && slot_dt != FKV_F16 && slot_dt != FKV_BF16))
		return -EINVAL;
	const size_t row = (size_t)n_kv * d;
	const float *k = slot;
	float *tmp = NULL;
	if (slot_dt != FKV_F32) {
		/* The K rows in f32: the values a 16-bit slot holds, exactly. */
		tmp = malloc((size_t)p * row * sizeof *tmp);
		if (!tmp)
			return -ENOMEM;
		dtype_to_f32(tmp, slot, slot_dt, (size_t)p * row);
		k = tmp;
	}
	for (int h = 0; h < n_kv; h++) {
		size_t at = ((size_t)h * page_stride + page) * d;
		select_page_summary(p, d, k + (size_t)h * d, row, kmin + at, kmax + at);
	}
	free(tmp);
	return 0;
}

int cpu_select_pages(void *ctx, const struct backend_select *g, const float *q,
		     const float *kmin, const float *kmax, const uint8_t *resident, int32_t *pages,
		     int32_t *changed, int32_t *n_changed)
{
	(void)ctx;
	if (g->n_q <= 0 || g->n_kv <= 0 || g->n_q % g->n_kv || g->d <= 0 || g->cand_begin < 0 ||
	    g->n_cand < 0 || g->k < 0 || g->k > g->n_cand ||
	    g->cand_begin + g->n_cand > g->page_stride)
		return -EINVAL;
	if (!g->k)
		return 0;
	/* select_topk reads only the geometry's head counts and d, and the layout's candidates. */
	const struct select_geom sg = { .n_q = g->n_q, .n_kv = g->n_kv, .d = g->d, .p = 1 };
	const struct select_layout lay = {
		.compressed = true, .cand_begin = g->cand_begin,
		.cand_end = g->cand_begin + g->n_cand, .k = g->k,
	};
	float *scratch = malloc(select_scratch_floats(&sg, g->n_cand) * sizeof *scratch);
	int *sel = malloc((size_t)g->n_kv * g->k * sizeof *sel);
	if (!scratch || !sel) {
		free(scratch);
		free(sel);
		return -ENOMEM;
	}
	select_topk(&sg, &lay, q, kmin, kmax, g->page_stride, sel, scratch);
	for (int h = 0; h < g->n_kv; h++) {
		int n = 0;
		for (int i = 0; i < g->k; i++) {
			int pg = sel[(size_t)h * g->k + i];
			pages[(size_t)h * g->k + i] = pg;
			if (!resident[(size_t)h * g->page_stride + pg])
				changed[(size_t)h * g->k + n++] = pg;
		}
		n_changed[h] = n;
		for (int i = n; i < g->k; i++)
			changed[(size_t)h * g->k + i] = -1;
	}
	free(scratch);
	free(sel);
	return 0;
}

int cpu_group_cosine(void *ctx, float *out, const float *q_t, const float *q_prev, int n_q,
		     int n_kv, int d)
{
	(void)ctx;
	if (n_q <= 0 || n_kv <= 0 || n_q % n_kv || d <= 0)
		return -EINVAL;
	const struct select_geom sg = { .n_q = n_q, .n_kv = n_kv, .d = d, .p = 1 };
	select_group_cosine(&sg, q_t, q_prev, out);
	return 0;
}

void *cpu_host_alloc(void *ctx, size_t bytes)
{
	(void)ctx;
	return malloc(bytes ? bytes : 1);
}

void cpu_host_free(void *ctx, void *p)
{
	(void)ctx;
	free(p);
}

/* Every copy is done on return, so a fence has nothing to record: one static object stands
 * for all of them. */
static char cpu_fence;

int cpu_fence_new(void *ctx, void **fence)
{
	(void)ctx;
	*fence = &cpu_fence;
	return 0;
}

void cpu_fence_free(void *ctx, void *fence)
{
	(void)ctx;
	(void)fence;
}

int cpu_download_async(void *ctx, void *host_dst, const void *src, size_t bytes, void *fence)
{
	(void)ctx;
	(void)fence;
	memcpy(host_dst, src, bytes);
	return 0;
}

int cpu_fence_wait(void *ctx, void *fence)
{
	(void)ctx;
	(void)fence;
	return 0;
}

int cpu_fence_stream_wait(void *ctx, void *fence)
{
	(void)ctx;
	(void)fence;
	return 0;
}
