/* policy_refresh — the refreshkv policy (docs/design.md §5 "refreshkv — exact semantics"; the
 * state is described in policy_refresh.h, the full step is refresh_full.c).
 *
 * Every decode step writes the token's K and V through to the host copy and keeps them in the
 * layer's `cur` row. While T <= B the row goes into slot T-1 and every head attends to all T
 * slots, in position order: `full`'s bits. Past the budget, at a retrieval layer: the first step
 * (and the first after a resume or a prefill) is a full step; after it, c counts the steps, and
 * when c is a multiple of Q the mean query is compared with q-bar: below s, a full step. Any
 * other step is partial: each head's next member in eviction order leaves, the current row
 * takes its slot, and the head attends to its B slots. A step retried after a failure repeats
 * the kind it had instead of deciding again. Prefill attends densely (the past from the host
 * copy), like the paged policies. */
#include "policy_refresh.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hostkv.h"
#include "refresh_select.h"

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void bfree(struct refresh *s, void *p)
{
	if (p)
		s->p.be->ops->buf_free(s->p.be->ctx, p);
}

static void refresh_destroy(void *st)
{
	struct refresh *s = st;
	if (!s)
		return;
	/* The recall threads go first: no job may still write a staging half being freed. */
	recall_free(s->rc);
	if (s->full)
		kv_policy_full.destroy(s->full);
	for (int l = 0; s->L && l < s->p.n_layers; l++) {
		struct rlayer *L = &s->L[l];
		bfree(s, L->slots);
		bfree(s, L->cur);
		free(L->set);
		free(L->evq);
		free(L->qbar);
	}
	bfree(s, s->logits);
	bfree(s, s->stream);
	bfree(s, s->dense_k);
	bfree(s, s->dense_v);
	kv_wt_free(&s->wt);
	free(s->L);
	free(s->hq);
	free(s->qm);
	free(s->hprobs);
	free(s->sel);
	free(s->npos);
	free(s->nu);
	free(s->nslot);
	free(s->fetch);
	free(s->order);
	free(s->tmp);
	free(s->map);
	free(s->spans);
	free(s->first);
	free(s->hrow);
	free(s->units);
	free(s);
}

/* The options refreshkv takes, checked (docs/design.md §5): B >= 8, Q >= 1, s in [-1, 2]. */
static int check_opts(const struct kv_policy_opts *o)
{
	if (o->page <= 0 || o->budget < 8 || o->refresh_stride < 1 ||
	    !(o->refresh_threshold >= -1.0f && o->refresh_threshold <= 2.0f) || o->full_layers < 0)
		return -EINVAL;
	return 0;
}

static int layer_init(struct refresh *s, struct rlayer *L)
{
	struct backend *be = s->p.be;
	const size_t HB = (size_t)s->n_kv * s->B;
	L->slots = be->ops->buf_alloc(be->ctx, 2 * (size_t)s->B * s->row * sizeof(float));
	L->cur = be->ops->buf_alloc(be->ctx, 2 * s->row * sizeof(float));
	L->set = malloc(HB * sizeof *L->set);
	L->evq = calloc(HB, sizeof *L->evq);
	L->qbar = calloc((size_t)s->d, sizeof *L->qbar);
	if (!L->slots || !L->cur || !L->set || !L->evq || !L->qbar)
		return -ENOMEM;
	for (size_t i = 0; i < HB; i++)
		L->set[i] = -1;
	L->need_full = true;
	L->last_T = -1;
	return 0;
}

static int refresh_create(const struct kv_seq_params *p, void **st)
{
	struct backend *be = p->be;
	if (!be || p->n_layers <= 0 || p->max_tokens <= 0 || p->max_tokens > INT32_MAX ||
	    p->attn.n_kv_heads <= 0 || p->attn.head_dim <= 0 ||
	    p->attn.n_heads % p->attn.n_kv_heads || !p->host)
		return -EINVAL;
	const struct backend_ops *ops = be->ops;
	if (!ops->attn_decode_heads || !ops->attn_scores || !ops->attn_accum || !ops->softmax ||
	    (!ops->host_memory && !ops->recall_units))
		return -EOPNOTSUPP;
	struct kv_policy_opts o = p->opts;
	if (!o.page && !o.budget && !o.sink && !o.window) {
		int ret = kvcache_resolve_opts(&o, p->max_tokens);
		if (ret)
			return ret;
	}
	if (check_opts(&o))
		return -EINVAL;
	struct refresh *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->p = *p;
	s->p.opts = o;
	s->B = o.budget < p->max_tokens ? o.budget : (int)p->max_tokens;
	s->Q = o.refresh_stride;
	s->thr = o.refresh_threshold;
	s->n_q = p->attn.n_heads;
	s->n_kv = p->attn.n_kv_heads;
	s->d = p->attn.head_dim;
	s->G = s->n_q / s->n_kv;
	s->P = o.page;
	s->row = (size_t)s->n_kv * s->d;
	s->full_layers = o.full_layers < p->n_layers ? o.full_layers : p->n_layers;
	s->direct = ops->host_memory;
	int ret = kv_wt_init(&s->wt, be, p->host, &p->attn, o.page);
	if (ret) {
		free(s);
		return ret;
	}
	const size_t HB = (size_t)s->n_kv * s->B;
	s->L = calloc((size_t)p->n_layers, sizeof *s->L);
	s->hq = calloc((size_t)s->n_q * s->d, sizeof *s->hq);
	s->qm = calloc((size_t)s->d, sizeof *s->qm);
	s->npos = malloc(HB * sizeof *s->npos);
	s->nu = malloc(HB * sizeof *s->nu);
	s->nslot = malloc(HB * sizeof *s->nslot);
	s->fetch = malloc(2 * HB * sizeof *s->fetch);
	s->order = malloc((size_t)s->B * sizeof *s->order);
	s->tmp = malloc((size_t)s->B * sizeof *s->tmp);
	s->map = malloc(6 * HB * sizeof *s->map);
	s->spans = malloc((size_t)s->n_kv * REFRESH_CHUNK_PAGES * sizeof *s->spans);
	s->first = malloc(((size_t)s->n_kv + 1) * sizeof *s->first);
	s->hrow = malloc(2 * (size_t)s->d * sizeof *s->hrow);
	ret = s->L && s->hq && s->qm && s->npos && s->nu && s->nslot && s->fetch && s->order &&
	      s->tmp && s->map && s->spans && s->first && s->hrow ? 0 : -ENOMEM;
	for (int l = s->full_layers; l < p->n_layers && !ret; l++)
		ret = layer_init(s, &s->L[l]);
	if (!ret && s->full_layers) {
		/* `full` reads only the page size of the host copy. */
		struct kv_seq_params fp = s->p;
		fp.n_layers = s->full_layers;
		fp.opts = (struct kv_policy_opts){ .page = o.page };
		ret = kv_policy_full.create(&fp, &s->full);
	}
	if (!ret && !s->direct && s->full_layers < p->n_layers) {
		/* Two staging halves of a chunk of NHD slots each, filled by the recall stream. */
		const size_t half = (size_t)REFRESH_CHUNK_PAGES * 2 * s->P * s->row;
		s->stream = ops->buf_alloc(be->ctx, 2 * half * sizeof(float));
		s->units = malloc(2 * (size_t)REFRESH_CHUNK_PAGES * s->n_kv * sizeof *s->units);
		struct recall_opts ro = { .g = s->wt.g, .host = p->host, .be = be, .max_jobs = 4 };
		ret = s->stream && s->units ? recall_new(&ro, &s->rc) : -ENOMEM;
	}
	if (ret) {
		refresh_destroy(s);
		return ret;
	}
	*st = s;
	return 0;
}

static int refresh_step_begin(void *st, int64_t n)
{
	struct refresh *s = st;
	if (n <= 0)
		return -EINVAL;
	if (s->len + n > s->p.max_tokens)
		return -ENOSPC;
	if (s->full) {
		int ret = kv_policy_full.step_begin(s->full, n);
		if (ret)
			return ret;
	}
	s->pending = n;
	return 0;
}

static int grow_dense(struct refresh *s, int64_t need)
{
	if (need <= s->dense_cap)
		return 0;
	struct backend *be = s->p.be;
	int64_t cap = s->dense_cap ? s->dense_cap : 256;
	while (cap < need)
		cap *= 2;
	size_t bytes = (size_t)cap * s->row * sizeof(float);
	float *k = be->ops->buf_alloc(be->ctx, bytes), *v = be->ops->buf_alloc(be->ctx, bytes);
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

/* Prefill at layer l: the past from the host copy and the step's n rounded host rows hk, hv
 * into the dense buffers; the rows also into the slots while the sequence fits B, else the
 * layer's next decode step past the budget is a full one. */
static int prefill_rows(struct refresh *s, int l, const float *hk, const float *hv, int64_t n)
{
	struct backend *be = s->p.be;
	struct rlayer *L = &s->L[l];
	const size_t rb = s->row * sizeof(float);
	int ret = grow_dense(s, s->len + n);
	if (!ret && s->len) {
		float *k = malloc((size_t)s->len * rb), *v = malloc((size_t)s->len * rb);
		ret = k && v ? kv_wt_load(&s->wt, l, 0, s->len, k, v) : -ENOMEM;
		if (!ret)
			ret = be->ops->upload(be->ctx, s->dense_k, k, (size_t)s->len * rb)
			   ?: be->ops->upload(be->ctx, s->dense_v, v, (size_t)s->len * rb);
		free(k);
		free(v);
	}
	if (!ret)
		ret = be->ops->upload(be->ctx, s->dense_k + (size_t)s->len * s->row, hk, n * rb)
		   ?: be->ops->upload(be->ctx, s->dense_v + (size_t)s->len * s->row, hv, n * rb);
	if (ret)
		return ret;
	if (s->len + n > s->B) {
		L->need_full = true;
		return 0;
	}
	ret = be->ops->upload(be->ctx, L->slots + (size_t)s->len * s->row, hk, n * rb)
	   ?: be->ops->upload(be->ctx, L->slots + ((size_t)s->B + s->len) * s->row, hv, n * rb);
	for (int h = 0; h < s->n_kv && !ret; h++)
		for (int64_t t = s->len; t < s->len + n; t++)
			L->set[(size_t)h * s->B + t] = (int32_t)t;
	return ret;
}

static int refresh_append(void *st, int layer, const float *k, const float *v, int64_t n)
{
	struct refresh *s = st;
	struct backend *be = s->p.be;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	if (layer < s->full_layers)
		return kv_policy_full.append(s->full, layer, k, v, n);
	struct rlayer *L = &s->L[layer];
	const size_t rb = s->row * sizeof(float);
	/* Decode: the row stays on the backend, rounded there to what the host copy holds. */
	if (n == 1 && be->ops->round_to)
		return kv_wt_put(&s->wt, layer, s->len, k, v, 1)
		    ?: be->ops->copy(be->ctx, L->cur, k, rb)
		    ?: be->ops->copy(be->ctx, L->cur + s->row, v, rb)
		    ?: be->ops->round_to(be->ctx, L->cur, 2 * (int64_t)s->row, s->p.attn.kv_dtype);
	const float *hk, *hv;
	int ret = kv_wt_fetch(&s->wt, k, v, n, &hk, &hv)
	       ?: kv_wt_store(&s->wt, layer, s->len, hk, hv, n);
	if (ret)
		return ret;
	size_t cnt = (size_t)n * s->row;
	dtype_round(s->wt.k, s->p.attn.kv_dtype, cnt);
	dtype_round(s->wt.v, s->p.attn.kv_dtype, cnt);
	if (n > 1)
		return prefill_rows(s, layer, hk, hv, n);
	return be->ops->upload(be->ctx, L->cur, hk, rb) ?: be->ops->upload(be->ctx, L->cur + s->row,
									    hv, rb);
}

/* Attention of the step's query over each head's first n slots (slot order). */
static int attend_slots(struct refresh *s, struct rlayer *L, float *out, const float *q,
			int64_t n)
{
	struct backend *be = s->p.be;
	struct backend_kv_span sp[s->n_kv];
	int first[s->n_kv + 1];
	for (int h = 0; h < s->n_kv; h++) {
		sp[h] = (struct backend_kv_span){ .k = L->slots, .v = L->slots + (size_t)s->B * s->row,
						  .n = n, .row_stride = (int64_t)s->row };
		first[h] = h;
	}
	first[s->n_kv] = s->n_kv;
	struct backend_attn a = s->p.attn;
	a.kv_dtype = FKV_F32;
	s->attended += n;
	int64_t t0 = now_ns();
	int ret = be->ops->attn_decode_heads(be->ctx, out, q, sp, first, &a);
	L->st.ns_attend += now_ns() - t0;
	return ret;
}

/* Puts head h's slice of the current row (K and V) into slot slot_of_head[h], every head. */
static int place_cur(struct refresh *s, struct rlayer *L, const int32_t *slot_of_head)
{
	struct backend *be = s->p.be;
	const int H = s->n_kv, d = s->d;
	for (int h = 0; h < H; h++) {
		int32_t *e = s->map + (size_t)h * 6;
		e[0] = slot_of_head[h], e[1] = 0, e[2] = h;	      /* K: cur row 0 */
		e[3] = s->B + slot_of_head[h], e[4] = 1, e[5] = h;    /* V: cur row 1 */
	}
	if (be->ops->gather_heads)
		return be->ops->gather_heads(be->ctx, L->slots, L->cur, s->map, 2 * H, H, d);
	int ret = 0;
	for (int j = 0; j < 2 * H && !ret; j++) {
		const int32_t *e = s->map + (size_t)j * 3;
		ret = be->ops->copy(be->ctx, L->slots + refresh_slot_off(s, e[0], e[2]),
				    L->cur + refresh_slot_off(s, e[1], e[2]), (size_t)d * sizeof(float));
	}
	return ret;
}

/* Debug: each set holds B distinct positions below T, the current one at a partial step, and
 * every slot the rows of its position in the host copy. */
static int check_sets(struct refresh *s, int l, int64_t T, bool full)
{
	struct rlayer *L = &s->L[l];
	const int B = s->B, d = s->d, P = s->P;
	struct backend *be = s->p.be;
	int ret = kv_wt_fence(&s->wt);
	char err[256];
	for (int h = 0; h < s->n_kv && !ret; h++) {
		const int32_t *set = L->set + (size_t)h * B;
		bool cur = false;
		for (int i = 0; i < B && !ret; i++) {
			cur |= set[i] == T - 1;
			for (int j = 0; j < i; j++)
				if (set[j] == set[i])
					ret = -EIO;
			if (set[i] < 0 || set[i] >= T)
				ret = -EIO;
			if (ret)
				break;
			const void *block;
			float *mine = s->hrow, host[2 * d];
			ret = hostkv_block_ro_pin(s->p.host, l, set[i] / P, &block, err, sizeof err);
			if (ret)
				break;
			layout_load_head(&s->wt.g, block, h, set[i] % P, set[i] % P + 1, host,
					 host + d);
			ret = hostkv_unpin(s->p.host, l, set[i] / P, err, sizeof err)
			   ?: be->ops->download(be->ctx, mine, L->slots + refresh_slot_off(s, i, h),
						(size_t)d * sizeof(float))
			   ?: be->ops->download(be->ctx, mine + d,
						L->slots + refresh_slot_off(s, (int64_t)B + i, h),
						(size_t)d * sizeof(float));
			if (!ret && memcmp(mine, host, 2 * (size_t)d * sizeof(float)))
				ret = -EIO;
		}
		if (!ret && !full && !cur)
			ret = -EIO;
		if (ret)
			fprintf(stderr, "policy refreshkv: layer %d head %d: the partial set is not "
				"%d distinct positions below %lld holding their host rows%s\n", l, h,
				B, (long long)T, full ? "" : " and the current one");
	}
	return ret;
}

/* A decode step past the budget at retrieval layer l. */
static int compressed_step(struct refresh *s, int l, float *out, const float *q, int64_t T)
{
	struct backend *be = s->p.be;
	struct rlayer *L = &s->L[l];
	const size_t qd = (size_t)s->n_q * s->d;
	int ret = be->ops->download(be->ctx, s->hq, q, qd * sizeof(float));
	if (ret)
		return ret;
	refresh_qmean(s->hq, s->n_q, s->d, s->qm);
	const bool retry = T == L->last_T;
	int64_t c = L->c;
	bool full;
	if (retry)
		full = L->last_full;
	else if (L->need_full)
		full = true;
	else
		full = ++c % s->Q == 0 && refresh_cos(s->qm, L->qbar, s->d) < (double)s->thr;
	if (full) {
		ret = refresh_full_step(s, l, out, q, T);
	} else {
		int32_t slot[s->n_kv];
		for (int h = 0; h < s->n_kv; h++)
			slot[h] = L->evq[(size_t)h * s->B + L->ev_next % s->B];
		/* A retried step finds the current row in place already. */
		if (!retry) {
			ret = place_cur(s, L, slot);
			for (int h = 0; h < s->n_kv && !ret; h++)
				L->set[(size_t)h * s->B + slot[h]] = (int32_t)(T - 1);
		}
		if (!ret)
			ret = attend_slots(s, L, out, q, s->B);
		if (!ret && !retry) {
			L->c = c;
			L->ev_next++;
		}
	}
	if (ret)
		return ret;
	/* A retried step is the same decode step, done again. */
	if (!retry) {
		L->st.steps++;
		L->st.full_steps += full;
	}
	L->last_T = T;
	L->last_full = full;
	if (s->p.opts.debug_invariants && (ret = check_sets(s, l, T, full)))
		return ret;
	if (s->p.opts.trace) {
		struct kv_trace t = { .layer = l, .T = T, .full = full, .q = s->hq, .set = L->set,
				      .n_q = s->n_q, .n_kv = s->n_kv, .d = s->d, .budget = s->B };
		s->p.opts.trace(s->p.opts.trace_arg, &t);
	}
	return 0;
}

static int refresh_attend(void *st, int layer, float *out, const float *q, int64_t n)
{
	struct refresh *s = st;
	struct backend *be = s->p.be;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	if (layer < s->full_layers)
		return kv_policy_full.attend(s->full, layer, out, q, n);
	if (n > 1) {
		struct backend_attn a = s->p.attn;
		a.kv_dtype = FKV_F32;
		s->attended += s->len + n;
		return be->ops->attn_prefill(be->ctx, out, q, n, s->dense_k, s->dense_v, s->len + n,
					     &a);
	}
	const int64_t T = s->len + 1;
	if (T > s->B)
		return compressed_step(s, layer, out, q, T);
	struct rlayer *L = &s->L[layer];
	int32_t slot[s->n_kv];
	for (int h = 0; h < s->n_kv; h++)
		slot[h] = (int32_t)(T - 1);
	int ret = place_cur(s, L, slot);
	for (int h = 0; h < s->n_kv && !ret; h++)
		L->set[(size_t)h * s->B + T - 1] = (int32_t)(T - 1);
	return ret ?: attend_slots(s, L, out, q, T);
}

static void refresh_step_end(void *st)
{
	struct refresh *s = st;
	if (s->full)
		kv_policy_full.step_end(s->full);
	/* The dense prefill buffers are scratch: the device keeps O(B) per layer between steps. */
	bfree(s, s->dense_k);
	bfree(s, s->dense_v);
	s->dense_k = s->dense_v = NULL;
	s->dense_cap = 0;
	s->len += s->pending;
	s->pending = 0;
}

static int64_t refresh_length(void *st)
{
	return ((struct refresh *)st)->len;
}

static void stats_add(struct kv_layer_stats *b, const struct kv_layer_stats *a)
{
	b->steps += a->steps;
	b->pages_recalled += a->pages_recalled;
	b->bytes_recalled += a->bytes_recalled;
	b->ns_select += a->ns_select;
	b->ns_recall_wait += a->ns_recall_wait;
	b->ns_attend += a->ns_attend;
	b->full_steps += a->full_steps;
	b->tokens_fetched += a->tokens_fetched;
	b->ns_full += a->ns_full;
}

static void refresh_stats(void *st, struct kv_stats *out)
{
	struct refresh *s = st;
	struct kv_stats f = { 0 };
	if (s->full)
		kv_policy_full.stats(s->full, &f);
	const int64_t retr = s->p.n_layers - s->full_layers;
	*out = (struct kv_stats){
		.tokens = s->len,
		.capacity = s->B,
		.device_bytes = f.device_bytes +
				retr * (int64_t)(2 * ((size_t)s->B + 1) * s->row * sizeof(float)),
		.attended = f.attended + s->attended,
	};
	for (int l = s->full_layers; l < s->p.n_layers; l++)
		stats_add(&out->sum, &s->L[l].st);
}

static int refresh_layer_stats(void *st, int layer, struct kv_layer_stats *out)
{
	struct refresh *s = st;
	if (layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	*out = layer < s->full_layers ? (struct kv_layer_stats){ 0 } : s->L[layer].st;
	return 0;
}

/* A resumed sequence: a sequence within B goes back into the slots in position order; past it,
 * the sets are empty and every layer's first step is full (docs/design.md §5). */
static int refresh_restore(void *st, int64_t len)
{
	struct refresh *s = st;
	if (len < 0 || len > s->p.max_tokens || s->len || s->pending)
		return -EINVAL;
	int ret = s->full ? kv_policy_full.restore(s->full, len) : 0;
	if (ret || !len)
		return ret;
	const size_t rb = s->row * sizeof(float);
	float *k = NULL, *v = NULL;
	if (len <= s->B) {
		k = malloc((size_t)len * rb);
		v = malloc((size_t)len * rb);
		ret = k && v ? 0 : -ENOMEM;
	}
	struct backend *be = s->p.be;
	for (int l = s->full_layers; l < s->p.n_layers && !ret; l++) {
		struct rlayer *L = &s->L[l];
		L->need_full = true;
		if (len > s->B)
			continue;
		ret = kv_wt_load(&s->wt, l, 0, len, k, v)
		   ?: be->ops->upload(be->ctx, L->slots, k, (size_t)len * rb)
		   ?: be->ops->upload(be->ctx, L->slots + (size_t)s->B * s->row, v, (size_t)len * rb);
		for (int h = 0; h < s->n_kv && !ret; h++)
			for (int64_t t = 0; t < len; t++)
				L->set[(size_t)h * s->B + t] = (int32_t)t;
	}
	free(k);
	free(v);
	if (!ret)
		s->len = len;
	return ret;
}

const struct kv_policy_ops kv_policy_refreshkv = {
	.name = "refreshkv",
	.create = refresh_create,
	.destroy = refresh_destroy,
	.step_begin = refresh_step_begin,
	.layer_begin = NULL,
	.append = refresh_append,
	.attend = refresh_attend,
	.layer_end = NULL,
	.step_end = refresh_step_end,
	.length = refresh_length,
	.stats = refresh_stats,
	.layer_stats = refresh_layer_stats,
	.restore = refresh_restore,
};
