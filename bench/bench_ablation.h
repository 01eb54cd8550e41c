/* The paper's Fig. 8 ablations as benchmark rows (docs/design.md §5 "Ablations"): a row names
 * a policy with suffixes, POLICY[+nospec][+frag][+single] — no speculation, recalls moved as
 * per-token pieces (an NHD host layout's fragmented transfers), one recall staging buffer.
 * Header-only; used by decode_bench and bench_decode_gpu. */
#ifndef FREEKV_BENCH_ABLATION_H
#define FREEKV_BENCH_ABLATION_H

#include <errno.h>
#include <string.h>

#include "kvcache.h"

/* The Fig. 8 set: quest with every ablation stands in for ArkVale. */
#define BENCH_FIG8_ROWS "quest,freekv,freekv+nospec,freekv+single,freekv+frag,quest+frag+single"

/* Strips the suffixes off name, in place, and sets kv's ablation flags from them (clearing
 * those not named). 0, or -EINVAL for an unknown suffix. */
static inline int bench_ablations(char *name, struct kv_policy_opts *kv)
{
	kv->no_speculation = kv->recall_fragmented = kv->recall_single_buffer = false;
	for (char *plus; (plus = strrchr(name, '+'));) {
		if (!strcmp(plus, "+nospec"))
			kv->no_speculation = true;
		else if (!strcmp(plus, "+frag"))
			kv->recall_fragmented = true;
		else if (!strcmp(plus, "+single"))
			kv->recall_single_buffer = true;
		else
			return -EINVAL;
		*plus = '\0';
	}
	return 0;
}

#endif
