/* policy_opts — the retrieval knobs every command shares (--policy, --page-size, --budget,
 * --sink, --window, --tau, --full-layers, --kv-top-p, --recalibrate, --refresh-stride,
 * --refresh-threshold, --kv-bits, --spec-topk) and their defaults (full, 32 / 2048 / 512 / 512 /
 * 0.9 / 1; top-p and recalibrate 0, the policy's own: hardkv 0.9 and 128; refreshkv 5 / 0.85;
 * specache 2 bits, 64 rows), scaled down for models whose context is shorter than the budget
 * needs. The policy itself defaults to freekv. Plain data; nothing is allocated.
 *
 * The commands parse with getopt_long: policy_opts_options() appends the retrieval options to a
 * command's own table (val POLICY_OPT_BASE + index) and policy_opts_apply() takes what
 * getopt_long returns for them (every binary, decode_bench too). policy_opts_parse_flag()
 * reads one flag of a hand-built argv through the same table (tests). */
#ifndef FREEKV_POLICY_OPTS_H
#define FREEKV_POLICY_OPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "kvcache.h"

struct policy_opts {
	char policy[16];	   /* full | streaming | quest | freekv | hardkv | refreshkv | specache */
	struct kv_policy_opts kv;  /* page, budget, sink, window, full_layers, tau, ... (kvcache.h) */
	bool set_page, set_budget, set_sink, set_window; /* given on the command line */
};

void policy_opts_default(struct policy_opts *o);

#define POLICY_OPT_BASE 0x1000 /* getopt_long vals of the retrieval options */
#define POLICY_OPT_POLICY POLICY_OPT_BASE /* --policy: the first of them */
/* Writes the retrieval options' struct option entries at out (at most max); returns how many. */
size_t policy_opts_options(struct option *out, size_t max);
/* A getopt_long result: 1 when val is a retrieval option (arg stored), 0 when not ours,
 * -EINVAL with a message in err for a bad value. */
int policy_opts_apply(struct policy_opts *o, int val, const char *arg, char *err, size_t errlen);
/* Consumes one flag at argv[*i] (and its value) when it is one of ours: returns 1 when consumed,
 * 0 when not ours, -EINVAL (message in err) on a bad value. */
int policy_opts_parse_flag(struct policy_opts *o, int argc, char **argv, int *i, char *err,
			   size_t errlen);
/* Checks consistency and scales defaults down for a model of ctx_len tokens, printing what it
 * changed to notice (may be NULL). The checks are those of o->policy: refreshkv's budget is
 * any count from 8 on, the paged policies' (and full's) a page multiple with room for the sink,
 * the window and a page. 0 or -EINVAL with a message. */
int policy_opts_finalize(struct policy_opts *o, int ctx_len, FILE *notice, char *err,
			 size_t errlen);
/* What only the model can say is wrong: --full-layers past its layer count. 0 or -EINVAL with a
 * message. */
int policy_opts_check_model(const struct policy_opts *o, int n_layers, char *err, size_t errlen);
/* One line for --help. */
const char *policy_opts_usage(void);

#endif
