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

void *paged_slot(const struct paged *s, const struct paged_layer *L, int slot)
{
	return L->slots + (size_t)slot * s->slot_bytes;
}

/* Uploads n f32 values (already rounded to the KV dtype) as the slot dtype: converted on the
 * host (exact), so the backend receives the bytes it keeps. */
static int upload_as_slot(struct paged *s, void *dst, const float *src, size_t n)
{
	struct backend *be = s->p.be;
	if (s->sdt == FKV_F32)
		return be->ops->upload(be->ctx, dst, src, n * sizeof *src);
	void *tmp = malloc(n * s->es);
	if (!tmp)
		return -ENOMEM;
	dtype_from_f32(tmp, src, s->sdt, n);
	int ret = be->ops->upload(be->ctx, dst, tmp, n * s->es);
	free(tmp);
	return ret;
}

static int win_slot(const struct paged *s, int page)
{
	return s->n_sink + (page - s->n_sink) % s->n_win;
}

static int sel_slot_index(const struct paged *s, int page)
{
	return (page - s->n_sink) % s->k_sel;
}

/* The layer's dense prefill buffers, gone (decode begins, or the sequence ends). */
static void dense_free(struct paged *s, struct paged_layer *L)
{
	struct backend *be = s->p.be;
	if (L->dense_k)
		be->ops->buf_free(be->ctx, L->dense_k);
	if (L->dense_v)
		be->ops->buf_free(be->ctx, L->dense_v);
	L->dense_k = L->dense_v = NULL;
	L->dense_cap = L->dense_len = 0;
}

static void layer_free(struct paged *s, struct paged_layer *L)
{
	dense_free(s, L);
	if (L->slots)
		s->p.be->ops->buf_free(s->p.be->ctx, L->slots);
	struct backend *be = s->p.be;
	void *bufs[] = { L->kmin, L->kmax, L->dq, L->dsel, L->dcos };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		if (bufs[i])
			be->ops->buf_free(be->ctx, bufs[i]);
	if (L->fence)
		be->ops->fence_free(be->ctx, L->fence);
	if (L->rc_done)
		be->ops->fence_free(be->ctx, L->rc_done);
	if (L->hsel && L->fence)
		be->ops->host_free(be->ctx, L->hsel);
	else
		free(L->hsel);
	free(L->res);
	free(L->target);
	free(L->fresh);
	free(L->res_mask);
	free(L->hkmin);
	free(L->hkmax);
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
	free(s->hraw);
	free(s);
}

/* Grows the summaries (backend buffers), the resident mask and the host scratch that scale
 * with them to hold need pages. Called on the compute thread with no speculative job in flight
 * for the layer; the old buffers are copied head by head on the backend, in stream order. */
static int grow_summaries(struct paged *s, struct paged_layer *L, int need)
{
	if (need <= L->page_cap)
		return 0;
	struct backend *be = s->p.be;
	int cap = L->page_cap ? L->page_cap : 2 * s->n_slots;
	while (cap < need)
		cap *= 2;
	size_t d = (size_t)s->g.d, H = (size_t)s->g.n_kv, old = (size_t)L->page_cap;
	size_t fb = H * cap * d * sizeof(float);
	float *mn = be->ops->buf_alloc(be->ctx, fb), *mx = be->ops->buf_alloc(be->ctx, fb);
	uint8_t *rm = calloc(H * cap, 1);
	/* top-p selection reads the scratch as doubles (topp.h), on both threads, and the
	 * summaries from their host copies */
	const bool tp = s->top_p > 0.0;
	size_t sf = select_scratch_floats(&s->g, cap), tf = 2 * topp_scratch_doubles(&s->g, cap);
	sf = tp && tf > sf ? tf : sf;
	float *sc = malloc(sf * sizeof *sc), *sr = tp ? malloc(sf * sizeof *sr) : NULL;
	float *hmn = tp ? calloc(H * cap * d, sizeof *hmn) : NULL;
	float *hmx = tp ? calloc(H * cap * d, sizeof *hmx) : NULL;
	int ret = mn && mx && rm && sc && (!tp || (sr && hmn && hmx)) ? 0 : -ENOMEM;
	for (size_t h = 0; old && h < H && !ret; h++)
		ret = be->ops->copy(be->ctx, mn + h * cap * d, L->kmin + h * old * d,
				    old * d * sizeof *mn)
		   ?: be->ops->copy(be->ctx, mx + h * cap * d, L->kmax + h * old * d,
				    old * d * sizeof *mx);
	for (size_t h = 0; old && tp && h < H && !ret; h++) {
		memcpy(hmn + h * cap * d, L->hkmin + h * old * d, old * d * sizeof *hmn);
		memcpy(hmx + h * cap * d, L->hkmax + h * old * d, old * d * sizeof *hmx);
	}
	if (ret) {
		void *bufs[] = { mn, mx };
		for (size_t i = 0; i < 2; i++)
			if (bufs[i])
				be->ops->buf_free(be->ctx, bufs[i]);
		free(rm);
		free(sr);
		free(hmn);
		free(hmx);
		free(sc);
		return ret;
	}
	if (L->kmin) {
		be->ops->buf_free(be->ctx, L->kmin);
		be->ops->buf_free(be->ctx, L->kmax);
	}
	free(L->res_mask);
	free(L->scratch_c);
	free(L->scratch_r);
	free(L->hkmin);
	free(L->hkmax);
	L->kmin = mn;
	L->kmax = mx;
	L->res_mask = rm;
	L->scratch_c = sc;
	L->scratch_r = sr;
	L->hkmin = hmn;
	L->hkmax = hmx;
	L->page_cap = cap;
	return 0;
}

static int layer_init(struct paged *s, struct paged_layer *L, int l)
{
	struct backend *be = s->p.be;
	size_t H = (size_t)s->g.n_kv, K = (size_t)s->k_sel, QD = (size_t)s->g.n_q * s->g.d;
	L->owner = s;
	L->layer = l;
	L->slots = be->ops->buf_alloc(be->ctx, (size_t)s->n_slots * s->slot_bytes);
	L->res = malloc(K * H * sizeof *L->res);
	L->target = calloc(H * K, sizeof *L->target);
	L->fresh = calloc(H * K, sizeof *L->fresh);
	L->att = calloc(H * K, sizeof *L->att);
	L->q_last = calloc(QD, sizeof *L->q_last);
	if (s->top_p > 0.0) /* the copy thread's top-p selection reads a host copy of q_t */
		L->q_spec = calloc(QD, sizeof *L->q_spec);
	L->dq = be->ops->buf_alloc(be->ctx, QD * sizeof(float));
	L->dcos = be->ops->buf_alloc(be->ctx, H * sizeof(float));
	const size_t sel_bytes = (2 * H * K + H) * sizeof(int32_t);
	L->dsel = be->ops->buf_alloc(be->ctx, sel_bytes);
	/* The selection's result lands in memory the device can write without staging, so the
	 * speculative path's download need not wait (docs/design.md "The GPU decode step"). */
	if (be->ops->download_async && be->ops->fence_new(be->ctx, &L->fence) == 0)
		L->hsel = be->ops->host_alloc(be->ctx, sel_bytes);
	else
		L->hsel = malloc(sel_bytes);
	/* The speculative recall's per-layer event (docs/design.md §5 step 6), where the backend
	 * can order its compute after one; else each scatter orders it when queued. */
	if (be->ops->fence_stream_wait && be->ops->fence_new(be->ctx, &L->rc_done))
		L->rc_done = NULL;
	L->units_c = calloc(H * K, sizeof *L->units_c);
	L->units_r = calloc(H * K, sizeof *L->units_r);
	L->spec_heads = calloc(H, 1);
	L->att_now = calloc(H, 1);
	L->theta_k = calloc(H, sizeof *L->theta_k);
	L->theta_k_prev = calloc(H, sizeof *L->theta_k_prev);
	L->since_cal = -1;
	if (!L->slots || !L->res || !L->target || !L->fresh || !L->att || !L->q_last ||
	    !L->dq || !L->dcos || !L->dsel || !L->hsel || !L->units_c || !L->units_r ||
	    !L->spec_heads || !L->att_now || !L->theta_k || !L->theta_k_prev ||
	    (s->top_p > 0.0 && !L->q_spec))
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
	if (!ops->attn_decode_heads || !ops->page_summary ||
	    (strat->recalls && (!ops->recall_units || !ops->select_pages || !ops->group_cosine)))
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
	if (select_geom_check(&s->g) || o->budget < o->sink + o->window + o->page ||
	    (o->recall_path != RECALL_MAPPED && o->recall_path != RECALL_STAGED &&
	     o->recall_path != RECALL_DMA)) {
		free(s);
		return -EINVAL;
	}
	s->n_sink = o->sink / o->page;
	s->n_win = o->window / o->page;
	s->k_sel = (o->budget - o->sink - o->window) / o->page;
	s->n_slots = o->budget / o->page;
	s->slot_floats = (size_t)2 * o->page * s->g.n_kv * s->g.d;
	s->sdt = ops->slot_dtype ? ops->slot_dtype(be->ctx, p->attn.kv_dtype) : FKV_F32;
	s->es = dtype_size(s->sdt);
	s->slot_bytes = s->slot_floats * s->es;
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
	s->hraw = malloc(s->slot_bytes);
	bool ok = s->L && s->hq && s->spans && s->span_page && s->first && s->slot_list &&
		  s->head_tok && s->chk && s->hslot && s->hraw;
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
		struct recall_opts ro = { .g = s->wt.g, .host = p->host, .be = be, .slot_dt = s->sdt,
					  .path = (enum recall_path)o->recall_path,
					  .max_jobs = 2 * p->n_layers + 2,
					  .fragmented = o->recall_fragmented,
					  .single_buffer = o->recall_single_buffer };
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
	/* Decode keeps O(B) per layer on the device: the prompt's dense rows go. */
	for (int l = 0; n == 1 && l < s->p.n_layers; l++)
		dense_free(s, &s->L[l]);
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
	/* Everything from here on touches the layer's slots: after the recall's scatters. */
	if (L->rc_done) {
		int r2 = s->p.be->ops->fence_stream_wait(s->p.be->ctx, L->rc_done);
		ret = ret ? ret : r2;
	}
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

/* Top-p selection and calibration run on the host (topp.c): they read a host copy of the
 * summaries, which takes page's rows of every head from the backend once page_summary has
 * made them (the same bits on every backend). Nothing under top-k. */
static int summary_to_host(struct paged *s, struct paged_layer *L, int page)
{
	struct backend *be = s->p.be;
	const size_t d = (size_t)s->g.d, bytes = d * sizeof(float);
	int ret = 0;
	for (int h = 0; s->top_p > 0.0 && h < s->g.n_kv && !ret; h++) {
		size_t at = ((size_t)h * L->page_cap + page) * d;
		ret = be->ops->download(be->ctx, L->hkmin + at, L->kmin + at, bytes)
		   ?: be->ops->download(be->ctx, L->hkmax + at, L->kmax + at, bytes);
	}
	return ret;
}

/* n rows of f32 values into dst in the slot dtype. Backend rows (dev) are converted or copied
 * and rounded to the KV dtype there (round_to); host rows are already rounded and are
 * converted on the host and uploaded: the same bytes either way. */
static int rows_to_slot(struct paged *s, char *dst, const float *src, size_t cnt, bool dev)
{
	struct backend *be = s->p.be;
	if (!dev)
		return upload_as_slot(s, dst, src, cnt);
	if (s->sdt != FKV_F32) /* f32 rows into 16-bit slots: rounded on the way */
		return be->ops->convert(be->ctx, dst, s->sdt, src, (int64_t)cnt);
	return be->ops->copy(be->ctx, dst, src, cnt * sizeof(float))
	    ?: be->ops->round_to(be->ctx, (float *)dst, (int64_t)cnt, s->p.attn.kv_dtype);
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
						    paged_slot(s, L, win_slot(s, gone)), s->slot_bytes);
				if (ret)
					return ret;
				for (int h = 0; h < H; h++)
					L->res[si * H + h] = gone;
			}
		}
		int slot = page < s->n_sink ? page : win_slot(s, page);
		char *sl = paged_slot(s, L, slot);
		const size_t cnt = (size_t)m * row, es = s->es;
		char *dk = sl + (size_t)off * row * es, *dv = sl + ((size_t)P + off) * row * es;
		ret = rows_to_slot(s, dk, k + i * row, cnt, dev)
		   ?: rows_to_slot(s, dv, v + i * row, cnt, dev);
		if (ret)
			return ret;
		/* Summarised on the backend from the slot's bytes, so the summaries are those of
		 * what attention reads, and no page is downloaded (docs/design.md §3). */
		if (off + m == P &&
		    ((ret = grow_summaries(s, L, page + 1)) ||
		     (ret = be->ops->page_summary(be->ctx, L->kmin, L->kmax, L->page_cap, page, sl,
						  s->sdt, P, H, d)) ||
		     (ret = summary_to_host(s, L, page))))
			return ret;
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

/* The layer's dense buffers hold at least need positions, the dense_len valid ones kept. */
static int grow_dense(struct paged *s, struct paged_layer *L, int64_t need)
{
	if (need <= L->dense_cap)
		return 0;
	struct backend *be = s->p.be;
	int64_t cap = L->dense_cap ? L->dense_cap : 256;
	while (cap < need)
		cap *= 2;
	const size_t row = (size_t)s->g.n_kv * s->g.d * s->es, bytes = (size_t)cap * row;
	char *k = be->ops->buf_alloc(be->ctx, bytes), *v = be->ops->buf_alloc(be->ctx, bytes);
	int ret = k && v ? 0 : -ENOMEM;
	if (!ret && L->dense_len)
		ret = be->ops->copy(be->ctx, k, L->dense_k, (size_t)L->dense_len * row)
		   ?: be->ops->copy(be->ctx, v, L->dense_v, (size_t)L->dense_len * row);
	if (ret) {
		if (k)
			be->ops->buf_free(be->ctx, k);
		if (v)
			be->ops->buf_free(be->ctx, v);
		return ret;
	}
	const int64_t keep = L->dense_len;
	dense_free(s, L);
	L->dense_k = k;
	L->dense_v = v;
	L->dense_cap = cap;
	L->dense_len = keep;
	return 0;
}

/* Prefill: every position of the layer, dense, for causal attention of the step's n queries.
 * The past is what the previous prefill step left (a prompt in several chunks: nothing to
 * read); else from the slots while it fits the budget (taken before the step's rows move pages
 * out; backend copies, one run per page), else from the host copy (a prefill after decode
 * steps: the worker's own blocks, committed or not, loaded on the host and uploaded, once);
 * then the step's rows k, v (n, n_kv, d) f32, on the backend (dev) or on the host. */
static int build_dense(struct paged *s, struct paged_layer *L, const float *k, const float *v,
		       int64_t n, bool dev)
{
	struct backend *be = s->p.be;
	const int64_t ctx = s->len + n;
	const int P = s->g.p;
	const size_t row = (size_t)s->g.n_kv * s->g.d;
	if (L->dense_len != s->len)
		L->dense_len = 0; /* a failed or retried step, or decode steps since */
	int ret = grow_dense(s, L, ctx);
	if (ret)
		return ret;
	if (L->dense_len == s->len) {
		/* kept from the previous prefill step */
	} else if (s->len > s->g.budget) {
		if (!s->p.host)
			return -EOPNOTSUPP;
		size_t cnt = (size_t)s->len * row;
		float *hk = malloc(cnt * sizeof *hk), *hv = malloc(cnt * sizeof *hv);
		ret = hk && hv ? kv_wt_load(&s->wt, L->layer, 0, s->len, hk, hv) : -ENOMEM;
		if (!ret)
			ret = upload_as_slot(s, L->dense_k, hk, cnt)
			   ?: upload_as_slot(s, L->dense_v, hv, cnt);
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
			const char *sl = paged_slot(s, L, slot);
			const size_t es = s->es;
			int off = (int)(t % P);
			int64_t m = s->len - t < P - off ? s->len - t : P - off;
			size_t bytes = (size_t)m * row * es;
			ret = be->ops->copy(be->ctx, L->dense_k + t * row * es,
					    sl + (size_t)off * row * es, bytes)
			   ?: be->ops->copy(be->ctx, L->dense_v + t * row * es,
					    sl + ((size_t)P + off) * row * es, bytes);
			if (ret)
				return ret;
			t += m;
		}
	}
	const size_t at = (size_t)s->len * row * s->es;
	ret = rows_to_slot(s, L->dense_k + at, k, (size_t)n * row, dev)
	   ?: rows_to_slot(s, L->dense_v + at, v, (size_t)n * row, dev);
	L->dense_len = ret ? 0 : ctx;
	return ret;
}

static int attend_dense(struct paged *s, struct paged_layer *L, float *out, const float *q,
			int64_t n)
{
	const int64_t ctx = s->len + n;
	struct backend_attn a = s->p.attn;
	a.kv_dtype = s->sdt;
	s->attended += ctx;
	return s->p.be->ops->attn_prefill(s->p.be->ctx, out, q, n, L->dense_k, L->dense_v, ctx,
					  &a);
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
	/* The rows stay on the backend (offload op; device copy and rounding into the dense
	 * prefill context and the slots): nothing is downloaded, in decode or in prefill. */
	if (s->p.be->ops->round_to || s->sdt != FKV_F32)
		return kv_wt_put(&s->wt, layer, s->len, k, v, n)
		    ?: (n > 1 ? build_dense(s, L, k, v, n, true) : 0)
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
	if (n > 1 && (ret = build_dense(s, L, hk, hv, n, false)))
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
			const char *sl = paged_slot(s, L, slot);
			s->slot_list[(size_t)h * s->n_slots + (ns - s->first[h])] = slot;
			s->span_page[ns] = j;
			s->spans[ns++] = (struct backend_kv_span){
				.k = sl, .v = sl + (size_t)P * H * s->g.d * s->es,
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

/* Debug: the layer's summaries downloaded into *mn, *mx (n_kv, page_cap, d), malloc'd. */
static int summaries_host(struct paged *s, struct paged_layer *L, float **mn, float **mx)
{
	struct backend *be = s->p.be;
	size_t bytes = (size_t)s->g.n_kv * L->page_cap * s->g.d * sizeof(float);
	*mn = malloc(bytes);
	*mx = malloc(bytes);
	int ret = *mn && *mx ? 0 : -ENOMEM;
	if (!ret)
		ret = be->ops->download(be->ctx, *mn, L->kmin, bytes)
		   ?: be->ops->download(be->ctx, *mx, L->kmax, bytes);
	if (ret) {
		free(*mn);
		free(*mx);
		*mn = *mx = NULL;
	}
	return ret;
}

/* Debug: every full page's min/max summary (made by the backend's page_summary) equals one
 * recomputed by select_page_summary from the host copy. */
static int check_summaries(struct paged *s, struct paged_layer *L, const struct select_layout *lay)
{
	const int P = s->g.p, d = s->g.d;
	float *k = malloc((size_t)(2 * P + 2) * d * sizeof *k), *hmn, *hmx;
	if (!k)
		return -ENOMEM;
	int ret = summaries_host(s, L, &hmn, &hmx);
	if (ret) {
		free(k);
		return ret;
	}
	float *v = k + (size_t)P * d, *mn = v + (size_t)P * d, *mx = mn + d;
	char err[256];
	for (int j = 0; j < lay->n_full && !ret; j++) {
		const void *block;
		ret = hostkv_block_ro_pin(s->p.host, L->layer, j, &block, err, sizeof err);
		if (ret)
			break;
		for (int h = 0; h < s->g.n_kv && !ret; h++) {
			layout_load_head(&s->wt.g, block, h, 0, P, k, v);
			select_page_summary(P, d, k, (size_t)d, mn, mx);
			size_t at = ((size_t)h * L->page_cap + j) * d;
			if (memcmp(mn, hmn + at, d * sizeof *mn) ||
			    memcmp(mx, hmx + at, d * sizeof *mx)) {
				fprintf(stderr, "policy %s: layer %d head %d: summary of page %d is "
					"stale\n", s->strat->name, L->layer, h, j);
				ret = -EIO;
			}
		}
		int r2 = hostkv_unpin(s->p.host, L->layer, j, err, sizeof err);
		ret = ret ? ret : r2;
	}
	free(k);
	free(hmn);
	free(hmx);
	return ret;
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

/* Debug: group-consistent selection as docs/design.md §5 defines it, recomputed by
 * paged_select_host
 * from downloaded summaries and host queries (independent of the backend's select_pages the
 * step ran): a head whose pages were selected with this step's query attends exactly the
 * selection of q_t at this layout (with the current temperatures); the others (freekv's
 * unflagged heads) exactly the selection of the previous query at the previous step's layout
 * and temperatures. Every query head of a group reads its KV head's pages (spans are per KV
 * head), so the group shares one selection. */
static int check_selection(struct paged *s, struct paged_layer *L, const struct select_layout *lay)
{
	const int H = s->g.n_kv, K = s->k_sel;
	int *now = malloc((size_t)2 * H * K * sizeof *now), *prev = now + (size_t)H * K;
	float *mn, *mx;
	if (!now)
		return -ENOMEM;
	int ret = summaries_host(s, L, &mn, &mx);
	if (ret) {
		free(now);
		return ret;
	}
	paged_select_host(s, L, s->hq, lay, mn, mx, L->theta_k, now, L->scratch_c);
	if (L->prev_valid)
		paged_select_host(s, L, L->q_last, &L->prev_lay, mn, mx, L->theta_k_prev, prev,
				  L->scratch_c);
	free(mn);
	free(mx);
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
			   ?: be->ops->download(be->ctx, s->hraw, at, s->slot_bytes);
			if (ret)
				return ret;
			dtype_to_f32(s->hslot, s->hraw, s->sdt, s->slot_floats);
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

/* A prefill's attention at a retrieval layer: over the dense rows of the step. */
static int attend_rows(struct paged *s, struct paged_layer *L, float *out, const float *q,
		       int64_t n)
{
	struct backend *be = s->p.be;
	const size_t qd = (size_t)s->g.n_q * s->g.d;
	L->prev_valid = false;
	const float *last = q + (size_t)(n - 1) * qd;
	int ret = attend_dense(s, L, out, q, n)
	       ?: be->ops->copy(be->ctx, L->dq, last, qd * sizeof(float));
	if (!ret && s->p.opts.debug_invariants)
		ret = be->ops->download(be->ctx, L->q_last, last, qd * sizeof(float));
	L->have_q = !ret;
	return ret;
}

/* A decode step at a retrieval layer up to its attention: the strategy's selection and recall
 * (before_attend) and the page lists; *lay the layout, *use_slots whether the attention goes
 * to attn_decode_slots (else attn_decode_heads over s->spans). */
static int attend_before(struct paged *s, struct paged_layer *L, const float *q,
			 struct select_layout *lay, bool *use_slots)
{
	struct backend *be = s->p.be;
	const size_t qd = (size_t)s->g.n_q * s->g.d;
	const bool dbg = s->p.opts.debug_invariants;
	const int len = (int)(s->len + 1);
	select_layout_of(&s->g, len, lay);
	int ret = 0;
	/* Only top-p selection (topp.c, on the host) and the debug checks read the query on the
	 * host; top-k decode keeps it on the backend (docs/design.md "The GPU decode step"). */
	if ((dbg || (lay->compressed && s->top_p > 0.0)) &&
	    (ret = be->ops->download(be->ctx, s->hq, q, qd * sizeof(float))))
		return ret;
	if (lay->compressed) {
		L->st.steps++;
		ret = s->strat->before_attend(s, L, q, lay);
		if (ret)
			return ret;
		for (int h = 0; h < s->g.n_kv; h++) {
			int c = att_count(s, L, h, lay);
			L->st.pages_selected += c;
			L->st.pages_max = c > L->st.pages_max ? c : L->st.pages_max;
		}
	}
	ret = build_spans(s, L, lay, len);
	*use_slots = !ret && be->ops->attn_decode_slots && spans_fit_slots(s);
	if (!ret && dbg)
		ret = check_invariants(s, L, lay, len, *use_slots);
	return ret;
}

/* The rest of a decode step at a retrieval layer once its attention (ret) has run. */
static int attend_after(struct paged *s, struct paged_layer *L, const float *q,
			const struct select_layout *lay, int ret)
{
	struct backend *be = s->p.be;
	const size_t qd = (size_t)s->g.n_q * s->g.d;
	if (!ret && lay->compressed && s->strat->after_attend)
		ret = s->strat->after_attend(s, L, q, lay);
	if (!ret)
		ret = be->ops->copy(be->ctx, L->dq, q, qd * sizeof(float));
	if (s->p.opts.debug_invariants)
		memcpy(L->q_last, s->hq, qd * sizeof(float));
	memcpy(L->theta_k_prev, L->theta_k, (size_t)s->g.n_kv * sizeof *L->theta_k);
	L->have_q = !ret;
	/* Once the layer's recall has landed, every head holds the selection of this query here. */
	L->prev_valid = !ret && lay->compressed && s->strat->recalls;
	L->prev_lay = *lay;
	return ret;
}

/* The attention attn_decode_slots runs for a decode step: the slot dtype's. */
static struct backend_attn slot_attn(const struct paged *s)
{
	struct backend_attn a = s->p.attn;
	a.kv_dtype = s->sdt;
	return a;
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
	if (n > 1)
		return attend_rows(s, L, out, q, n);
	struct select_layout lay;
	bool use_slots;
	int ret = attend_before(s, L, q, &lay, &use_slots);
	if (ret)
		return ret;
	const struct backend_attn a = slot_attn(s);
	int64_t t0 = paged_now_ns();
	if (use_slots)
		ret = be->ops->attn_decode_slots(be->ctx, out, q, L->slots, s->n_slots,
						 s->slot_list, s->n_slots, s->head_tok, s->g.p, &a);
	else
		ret = be->ops->attn_decode_heads(be->ctx, out, q, s->spans, s->first, &a);
	L->st.ns_attend += paged_now_ns() - t0;
	return attend_after(s, L, q, &lay, ret);
}

/* A decode step over slots is batched (its layout kept in s->batch_lay for
 * paged_attend_finish); over span lists, and prefill rows, it attends here. */
int paged_attend_prepare(void *st, int layer, float *out, const float *q, int64_t n,
			 struct backend_attn_item *it)
{
	struct paged *s = st;
	if (n != s->pending || layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	if (layer < s->full_layers)
		return kv_policy_full.attend_prepare(s->full, layer, out, q, n, it);
	if (n > 1) {
		int ret = paged_attend(st, layer, out, q, n);
		return ret ? ret : 1;
	}
	struct paged_layer *L = &s->L[layer];
	bool use_slots;
	int ret = attend_before(s, L, q, &s->batch_lay, &use_slots);
	if (ret)
		return ret;
	if (!use_slots) {
		struct backend *be = s->p.be;
		const struct backend_attn a = slot_attn(s);
		int64_t t0 = paged_now_ns();
		ret = be->ops->attn_decode_heads(be->ctx, out, q, s->spans, s->first, &a);
		L->st.ns_attend += paged_now_ns() - t0;
		ret = attend_after(s, L, q, &s->batch_lay, ret);
		return ret ? ret : 1;
	}
	*it = (struct backend_attn_item){ .slots = L->slots, .n_slots = s->n_slots,
					  .max_pages = s->n_slots, .p = s->g.p,
					  .list = s->slot_list, .n_tok = s->head_tok,
					  .a = slot_attn(s) };
	return 0;
}

int paged_attend_finish(void *st, int layer, const float *q, int64_t ns)
{
	struct paged *s = st;
	if (layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	if (layer < s->full_layers)
		return kv_policy_full.attend_finish(s->full, layer, q, ns);
	struct paged_layer *L = &s->L[layer];
	L->st.ns_attend += ns;
	return attend_after(s, L, q, &s->batch_lay, 0);
}

void paged_step_end(void *st)
{
	struct paged *s = st;
	if (s->full)
		kv_policy_full.step_end(s->full);
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
				(int64_t)retr * s->n_slots * (int64_t)s->slot_bytes,
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
	/* Urgent: the step waits for it, so it goes before other layers' speculative jobs. */
	int ret = recall_submit_urgent(s->rc, units, n, &ticket);
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
