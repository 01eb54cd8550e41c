/* policy_specache — the `specache` KV policy (docs/design.md §5 "`specache` — exact semantics"):
 * a low-bit KIVI copy of every position below tq on the device, the residual above it in the KV
 * dtype, and k exact rows per KV head fetched for each decode step from the host copy, chosen
 * by the attention of a speculative token run beside the previous step. The state and how it
 * moves: specache.h. The engine runs the two rows of a step and the pre-step
 * (kvcache.h, step_begin_keep). */
#include "specache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

static void bfree(struct specache *s, void *p)
{
	if (p)
		s->p.be->ops->buf_free(s->p.be->ctx, p);
}

static void *balloc(struct specache *s, size_t bytes)
{
	return s->p.be->ops->buf_alloc(s->p.be->ctx, bytes);
}

static size_t cb_of(const struct specache *s)
{
	return (size_t)s->p.attn.head_dim * s->bits / 8;
}

static size_t nvg_of(const struct specache *s)
{
	const int d = s->p.attn.head_dim, gv = s->P < d ? s->P : d;
	return (size_t)((d + gv - 1) / gv);
}

/* Bytes of the four KIVI arrays for cap positions: key codes, key (z, s), value codes, value
 * (z, s). */
static void kivi_sizes(const struct specache *s, int64_t cap, size_t sz[4])
{
	const size_t H = (size_t)s->p.attn.n_kv_heads, d = (size_t)s->p.attn.head_dim;
	sz[0] = (size_t)cap * H * cb_of(s);
	sz[1] = (size_t)(cap / s->P) * H * d * 2 * sizeof(float);
	sz[2] = sz[0];
	sz[3] = (size_t)cap * H * nvg_of(s) * 2 * sizeof(float);
}

static void kivi_release(struct specache *s, struct backend_kivi *q)
{
	bfree(s, q->kc);
	bfree(s, q->kzs);
	bfree(s, q->vc);
	bfree(s, q->vzs);
	q->kc = q->vc = NULL;
	q->kzs = q->vzs = NULL;
}

static void layer_free(struct specache *s, struct spec_layer *L)
{
	kivi_release(s, &L->q);
	void *bufs[] = { L->rk, L->rv, L->ak, L->av, L->fk, L->fv, L->fpos_b };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		bfree(s, bufs[i]);
	free(L->fpos);
}

static void spec_destroy(void *st)
{
	struct specache *s = st;
	if (!s)
		return;
	/* The fetch thread first: no job may still write a staging buffer being freed. */
	sfetch_free(s->fetch);
	for (int l = 0; s->L && l < s->p.n_layers; l++)
		layer_free(s, &s->L[l]);
	bfree(s, s->probs_b);
	bfree(s, s->dense_k);
	bfree(s, s->dense_v);
	kv_wt_free(&s->wt);
	free(s->L);
	free(s->probs_h);
	free(s->want);
	free(s->heap);
	free(s->hk);
	free(s->hv);
	free(s->ht);
	free(s->pairs);
	free(s);
}

/* Grows the KIVI buffers of a layer to hold need positions, keeping [0, tq). */
static int grow_kivi(struct specache *s, struct spec_layer *L, int64_t need)
{
	if (need <= L->qcap)
		return 0;
	int64_t cap = L->qcap ? L->qcap : ((256 + s->P - 1) / s->P) * s->P;
	while (cap < need)
		cap *= 2;
	size_t sz[4], used[4];
	kivi_sizes(s, cap, sz);
	kivi_sizes(s, L->tq, used);
	struct backend_kivi q = L->q;
	void **dst[4] = { (void **)&q.kc, (void **)&q.kzs, (void **)&q.vc, (void **)&q.vzs };
	void *src[4] = { L->q.kc, L->q.kzs, L->q.vc, L->q.vzs };
	int ret = 0;
	for (int i = 0; i < 4; i++)
		*dst[i] = NULL;
	for (int i = 0; i < 4 && !ret; i++) {
		if (!(*dst[i] = balloc(s, sz[i])))
			ret = -ENOMEM;
		else if (used[i])
			ret = s->p.be->ops->copy(s->p.be->ctx, *dst[i], src[i], used[i]);
	}
	if (ret) {
		kivi_release(s, &q);
		return ret;
	}
	kivi_release(s, &L->q);
	L->q = q;
	L->qcap = cap;
	return 0;
}

/* Grows the residual (and its twin) of a layer to hold need rows, keeping the len - tq it
 * holds. */
static int grow_res(struct specache *s, struct spec_layer *L, int64_t need)
{
	if (need <= L->rcap)
		return 0;
	int64_t cap = L->rcap ? L->rcap : 64;
	while (cap < need)
		cap *= 2;
	if (cap > s->p.max_tokens + 2)
		cap = need > s->p.max_tokens + 2 ? need : s->p.max_tokens + 2;
	const size_t bytes = (size_t)cap * s->row_bytes;
	void *k = balloc(s, bytes), *v = balloc(s, bytes);
	void *ak = L->full ? NULL : balloc(s, bytes), *av = L->full ? NULL : balloc(s, bytes);
	int ret = k && v && (L->full || (ak && av)) ? 0 : -ENOMEM;
	const size_t keep = (size_t)(s->len - L->tq) * s->row_bytes;
	if (!ret && keep)
		ret = s->p.be->ops->copy(s->p.be->ctx, k, L->rk, keep)
		   ?: s->p.be->ops->copy(s->p.be->ctx, v, L->rv, keep);
	if (ret) {
		bfree(s, k);
		bfree(s, v);
		bfree(s, ak);
		bfree(s, av);
		return ret;
	}
	bfree(s, L->rk);
	bfree(s, L->rv);
	bfree(s, L->ak);
	bfree(s, L->av);
	L->rk = k;
	L->rv = v;
	L->ak = ak;
	L->av = av;
	L->rcap = cap;
	return 0;
}

/* Forgets a layer's exact rows: the next decode step reads none until one selects them. */
static void drop_rows(struct specache *s, struct spec_layer *L)
{
	for (int i = 0; i < s->p.attn.n_kv_heads * s->K; i++)
		L->fpos[i] = -1;
	L->stale = true;
}

static int layer_init(struct specache *s, struct spec_layer *L, int l)
{
	const size_t H = (size_t)s->p.attn.n_kv_heads, K = (size_t)s->K;
	const size_t rows = H * K * (size_t)s->p.attn.head_dim * dtype_size(s->p.attn.kv_dtype);
	L->full = l < s->full_layers;
	L->q = (struct backend_kivi){ .bits = s->bits, .p = s->P,
				      .gv = s->P < s->p.attn.head_dim ? s->P : s->p.attn.head_dim,
				      .n_kv = (int)H, .d = s->p.attn.head_dim };
	L->fpos = malloc(H * K * sizeof *L->fpos);
	if (!L->full) {
		L->fk = balloc(s, rows);
		L->fv = balloc(s, rows);
		L->fpos_b = balloc(s, H * K * sizeof *L->fpos_b);
	}
	if (!L->fpos || (!L->full && (!L->fk || !L->fv || !L->fpos_b)))
		return -ENOMEM;
	drop_rows(s, L);
	return grow_res(s, L, L->full ? 256 : s->W + s->P + 2);
}

static int spec_create(const struct kv_seq_params *p, void **st)
{
	const struct backend_ops *o = p->be ? p->be->ops : NULL;
	if (!o || p->n_layers <= 0 || p->max_tokens <= 0 || p->max_tokens > INT32_MAX - 2 ||
	    p->attn.n_kv_heads <= 0 || p->attn.head_dim <= 0 ||
	    p->attn.n_heads % p->attn.n_kv_heads || p->attn.window)
		return -EINVAL;
	if (!o->kivi_quant || !o->attn_kivi)
		return -EOPNOTSUPP;
	/* The exact rows come from the host copy. */
	if (!p->host)
		return -EINVAL;
	struct specache *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->p = *p;
	struct kv_policy_opts *op = &s->p.opts;
	int ret = 0;
	if (!op->page && !op->window)
		ret = kvcache_resolve_opts(op, p->max_tokens);
	s->P = op->page;
	s->W = op->window;
	s->bits = op->kv_bits ? op->kv_bits : 2;
	s->K = op->spec_topk ? op->spec_topk : 64;
	if (!ret && (s->P <= 0 || s->W < s->P || s->W % s->P || (s->bits != 1 && s->bits != 2) ||
		     s->K <= 0 || (p->attn.head_dim * s->bits) % 8 || op->full_layers < 0))
		ret = -EINVAL;
	s->full_layers = op->full_layers < p->n_layers ? op->full_layers : p->n_layers;
	s->row_bytes = (size_t)p->attn.n_kv_heads * p->attn.head_dim *
		       dtype_size(p->attn.kv_dtype);
	if (!ret)
		ret = kv_wt_init(&s->wt, p->be, p->host, &p->attn, s->P);
	if (ret) {
		free(s);
		return ret;
	}
	s->L = calloc((size_t)p->n_layers, sizeof *s->L);
	s->want = malloc((size_t)s->K * sizeof *s->want);
	s->heap = malloc((size_t)s->K * sizeof *s->heap);
	s->pairs = malloc((size_t)s->K * 2 * sizeof *s->pairs);
	ret = s->L && s->want && s->heap && s->pairs ? 0 : -ENOMEM;
	for (int l = 0; l < p->n_layers && !ret; l++)
		ret = layer_init(s, &s->L[l], l);
	if (!ret) {
		struct sfetch_opts fo = { .host = p->host, .g = s->wt.g, .n_layers = p->n_layers,
					  .k = s->K };
		ret = sfetch_new(&fo, &s->fetch);
	}
	if (ret) {
		spec_destroy(s);
		return ret;
	}
	*st = s;
	return 0;
}

/* Quantises the groups the previous steps left below tq (from the residual's first rows), then
 * compacts the residual into its twin. */
static int settle_quant(struct specache *s, struct spec_layer *L)
{
	const int64_t target = L->full ? 0 : specache_tq(s, s->len);
	if (target <= L->tq)
		return 0;
	struct backend *be = s->p.be;
	const int64_t n = target - L->tq, rest = s->len - target;
	int ret = grow_kivi(s, L, target)
	       ?: be->ops->kivi_quant(be->ctx, &L->q, L->tq, L->rk, L->rv, n, s->p.attn.kv_dtype);
	if (!ret && rest)
		ret = be->ops->copy(be->ctx, L->ak, (char *)L->rk + (size_t)n * s->row_bytes,
				    (size_t)rest * s->row_bytes)
		   ?: be->ops->copy(be->ctx, L->av, (char *)L->rv + (size_t)n * s->row_bytes,
				    (size_t)rest * s->row_bytes);
	if (ret)
		return ret;
	void *t = L->rk;
	L->rk = L->ak;
	L->ak = t;
	t = L->rv;
	L->rv = L->av;
	L->av = t;
	L->tq = target;
	return 0;
}

static int begin(struct specache *s, int64_t n, int64_t keep, bool spec)
{
	if (n <= 0 || keep < 0 || keep > n)
		return -EINVAL;
	/* A speculative row may sit one past the context: only kept tokens count against it. */
	if (s->len + (spec ? keep : n) > s->p.max_tokens)
		return -ENOSPC;
	for (int l = 0; l < s->p.n_layers; l++) {
		struct spec_layer *L = &s->L[l];
		int ret = settle_quant(s, L) ?: grow_res(s, L, s->len + n - L->tq);
		if (ret)
			return ret;
	}
	/* The probabilities a decode step selects from: positions below the next step's tq. */
	const int64_t need_p = s->full_layers < s->p.n_layers ? specache_tq(s, s->len + keep) : 0;
	if (spec && need_p > s->pcap) {
		int64_t cap = s->pcap ? s->pcap : 256;
		while (cap < need_p)
			cap *= 2;
		const size_t bytes = (size_t)cap * s->p.attn.n_kv_heads * sizeof(float);
		float *b = balloc(s, bytes), *h = malloc(bytes);
		if (!b || !h) {
			bfree(s, b);
			free(h);
			return -ENOMEM;
		}
		bfree(s, s->probs_b);
		free(s->probs_h);
		s->probs_b = b;
		s->probs_h = h;
		s->pcap = cap;
	}
	s->pending = n;
	s->keep = keep;
	s->spec = spec;
	return 0;
}

static int spec_step_begin(void *st, int64_t n)
{
	return begin(st, n, n, false);
}

static int spec_step_begin_keep(void *st, int64_t n, int64_t keep)
{
	return begin(st, n, keep, true);
}

/* Waits for the rows the previous step fetched for this layer and uploads them (with their
 * positions) when they changed. A failed fetch leaves the layer with no exact row. */
static int settle_fetch(struct specache *s, struct spec_layer *L, int layer)
{
	struct sfetch_done dn;
	int ret = sfetch_wait(s->fetch, layer, &dn);
	L->st.tokens_fetched += dn.rows;
	L->st.bytes_recalled += dn.bytes;
	L->st.ns_recall_wait += dn.ns_waited;
	L->st.ns_recall_hidden += dn.ns_hidden;
	if (ret)
		drop_rows(s, L);
	if (!L->stale)
		return ret;
	struct backend *be = s->p.be;
	const size_t H = (size_t)s->p.attn.n_kv_heads;
	const size_t half = H * s->K * s->p.attn.head_dim * dtype_size(s->p.attn.kv_dtype);
	const char *stage = sfetch_stage(s->fetch, layer);
	int up = be->ops->upload(be->ctx, L->fk, stage, half)
	      ?: be->ops->upload(be->ctx, L->fv, stage + half, half)
	      ?: be->ops->upload(be->ctx, L->fpos_b, L->fpos, H * s->K * sizeof *L->fpos);
	if (!up)
		L->stale = false;
	return ret ? ret : up;
}

static int spec_append(void *st, int layer, const float *k, const float *v, int64_t n)
{
	struct specache *s = st;
	struct backend *be = s->p.be;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	struct spec_layer *L = &s->L[layer];
	int ret = L->full ? 0 : settle_fetch(s, L, layer);
	if (ret)
		return ret;
	const size_t off = (size_t)(s->len - L->tq) * s->row_bytes;
	const int64_t cnt = n * s->p.attn.n_kv_heads * s->p.attn.head_dim;
	const enum fkv_dtype t = s->p.attn.kv_dtype;
	return be->ops->convert(be->ctx, (char *)L->rk + off, t, k, cnt)
	    ?: be->ops->convert(be->ctx, (char *)L->rv + off, t, v, cnt)
	    ?: kv_wt_put(&s->wt, layer, s->len, k, v, s->keep);
}

static int grow_dense(struct specache *s, int64_t need)
{
	if (need <= s->dense_cap)
		return 0;
	int64_t cap = s->dense_cap ? s->dense_cap : 256;
	while (cap < need)
		cap *= 2;
	void *k = balloc(s, (size_t)cap * s->row_bytes), *v = balloc(s, (size_t)cap * s->row_bytes);
	if (!k || !v) {
		bfree(s, k);
		bfree(s, v);
		return -ENOMEM;
	}
	bfree(s, s->dense_k);
	bfree(s, s->dense_v);
	s->dense_k = k;
	s->dense_v = v;
	s->dense_cap = cap;
	return 0;
}

/* Host scratch for n rows: f32 loads (hk, hv), and one typed row buffer (ht). */
static int grow_host(struct specache *s, int64_t n)
{
	if (n <= s->hcap)
		return 0;
	const size_t bytes = (size_t)n * s->p.attn.n_kv_heads * s->p.attn.head_dim * sizeof(float);
	void *k = malloc(bytes), *v = malloc(bytes), *t = malloc((size_t)n * s->row_bytes);
	if (!k || !v || !t) {
		free(k);
		free(v);
		free(t);
		return -ENOMEM;
	}
	free(s->hk);
	free(s->hv);
	free(s->ht);
	s->hk = k;
	s->hv = v;
	s->ht = t;
	s->hcap = n;
	return 0;
}

/* Positions [t0, t1) of a layer from the host copy into backend rows dk, dv (KV dtype). */
static int load_rows(struct specache *s, int layer, int64_t t0, int64_t t1, void *dk, void *dv)
{
	struct backend *be = s->p.be;
	const int64_t n = t1 - t0;
	const size_t cnt = (size_t)n * s->p.attn.n_kv_heads * s->p.attn.head_dim;
	const size_t bytes = (size_t)n * s->row_bytes;
	const enum fkv_dtype t = s->p.attn.kv_dtype;
	int ret = grow_host(s, n) ?: kv_wt_load(&s->wt, layer, t0, t1, s->hk, s->hv);
	if (ret)
		return ret;
	if (t == FKV_F32)
		return be->ops->upload(be->ctx, dk, s->hk, bytes)
		    ?: be->ops->upload(be->ctx, dv, s->hv, bytes);
	dtype_from_f32(s->ht, s->hk, t, cnt);
	ret = be->ops->upload(be->ctx, dk, s->ht, bytes);
	dtype_from_f32(s->ht, s->hv, t, cnt);
	return ret ?: be->ops->upload(be->ctx, dv, s->ht, bytes);
}

/* A dense step (prefill): exact causal attention over every position, those below tq read
 * from the host copy. The exact rows are forgotten: positions moved on. */
static int attend_dense(struct specache *s, struct spec_layer *L, int layer, float *out,
			const float *q, int64_t n)
{
	struct backend *be = s->p.be;
	const int64_t n_ctx = s->len + n;
	s->attended += n_ctx;
	if (!L->full)
		drop_rows(s, L);
	if (!L->tq)
		return be->ops->attn_prefill(be->ctx, out, q, n, L->rk, L->rv, n_ctx, &s->p.attn);
	const size_t res = (size_t)(n_ctx - L->tq) * s->row_bytes;
	const size_t at = (size_t)L->tq * s->row_bytes;
	int ret = grow_dense(s, n_ctx) ?: load_rows(s, layer, 0, L->tq, s->dense_k, s->dense_v)
	       ?: be->ops->copy(be->ctx, (char *)s->dense_k + at, L->rk, res)
	       ?: be->ops->copy(be->ctx, (char *)s->dense_v + at, L->rv, res);
	return ret ?: be->ops->attn_prefill(be->ctx, out, q, n, s->dense_k, s->dense_v, n_ctx,
					    &s->p.attn);
}

static int by_pos(const void *a, const void *b)
{
	const int32_t *x = a, *y = b;
	return (x[0] > y[0]) - (x[0] < y[0]);
}

/* The next step's exact rows of head h: the top-k of the last row's probabilities, keeping the
 * rows already held in their slots (a merge of both lists by position); the others are listed
 * for the fetch stream at *n. */
static void plan_head(struct specache *s, struct spec_layer *L, int h, const float *prob,
		      int64_t n_prob, struct sfetch_row *rows, int *n)
{
	int32_t *fp = L->fpos + (size_t)h * s->K, *pr = s->pairs;
	const int cnt = specache_topk(prob, n_prob, s->K, s->want, s->heap);
	int32_t *held = s->heap; /* free again: flags per wanted position */
	int np = 0;
	for (int slot = 0; slot < s->K; slot++)
		if (fp[slot] >= 0) {
			pr[2 * np] = fp[slot];
			pr[2 * np++ + 1] = slot;
		}
	qsort(pr, (size_t)np, 2 * sizeof *pr, by_pos);
	int a = 0;
	for (int i = 0; i < cnt; i++) {
		for (; a < np && pr[2 * a] < s->want[i]; a++)
			fp[pr[2 * a + 1]] = -1;
		held[i] = a < np && pr[2 * a] == s->want[i];
		a += held[i];
	}
	for (; a < np; a++)
		fp[pr[2 * a + 1]] = -1;
	for (int i = 0, slot = 0; i < cnt; i++) {
		if (held[i])
			continue;
		while (fp[slot] >= 0)
			slot++;
		fp[slot] = s->want[i];
		rows[(*n)++] = (struct sfetch_row){ .head = h, .slot = slot, .pos = s->want[i] };
	}
}

static int check_fail(int layer, const char *what)
{
	fprintf(stderr, "policy specache: layer %d: %s\n", layer, what);
	return -EIO;
}

/* Debug (debug_invariants), at a decode step of a layer past full_layers, its rows appended:
 * the residual holds the host copy's rows [tq, len + keep); the KIVI copy is what kivi_quant
 * makes of the host copy's rows [0, tq) in one go; every exact row the step reads is the host
 * copy's row of its position, below tq, and the device's positions are the host's. */
static int check_layer(struct specache *s, int layer)
{
	struct spec_layer *L = &s->L[layer];
	struct backend *be = s->p.be;
	const int H = s->p.attn.n_kv_heads;
	const size_t rb = s->row_bytes, hb = rb / (size_t)H; /* a position's row; one head's */
	const int64_t top = s->len + s->keep, nr = top - L->tq;
	size_t sz[4];
	kivi_sizes(s, L->tq, sz);
	size_t big = (size_t)(nr > L->tq ? nr : L->tq) * rb;
	for (int i = 0; i < 4; i++)
		big = sz[i] > big ? sz[i] : big;
	char *a = malloc(big), *b = malloc(big);
	struct backend_kivi q = L->q;
	q.kc = q.vc = NULL;
	q.kzs = q.vzs = NULL;
	int ret = a && b ? grow_dense(s, L->tq > nr ? L->tq : nr) : -ENOMEM;
	/* Residual. */
	if (!ret && nr)
		ret = load_rows(s, layer, L->tq, top, s->dense_k, s->dense_v);
	for (int kv = 0; kv < 2 && !ret && nr; kv++) {
		ret = be->ops->download(be->ctx, a, kv ? L->rv : L->rk, (size_t)nr * rb)
		   ?: be->ops->download(be->ctx, b, kv ? s->dense_v : s->dense_k, (size_t)nr * rb);
		if (!ret && memcmp(a, b, (size_t)nr * rb))
			ret = check_fail(layer, "residual differs from the host copy");
	}
	/* The KIVI copy, against a fresh quantisation of the host copy. */
	if (!ret && L->tq) {
		void **dst[4] = { (void **)&q.kc, (void **)&q.kzs, (void **)&q.vc, (void **)&q.vzs };
		const void *mine[4] = { L->q.kc, L->q.kzs, L->q.vc, L->q.vzs };
		for (int i = 0; i < 4 && !ret; i++)
			if (!(*dst[i] = balloc(s, sz[i])))
				ret = -ENOMEM;
		ret = ret ?: load_rows(s, layer, 0, L->tq, s->dense_k, s->dense_v)
		    ?: be->ops->kivi_quant(be->ctx, &q, 0, s->dense_k, s->dense_v, L->tq,
					   s->p.attn.kv_dtype);
		for (int i = 0; i < 4 && !ret; i++) {
			ret = be->ops->download(be->ctx, a, mine[i], sz[i])
			   ?: be->ops->download(be->ctx, b, *dst[i], sz[i]);
			if (!ret && memcmp(a, b, sz[i]))
				ret = check_fail(layer, "KIVI copy differs from the host copy's");
		}
	}
	kivi_release(s, &q);
	/* Exact rows: positions on the device as on the host, rows as in the host copy. */
	const size_t n_f = (size_t)H * s->K, fb = n_f * hb;
	int32_t *dpos = malloc(n_f * sizeof *dpos);
	char *fk = malloc(2 * fb);
	if (!ret && (!dpos || !fk))
		ret = -ENOMEM;
	ret = ret ?: be->ops->download(be->ctx, dpos, L->fpos_b, n_f * sizeof *dpos)
	    ?: be->ops->download(be->ctx, fk, L->fk, fb)
	    ?: be->ops->download(be->ctx, fk + fb, L->fv, fb);
	if (!ret && s->keep && memcmp(dpos, L->fpos, n_f * sizeof *dpos))
		ret = check_fail(layer, "exact row positions on the device are stale");
	for (size_t i = 0; i < n_f && !ret && s->keep; i++) {
		const int32_t pos = L->fpos[i];
		if (pos < 0)
			continue;
		const int h = (int)(i / (size_t)s->K);
		if (pos >= L->tq)
			ret = check_fail(layer, "an exact row is not below tq");
		ret = ret ?: load_rows(s, layer, pos, pos + 1, s->dense_k, s->dense_v)
		    ?: be->ops->download(be->ctx, a, s->dense_k, rb)
		    ?: be->ops->download(be->ctx, a + rb, s->dense_v, rb);
		if (!ret && (memcmp(fk + i * hb, a + (size_t)h * hb, hb) ||
			     memcmp(fk + fb + i * hb, a + rb + (size_t)h * hb, hb)))
			ret = check_fail(layer, "an exact row differs from the host copy");
	}
	free(dpos);
	free(fk);
	free(a);
	free(b);
	return ret;
}

/* A decode step (step_begin_keep): attn_kivi over the KIVI copy, the exact rows (none at a
 * pre-step) and the residual; then the next step's rows from the last row's probabilities. */
static int attend_spec(struct specache *s, struct spec_layer *L, int layer, float *out,
		       const float *q, int64_t n)
{
	struct backend *be = s->p.be;
	const int H = s->p.attn.n_kv_heads;
	const bool pre = s->keep == 0;
	const int64_t n_prob = L->full ? 0 : specache_tq(s, s->len + s->keep);
	if (pre && !L->full)
		drop_rows(s, L);
	struct backend_kivi_attn ka = {
		.q = &L->q, .n_quant = L->tq, .fk = L->fk, .fv = L->fv, .fpos = L->fpos_b,
		.n_f = pre || L->full ? 0 : s->K, .k = L->rk, .v = L->rv,
		.n_dense = s->len + n - L->tq, .probs = n_prob ? s->probs_b : NULL,
		.n_prob = n_prob,
	};
	s->attended += s->len + n;
	int ret = s->p.opts.debug_invariants && !L->full ? check_layer(s, layer) : 0;
	const int64_t t0 = (int64_t)clock_ns();
	ret = ret ?: be->ops->attn_kivi(be->ctx, out, q, (int)n, &ka, &s->p.attn);
	const int64_t t1 = (int64_t)clock_ns();
	L->st.ns_attend += t1 - t0;
	if (ret || L->full)
		return ret;
	L->st.steps += !pre && (L->tq || n_prob); /* a step with a quantised past */
	if (!n_prob) {
		drop_rows(s, L);
		return 0;
	}
	ret = be->ops->download(be->ctx, s->probs_h, s->probs_b,
				(size_t)H * n_prob * sizeof *s->probs_h);
	if (ret)
		return ret;
	struct sfetch_row *rows = sfetch_rows(s->fetch, layer);
	int nr = 0;
	for (int h = 0; h < H; h++)
		plan_head(s, L, h, s->probs_h + (size_t)h * n_prob, n_prob, rows, &nr);
	L->stale = true;
	L->st.ns_select += (int64_t)clock_ns() - t1;
	ret = sfetch_submit(s->fetch, layer, nr);
	if (ret)
		drop_rows(s, L);
	return ret;
}

static int spec_attend(void *st, int layer, float *out, const float *q, int64_t n)
{
	struct specache *s = st;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	struct spec_layer *L = &s->L[layer];
	return s->spec ? attend_spec(s, L, layer, out, q, n) : attend_dense(s, L, layer, out, q, n);
}

static void spec_step_end(void *st)
{
	struct specache *s = st;
	s->len += s->keep;
	s->pending = s->keep = 0;
	/* The dense buffers are scratch: between steps the device keeps the copy, the residual
	 * and the exact rows. */
	bfree(s, s->dense_k);
	bfree(s, s->dense_v);
	s->dense_k = s->dense_v = NULL;
	s->dense_cap = 0;
}

static int64_t spec_length(void *st)
{
	return ((struct specache *)st)->len;
}

static void spec_stats(void *st, struct kv_stats *out)
{
	struct specache *s = st;
	const size_t H = (size_t)s->p.attn.n_kv_heads;
	const size_t rows = H * s->K * s->p.attn.head_dim * dtype_size(s->p.attn.kv_dtype);
	*out = (struct kv_stats){ .tokens = s->len, .capacity = s->p.max_tokens,
				  .attended = s->attended };
	for (int l = 0; l < s->p.n_layers; l++) {
		const struct spec_layer *L = &s->L[l];
		size_t sz[4];
		kivi_sizes(s, L->tq, sz);
		out->device_bytes += (int64_t)(sz[0] + sz[1] + sz[2] + sz[3]) +
				     2 * (s->len - L->tq) * (int64_t)s->row_bytes +
				     (L->full ? 0 : 2 * (int64_t)rows);
		const struct kv_layer_stats *a = &L->st;
		struct kv_layer_stats *b = &out->sum;
		b->steps += a->steps;
		b->pages_selected += a->pages_selected;
		b->bytes_recalled += a->bytes_recalled;
		b->tokens_fetched += a->tokens_fetched;
		b->ns_select += a->ns_select;
		b->ns_recall_wait += a->ns_recall_wait;
		b->ns_recall_hidden += a->ns_recall_hidden;
		b->ns_attend += a->ns_attend;
	}
}

static int spec_layer_stats(void *st, int layer, struct kv_layer_stats *out)
{
	struct specache *s = st;
	if (layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	*out = s->L[layer].st;
	return 0;
}

/* Rebuilds every layer from the host copy: positions below tq quantised a chunk of groups at a
 * time (loaded, uploaded into the dense scratch, kivi_quant), the rest into the residual. */
static int spec_restore(void *st, int64_t len)
{
	struct specache *s = st;
	struct backend *be = s->p.be;
	if (!s->p.host || len < 0 || len > s->p.max_tokens || s->len || s->pending)
		return -EINVAL;
	const int64_t chunk = ((1024 + s->P - 1) / s->P) * s->P;
	int ret = 0;
	for (int l = 0; l < s->p.n_layers && !ret; l++) {
		struct spec_layer *L = &s->L[l];
		const int64_t tq = L->full ? 0 : specache_tq(s, len);
		ret = grow_kivi(s, L, tq) ?: grow_dense(s, chunk);
		for (int64_t t = 0; t < tq && !ret; t += chunk) {
			const int64_t e = t + chunk < tq ? t + chunk : tq;
			ret = load_rows(s, l, t, e, s->dense_k, s->dense_v)
			   ?: be->ops->kivi_quant(be->ctx, &L->q, t, s->dense_k, s->dense_v, e - t,
						  s->p.attn.kv_dtype);
		}
		L->tq = tq;
		ret = ret ?: grow_res(s, L, len - tq + 2);
		if (!ret && len > tq)
			ret = load_rows(s, l, tq, len, L->rk, L->rv);
	}
	spec_step_end(s); /* frees the scratch; nothing is pending */
	if (ret) {
		for (int l = 0; l < s->p.n_layers; l++)
			s->L[l].tq = 0;
		return ret;
	}
	s->len = len;
	return 0;
}

int specache_topk(const float *prob, int64_t n, int k, int32_t *out, int32_t *heap)
{
	if (n <= k) {
		for (int64_t i = 0; i < n; i++)
			out[i] = (int32_t)i;
		return (int)n;
	}
	/* A min-heap of the k best so far, worst at the root; "worse" is a lower probability,
	 * or an equal one at a higher position, so ties go to the lower position. */
#define WORSE(a, b) (prob[a] < prob[b] || (prob[a] == prob[b] && (a) > (b)))
	int m = 0;
	for (int64_t j = 0; j < n; j++) {
		int i;
		if (m < k) {
			for (i = m++; i && WORSE(j, heap[(i - 1) / 2]); i = (i - 1) / 2)
				heap[i] = heap[(i - 1) / 2];
			heap[i] = (int32_t)j;
			continue;
		}
		if (!WORSE(heap[0], j))
			continue;
		for (i = 0;;) {
			int c = 2 * i + 1;
			if (c >= k)
				break;
			if (c + 1 < k && WORSE(heap[c + 1], heap[c]))
				c++;
			if (!WORSE(heap[c], j))
				break;
			heap[i] = heap[c];
			i = c;
		}
		heap[i] = (int32_t)j;
	}
#undef WORSE
	/* Ascending positions: an insertion sort of k entries. */
	for (int i = 0; i < k; i++) {
		int32_t x = heap[i];
		int j = i;
		for (; j && out[j - 1] > x; j--)
			out[j] = out[j - 1];
		out[j] = x;
	}
	return k;
}

int specache_fetched(void *st, int layer, int head, int32_t *pos)
{
	struct specache *s = st;
	if (layer < 0 || layer >= s->p.n_layers || head < 0 || head >= s->p.attn.n_kv_heads)
		return -EINVAL;
	const int32_t *fp = s->L[layer].fpos + (size_t)head * s->K;
	int n = 0;
	for (int i = 0; i < s->K && !s->L[layer].full; i++) {
		if (fp[i] < 0)
			continue;
		int j = n++;
		for (; j && pos[j - 1] > fp[i]; j--)
			pos[j] = pos[j - 1];
		pos[j] = fp[i];
	}
	return n;
}

const struct kv_policy_ops kv_policy_specache = {
	.name = "specache",
	.create = spec_create,
	.destroy = spec_destroy,
	.step_begin = spec_step_begin,
	.layer_begin = NULL,
	.append = spec_append,
	.attend = spec_attend,
	.layer_end = NULL,
	.step_end = spec_step_end,
	.length = spec_length,
	.stats = spec_stats,
	.layer_stats = spec_layer_stats,
	.restore = spec_restore,
	.spec_rows = 1,
	.step_begin_keep = spec_step_begin_keep,
};
