/* policy_paged — see policy_paged.h. */
#include "policy_paged.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hostkv.h"
#include "topp.h"

int64_t paged_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

float *paged_slot(const struct paged *s, const struct paged_layer *L, int slot)
{
	return L->slots + (size_t)slot * s->slot_floats;
}

static int win_slot(const struct paged *s, int page)
{
	return s->n_sink + (page - s->n_sink) % s->n_win;
}

static int sel_slot_index(const struct paged *s, int page)
{
	return (page - s->n_sink) % s->k_sel;
}

static void layer_free(struct paged *s, struct paged_layer *L)
{
	if (L->slots)
		s->p.be->ops->buf_free(s->p.be->ctx, L->slots);
	free(L->res);
	free(L->target);
	free(L->fresh);
	free(L->kmin);
	free(L->kmax);
	free(L->q_last);
	free(L->q_spec);
	free(L->scratch_c);
	free(L->scratch_r);
	free(L->att);
	free(L->units_c);
	free(L->units_r);
	free(L->spec_heads);
	free(L->att_now);
	free(L->theta_k);
	free(L->theta_k_prev);
}

void paged_destroy(void *st)
{
	struct paged *s = st;
	if (!s)
		return;
	/* Joining the recall threads first: no job may still write a slot being freed. */
	recall_free(s->rc);
	if (s->full)
		kv_policy_full.destroy(s->full);
	for (int l = 0; s->L && l < s->p.n_layers; l++)
		layer_free(s, &s->L[l]);
	struct backend *be = s->p.be;
	if (s->dense_k)
		be->ops->buf_free(be->ctx, s->dense_k);
	if (s->dense_v)
		be->ops->buf_free(be->ctx, s->dense_v);
	kv_wt_free(&s->wt);
	free(s->L);
	free(s->hq);
	free(s->spans);
	free(s->span_page);
	free(s->first);
	free(s->slot_list);
	free(s->head_tok);
	free(s->chk);
	free(s->hslot);
	free(s);
}

/* Grows every summary array (and the selection scratch that scales with it) to hold need pages.
 * Called on the compute thread with no speculative job in flight for the layer. */
static int grow_summaries(struct paged *s, struct paged_layer *L, int need)
{
	if (need <= L->page_cap)
		return 0;
	int cap = L->page_cap ? L->page_cap : 2 * s->n_slots;
	while (cap < need)
		cap *= 2;
	size_t d = (size_t)s->g.d, H = (size_t)s->g.n_kv, old = (size_t)L->page_cap;
	float *mn = calloc(H * cap * d, sizeof *mn), *mx = calloc(H * cap * d, sizeof *mx);
	/* top-p selection reads the scratch as doubles (topp.h) */
	size_t sf = select_scratch_floats(&s->g, cap), tf = 2 * topp_scratch_doubles(&s->g, cap);
	sf = sf > tf ? sf : tf;
	float *sc = malloc(sf * sizeof *sc), *sr = malloc(sf * sizeof *sr);
	if (!mn || !mx || !sc || !sr) {
		free(mn);
		free(mx);
		free(sc);
		free(sr);
		return -ENOMEM;
	}
	for (size_t h = 0; old && h < H; h++) {
		memcpy(mn + h * cap * d, L->kmin + h * old * d, old * d * sizeof *mn);
		memcpy(mx + h * cap * d, L->kmax + h * old * d, old * d * sizeof *mx);
	}
	free(L->kmin);
	free(L->kmax);
	free(L->scratch_c);
	free(L->scratch_r);
	L->kmin = mn;
	L->kmax = mx;
	L->scratch_c = sc;
	L->scratch_r = sr;
	L->page_cap = cap;
	return 0;
}

static int layer_init(struct paged *s, struct paged_layer *L, int l)
{
	struct backend *be = s->p.be;
	size_t H = (size_t)s->g.n_kv, K = (size_t)s->k_sel, QD = (size_t)s->g.n_q * s->g.d;
	L->owner = s;
	L->layer = l;
	L->slots = be->ops->buf_alloc(be->ctx, (size_t)s->n_slots * s->slot_floats * sizeof(float));
	L->res = malloc(K * H * sizeof *L->res);
	L->target = calloc(H * K, sizeof *L->target);
	L->fresh = calloc(H * K, sizeof *L->fresh);
	L->att = calloc(H * K, sizeof *L->att);
	L->q_last = calloc(QD, sizeof *L->q_last);
	L->q_spec = calloc(QD, sizeof *L->q_spec);
	L->units_c = calloc(H * K, sizeof *L->units_c);
	L->units_r = calloc(H * K, sizeof *L->units_r);
	L->spec_heads = calloc(H, 1);
	L->att_now = calloc(H, 1);
	L->theta_k = calloc(H, sizeof *L->theta_k);
	L->theta_k_prev = calloc(H, sizeof *L->theta_k_prev);
	L->since_cal = -1;
	if (!L->slots || !L->res || !L->target || !L->fresh || !L->att || !L->q_last ||
	    !L->q_spec || !L->units_c || !L->units_r || !L->spec_heads || !L->att_now ||
	    !L->theta_k || !L->theta_k_prev)
		return -ENOMEM;
	for (size_t i = 0; i < K * H; i++)
		L->res[i] = -1;
	return grow_summaries(s, L, 1);
}

int paged_create(const struct kv_seq_params *p, const struct paged_strategy *strat, void **st)
{
	struct backend *be = p->be;
	if (!be || p->n_layers <= 0 || p->max_tokens <= 0 || p->attn.n_kv_heads <= 0 ||
	    p->attn.head_dim <= 0 || p->attn.n_heads % p->attn.n_kv_heads ||
	    p->max_tokens > INT32_MAX)
		return -EINVAL;
	const struct backend_ops *ops = be->ops;
	if (!ops->attn_decode_heads || (strat->recalls && !ops->recall_units))
		return -EOPNOTSUPP;
	if (strat->recalls && !p->host)
		return -EINVAL;
	struct paged *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->p = *p;
	s->strat = strat;
	int ret = kvcache_resolve_opts(&s->p.opts, p->max_tokens);
	if (ret) {
		free(s);
		return ret;
	}
	const struct kv_policy_opts *o = &s->p.opts;
	s->g = (struct select_geom){
		.n_q = p->attn.n_heads, .n_kv = p->attn.n_kv_heads, .d = p->attn.head_dim,
		.p = o->page, .sink = o->sink, .window = o->window, .budget = o->budget,
	};
	if (select_geom_check(&s->g) || o->budget < o->sink + o->window + o->page) {
		free(s);
		return -EINVAL;
	}
	s->n_sink = o->sink / o->page;
	s->n_win = o->window / o->page;
	s->k_sel = (o->budget - o->sink - o->window) / o->page;
	s->n_slots = o->budget / o->page;
	s->slot_floats = (size_t)2 * o->page * s->g.n_kv * s->g.d;
	s->full_layers = o->full_layers < p->n_layers ? o->full_layers : p->n_layers;
	s->top_p = !strat->top_p ? 0.0 : o->top_p > 0.0f ? o->top_p : strat->top_p_default;
	s->recal = o->recalibrate > 0 ? o->recalibrate : 128;
	ret = kv_wt_init(&s->wt, be, p->host, &p->attn, o->page);
	if (ret) {
		free(s);
		return ret;
	}
	s->L = calloc((size_t)p->n_layers, sizeof *s->L);
	s->hq = calloc((size_t)s->g.n_q * s->g.d, sizeof *s->hq);
	s->spans = calloc((size_t)s->g.n_kv * s->n_slots, sizeof *s->spans);
	s->span_page = calloc((size_t)s->g.n_kv * s->n_slots, sizeof *s->span_page);
	s->first = calloc((size_t)s->g.n_kv + 1, sizeof *s->first);
	s->slot_list = calloc((size_t)s->g.n_kv * s->n_slots, sizeof *s->slot_list);
	s->head_tok = calloc((size_t)s->g.n_kv, sizeof *s->head_tok);
	s->chk = malloc(2 * layout_unit_bytes(&s->wt.g));
	s->hslot = malloc(s->slot_floats * sizeof *s->hslot);
	bool ok = s->L && s->hq && s->spans && s->span_page && s->first && s->slot_list &&
		  s->head_tok && s->chk && s->hslot;
	ret = ok ? 0 : -ENOMEM;
	for (int l = s->full_layers; l < p->n_layers && !ret; l++)
		ret = layer_init(s, &s->L[l], l);
	if (!ret && s->full_layers) {
		struct kv_seq_params fp = s->p;
		fp.n_layers = s->full_layers;
		ret = kv_policy_full.create(&fp, &s->full);
	}
	if (!ret && strat->recalls) {
		/* A layer's speculative job stays unwaited until the next step reaches the layer;
		 * meanwhile every layer submits at most one blocking and one speculative job. */
		struct recall_opts ro = { .g = s->wt.g, .host = p->host, .be = be,
					  .max_jobs = 2 * p->n_layers + 2 };
		ret = recall_new(&ro, &s->rc);
	}
	if (ret) {
		paged_destroy(s);
		return ret;
	}
	*st = s;
	return 0;
}

int paged_step_begin(void *st, int64_t n)
{
	struct paged *s = st;
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

/* Waits for the layer's speculative recall and folds its accounting into the counters. */
static int settle_layer(struct paged *s, struct paged_layer *L)
{
	if (!L->ticket)
		return 0;
	struct recall_done dn;
	int ret = recall_wait(s->rc, L->ticket, &dn);
	L->ticket = 0;
	L->st.ns_recall_wait += dn.ns_waited;
	L->st.ns_recall_hidden += dn.ns_hidden;
	L->st.pages_recalled += dn.units;
	L->st.bytes_recalled += dn.bytes;
	L->st.ns_select += L->spec_ns_select;
	L->spec_ns_select = 0;
	if (ret)
		paged_drop_selection(s, L);
	return ret;
}

/* Places rows k, v (n, n_kv, d) f32 of positions [pos, pos + n) into the slots, one run of
 * rows per page: window ring or sink, moving pages that leave the window (a backend copy),
 * summarising pages that fill (from a download of the page's keys, so the summaries are those
 * of the slot's bytes on every backend). Host rows (dev false) are already rounded and are
 * uploaded; backend rows (dev true, the decode path) are copied on the backend and rounded to
 * the KV dtype there (round_to), the same bits without a round trip through the host. */
static int place_tokens(struct paged *s, struct paged_layer *L, int64_t pos, const float *k,
			const float *v, int64_t n, bool dev)
{
	struct backend *be = s->p.be;
	const int P = s->g.p, H = s->g.n_kv, d = s->g.d;
	const size_t row = (size_t)H * d;
	for (int64_t i = 0; i < n;) {
		int64_t t = pos + i;
		int page = (int)(t / P), off = (int)(t % P);
		int64_t m = n - i < P - off ? n - i : P - off;
		int ret;
		if (off == 0 && page >= s->n_sink + s->n_win) {
			int gone = page - s->n_win; /* leaves the window now */
			int si = sel_slot_index(s, gone);
			/* A retried step finds the page already moved (its ring rows since reused). */
			bool moved = L->res[si * H] == gone;
			if (!moved && (s->strat->keep_recent || gone - s->n_sink < s->k_sel)) {
				ret = be->ops->copy(be->ctx,
						    paged_slot(s, L, s->n_sink + s->n_win + si),
						    paged_slot(s, L, win_slot(s, gone)),
						    s->slot_floats * sizeof(float));
				if (ret)
					return ret;
				for (int h = 0; h < H; h++)
					L->res[si * H + h] = gone;
			}
		}
		int slot = page < s->n_sink ? page : win_slot(s, page);
		float *sl = paged_slot(s, L, slot);
		size_t bytes = (size_t)m * row * sizeof(float);
		float *dk = sl + (size_t)off * row, *dv = sl + ((size_t)P + off) * row;
		enum fkv_dtype kt = s->p.attn.kv_dtype;
		if (dev)
			ret = be->ops->copy(be->ctx, dk, k + i * row, bytes)
			   ?: be->ops->copy(be->ctx, dv, v + i * row, bytes)
			   ?: be->ops->round_to(be->ctx, dk, m * (int64_t)row, kt)
			   ?: be->ops->round_to(be->ctx, dv, m * (int64_t)row, kt);
		else
			ret = be->ops->upload(be->ctx, dk, k + i * row, bytes)
			   ?: be->ops->upload(be->ctx, dv, v + i * row, bytes);
		if (ret)
			return ret;
		if (off + m == P) {
			ret = grow_summaries(s, L, page + 1)
			   ?: be->ops->download(be->ctx, s->hslot, sl, (size_t)P * row * sizeof(float));
			if (ret)
				return ret;
			for (int h = 0; h < H; h++) {
				size_t at = ((size_t)h * L->page_cap + page) * d;
				select_page_summary(P, d, s->hslot + (size_t)h * d, row, L->kmin + at,
						    L->kmax + at);
			}
		}
		i += m;
	}
	return 0;
}

/* Slot of a page for head h at the current layout; -1 when it is not on the device. */
static int find_slot(const struct paged *s, const struct paged_layer *L,
		     const struct select_layout *lay, int page, int h)
{
	if (page < s->n_sink)
		return page;
	if (page >= lay->cand_end)
		return win_slot(s, page);
	int si = sel_slot_index(s, page);
	if (L->res[si * s->g.n_kv + h] == page)
		return s->n_sink + s->n_win + si;
	for (int i = 0; i < s->k_sel; i++)
		if (L->res[i * s->g.n_kv + h] == page)
			return s->n_sink + s->n_win + i;
	return -1;
}

static int grow_dense(struct paged *s, int64_t need)
{
	if (need <= s->dense_cap)
		return 0;
	struct backend *be = s->p.be;
	int64_t cap = s->dense_cap ? s->dense_cap : 256;
	while (cap < need)
		cap *= 2;
	size_t bytes = (size_t)cap * s->g.n_kv * s->g.d * sizeof(float);
	float *k = be->ops->buf_alloc(be->ctx, bytes), *v = be->ops->buf_alloc(be->ctx, bytes);
	if (!k || !v) {
		if (k)
			be->ops->buf_free(be->ctx, k);
		if (v)
			be->ops->buf_free(be->ctx, v);
		return -ENOMEM;
	}
	if (s->dense_k)
		be->ops->buf_free(be->ctx, s->dense_k);
	if (s->dense_v)
		be->ops->buf_free(be->ctx, s->dense_v);
	s->dense_k = k;
	s->dense_v = v;
	s->dense_cap = cap;
	return 0;
}

/* Prefill: every position of the layer, dense, for causal attention of the step's n queries:
 * the past from the slots while it fits the budget (taken before the step's rows move pages
 * out; backend copies, one run per page), else from the host copy (the worker's own blocks,
 * committed or not, loaded on the host and uploaded); then the step's rows k, v (n, n_kv, d)
 * f32 host memory, rounded. */
static int build_dense(struct paged *s, struct paged_layer *L, const float *k, const float *v,
		       int64_t n)
{
	struct backend *be = s->p.be;
	const int64_t ctx = s->len + n;
	const int P = s->g.p;
	const size_t row = (size_t)s->g.n_kv * s->g.d;
	int ret = grow_dense(s, ctx);
	if (ret)
		return ret;
	if (s->len > s->g.budget) {
		if (!s->p.host)
			return -EOPNOTSUPP;
		size_t bytes = (size_t)s->len * row * sizeof(float);
		float *hk = malloc(bytes), *hv = malloc(bytes);
		ret = hk && hv ? kv_wt_load(&s->wt, L->layer, 0, s->len, hk, hv) : -ENOMEM;
		if (!ret)
			ret = be->ops->upload(be->ctx, s->dense_k, hk, bytes)
			   ?: be->ops->upload(be->ctx, s->dense_v, hv, bytes);
		free(hk);
		free(hv);
		if (ret)
			return ret;
	} else {
		struct select_layout lay;
		select_layout_of(&s->g, (int)s->len, &lay);
		for (int64_t t = 0; t < s->len;) {
			int slot = find_slot(s, L, &lay, (int)(t / P), 0);
			if (slot < 0)
				return -EIO;
			const float *sl = paged_slot(s, L, slot);
			int off = (int)(t % P);
			int64_t m = s->len - t < P - off ? s->len - t : P - off;
			size_t bytes = (size_t)m * row * sizeof(float);
			ret = be->ops->copy(be->ctx, s->dense_k + t * row, sl + (size_t)off * row, bytes)
			   ?: be->ops->copy(be->ctx, s->dense_v + t * row,
					    sl + ((size_t)P + off) * row, bytes);
			if (ret)
				return ret;
			t += m;
		}
	}
	size_t bytes = (size_t)n * row * sizeof(float);
	return be->ops->upload(be->ctx, s->dense_k + s->len * row, k, bytes)
	    ?: be->ops->upload(be->ctx, s->dense_v + s->len * row, v, bytes);
}

static int attend_dense(struct paged *s, float *out, const float *q, int64_t n)
{
	const int64_t ctx = s->len + n;
	struct backend_attn a = s->p.attn;
	a.kv_dtype = FKV_F32;
	s->attended += ctx;
	return s->p.be->ops->attn_prefill(s->p.be->ctx, out, q, n, s->dense_k, s->dense_v, ctx, &a);
}

int paged_append(void *st, int layer, const float *k, const float *v, int64_t n)
{
	struct paged *s = st;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	if (layer < s->full_layers)
		return kv_policy_full.append(s->full, layer, k, v, n);
	struct paged_layer *L = &s->L[layer];
	/* Step t's recall of this layer lands before step t+1 touches the layer. */
	int ret = settle_layer(s, L);
	if (ret)
		return ret;
	/* Decode: the rows stay on the backend (offload op, device copy and rounding). Prefill
	 * needs them on the host anyway for the dense context, so it downloads them once. */
	if (n == 1 && s->p.be->ops->round_to)
		return kv_wt_put(&s->wt, layer, s->len, k, v, n)
		    ?: place_tokens(s, L, s->len, k, v, n, true);
	const float *hk, *hv;
	ret = kv_wt_fetch(&s->wt, k, v, n, &hk, &hv)
	   ?: kv_wt_store(&s->wt, layer, s->len, hk, hv, n);
	if (ret)
		return ret;
	size_t cnt = (size_t)n * s->g.n_kv * s->g.d;
	/* Rounded to the KV dtype, so the slots hold exactly what the host copy and `full` hold. */
	dtype_round(s->wt.k, s->p.attn.kv_dtype, cnt);
	dtype_round(s->wt.v, s->p.attn.kv_dtype, cnt);
	if (n > 1 && (ret = build_dense(s, L, hk, hv, n)))
		return ret;
	return place_tokens(s, L, s->len, hk, hv, n, false);
}

/* Spans of every head: sink, then the attended candidates (all of them while the sequence fits
 * the budget), then the window — ascending positions, as `full` reads them — and the slot of
 * each in slot_list. At most n_slots pages per head: len <= B before compression, sink + k +
 * window pages after. */
static int build_spans(struct paged *s, struct paged_layer *L, const struct select_layout *lay,
		       int len)
{
	const int H = s->g.n_kv, P = s->g.p;
	const int n_pages = lay->n_full + (lay->tail_tokens ? 1 : 0);
	int ns = 0;
	for (int h = 0; h < H; h++) {
		s->first[h] = ns;
		int64_t keys = 0;
		for (int j = 0; j < n_pages; j++) {
			if (j >= lay->cand_begin && j < lay->cand_end && lay->compressed) {
				bool want = false;
				for (int i = 0; i < lay->k && !want; i++)
					want = L->att[h * s->k_sel + i] == j;
				if (!want)
					continue;
			}
			int slot = find_slot(s, L, lay, j, h);
			if (slot < 0) {
				fprintf(stderr, "policy %s: layer %d head %d: page %d is not "
					"resident\n", s->strat->name, L->layer, h, j);
				return -EIO;
			}
			const float *sl = paged_slot(s, L, slot);
			s->slot_list[(size_t)h * s->n_slots + (ns - s->first[h])] = slot;
			s->span_page[ns] = j;
			s->spans[ns++] = (struct backend_kv_span){
				.k = sl, .v = sl + (size_t)P * H * s->g.d,
				.n = j * P + P <= len ? P : len - j * P,
				.row_stride = (int64_t)H * s->g.d,
			};
			keys += s->spans[ns - 1].n;
		}
		if (s->p.opts.debug_invariants && keys > (lay->compressed ? s->g.budget : len)) {
			fprintf(stderr, "policy %s: layer %d head %d attends %lld keys, budget %d\n",
				s->strat->name, L->layer, h, (long long)keys, s->g.budget);
			return -EIO;
		}
		s->attended += h == 0 ? keys : 0;
	}
	s->first[H] = ns;
	return 0;
}

/* Whether the spans fit attn_decode_slots: every page full but each head's last, at least one
 * page a head; the tokens of each head go to s->head_tok. build_spans meets this in every phase
 * (the partial tail page is the last page and never a candidate; each head attends the sink,
 * its distinct candidates and the window); a false here means a strategy broke the selection,
 * and the step falls back to attn_decode_heads over the spans as they are. */
static bool spans_fit_slots(const struct paged *s)
{
	for (int h = 0; h < s->g.n_kv; h++) {
		int64_t t = 0;
		if (s->first[h + 1] <= s->first[h])
			return false;
		for (int sp = s->first[h]; sp < s->first[h + 1]; sp++) {
			if (sp + 1 < s->first[h + 1] && s->spans[sp].n != s->g.p)
				return false;
			t += s->spans[sp].n;
		}
		s->head_tok[h] = (int32_t)t;
	}
	return true;
}

/* Debug: every full page's min/max summary equals one recomputed from the host copy. */
static int check_summaries(struct paged *s, struct paged_layer *L, const struct select_layout *lay)
{
	const int P = s->g.p, d = s->g.d;
	float *k = malloc((size_t)(2 * P + 2) * d * sizeof *k);
	if (!k)
		return -ENOMEM;
	float *v = k + (size_t)P * d, *mn = v + (size_t)P * d, *mx = mn + d;
	char err[256];
	int ret = 0;
	for (int j = 0; j < lay->n_full && !ret; j++) {
		const void *block;
		ret = hostkv_block_ro_pin(s->p.host, L->layer, j, &block, err, sizeof err);
		if (ret)
			break;
		for (int h = 0; h < s->g.n_kv && !ret; h++) {
			layout_load_head(&s->wt.g, block, h, 0, P, k, v);
			select_page_summary(P, d, k, (size_t)d, mn, mx);
			size_t at = ((size_t)h * L->page_cap + j) * d;
			if (memcmp(mn, L->kmin + at, d * sizeof *mn) ||
			    memcmp(mx, L->kmax + at, d * sizeof *mx)) {
				fprintf(stderr, "policy %s: layer %d head %d: summary of page %d is "
					"stale\n", s->strat->name, L->layer, h, j);
				ret = -EIO;
			}
		}
		int r2 = hostkv_unpin(s->p.host, L->layer, j, err, sizeof err);
		ret = ret ? ret : r2;
	}
	free(k);
	return ret;
}

/* The selection docs/design.md §5 defines for the strategy: top-k, or top-p on the calibrated
 * scores of temperatures theta_k. */
static void select_with(const struct paged *s, const struct paged_layer *L, const float *q,
			const struct select_layout *lay, const int8_t *theta_k, int *pages,
			float *scratch)
{
	if (s->top_p > 0.0)
		/* the scratch holds doubles here: grow_summaries sized it for both */
		topp_select(&s->g, lay, q, L->kmin, L->kmax, L->page_cap, theta_k, s->top_p, pages,
			    (double *)(void *)scratch);
	else
		select_topk(&s->g, lay, q, L->kmin, L->kmax, L->page_cap, pages, scratch);
}

/* Selected pages head h attends at a compressed step: its row of L->att up to the first -1. */
static int att_count(const struct paged *s, const struct paged_layer *L, int h,
		     const struct select_layout *lay)
{
	const int *row = L->att + (size_t)h * s->k_sel;
	int c = 0;
	while (c < lay->k && row[c] >= 0)
		c++;
	return c;
}

/* Debug: group-consistent selection as docs/design.md §5 defines it, recomputed by select_with: a
 * head whose pages were selected with this step's query attends exactly the selection of q_t at
 * this layout (with the current temperatures); the others (freekv's unflagged heads) exactly the
 * selection of the previous query at the previous step's layout and temperatures. Every query
 * head of a group reads its KV head's pages (spans are per KV head), so the group shares one
 * selection. */
static int check_selection(struct paged *s, struct paged_layer *L, const struct select_layout *lay)
{
	const int H = s->g.n_kv, K = s->k_sel;
	int *now = malloc((size_t)2 * H * K * sizeof *now), *prev = now + (size_t)H * K;
	if (!now)
		return -ENOMEM;
	select_with(s, L, s->hq, lay, L->theta_k, now, L->scratch_c);
	if (L->prev_valid)
		select_with(s, L, L->q_last, &L->prev_lay, L->theta_k_prev, prev, L->scratch_c);
	int ret = 0;
	for (int h = 0; h < H && !ret; h++) {
		const int *want = L->att_now[h] ? now : L->prev_valid ? prev : NULL;
		if (want && memcmp(L->att + h * K, want + h * K, (size_t)K * sizeof *want)) {
			fprintf(stderr, "policy %s: layer %d head %d: pages are not the selection of "
				"the %s query\n", s->strat->name, L->layer, h,
				L->att_now[h] ? "current" : "previous");
			ret = -EIO;
		}
	}
	free(now);
	return ret;
}

/* Debug: the selection is lay->k distinct candidates per head — between 1 and lay->k under
 * top-p, the row -1 past them — (the selection docs/design.md §5 defines, for the strategies
 * that select), every page the step attends equals its page in the host copy — read where the
 * attention op will read it: slot_list with the op's row counts (s->head_tok) when use_slots,
 * else the spans — and the summaries are current. */
static int check_invariants(struct paged *s, struct paged_layer *L,
			    const struct select_layout *lay, int len, bool use_slots)
{
	const int H = s->g.n_kv;
	for (int h = 0; h < H && lay->compressed; h++) {
		const int *row = L->att + (size_t)h * s->k_sel, c = att_count(s, L, h, lay);
		bool bad = c < 1 || (s->top_p == 0.0 && c != lay->k);
		for (int i = 0; i < lay->k && !bad; i++)
			bad = i >= c ? row[i] != -1
			      : row[i] < lay->cand_begin || row[i] >= lay->cand_end ||
					(i && row[i] <= row[i - 1]);
		if (bad) {
			fprintf(stderr, "policy %s: layer %d head %d: selection is not %s%d distinct "
				"candidates\n", s->strat->name, L->layer, h,
				s->top_p > 0.0 ? "1 to " : "", lay->k);
			return -EIO;
		}
	}
	if (lay->compressed && s->strat->recalls) {
		int ret = check_selection(s, L, lay);
		if (ret)
			return ret;
	}
	/* Every head attends all of the sequence but its unselected candidates. */
	for (int h = 0; h < H; h++) {
		const int64_t want = len - (int64_t)(lay->compressed ? lay->cand_end - lay->cand_begin -
									 att_count(s, L, h, lay)
								      : 0) * s->g.p;
		int64_t keys = 0;
		for (int sp = s->first[h]; sp < s->first[h + 1]; sp++)
			keys += s->spans[sp].n;
		if (keys != want || (use_slots && s->head_tok[h] != want)) {
			fprintf(stderr, "policy %s: layer %d head %d attends %lld keys, not %lld\n",
				s->strat->name, L->layer, h,
				(long long)(use_slots ? s->head_tok[h] : keys), (long long)want);
			return -EIO;
		}
	}
	if (!s->p.host)
		return 0;
	int fenced = kv_wt_fence(&s->wt); /* this step's rows may still be on their way */
	if (fenced)
		return fenced;
	struct backend *be = s->p.be;
	const struct kv_geom *g = &s->wt.g;
	size_t ub = layout_unit_bytes(g);
	char *mine = (char *)s->chk, *host = mine + ub, err[256];
	for (int h = 0; h < H; h++)
		for (int sp = s->first[h]; sp < s->first[h + 1]; sp++) {
			const int i = sp - s->first[h];
			int page = s->span_page[sp];
			const void *at = use_slots ? paged_slot(s, L, s->slot_list[(size_t)h *
										      s->n_slots + i])
						   : s->spans[sp].k;
			const void *block;
			int ret = hostkv_block_ro_pin(s->p.host, L->layer, page, &block, err,
						      sizeof err);
			if (ret)
				return ret;
			memcpy(host, (const char *)block + (size_t)h * ub, ub);
			ret = hostkv_unpin(s->p.host, L->layer, page, err, sizeof err)
			   ?: be->ops->download(be->ctx, s->hslot, at,
						s->slot_floats * sizeof(float));
			if (ret)
				return ret;
			layout_gather_unit(g, mine, h, s->hslot);
			int n = !use_slots ? (int)s->spans[sp].n
			      : sp + 1 < s->first[h + 1] ? s->g.p
							 : s->head_tok[h] - i * s->g.p;
			size_t rb = (size_t)g->d * dtype_size(g->dtype);
			if (memcmp(mine, host, n * rb) ||
			    memcmp(mine + (size_t)g->p * rb, host + (size_t)g->p * rb, n * rb)) {
				fprintf(stderr, "policy %s: layer %d head %d: slot of page %d differs "
					"from the host copy (len %d)\n", s->strat->name, L->layer, h,
					page, len);
				return -EIO;
			}
		}
	return check_summaries(s, L, lay);
}

int paged_attend(void *st, int layer, float *out, const float *q, int64_t n)
{
	struct paged *s = st;
	struct backend *be = s->p.be;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	if (layer < s->full_layers)
		return kv_policy_full.attend(s->full, layer, out, q, n);
	struct paged_layer *L = &s->L[layer];
	const size_t qd = (size_t)s->g.n_q * s->g.d;
	if (n > 1) {
		L->prev_valid = false;
		int ret = attend_dense(s, out, q, n);
		if (!ret)
			ret = be->ops->download(be->ctx, L->q_last, q + (size_t)(n - 1) * qd,
						qd * sizeof(float));
		L->have_q = !ret;
		return ret;
	}
	const int len = (int)(s->len + 1);
	struct select_layout lay;
	select_layout_of(&s->g, len, &lay);
	int ret = be->ops->download(be->ctx, s->hq, q, qd * sizeof(float));
	if (ret)
		return ret;
	if (lay.compressed) {
		L->st.steps++;
		ret = s->strat->before_attend(s, L, s->hq, &lay);
		if (ret)
			return ret;
		for (int h = 0; h < s->g.n_kv; h++) {
			int c = att_count(s, L, h, &lay);
			L->st.pages_selected += c;
			L->st.pages_max = c > L->st.pages_max ? c : L->st.pages_max;
		}
	}
	ret = build_spans(s, L, &lay, len);
	const bool use_slots = !ret && be->ops->attn_decode_slots && spans_fit_slots(s);
	if (!ret && s->p.opts.debug_invariants)
		ret = check_invariants(s, L, &lay, len, use_slots);
	if (ret)
		return ret;
	struct backend_attn a = s->p.attn;
	a.kv_dtype = FKV_F32;
	int64_t t0 = paged_now_ns();
	if (use_slots)
		ret = be->ops->attn_decode_slots(be->ctx, out, q, L->slots, s->n_slots,
						 s->slot_list, s->n_slots, s->head_tok, s->g.p, &a);
	else
		ret = be->ops->attn_decode_heads(be->ctx, out, q, s->spans, s->first, &a);
	L->st.ns_attend += paged_now_ns() - t0;
	if (!ret && lay.compressed && s->strat->after_attend)
		ret = s->strat->after_attend(s, L, s->hq, &lay);
	memcpy(L->q_last, s->hq, qd * sizeof(float));
	memcpy(L->theta_k_prev, L->theta_k, (size_t)s->g.n_kv * sizeof *L->theta_k);
	L->have_q = true;
	/* Once the layer's recall has landed, every head holds the top-k of this query here. */
	L->prev_valid = !ret && lay.compressed && s->strat->recalls;
	L->prev_lay = lay;
	return ret;
}

void paged_step_end(void *st)
{
	struct paged *s = st;
	struct backend *be = s->p.be;
	if (s->full)
		kv_policy_full.step_end(s->full);
	/* The dense prefill buffers are scratch: the device keeps O(B) per layer between steps. */
	if (s->dense_k) {
		be->ops->buf_free(be->ctx, s->dense_k);
		be->ops->buf_free(be->ctx, s->dense_v);
		s->dense_k = s->dense_v = NULL;
		s->dense_cap = 0;
	}
	s->len += s->pending;
	s->pending = 0;
}

int64_t paged_length(void *st)
{
	return ((struct paged *)st)->len;
}

void paged_stats(void *st, struct kv_stats *out)
{
	struct paged *s = st;
	struct kv_stats f = { 0 };
	if (s->full)
		kv_policy_full.stats(s->full, &f);
	int retr = s->p.n_layers - s->full_layers;
	*out = (struct kv_stats){
		.tokens = s->len,
		.capacity = (int64_t)s->n_slots * s->g.p,
		.device_bytes = f.device_bytes +
				(int64_t)retr * s->n_slots * (int64_t)(s->slot_floats * sizeof(float)),
		.attended = f.attended + s->attended,
	};
	for (int l = s->full_layers; l < s->p.n_layers; l++) {
		const struct kv_layer_stats *a = &s->L[l].st;
		struct kv_layer_stats *b = &out->sum;
		b->steps += a->steps;
		b->head_checks += a->head_checks;
		b->corrections += a->corrections;
		b->pages_selected += a->pages_selected;
		b->pages_recalled += a->pages_recalled;
		b->bytes_recalled += a->bytes_recalled;
		b->ns_select += a->ns_select;
		b->ns_recall_wait += a->ns_recall_wait;
		b->ns_recall_hidden += a->ns_recall_hidden;
		b->ns_attend += a->ns_attend;
		b->pages_max = a->pages_max > b->pages_max ? a->pages_max : b->pages_max;
		b->calibrations += a->calibrations;
		b->ns_calibrate += a->ns_calibrate;
	}
}

int paged_layer_stats(void *st, int layer, struct kv_layer_stats *out)
{
	struct paged *s = st;
	if (layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	*out = layer < s->full_layers ? (struct kv_layer_stats){ 0 } : s->L[layer].st;
	return 0;
}

int paged_restore(void *st, int64_t len)
{
	struct paged *s = st;
	if (!s->p.host || len < 0 || len > s->p.max_tokens || s->len || s->pending)
		return -EINVAL;
	if (s->full) {
		int ret = kv_policy_full.restore(s->full, len);
		if (ret)
			return ret;
	}
	const int P = s->g.p;
	size_t row = (size_t)s->g.n_kv * s->g.d;
	float *k = malloc((size_t)P * row * sizeof *k), *v = malloc((size_t)P * row * sizeof *v);
	int ret = k && v ? 0 : -ENOMEM;
	for (int l = s->full_layers; l < s->p.n_layers && !ret; l++)
		for (int64_t t = 0; t < len && !ret; t += P) {
			int64_t e = t + P < len ? t + P : len;
			ret = kv_wt_load(&s->wt, l, t, e, k, v);
			if (!ret)
				ret = place_tokens(s, &s->L[l], t, k, v, e - t, false);
		}
	free(k);
	free(v);
	if (!ret)
		s->len = len;
	return ret;
}

void paged_select(const struct paged *s, const struct paged_layer *L, const float *q,
		  const struct select_layout *lay, int *pages, float *scratch, int64_t *ns)
{
	int64_t t0 = paged_now_ns();
	select_with(s, L, q, lay, L->theta_k, pages, scratch);
	*ns += paged_now_ns() - t0;
}

int paged_plan_head(const struct paged *s, struct paged_layer *L, int h, const int *pages,
		    struct recall_unit *units, int *n)
{
	const int H = s->g.n_kv, K = s->k_sel, n0 = *n;
	int np = 0; /* wanted pages: the row up to its first -1 */
	while (np < K && pages[np] >= 0)
		np++;
	bool keep[K];
	int old[K];
	for (int i = 0; i < K; i++)
		old[i] = L->res[i * H + h];
	for (int i = 0; i < K; i++) {
		keep[i] = false;
		for (int j = 0; j < np && !keep[i]; j++)
			keep[i] = old[i] == pages[j];
	}
	for (int j = 0; j < np; j++) {
		bool resident = false;
		for (int i = 0; i < K && !resident; i++)
			resident = L->res[i * H + h] == pages[j];
		if (resident)
			continue;
		/* An empty slot first: under top-p a slot no page wants still holds its page for a
		 * later step that wants it again. */
		int next = -1;
		for (int i = 0; i < K && next < 0; i++)
			next = !keep[i] && old[i] < 0 ? i : -1;
		for (int i = 0; i < K && next < 0; i++)
			next = !keep[i] ? i : -1;
		keep[next] = true;
		L->res[next * H + h] = pages[j];
		units[(*n)++] = (struct recall_unit){
			.layer = L->layer, .page = pages[j], .head = h,
			.slot = paged_slot(s, L, s->n_sink + s->n_win + next),
		};
	}
	if (!s->p.opts.debug_invariants)
		return 0;
	/* Checked against the residency before planning: the units are exactly the pages that were
	 * not resident, once each; pages that were resident stay in their slots; the head now holds
	 * every wanted page once, ascending, and the row is -1 past them. */
	bool ok = np > 0 || K == 0;
	for (int j = np; j < K; j++)
		ok &= pages[j] == -1;
	for (int j = 0; j < np; j++) {
		int held = 0, was = 0, planned = 0;
		for (int i = 0; i < K; i++) {
			held += L->res[i * H + h] == pages[j];
			was += old[i] == pages[j];
		}
		for (int u = n0; u < *n; u++)
			planned += units[u].page == pages[j] && units[u].head == h;
		ok &= held == 1 && planned == (was ? 0 : 1) && !(j && pages[j] <= pages[j - 1]);
	}
	for (int i = 0; i < K; i++) {
		bool wanted = false;
		for (int j = 0; j < np; j++)
			wanted |= old[i] == pages[j];
		ok &= !wanted || L->res[i * H + h] == old[i];
	}
	int fresh = 0;
	for (int j = 0; j < np; j++) {
		bool was = false;
		for (int i = 0; i < K; i++)
			was |= old[i] == pages[j];
		fresh += !was;
	}
	if (!ok || fresh != *n - n0) {
		fprintf(stderr, "policy %s: layer %d head %d: recall plan is not the changed pages\n",
			s->strat->name, L->layer, h);
		return -EIO;
	}
	return 0;
}

int paged_recall_now(struct paged *s, struct paged_layer *L, struct recall_unit *units, int n)
{
	if (!n)
		return 0;
	uint64_t ticket;
	struct recall_done dn;
	int ret = recall_submit(s->rc, units, n, NULL, NULL, &ticket);
	if (ret)
		return ret;
	ret = recall_wait(s->rc, ticket, &dn);
	L->st.ns_recall_wait += dn.ns_waited;
	L->st.pages_recalled += dn.units;
	L->st.bytes_recalled += dn.bytes;
	if (ret)
		paged_drop_selection(s, L);
	return ret;
}

void paged_drop_selection(struct paged *s, struct paged_layer *L)
{
	for (int i = 0; i < s->k_sel * s->g.n_kv; i++)
		L->res[i] = -1;
	L->have_target = false;
	L->prev_valid = false;
}
