/* kv_writethrough — see kv_writethrough.h. */
#include "kv_writethrough.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hostkv.h"
#include "log.h"

int kv_wt_init(struct kv_wt *w, struct backend *be, struct hostkv_seq *host,
	       const struct backend_attn *a, int page)
{
	if (page <= 0 || a->n_kv_heads <= 0 || a->head_dim <= 0)
		return -EINVAL;
	*w = (struct kv_wt){
		.host = host, .be = be,
		.g = { .n_kv = a->n_kv_heads, .p = page, .d = a->head_dim, .dtype = a->kv_dtype },
	};
	return 0;
}

void kv_wt_free(struct kv_wt *w)
{
	free(w->k);
	free(w->v);
	free(w->blocks);
	w->k = w->v = NULL;
	w->blocks = NULL;
	w->cap = 0;
	w->cap_blocks = 0;
}

int kv_wt_fence(struct kv_wt *w)
{
	if (!w->dirty)
		return 0;
	int ret = w->be->ops->sync ? w->be->ops->sync(w->be->ctx) : 0;
	if (!ret)
		w->dirty = false;
	return ret;
}

static int wt_reserve(struct kv_wt *w, int64_t n)
{
	if (n <= w->cap)
		return 0;
	size_t row = (size_t)w->g.n_kv * (size_t)w->g.d;
	float *k = malloc((size_t)n * row * sizeof *k), *v = malloc((size_t)n * row * sizeof *v);
	if (!k || !v) {
		free(k);
		free(v);
		return -ENOMEM;
	}
	free(w->k);
	free(w->v);
	w->k = k;
	w->v = v;
	w->cap = n;
	return 0;
}

/* The policy ops return an errno only: the store's message (which block, why, what to do)
 * goes to stderr here, once per failure, so the worker's log says more than strerror. */
static int host_err(int ret, const char *err)
{
	if (ret)
		log_error("host KV copy: %s", err);
	return ret;
}

int kv_wt_fetch(struct kv_wt *w, const float *k, const float *v, int64_t n, const float **hk,
		const float **hv)
{
	size_t bytes = (size_t)n * (size_t)w->g.n_kv * (size_t)w->g.d * sizeof(float);
	int ret = wt_reserve(w, n) ?: w->be->ops->download(w->be->ctx, w->k, k, bytes)
		  ?: w->be->ops->download(w->be->ctx, w->v, v, bytes);
	if (ret)
		return ret;
	*hk = w->k;
	*hv = w->v;
	return 0;
}

int kv_wt_store(struct kv_wt *w, int layer, int64_t pos, const float *k, const float *v,
		int64_t n)
{
	if (!w->host)
		return 0;
	const int p = w->g.p;
	size_t row = (size_t)w->g.n_kv * (size_t)w->g.d;
	char err[256];
	int ret = kv_wt_fence(w);
	if (ret)
		return ret;
	for (int64_t t = pos; t < pos + n;) {
		int64_t page = t / p;
		int t0 = (int)(t % p);
		int t1 = pos + n - page * p < p ? (int)(pos + n - page * p) : p;
		if (page > INT32_MAX)
			return -EOVERFLOW;
		void *block;
		if ((ret = hostkv_block(w->host, layer, (int)page, &block, err, sizeof err)))
			return host_err(ret, err);
		size_t off = (size_t)(t - pos) * row;
		layout_store_tokens(&w->g, block, t0, t1, k + off, v + off);
		t += t1 - t0;
	}
	return 0;
}

/* The blocks of positions [pos, pos + n) into w->blocks; -EOVERFLOW past the op's int. */
static int put_blocks(struct kv_wt *w, int layer, int64_t pos, int64_t n)
{
	const int p = w->g.p;
	int64_t first = pos / p, last = (pos + n - 1) / p;
	if (n > INT32_MAX || last > INT32_MAX)
		return -EOVERFLOW;
	int count = (int)(last - first + 1);
	if (count > w->cap_blocks) {
		void **b = realloc(w->blocks, (size_t)count * sizeof *b);
		if (!b)
			return -ENOMEM;
		w->blocks = b;
		w->cap_blocks = count;
	}
	char err[256];
	for (int i = 0; i < count; i++) {
		int ret = hostkv_block(w->host, layer, (int)first + i, &w->blocks[i], err,
				       sizeof err);
		if (ret)
			return host_err(ret, err);
	}
	return 0;
}

int kv_wt_put(struct kv_wt *w, int layer, int64_t pos, const float *k, const float *v,
	      int64_t n)
{
	if (!w->host || n <= 0)
		return 0;
	const struct backend_ops *o = w->be->ops;
	int ret;
	if (o->store_rows) {
		if ((ret = put_blocks(w, layer, pos, n)))
			return ret;
		ret = o->store_rows(w->be->ctx, w->blocks, (int)(pos % w->g.p), k, v, (int)n,
				    w->g.p, w->g.n_kv, w->g.d, w->g.dtype);
		if (ret != -EOPNOTSUPP) {
			w->dirty = true; /* a failed call may have queued part of its work */
			return ret;
		}
	}
	const float *hk, *hv;
	return kv_wt_fetch(w, k, v, n, &hk, &hv) ?: kv_wt_store(w, layer, pos, hk, hv, n);
}

/* Pages pinned at once by kv_wt_load: one ring batch of RECALLs for those not leased. */
#define KV_WT_PIN_BATCH 32

int kv_wt_load(struct kv_wt *w, int layer, int64_t t0, int64_t t1, float *k, float *v)
{
	if (!w->host)
		return -EINVAL;
	int fenced = kv_wt_fence(w);
	if (fenced)
		return fenced;
	const int p = w->g.p, d = w->g.d, H = w->g.n_kv;
	float *tk = malloc((size_t)2 * p * d * sizeof *tk), *tv = tk + (size_t)p * d;
	if (!tk)
		return -ENOMEM;
	char err[256];
	int ret = 0;
	for (int64_t t = t0; t < t1 && !ret;) {
		int pages[KV_WT_PIN_BATCH], n = 0;
		const void *blocks[KV_WT_PIN_BATCH];
		for (int64_t pg = t / p; n < KV_WT_PIN_BATCH && pg * p < t1; pg++)
			pages[n++] = (int)pg;
		ret = host_err(hostkv_pin_many(w->host, layer, pages, n, blocks, err, sizeof err),
			       err);
		for (int j = 0; j < n && !ret; j++) {
			int a = (int)(t % p);
			int b = t1 - (int64_t)pages[j] * p < p ? (int)(t1 - (int64_t)pages[j] * p) : p;
			for (int h = 0; h < H; h++) {
				layout_load_head(&w->g, blocks[j], h, a, b, tk, tv);
				for (int i = 0; i < b - a; i++) {
					size_t dst = ((size_t)(t - t0 + i) * H + h) * d;
					memcpy(k + dst, tk + (size_t)i * d, (size_t)d * sizeof *k);
					memcpy(v + dst, tv + (size_t)i * d, (size_t)d * sizeof *v);
				}
			}
			t += b - a;
		}
		if (!ret)
			ret = host_err(hostkv_unpin_many(w->host, layer, pages, n, err, sizeof err),
				       err);
	}
	free(tk);
	return ret;
}
