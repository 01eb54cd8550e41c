/* kvcache — the seam between the engine and a KV retrieval policy (docs/design.md §5).
 *
 * One policy state per sequence holds that sequence's keys and values of every layer (after
 * RoPE) and decides which cached positions attention reads: `full` reads all of them; the
 * retrieval policies (streaming, quest, freekv: policy_paged.h) keep a budget of B tokens per
 * layer on the device and recall the rest from the host copy; refreshkv (policy_refresh.h)
 * keeps B token slots per KV head, refreshed by full-attention steps over the host copy;
 * specache (specache.h) keeps a low-bit copy of every position plus exact rows fetched per
 * step. The engine drives every policy the same way and never learns which one runs:
 *
 *   step_begin(n)                      a forward pass will add n tokens
 *     for each layer: layer_begin, append(k, v, n), attend(q, n) -> out, layer_end
 *   step_end()                         the n tokens are committed (length += n)
 *
 * Every policy writes each appended token's K and V through to the host copy when there is one
 * (kv_seq_params.host; the page block of its position, the partial tail page rewritten step by
 * step), so the host copy is complete up to the length and restore() can rebuild the state of
 * a resumed sequence from it. Per-layer retrieval counters come from layer_stats() and their sum
 * with stats().
 *
 * A policy with speculative rows (spec_rows > 0: `specache`) also takes decode steps through
 * step_begin_keep(n, keep): append and attend get n rows at positions length .. length + n - 1,
 * causal between them, of which only the first keep are tokens of the sequence (written through
 * and committed by step_end); the others are speculative, their K/V never kept. keep 0 is a
 * pre-step, which commits nothing.
 *
 * A step that fails before step_end leaves the committed length unchanged: whatever append wrote
 * past it is overwritten by the next step, so a failed step loses nothing. The policy allocates
 * its storage on the backend it is given and frees it in destroy(); k, v, q and out are backend
 * buffers the caller owns and the policy only borrows for the call. Shapes: k, v (n, n_kv, d),
 * q and out (n, n_heads, d), f32. Slots marked "(optional)" may be NULL. */
#ifndef FREEKV_KVCACHE_H
#define FREEKV_KVCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

struct hostkv_seq;
struct kv_trace;

/* Retrieval settings (docs/design.md §3, §5). page, budget, sink and window all 0 means the defaults
 * scaled to max_tokens (policy_opts.h); tau 0 is pure speculation, full_layers 0 none. `full`
 * ignores them. */
struct kv_policy_opts {
	int page;	 /* p, tokens per page */
	int budget;	 /* B, tokens attended per decode step */
	int sink;	 /* S, tokens */
	int window;	 /* W, tokens */
	int full_layers; /* first layers that keep full attention */
	float tau;	 /* correction threshold on the cosine of adjacent queries */
	int kv_bits;	 /* specache: bits of the KIVI copy, 2 or 1; 0 = 2 */
	int spec_topk;	 /* specache: exact rows fetched per KV head and step; 0 = 64 */
	bool debug_invariants; /* check group consistency, budget, recalls, slot bytes each step */
	int recall_path; /* enum recall_path (recall.h): 0 mapped (gather kernel), 1 staged, 2 DMA */
	/* Ablations of the paper's Fig. 8 (docs/design.md §5 "Ablations"): freekv without
	 * speculation (every head selected with the current query and recalled before the
	 * attention, i.e. quest's step); recalls moved as per-token pieces (an NHD host
	 * layout's fragmented transfers); one recall staging buffer instead of two. */
	bool no_speculation;
	bool recall_fragmented;
	bool recall_single_buffer;
	/* Top-p selection on calibrated scores (docs/design.md §5 "hardkv"): P in (0, 1], 0 the
	 * policy's default (hardkv 0.9; freekv keeps top-k); R, steps between calibrations, 0: 128. */
	float top_p;
	int recalibrate;
	int refresh_stride;	  /* refreshkv: Q, decode steps between query comparisons (>= 1) */
	float refresh_threshold;  /* refreshkv: s, a compared query below it triggers a full step */
	/* (tests, debugging) refreshkv calls it after every decode step past the budget at a
	 * retrieval layer; NULL: none. */
	void (*trace)(void *arg, const struct kv_trace *t);
	void *trace_arg;
};

/* What one refreshkv decode step did at one layer (docs/design.md §5), for opts.trace: every
 * pointer is borrowed for the call. */
struct kv_trace {
	int layer;
	int64_t T;		/* tokens including the current one (> budget) */
	bool full;		/* a full step; else partial */
	const float *q;		/* (n_q, d) the step's query, after RoPE */
	const int32_t *set;	/* (n_kv, budget) the partial sets after the step, slot order */
	int n_q, n_kv, d, budget;
};

struct kv_seq_params {
	struct backend *be;	 /* borrowed; outlives the state */
	int n_layers;
	struct backend_attn attn; /* heads, head_dim, kv dtype, scale */
	int64_t max_tokens;	 /* context limit: step_begin refuses to go past it */
	struct kv_policy_opts opts;
	/* Host copy every appended token is written through to (borrowed, outlives the state);
	 * NULL: none (unit tests; quest and freekv then refuse to create). */
	struct hostkv_seq *host;
};

/* Retrieval counters of one layer, cumulative since create. A "head-page" is one KV head's
 * slice of one page (one recall unit). Times in nanoseconds of the compute thread, except
 * ns_recall_hidden, which is the wall time of speculative recalls (copy and conversion, not
 * the selection before them, which ns_select counts) that attention did not wait for. */
struct kv_layer_stats {
	int64_t steps;		  /* decode steps that ran retrieval (compressed, past full_layers) */
	int64_t head_checks;	  /* KV heads checked for correction (after the first step) */
	int64_t corrections;	  /* of those, heads flagged (cosine below tau) */
	int64_t pages_selected;	  /* head-pages attended from selection, summed over steps */
	int64_t pages_recalled;	  /* head-pages copied from the host copy */
	int64_t bytes_recalled;	  /* bytes of those recall units */
	int64_t ns_select;	  /* selection, on either thread */
	int64_t ns_recall_wait;	  /* recall exposed: attention waited for it */
	int64_t ns_recall_hidden; /* recall overlapped with the rest of the step */
	int64_t ns_attend;	  /* decode attention */
	int64_t pages_max;	  /* most head-pages one KV head attended from selection in a step */
	int64_t calibrations;	  /* temperature calibrations (top-p selection) */
	int64_t ns_calibrate;	  /* their time, the read of the layer's host copy included */
	int64_t full_steps;	  /* refreshkv: of `steps`, the full-attention steps */
	int64_t tokens_fetched;	  /* refreshkv, specache: (KV head, position) rows fetched from the host copy */
	int64_t ns_full;	  /* refreshkv: time in full steps (their attention included) */
};

struct kv_stats {
	int64_t tokens;		/* committed length */
	int64_t capacity;	/* tokens storable without growing, per layer */
	int64_t device_bytes;	/* KV bytes held on the backend, all layers (specache: those of the
				 * committed length, not the allocation rounded up by doubling) */
	int64_t attended;	/* keys read by the last query of each attend call, summed */
	struct kv_layer_stats sum; /* every layer's counters added up (zero for `full`) */
};

/* Correction rate: flagged heads / checked heads (0 when none were checked). */
static inline double kv_correction_rate(const struct kv_layer_stats *s)
{
	return s->head_checks ? (double)s->corrections / (double)s->head_checks : 0.0;
}

/* refreshkv's full-step rate: full steps / steps past the budget (0 when none); its inverse is
 * the effective stride. */
static inline double kv_full_step_rate(const struct kv_layer_stats *s)
{
	return s->steps ? (double)s->full_steps / (double)s->steps : 0.0;
}

struct kv_policy_ops {
	const char *name;
	/* Returns 0 or a negative errno; on failure *st is untouched and nothing is held. */
	int (*create)(const struct kv_seq_params *p, void **st);
	void (*destroy)(void *st);
	/* Prepares to add n tokens; -ENOSPC past max_tokens, -ENOMEM when storage cannot grow. */
	int (*step_begin)(void *st, int64_t n);
	int (*layer_begin)(void *st, int layer); /* (optional) */
	/* Stores the step's n keys and values (f32, after RoPE) of a layer. */
	int (*append)(void *st, int layer, const float *k, const float *v, int64_t n);
	/* Attention of the step's n queries of a layer; causal over the sequence. */
	int (*attend)(void *st, int layer, float *out, const float *q, int64_t n);
	/* (optional, both or neither) attend split around one batch-wide attention launch (the
	 * engine's decode batch, backend attn_decode_batch; docs/design.md "The GPU decode
	 * step"): attend_prepare does what attend does before its attention and describes that
	 * attention in *it (all but it->row, which the caller sets) and returns 0, or runs
	 * attend whole and returns 1 (the rows it does not batch: prefill, layers without such
	 * an attention); after the item's attention has run, attend_finish does the rest of
	 * attend, ns being this sequence's share of the batch call's time (its counters).
	 * prepare, the item's attention and finish equal attend. */
	int (*attend_prepare)(void *st, int layer, float *out, const float *q, int64_t n,
			      struct backend_attn_item *it);
	int (*attend_finish)(void *st, int layer, const float *q, int64_t ns);
	int (*layer_end)(void *st, int layer); /* (optional) */
	void (*step_end)(void *st);
	int64_t (*length)(void *st);
	void (*stats)(void *st, struct kv_stats *out);
	/* (optional) Counters of one layer; -EINVAL for a bad layer. NULL: no retrieval stats. */
	int (*layer_stats)(void *st, int layer, struct kv_layer_stats *out);
	/* Rebuilds the state of a resumed sequence from the host copy for positions [0, len):
	 * only on a fresh state (length 0); -EINVAL without a host copy or past max_tokens. */
	int (*restore)(void *st, int64_t len);
	/* (optional) One layer's selection at its last compressed decode step: pages (n_kv, k),
	 * k = (B - S - W) / p, the candidate pages each KV head attended, ascending, then -1 past
	 * its count (NULL: not wanted); theta (n_kv) the layer's calibrated temperatures (top-p
	 * selection; 0 where the policy does not calibrate; NULL: not wanted). -ENODATA before
	 * the layer's first compressed step and for layers without retrieval, -EINVAL for a bad
	 * layer. */
	int (*layer_select)(void *st, int layer, int *pages, float *theta);
	/* Speculative rows a decode step of this policy carries after the real token
	 * (docs/design.md §5 `specache`); 0 for every other policy. */
	int spec_rows;
	/* (optional; set when spec_rows > 0) step_begin for a step of n rows of which the first
	 * keep are kept (see above); -EINVAL for keep > n. */
	int (*step_begin_keep)(void *st, int64_t n, int64_t keep);
};

/* The `full` policy: every token's K and V kept on the backend in attn.kv_dtype. */
extern const struct kv_policy_ops kv_policy_full;
/* Retrieval policies (docs/design.md §5): sink + window; blocking top-k; speculative + correction. */
extern const struct kv_policy_ops kv_policy_streaming;
extern const struct kv_policy_ops kv_policy_quest;
extern const struct kv_policy_ops kv_policy_freekv;
/* Head-adaptive top-p page budgets on calibrated scores (policy_hardkv.c). */
extern const struct kv_policy_ops kv_policy_hardkv;
/* A partial token cache per KV head refreshed by query-triggered full steps (RefreshKV seed). */
extern const struct kv_policy_ops kv_policy_refreshkv;
/* A low-bit (KIVI) device copy plus exact rows prefetched by a speculative token. */
extern const struct kv_policy_ops kv_policy_specache;

/* Fills page, budget, sink and window when all four are 0 with the defaults scaled to a
 * max_tokens context (policy_opts_finalize), and checks them; 0 or -EINVAL. The engine and the
 * host copy use it to agree on the page size with the policies. */
int kvcache_resolve_opts(struct kv_policy_opts *o, int64_t max_tokens);

/* Looks a policy up by name in the table of built policies; NULL when unknown. */
const struct kv_policy_ops *kvcache_policy(const char *name);
/* Comma-separated names of the built policies, for usage messages. */
const char *kvcache_policy_names(void);

#endif
