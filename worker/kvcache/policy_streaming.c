/* policy_streaming — KV dropping, StreamingLLM-style (docs/design.md §5): once a sequence outgrows the
 * budget, attention reads the sink and the most recent tokens only and nothing is recalled.
 * The selected part of the budget holds the most recent pages that left the window (oldest out),
 * so the recent part is B - S tokens: the same budget as the retrieval policies. */
#include "policy_paged.h"

/* The k most recent candidates, the same for every head: resident by construction. */
static int streaming_before(struct paged *s, struct paged_layer *L, const float *q,
			    const struct select_layout *lay)
{
	(void)q;
	for (int h = 0; h < s->g.n_kv; h++)
		for (int i = 0; i < lay->k; i++)
			L->att[h * s->k_sel + i] = lay->cand_end - lay->k + i;
	return 0;
}

static const struct paged_strategy streaming = {
	.name = "streaming",
	.recalls = false,
	.keep_recent = true,
	.before_attend = streaming_before,
	.after_attend = NULL,
};

static int streaming_create(const struct kv_seq_params *p, void **st)
{
	return paged_create(p, &streaming, st);
}

const struct kv_policy_ops kv_policy_streaming = PAGED_POLICY_OPS("streaming", streaming_create);
