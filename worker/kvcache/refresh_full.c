/* refresh_full — refreshkv's full step (docs/design.md §5; the state is in policy_refresh.h).
 *
 * Two passes over the layer's host copy, chunk by chunk in position order, so nothing of size T
 * but the scores lives on the device: pass 0 computes every query head's scores over the
 * chunk's keys (attn_scores), then one softmax over all T gives the probabilities a_i, which
 * are pooled and ranked into the new sets (the backend's pool_topk, or refresh_topk on the
 * host); pass 1 adds the chunk's share of the output (attn_accum, the same sum in key order as
 * `full`'s decode attention, so on the CPU backend the output is `full`'s to the bit) and
 * fetches the positions new to a set that fall in the chunk into the slots they take (slots of
 * members that left). On a backend whose buffers are host memory a chunk is its pinned host
 * blocks, read in place (HND: head h's rows of a block are contiguous, d apart); elsewhere it
 * is streamed through the recall stream's double buffer into one of two staging halves of NHD
 * slots, the next chunk copying while this one computes. */
#include "policy_refresh.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hostkv.h"
#include "layout.h"
#include "refresh_select.h"
#include "log.h"

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int refresh_reserve(struct refresh *s, int64_t T)
{
	if (T <= s->prob_cap)
		return 0;
	struct backend *be = s->p.be;
	int64_t cap = s->prob_cap ? s->prob_cap : 256;
	while (cap < T)
		cap *= 2;
	if (cap > s->p.max_tokens)
		cap = s->p.max_tokens;
	size_t n = (size_t)s->n_q * (size_t)cap;
	float *lg = be->ops->buf_alloc(be->ctx, n * sizeof(float));
	float *hp = malloc(n * sizeof *hp);
	float *sel = malloc(refresh_scratch_floats(cap) * sizeof *sel);
	if (!lg || !hp || !sel) {
		if (lg)
			be->ops->buf_free(be->ctx, lg);
		free(hp);
		free(sel);
		return -ENOMEM;
	}
	if (s->logits)
		be->ops->buf_free(be->ctx, s->logits);
	free(s->hprobs);
	free(s->sel);
	s->logits = lg;
	s->hprobs = hp;
	s->sel = sel;
	s->prob_cap = cap;
	return 0;
}

/* One chunk of pages [pg0, pg1) of the layer. */
struct chunk {
	int pg0, pg1, half;
	const void *blocks[REFRESH_CHUNK_PAGES]; /* direct: the pinned blocks */
	int pages[REFRESH_CHUNK_PAGES];
};

struct pass {
	struct refresh *s;
	struct rlayer *L;
	int l;
	int64_t T;
	int n_pages, n_chunks;
	uint64_t ticket[2];	/* streamed: the recall job filling each half (0: none) */
	int *cursor;		/* (n_kv) next fetch of each head (pass 1) */
	int *n_head;		/* (n_kv) fetches of each head */
};

static int64_t keys_of(const struct pass *ps, int pg)
{
	int64_t n = ps->T - (int64_t)pg * ps->s->P;
	return n < ps->s->P ? n : ps->s->P;
}

static float *half_slot(const struct refresh *s, int half, int i)
{
	return s->stream + ((size_t)half * REFRESH_CHUNK_PAGES + (size_t)i) * 2 * s->P * s->row;
}

/* Streamed: queues the recall of chunk c into its half. */
static int submit_chunk(struct pass *ps, int c)
{
	struct refresh *s = ps->s;
	int pg0 = c * REFRESH_CHUNK_PAGES, half = c & 1, n = 0;
	int pg1 = pg0 + REFRESH_CHUNK_PAGES < ps->n_pages ? pg0 + REFRESH_CHUNK_PAGES : ps->n_pages;
	struct recall_unit *u = s->units + (size_t)half * REFRESH_CHUNK_PAGES * s->n_kv;
	for (int pg = pg0; pg < pg1; pg++)
		for (int h = 0; h < s->n_kv; h++)
			u[n++] = (struct recall_unit){ .layer = ps->l, .page = pg, .head = h,
						       .slot = half_slot(s, half, pg - pg0) };
	return recall_submit(s->rc, u, n, NULL, NULL, &ps->ticket[half]);
}

static int wait_half(struct pass *ps, int half)
{
	if (!ps->ticket[half])
		return 0;
	struct recall_done dn;
	int ret = recall_wait(ps->s->rc, ps->ticket[half], &dn);
	ps->ticket[half] = 0;
	ps->L->st.ns_recall_wait += dn.ns_waited;
	ps->L->st.pages_recalled += dn.units;
	ps->L->st.bytes_recalled += dn.bytes;
	return ret;
}

/* Makes chunk c readable (pins it, or waits for its recall after queueing the next one) and
 * lays out every head's spans over it; resident: the chunk is already in half 0. */
static int open_chunk(struct pass *ps, int c, struct chunk *ch, bool resident)
{
	struct refresh *s = ps->s;
	const int P = s->P, H = s->n_kv, d = s->d;
	ch->pg0 = c * REFRESH_CHUNK_PAGES;
	ch->pg1 = ch->pg0 + REFRESH_CHUNK_PAGES < ps->n_pages ? ch->pg0 + REFRESH_CHUNK_PAGES
							      : ps->n_pages;
	ch->half = c & 1;
	const int n = ch->pg1 - ch->pg0;
	int ret = 0;
	if (s->direct) {
		char err[256];
		for (int i = 0; i < n; i++)
			ch->pages[i] = ch->pg0 + i;
		ret = hostkv_pin_many(s->p.host, ps->l, ch->pages, n, ch->blocks, err, sizeof err);
		if (ret)
			log_error("refreshkv: host KV copy: %s", err);
	} else if (!resident) {
		if (c + 1 < ps->n_chunks)
			ret = submit_chunk(ps, c + 1);
		int r2 = wait_half(ps, ch->half);
		ret = ret ? ret : r2;
	}
	if (ret)
		return ret;
	const size_t es = dtype_size(s->wt.g.dtype), ub = layout_unit_bytes(&s->wt.g);
	for (int h = 0; h < H; h++) {
		s->first[h] = h * n;
		for (int i = 0; i < n; i++) {
			struct backend_kv_span *sp = &s->spans[h * n + i];
			if (s->direct) {
				/* Head h's K rows of the block, d apart; the op adds h * d. */
				const char *k = (const char *)ch->blocks[i] + (size_t)h * ub -
						(size_t)h * d * es;
				*sp = (struct backend_kv_span){ .k = k, .v = k + (size_t)P * d * es,
								.n = keys_of(ps, ch->pg0 + i),
								.row_stride = d };
			} else {
				const float *sl = half_slot(s, ch->half, i);
				*sp = (struct backend_kv_span){ .k = sl, .v = sl + (size_t)P * s->row,
								.n = keys_of(ps, ch->pg0 + i),
								.row_stride = (int64_t)s->row };
			}
		}
	}
	s->first[H] = H * n;
	return 0;
}

static int close_chunk(struct pass *ps, struct chunk *ch)
{
	if (!ps->s->direct)
		return 0;
	char err[256];
	int ret = hostkv_unpin_many(ps->s->p.host, ps->l, ch->pages, ch->pg1 - ch->pg0, err,
				    sizeof err);
	if (ret)
		log_error("refreshkv: host KV copy: %s", err);
	return ret;
}

/* Pass 1's fetches that fall in the chunk: every head's new members at positions below the
 * chunk's end, into their slots (K row slot, V row B + slot). */
static int fetch_chunk(struct pass *ps, const struct chunk *ch)
{
	struct refresh *s = ps->s;
	struct backend *be = s->p.be;
	const int P = s->P, H = s->n_kv, d = s->d, B = s->B;
	const int64_t end = (int64_t)ch->pg1 * P;
	int m = 0, ret = 0;
	for (int h = 0; h < H && !ret; h++) {
		const int32_t *f = s->fetch + (size_t)h * B * 2;
		for (; ps->cursor[h] < ps->n_head[h] && f[2 * ps->cursor[h] + 1] < end; ps->cursor[h]++) {
			const int slot = f[2 * ps->cursor[h]], pos = f[2 * ps->cursor[h] + 1];
			const int i = pos / P - ch->pg0, t = pos % P;
			if (s->direct) {
				layout_load_head(&s->wt.g, ch->blocks[i], h, t, t + 1, s->hrow,
						 s->hrow + d);
				ret = be->ops->upload(be->ctx, s->L[ps->l].slots +
						      refresh_slot_off(s, slot, h), s->hrow,
						      (size_t)d * sizeof(float))
				   ?: be->ops->upload(be->ctx, s->L[ps->l].slots +
						      refresh_slot_off(s, (int64_t)B + slot, h),
						      s->hrow + d, (size_t)d * sizeof(float));
				if (ret)
					break;
				continue;
			}
			/* The staging half as (rows, n_kv, d): page i's K rows, then its V rows. */
			const int32_t src = (int32_t)(((size_t)ch->half * REFRESH_CHUNK_PAGES + i) *
						      2 * P + t);
			int32_t *e = s->map + (size_t)m * 3;
			e[0] = slot, e[1] = src, e[2] = h;
			e[3] = B + slot, e[4] = src + P, e[5] = h;
			m += 2;
		}
	}
	if (ret || !m)
		return ret;
	if (be->ops->gather_heads)
		return be->ops->gather_heads(be->ctx, s->L[ps->l].slots, s->stream, s->map, m, H, d);
	for (int j = 0; j < m && !ret; j++) {
		const int32_t *e = s->map + (size_t)j * 3;
		ret = be->ops->copy(be->ctx, s->L[ps->l].slots + refresh_slot_off(s, e[0], e[2]),
				    s->stream + refresh_slot_off(s, e[1], e[2]),
				    (size_t)d * sizeof(float));
	}
	return ret;
}

/* One pass over every chunk: 0 scores into s->logits, 1 the output and the fetches. */
static int run_pass(struct pass *ps, int pass, const float *q, float *out)
{
	struct refresh *s = ps->s;
	struct backend *be = s->p.be;
	struct backend_attn a = s->p.attn;
	a.kv_dtype = s->direct ? s->wt.g.dtype : FKV_F32;
	a.window = 0;
	/* A layer of one chunk stays in its half between the passes. */
	const bool resident = !s->direct && pass == 1 && ps->n_chunks == 1;
	int ret = !s->direct && !resident ? submit_chunk(ps, 0) : 0;
	for (int c = 0; c < ps->n_chunks && !ret; c++) {
		struct chunk ch;
		ret = open_chunk(ps, c, &ch, resident);
		if (ret)
			break;
		float *col = s->logits + (size_t)ch.pg0 * s->P;
		if (pass == 0)
			ret = be->ops->attn_scores(be->ctx, col, ps->T, q, s->spans, s->first, &a);
		else
			ret = be->ops->attn_accum(be->ctx, out, col, ps->T, s->spans, s->first, c > 0,
						  &a) ?: fetch_chunk(ps, &ch);
		int r2 = close_chunk(ps, &ch);
		ret = ret ? ret : r2;
	}
	for (int h = 0; h < 2; h++) {
		int r2 = wait_half(ps, h); /* a job left behind by a failure borrows the half */
		ret = ret ? ret : r2;
	}
	return ret;
}

/* Head h's old members sorted by position into idx (slots; empty ones first): merge sort. */
static void slots_by_pos(const int32_t *set, int B, int *idx, int *tmp)
{
	for (int i = 0; i < B; i++)
		idx[i] = i;
	for (int w = 1; w < B; w *= 2) {
		for (int lo = 0; lo < B; lo += 2 * w) {
			int mid = lo + w < B ? lo + w : B, hi = lo + 2 * w < B ? lo + 2 * w : B;
			int i = lo, j = mid, k = lo;
			while (i < mid && j < hi)
				tmp[k++] = set[idx[j]] < set[idx[i]] ? idx[j++] : idx[i++];
			while (i < mid)
				tmp[k++] = idx[i++];
			while (j < hi)
				tmp[k++] = idx[j++];
		}
		memcpy(idx, tmp, (size_t)B * sizeof *idx);
	}
}

/* Where each new member goes: a member already in the set keeps its slot, a new one takes a
 * slot freed by a member that left (or an empty one) and is listed for fetching, per head in
 * position order: s->fetch (n_kv, B, 2) (slot, position), n_head its counts. */
static void plan_sets(struct refresh *s, struct rlayer *L, int *n_head)
{
	const int B = s->B;
	s->n_fetch = 0;
	for (int h = 0; h < s->n_kv; h++) {
		const int32_t *old = L->set + (size_t)h * B, *nw = s->npos + (size_t)h * B;
		int32_t *slot = s->nslot + (size_t)h * B, *f = s->fetch + (size_t)h * B * 2;
		int *idx = s->order, *freed = s->tmp, n_freed = 0;
		slots_by_pos(old, B, idx, s->tmp);
		/* Two-pointer walk: old members in position order against the new set. */
		int i = 0, j = 0;
		for (int k = 0; k < B; k++)
			slot[k] = -1;
		while (i < B) {
			const int32_t op = old[idx[i]];
			while (j < B && nw[j] < op)
				j++;
			if (op >= 0 && j < B && nw[j] == op)
				slot[j] = idx[i];
			i++;
		}
		/* Slots not kept are free, in slot order (idx now marks the kept ones). */
		memset(idx, 0, (size_t)B * sizeof *idx);
		for (int k = 0; k < B; k++)
			if (slot[k] >= 0)
				idx[slot[k]] = 1;
		for (int k = 0; k < B; k++)
			if (!idx[k])
				freed[n_freed++] = k;
		int n = 0;
		for (int k = 0, fi = 0; k < B; k++)
			if (slot[k] < 0) {
				slot[k] = freed[fi++];
				f[2 * n] = slot[k];
				f[2 * n + 1] = nw[k];
				n++;
			}
		n_head[h] = n;
		s->n_fetch += n;
	}
}

int refresh_full_step(struct refresh *s, int l, float *out, const float *q, int64_t T)
{
	struct backend *be = s->p.be;
	struct rlayer *L = &s->L[l];
	const int64_t t0 = now_ns();
	int cursor[s->n_kv], n_head[s->n_kv];
	struct pass ps = {
		.s = s, .L = L, .l = l, .T = T,
		.n_pages = (int)((T + s->P - 1) / s->P), .cursor = cursor, .n_head = n_head,
	};
	ps.n_chunks = (ps.n_pages + REFRESH_CHUNK_PAGES - 1) / REFRESH_CHUNK_PAGES;
	/* The step's own row is in the host copy once its write-through has landed. */
	int ret = kv_wt_fence(&s->wt) ?: refresh_reserve(s, T) ?: run_pass(&ps, 0, q, NULL)
		  ?: be->ops->softmax(be->ctx, s->logits, s->n_q, T);
	const int64_t ts = now_ns();
	if (!ret) {
		/* The new sets: on the backend when it has the op, else from the probabilities. */
		if (be->ops->pool_topk)
			ret = be->ops->pool_topk(be->ctx, s->npos, s->nu, s->logits, T, s->n_q,
						 s->n_kv, T, s->B);
		else if (!(ret = be->ops->download(be->ctx, s->hprobs, s->logits,
						   (size_t)s->n_q * (size_t)T * sizeof(float))))
			refresh_topk(s->hprobs, T, s->n_q, s->n_kv, T, s->B, s->npos, s->nu,
				     s->sel);
	}
	if (!ret) {
		plan_sets(s, L, n_head);
		L->st.ns_select += now_ns() - ts;
		memset(cursor, 0, sizeof cursor);
		ret = run_pass(&ps, 1, q, out);
	}
	const int B = s->B;
	if (ret) {
		/* Slots may hold rows of the sets that were being built: start over. */
		for (size_t i = 0; i < (size_t)s->n_kv * B; i++)
			L->set[i] = -1;
		L->need_full = true;
		return ret;
	}
	for (int h = 0; h < s->n_kv; h++) {
		const int32_t *nw = s->npos + (size_t)h * B, *slot = s->nslot + (size_t)h * B;
		refresh_evict_order(nw, s->nu + (size_t)h * B, B, s->order, s->tmp);
		for (int k = 0; k < B; k++) {
			L->evq[(size_t)h * B + k] = slot[s->order[k]];
			L->set[(size_t)h * B + slot[k]] = nw[k];
		}
	}
	memcpy(L->qbar, s->qm, (size_t)s->d * sizeof *L->qbar);
	L->c = 0;
	L->ev_next = 0;
	L->need_full = false;
	L->st.tokens_fetched += s->n_fetch;
	if (s->direct)
		L->st.bytes_recalled += (int64_t)s->n_fetch * 2 * s->d *
					(int64_t)dtype_size(s->wt.g.dtype);
	L->st.ns_full += now_ns() - t0;
	s->attended += T;
	return 0;
}
