/* policy_hardkv — head-adaptive top-p page budgets on calibrated scores (docs/design.md §5
 * "hardkv", after the HARD-KV seed, as retrieval): sink, window, candidates and page scores as
 * for quest; each KV head attends the fewest candidate pages, between 1 and k, whose calibrated
 * probability holds at least P (--kv-top-p) of the mass, so a head whose attention is concentrated
 * reads fewer pages and a head whose attention is spread reads up to k. The probabilities are
 * the group-mean softmax of the page scores at a per-layer, per-KV-head temperature, calibrated
 * against the true page mass of the current query over the whole layer, read from the host
 * copy: at the layer's first compressed step, the first after a resume, and every R
 * (--recalibrate) steps after that. A calibrating step selects with the new temperatures.
 * Selection and recall are blocking, as quest's; device memory stays k selected slots per
 * head, and a slot no page wants keeps its page for a later step (policy_paged.c). The same
 * calibration serves freekv with --kv-top-p (policy_freekv.c). The math is topp.c. */
#include "policy_paged.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topp.h"

/* Pages of the host copy a calibration reads at a time (kv_wt_load pins up to 32 at once). */
#define CALIB_RUN_PAGES 32

int paged_calibrate(struct paged *s, struct paged_layer *L, const float *q,
		    const struct select_layout *lay)
{
	/* R counts the compressed steps at the layer since its last calibration (§5). */
	if (L->since_cal >= 0 && ++L->since_cal < s->recal)
		return 0;
	int64_t t0 = paged_now_ns();
	const int len = lay->n_full * s->g.p + lay->tail_tokens, run = CALIB_RUN_PAGES * s->g.p;
	const size_t rows = (size_t)run * s->g.n_kv * s->g.d;
	/* The true attention mass needs every key of the layer: only the host copy has them, read
	 * a run of pages at a time into the logits of every query head. */
	double *z = malloc((size_t)s->g.n_q * len * sizeof *z);
	float *k = malloc(rows * sizeof *k), *v = malloc(rows * sizeof *v);
	int ret = z && k && v ? 0 : -ENOMEM;
	for (int a = 0; a < len && !ret; a += run) {
		int b = a + run < len ? a + run : len;
		ret = kv_wt_load(&s->wt, L->layer, a, b, k, v);
		if (!ret)
			topp_logits(&s->g, q, k, a, b - a, len, z);
	}
	if (!ret)
		ret = topp_calibrate(&s->g, lay, q, z, len, L->hkmin, L->hkmax, L->page_cap,
				     L->theta_k);
	free(z);
	free(k);
	free(v);
	/* A failed step is retried: the retry calibrates. */
	L->since_cal = ret ? -1 : 0;
	if (ret) {
		fprintf(stderr, "policy %s: layer %d: calibration failed: %s\n", s->strat->name,
			L->layer, strerror(-ret));
		return ret;
	}
	L->st.calibrations++;
	L->st.ns_calibrate += paged_now_ns() - t0;
	return 0;
}

int paged_layer_select(void *st, int layer, int *pages, float *theta)
{
	struct paged *s = st;
	if (layer < 0 || layer >= s->p.n_layers)
		return -EINVAL;
	if (layer < s->full_layers || !s->L[layer].st.steps)
		return -ENODATA;
	const struct paged_layer *L = &s->L[layer];
	const int H = s->g.n_kv;
	if (pages)
		memcpy(pages, L->att, (size_t)H * s->k_sel * sizeof *pages);
	for (int h = 0; theta && h < H; h++)
		theta[h] = s->top_p > 0.0 ? (float)topp_theta(L->theta_k[h]) : 0.0f;
	return 0;
}

static int hardkv_before(struct paged *s, struct paged_layer *L, const float *q,
			 const struct select_layout *lay)
{
	/* top-p: the calibration and the selection read the query's host copy (policy_paged.h) */
	int ret = paged_calibrate(s, L, s->hq, lay) ?: paged_select(s, L, q, lay, L->att,
								     &L->st.ns_select);
	if (ret)
		return ret;
	memset(L->att_now, 1, (size_t)s->g.n_kv);
	int n = 0;
	for (int h = 0; h < s->g.n_kv && !ret; h++)
		ret = paged_plan_head(s, L, h, L->att + h * s->k_sel, L->units_c, &n);
	if (ret)
		return ret;
	L->have_target = true;
	return paged_recall_now(s, L, L->units_c, n);
}

static const struct paged_strategy hardkv = {
	.name = "hardkv",
	.recalls = true,
	.keep_recent = false,
	.before_attend = hardkv_before,
	.after_attend = NULL,
	.top_p = true,
	.top_p_default = 0.9f,
};

static int hardkv_create(const struct kv_seq_params *p, void **st)
{
	return paged_create(p, &hardkv, st);
}

const struct kv_policy_ops kv_policy_hardkv = PAGED_POLICY_OPS("hardkv", hardkv_create);
