/* policy_freekv — speculative retrieval with fine-grained correction (docs/design.md §5, the seed
 * paper). At a compressed decode step, at layer l:
 *   - correction check: per KV head, the group-mean cosine of q_t and q_{t-1} (group_cosine on
 *     the backend); below tau the head is flagged;
 *   - if any head is flagged: selection with q_t for every head now, and a blocking recall of
 *     the flagged heads' changed pages; unflagged heads keep the pages selected with q_{t-1};
 *   - attention over sink + those pages + window;
 *   - beside the rest of the step: selection with q_t when it did not run above, queued on the
 *     backend behind the attention (select_pages) and taken by the recall stream's copy thread
 *     behind a fence, and the recall of the unflagged heads' changed pages into their
 *     slots for step t+1 (staged through the double buffer). Step t+1 waits for it at layer l
 *     before touching the layer (paged_append).
 * The first compressed step (and the first after a resume) selects with the current query.
 * tau 0 never corrects (pure speculation); tau > 1 corrects every head every step, which is
 * exactly `quest`. With --kv-top-p every selection is hardkv's instead of top-k (docs/design.md §5
 * "hardkv": per-head page counts on calibrated scores, calibrated at the same steps, before
 * the correction check); speculation and correction are unchanged, and tau > 1 is then
 * exactly `hardkv`. */
#include "policy_paged.h"

#include <string.h>

static void set_att(struct paged *s, struct paged_layer *L)
{
	memcpy(L->att, L->target, (size_t)s->g.n_kv * s->k_sel * sizeof *L->att);
}

static int freekv_before(struct paged *s, struct paged_layer *L, const float *q,
			 const struct select_layout *lay)
{
	const int H = s->g.n_kv, K = s->k_sel;
	int n = 0, ret = s->top_p > 0.0 ? paged_calibrate(s, L, s->hq, lay) : 0;
	if (ret)
		return ret;
	memset(L->spec_heads, 0, (size_t)H);
	if (!L->have_target || !L->have_q) {
		ret = paged_select(s, L, q, lay, L->target, &L->st.ns_select);
		for (int h = 0; h < H && !ret; h++)
			ret = paged_plan_head(s, L, h, L->target + h * K, L->units_c, &n);
		if (ret)
			return ret;
		L->have_target = true;
		L->spec_select = false;
		memset(L->att_now, 1, (size_t)H);
		set_att(s, L);
		return paged_recall_now(s, L, L->units_c, n);
	}
	/* The check runs on the backend; its n_kv cosines are the one result the compute thread
	 * waits for, because a flagged head's recall must land before this step's attention.
	 * Where no cosine can change the outcome it is not computed, and nothing is waited for:
	 * tau 0 flags no head, tau > 1 every head (a cosine is at most 1), and --no-speculation
	 * (quest's step) every head. */
	const float tau = s->p.opts.tau;
	const bool every = s->p.opts.no_speculation || tau > 1.0f;
	float cos[H];
	if (!every && tau > 0.0f) {
		struct backend *be = s->p.be;
		ret = be->ops->group_cosine(be->ctx, L->dcos, q, L->dq, s->g.n_q, H, s->g.d)
		   ?: be->ops->download(be->ctx, cos, L->dcos, sizeof cos);
		if (ret)
			return ret;
	}
	int flagged = 0;
	for (int h = 0; h < H; h++) {
		L->spec_heads[h] = !every && !(tau > 0.0f && cos[h] < tau);
		flagged += !L->spec_heads[h];
	}
	L->st.head_checks += H;
	L->st.corrections += flagged;
	L->spec_select = !flagged;
	for (int h = 0; h < H; h++)
		L->att_now[h] = !L->spec_heads[h];
	if (flagged) {
		ret = paged_select(s, L, q, lay, L->fresh, &L->st.ns_select);
		for (int h = 0; h < H && !ret; h++) {
			if (L->spec_heads[h])
				continue;
			memcpy(L->target + h * K, L->fresh + h * K, (size_t)K * sizeof *L->target);
			ret = paged_plan_head(s, L, h, L->target + h * K, L->units_c, &n);
		}
		if (ret)
			return ret;
	}
	set_att(s, L);
	return paged_recall_now(s, L, L->units_c, n);
}

/* Copy thread: the selection with q_t queued by freekv_after (waited for here, on its fence,
 * not on the compute thread) if needed, then the unflagged heads' recall plan. */
static int freekv_prepare(void *arg, struct recall_unit **units, int *n)
{
	struct paged_layer *L = arg;
	struct paged *s = L->owner;
	const int K = s->k_sel;
	*n = 0;
	*units = L->units_r;
	if (L->spec_select) {
		int ret = paged_select_finish(s, L, L->fresh, &L->spec_ns_select);
		if (ret)
			return ret;
	}
	for (int h = 0; h < s->g.n_kv; h++) {
		if (!L->spec_heads[h])
			continue;
		memcpy(L->target + h * K, L->fresh + h * K, (size_t)K * sizeof *L->target);
		int ret = paged_plan_head(s, L, h, L->target + h * K, L->units_r, n);
		if (ret)
			return ret;
	}
	return 0;
}

static int freekv_after(struct paged *s, struct paged_layer *L, const float *q,
			const struct select_layout *lay)
{
	bool any = false;
	for (int h = 0; h < s->g.n_kv; h++)
		any |= L->spec_heads[h];
	if (!any)
		return 0;
	/* Queued on the backend behind this step's attention; the recall thread waits for it. */
	if (L->spec_select) {
		int ret = paged_select_start(s, L, q, lay, &L->st.ns_select);
		if (ret)
			return ret;
	}
	return recall_submit_fenced(s->rc, NULL, 0, freekv_prepare, L, L->rc_done, &L->ticket);
}

static const struct paged_strategy freekv = {
	.name = "freekv",
	.recalls = true,
	.keep_recent = false,
	.before_attend = freekv_before,
	.after_attend = freekv_after,
	.top_p = true,
	.top_p_default = 0.0f,
};

static int freekv_create(const struct kv_seq_params *p, void **st)
{
	return paged_create(p, &freekv, st);
}

const struct kv_policy_ops kv_policy_freekv = PAGED_POLICY_OPS("freekv", freekv_create);
