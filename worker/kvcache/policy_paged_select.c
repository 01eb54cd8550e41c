/* policy_paged_select — the paged state's selection (docs/design.md §5 "Selection", "The GPU
 * decode step"). Top-k goes through the backend's select ops: the query and the summaries stay
 * on the backend (the resident mask goes with the call, staged without a wait); only the
 * selection's page lists come back, waited for on the blocking paths (quest, freekv's
 * corrections: recall is on the critical path there anyway) and through a fence on the recall
 * thread on freekv's speculative path, so the compute thread never waits for a speculative
 * selection. Top-p (hardkv, freekv --kv-top-p) has no backend op: it runs topp.c on the host
 * over the query's host copy and the host summaries, freekv's speculative one on the recall
 * thread. See policy_paged.h. */
#include "policy_paged.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "topp.h"

void paged_select_host(const struct paged *s, const struct paged_layer *L, const float *q,
		       const struct select_layout *lay, const float *kmin, const float *kmax,
		       const int8_t *theta_k, int *pages, float *scratch)
{
	if (s->top_p > 0.0)
		/* the scratch holds doubles here: grow_summaries sized it for both */
		topp_select(&s->g, lay, q, kmin, kmax, L->page_cap, theta_k, s->top_p, pages,
			    (double *)(void *)scratch);
	else
		select_topk(&s->g, lay, q, kmin, kmax, L->page_cap, pages, scratch);
}

/* Top-p on the host over the host summaries, timed into *ns. */
static void select_topp(struct paged *s, struct paged_layer *L, const float *q,
			const struct select_layout *lay, int *pages, float *scratch, int64_t *ns)
{
	int64_t t0 = paged_now_ns();
	paged_select_host(s, L, q, lay, L->hkmin, L->hkmax, L->theta_k, pages, scratch);
	*ns += paged_now_ns() - t0;
}

/* Builds the resident mask of L->res (which page each head already holds in a selected slot;
 * host memory, which the op reads before it returns) and queues select_pages into L->dsel. */
static int select_queue(struct paged *s, struct paged_layer *L, const float *q,
			const struct select_layout *lay)
{
	struct backend *be = s->p.be;
	const int H = s->g.n_kv, K = s->k_sel;
	const size_t mask = (size_t)H * L->page_cap;
	memset(L->res_mask, 0, mask);
	for (int i = 0; i < K; i++)
		for (int h = 0; h < H; h++) {
			int pg = L->res[i * H + h];
			if (pg >= 0 && pg < L->page_cap)
				L->res_mask[(size_t)h * L->page_cap + pg] = 1;
		}
	const struct backend_select g = {
		.n_q = s->g.n_q, .n_kv = H, .d = s->g.d, .page_stride = L->page_cap,
		.cand_begin = lay->cand_begin, .n_cand = lay->cand_end - lay->cand_begin,
		.k = lay->k,
	};
	if (lay->k != K || g.cand_begin + g.n_cand > L->page_cap)
		return -EINVAL; /* a compressed layout always keeps k_sel summarised candidates */
	return be->ops->select_pages(be->ctx, &g, q, L->kmin, L->kmax, L->res_mask, L->dsel,
				     L->dsel + (size_t)H * K, L->dsel + (size_t)2 * H * K);
}

/* Copies the pages out of L->hsel; with debug_invariants, checks that the op's changed lists
 * are exactly the selected pages L->res does not hold, ascending, padded with -1. */
static int select_take(struct paged *s, struct paged_layer *L, int *pages)
{
	const int H = s->g.n_kv, K = s->k_sel;
	const int32_t *sel = L->hsel, *chg = sel + (size_t)H * K, *nchg = chg + (size_t)H * K;
	for (int i = 0; i < H * K; i++)
		pages[i] = sel[i];
	if (!s->p.opts.debug_invariants)
		return 0;
	for (int h = 0; h < H; h++) {
		int n = 0;
		bool ok = true;
		for (int j = 0; j < K; j++) {
			bool held = false;
			for (int i = 0; i < K && !held; i++)
				held = L->res[i * H + h] == sel[h * K + j];
			if (!held)
				ok &= n < K && chg[h * K + n++] == sel[h * K + j];
		}
		ok &= nchg[h] == n;
		for (int i = n; i < K; i++)
			ok &= chg[h * K + i] == -1;
		if (!ok) {
			fprintf(stderr, "policy %s: layer %d head %d: select_pages' changed pages are "
				"not the selected pages outside the resident set\n", s->strat->name,
				L->layer, h);
			return -EIO;
		}
	}
	return 0;
}

int paged_select(struct paged *s, struct paged_layer *L, const float *q,
		 const struct select_layout *lay, int *pages, int64_t *ns)
{
	if (s->top_p > 0.0) {
		select_topp(s, L, s->hq, lay, pages, L->scratch_c, ns);
		return 0;
	}
	struct backend *be = s->p.be;
	const size_t bytes = (2 * (size_t)s->g.n_kv * s->k_sel + s->g.n_kv) * sizeof(int32_t);
	int64_t t0 = paged_now_ns();
	int ret = select_queue(s, L, q, lay)
	       ?: be->ops->download(be->ctx, L->hsel, L->dsel, bytes);
	*ns += paged_now_ns() - t0;
	return ret ? ret : select_take(s, L, pages);
}

int paged_select_start(struct paged *s, struct paged_layer *L, const float *q,
		       const struct select_layout *lay, int64_t *ns)
{
	if (s->top_p > 0.0) { /* the recall thread selects on the host, from copies */
		memcpy(L->q_spec, s->hq, (size_t)s->g.n_q * s->g.d * sizeof *L->q_spec);
		L->spec_lay = *lay;
		return 0;
	}
	struct backend *be = s->p.be;
	const size_t bytes = (2 * (size_t)s->g.n_kv * s->k_sel + s->g.n_kv) * sizeof(int32_t);
	int64_t t0 = paged_now_ns();
	int ret = select_queue(s, L, q, lay);
	if (!ret)
		ret = L->fence ? be->ops->download_async(be->ctx, L->hsel, L->dsel, bytes, L->fence)
			       : be->ops->download(be->ctx, L->hsel, L->dsel, bytes);
	*ns += paged_now_ns() - t0;
	return ret;
}

int paged_select_finish(struct paged *s, struct paged_layer *L, int *pages, int64_t *ns)
{
	if (s->top_p > 0.0) {
		select_topp(s, L, L->q_spec, &L->spec_lay, pages, L->scratch_r, ns);
		return 0;
	}
	struct backend *be = s->p.be;
	int64_t t0 = paged_now_ns();
	int ret = L->fence ? be->ops->fence_wait(be->ctx, L->fence) : 0;
	*ns += paged_now_ns() - t0;
	return ret ? ret : select_take(s, L, pages);
}
