/* policy_quest — blocking page retrieval, Quest/ArkVale-style (docs/design.md §5): at every compressed
 * decode step each KV head selects its top-k pages with the current query (the backend's
 * select_pages, group-consistent), the pages not already resident are recalled, and attention waits for them:
 * selection and recall sit on the critical path. */
#include "policy_paged.h"

#include <string.h>

static int quest_before(struct paged *s, struct paged_layer *L, const float *q,
			const struct select_layout *lay)
{
	int n = 0, ret = paged_select(s, L, q, lay, L->att, &L->st.ns_select);
	if (ret)
		return ret;
	memset(L->att_now, 1, (size_t)s->g.n_kv);
	for (int h = 0; h < s->g.n_kv && !ret; h++)
		ret = paged_plan_head(s, L, h, L->att + h * s->k_sel, L->units_c, &n);
	if (ret)
		return ret;
	L->have_target = true;
	return paged_recall_now(s, L, L->units_c, n);
}

static const struct paged_strategy quest = {
	.name = "quest",
	.recalls = true,
	.keep_recent = false,
	.before_attend = quest_before,
	.after_attend = NULL,
};

static int quest_create(const struct kv_seq_params *p, void **st)
{
	return paged_create(p, &quest, st);
}

const struct kv_policy_ops kv_policy_quest = PAGED_POLICY_OPS("quest", quest_create);
