/* policy_full — the `full` KV policy: all keys and values stay on the backend and every decode
 * step attends to all of them. The accuracy reference for the retrieval policies.
 *
 * Storage per layer: K and V, each (capacity, n_kv, d) in the KV dtype, grown by doubling up to
 * max_tokens (a grow copies the committed rows into fresh buffers). Appended rows are written
 * through to the host copy from the backend rows (kv_wt_put: the offload op where the backend
 * has one, no download), which restore() reads back. Also the policy table. */
#include "kvcache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_writethrough.h"

struct full_state {
	struct kv_seq_params p;
	int64_t len;	  /* committed tokens */
	int64_t pending;  /* tokens of the current step */
	int64_t cap;	  /* rows allocated per layer */
	size_t row_bytes; /* one token's (n_kv, d) row */
	void **k, **v;	  /* n_layers buffers each: (cap, n_kv, d) */
	int64_t attended;
	struct kv_wt wt;  /* write-through to the host copy */
};

static void full_free_bufs(struct full_state *s)
{
	struct backend *be = s->p.be;
	for (int l = 0; l < s->p.n_layers; l++) {
		if (s->k[l])
			be->ops->buf_free(be->ctx, s->k[l]);
		if (s->v[l])
			be->ops->buf_free(be->ctx, s->v[l]);
	}
}

static void full_destroy(void *st)
{
	struct full_state *s = st;
	if (!s)
		return;
	full_free_bufs(s);
	kv_wt_free(&s->wt);
	free(s->k);
	free(s->v);
	free(s);
}

static int full_create(const struct kv_seq_params *p, void **st)
{
	if (!p->be || p->n_layers <= 0 || p->max_tokens <= 0 || p->attn.n_kv_heads <= 0 ||
	    p->attn.head_dim <= 0)
		return -EINVAL;
	struct full_state *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->p = *p;
	/* `full` needs the page size only to address the host copy's blocks: a given page is
	 * taken as it is, the other knobs (another policy's) are not its to check. */
	int ret = p->host && !p->opts.page ? kvcache_resolve_opts(&s->p.opts, p->max_tokens) : 0;
	ret = ret ?: kv_wt_init(&s->wt, p->be, p->host, &p->attn, p->host ? s->p.opts.page : 1);
	if (ret) {
		free(s);
		return ret;
	}
	s->row_bytes = (size_t)p->attn.n_kv_heads * (size_t)p->attn.head_dim *
		       dtype_size(p->attn.kv_dtype);
	s->k = calloc((size_t)p->n_layers, sizeof *s->k);
	s->v = calloc((size_t)p->n_layers, sizeof *s->v);
	if (!s->k || !s->v) {
		full_destroy(s);
		return -ENOMEM;
	}
	*st = s;
	return 0;
}

/* Grows every layer's buffers to hold need rows; on failure the old buffers stay intact. */
static int full_grow(struct full_state *s, int64_t need)
{
	struct backend *be = s->p.be;
	int64_t cap = s->cap ? s->cap : 256;
	while (cap < need)
		cap *= 2;
	if (cap > s->p.max_tokens)
		cap = s->p.max_tokens;
	int L = s->p.n_layers;
	void **nk = calloc((size_t)L, sizeof *nk), **nv = calloc((size_t)L, sizeof *nv);
	int ret = nk && nv ? 0 : -ENOMEM;
	for (int l = 0; l < L && !ret; l++) {
		nk[l] = be->ops->buf_alloc(be->ctx, (size_t)cap * s->row_bytes);
		nv[l] = be->ops->buf_alloc(be->ctx, (size_t)cap * s->row_bytes);
		if (!nk[l] || !nv[l])
			ret = -ENOMEM;
		else if (s->len)
			ret = be->ops->copy(be->ctx, nk[l], s->k[l], (size_t)s->len * s->row_bytes) ?:
			      be->ops->copy(be->ctx, nv[l], s->v[l], (size_t)s->len * s->row_bytes);
	}
	if (ret) {
		for (int l = 0; nk && nv && l < L; l++) {
			if (nk[l])
				be->ops->buf_free(be->ctx, nk[l]);
			if (nv[l])
				be->ops->buf_free(be->ctx, nv[l]);
		}
		free(nk);
		free(nv);
		return ret;
	}
	full_free_bufs(s);
	free(s->k);
	free(s->v);
	s->k = nk;
	s->v = nv;
	s->cap = cap;
	return 0;
}

static int full_step_begin(void *st, int64_t n)
{
	struct full_state *s = st;
	if (n <= 0)
		return -EINVAL;
	if (s->len + n > s->p.max_tokens)
		return -ENOSPC;
	if (s->len + n > s->cap) {
		int ret = full_grow(s, s->len + n);
		if (ret)
			return ret;
	}
	s->pending = n;
	return 0;
}

static int full_append(void *st, int layer, const float *k, const float *v, int64_t n)
{
	struct full_state *s = st;
	struct backend *be = s->p.be;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	int64_t per_row = (int64_t)s->p.attn.n_kv_heads * s->p.attn.head_dim;
	size_t off = (size_t)s->len * s->row_bytes;
	enum fkv_dtype t = s->p.attn.kv_dtype;
	int ret = be->ops->convert(be->ctx, (char *)s->k[layer] + off, t, k, n * per_row) ?:
		  be->ops->convert(be->ctx, (char *)s->v[layer] + off, t, v, n * per_row);
	return ret ?: kv_wt_put(&s->wt, layer, s->len, k, v, n);
}

/* The one dense span a decode query of the layer reads: with a sliding window only the
 * window's tail of the cache. */
static struct backend_kv_span decode_span(const struct full_state *s, int layer)
{
	int64_t n_ctx = s->len + 1;
	int64_t first = s->p.attn.window > 0 && n_ctx > s->p.attn.window ?
			n_ctx - s->p.attn.window : 0;
	size_t off = (size_t)first * s->row_bytes;
	return (struct backend_kv_span){
		.k = (char *)s->k[layer] + off, .v = (char *)s->v[layer] + off,
		.n = n_ctx - first,
		.row_stride = (int64_t)s->p.attn.n_kv_heads * s->p.attn.head_dim,
	};
}

static int full_attend(void *st, int layer, float *out, const float *q, int64_t n)
{
	struct full_state *s = st;
	struct backend *be = s->p.be;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	int64_t n_ctx = s->len + n;
	if (n == 1) {
		struct backend_kv_span span = decode_span(s, layer);
		s->attended += span.n;
		return be->ops->attn_decode(be->ctx, out, q, &span, 1, &s->p.attn);
	}
	s->attended += s->p.attn.window > 0 && n_ctx > s->p.attn.window ? s->p.attn.window : n_ctx;
	return be->ops->attn_prefill(be->ctx, out, q, n, s->k[layer], s->v[layer], n_ctx,
				     &s->p.attn);
}

/* A decode row is the one span of decode_span; prefill rows attend here. */
static int full_attend_prepare(void *st, int layer, float *out, const float *q, int64_t n,
			       struct backend_attn_item *it)
{
	struct full_state *s = st;
	if (n != 1) {
		int ret = full_attend(st, layer, out, q, n);
		return ret ? ret : 1;
	}
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	*it = (struct backend_attn_item){ .span = decode_span(s, layer), .a = s->p.attn };
	s->attended += it->span.n;
	return 0;
}

static int full_attend_finish(void *st, int layer, const float *q, int64_t ns)
{
	(void)st, (void)layer, (void)q, (void)ns;
	return 0;
}

static void full_step_end(void *st)
{
	struct full_state *s = st;
	s->len += s->pending;
	s->pending = 0;
}

static int64_t full_length(void *st)
{
	return ((struct full_state *)st)->len;
}

static void full_stats(void *st, struct kv_stats *out)
{
	struct full_state *s = st;
	*out = (struct kv_stats){
		.tokens = s->len,
		.capacity = s->cap,
		.device_bytes = 2 * (int64_t)s->p.n_layers * s->cap * (int64_t)s->row_bytes,
		.attended = s->attended,
	}; /* sum: zero */
}

/* Reloads [0, len) of every layer from the host copy into fresh buffers. */
static int full_restore(void *st, int64_t len)
{
	struct full_state *s = st;
	struct backend *be = s->p.be;
	if (!s->wt.host || len < 0 || len > s->p.max_tokens || s->len || s->pending)
		return -EINVAL;
	if (!len)
		return 0;
	int ret = len > s->cap ? full_grow(s, len) : 0;
	size_t n = (size_t)len * s->p.attn.n_kv_heads * s->p.attn.head_dim;
	float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
	void *kt = malloc((size_t)len * s->row_bytes), *vt = malloc((size_t)len * s->row_bytes);
	if (!ret && (!k || !v || !kt || !vt))
		ret = -ENOMEM;
	enum fkv_dtype t = s->p.attn.kv_dtype;
	for (int l = 0; l < s->p.n_layers && !ret; l++) {
		ret = kv_wt_load(&s->wt, l, 0, len, k, v);
		if (ret)
			break;
		dtype_from_f32(kt, k, t, n);
		dtype_from_f32(vt, v, t, n);
		ret = be->ops->upload(be->ctx, s->k[l], kt, (size_t)len * s->row_bytes) ?:
		      be->ops->upload(be->ctx, s->v[l], vt, (size_t)len * s->row_bytes);
	}
	free(k);
	free(v);
	free(kt);
	free(vt);
	if (!ret)
		s->len = len;
	return ret;
}

const struct kv_policy_ops kv_policy_full = {
	.name = "full",
	.create = full_create,
	.destroy = full_destroy,
	.step_begin = full_step_begin,
	.layer_begin = NULL,
	.append = full_append,
	.attend = full_attend,
	.attend_prepare = full_attend_prepare,
	.attend_finish = full_attend_finish,
	.layer_end = NULL,
	.step_end = full_step_end,
	.length = full_length,
	.stats = full_stats,
	.layer_stats = NULL,
	.restore = full_restore,
};

/* Every built policy; retrieval policies add a line here. */
static const struct kv_policy_ops *const policies[] = {
	&kv_policy_full,
	&kv_policy_streaming,
	&kv_policy_quest,
	&kv_policy_freekv,
	&kv_policy_hardkv,
	&kv_policy_refreshkv,
	&kv_policy_specache,
};

const struct kv_policy_ops *kvcache_policy(const char *name)
{
	for (size_t i = 0; i < sizeof policies / sizeof *policies; i++)
		if (!strcmp(policies[i]->name, name))
			return policies[i];
	return NULL;
}

const char *kvcache_policy_names(void)
{
	static char names[256];
	if (!names[0])
		for (size_t i = 0; i < sizeof policies / sizeof *policies; i++)
			snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
				 i ? ", " : "", policies[i]->name);
	return names;
}
