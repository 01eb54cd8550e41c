/* engine — runs a Llama-family model on a backend: batches of sequences of different lengths,
 * chunked causal prefill, one decode step for a whole batch, logits out.
 *
 * The engine borrows the model (the caller keeps it loaded until engine_free) and the backend
 * (the caller frees it after engine_free); it owns the resident weights, its activation buffers
 * and every sequence's KV policy state. Sequences are small integer handles from engine_seq_new;
 * their KV lives behind the policy interface (kvcache.h), so the engine never knows which policy
 * runs. Errors return a negative errno with a message in err. A request is validated whole
 * before anything runs (handles, token ids, context limit), so a refused call changes nothing;
 * a failure while running (out of memory) leaves each sequence at the last completed chunk.
 * A sequence may have a host copy (hostkv.h, borrowed): its policy writes every token through
 * to it, and the engine commits each completed chunk's length and token ids there.
 *
 * Under a policy with a speculative row (kvcache.h spec_rows, `specache`, docs/design.md §5),
 * the last token of each item is a decode step of two rows — the token, then a speculative
 * token at the next position, the argmax of the previous step's speculative row — whose
 * first row gives the item's logits; only the token is kept. Every other token is prefilled,
 * and when a sequence has no previous step (a new or resumed sequence, or an item of several
 * tokens) a one-row pre-step of the last token comes first, yielding the speculative token;
 * its K/V and logits are discarded. engine_seq_spec_stats counts how often the speculative
 * token was the next real one. */
#ifndef FREEKV_ENGINE_H
#define FREEKV_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kvcache.h"
#include "layout.h"
#include "model.h"

struct engine_opts {
	int64_t max_ctx;	/* tokens per sequence; 0 = the model's trained context */
	int ubatch;		/* tokens per forward chunk (prefill chunk size); 0 = 256 */
	int max_seqs;		/* concurrent sequences; 0 = 64 */
	const char *policy;	/* KV policy name; NULL = "full" */
	/* Passed to the policy of every sequence; page, budget, sink and window all 0 take the
	 * defaults scaled to max_ctx (policy_opts_finalize). */
	struct kv_policy_opts kv;
	enum fkv_dtype kv_dtype; /* with kv_dtype_set; otherwise the model's dtype */
	bool kv_dtype_set;
	/* Called after each ubatch of a forward with the rows done and the rows of the whole call
	 * (a prefill's progress); NULL: none. It changes nothing in the computation. */
	void (*progress)(void *ctx, int64_t done, int64_t total);
	void *progress_ctx;
};

struct engine;

int engine_new(struct engine **out, const struct fkv_model *m, struct backend *be,
	       const struct engine_opts *o, char *err, size_t errlen);
void engine_free(struct engine *e);

int engine_vocab(const struct engine *e);
int64_t engine_max_ctx(const struct engine *e);
/* Tokens per forward chunk: a prefill runs in chunks of it from where it starts. */
int engine_ubatch(const struct engine *e);
/* What besides the model, geometry and ubatch decides the bits of a page this engine prefills
 * (docs/design.md §4 "Prefix sharing"): backend, policy, build and CPU model, as one string. */
void engine_prefix_variant(const struct engine *e, char *buf, size_t len);

/* The resolved KV settings, the policy's name, and the geometry of the host page blocks
 * (n_kv, page, head dim, KV dtype) every sequence's host copy must be opened with. */
const struct kv_policy_opts *engine_kv_opts(const struct engine *e);
const char *engine_policy_name(const struct engine *e);
void engine_kv_geom(const struct engine *e, struct kv_geom *g);

/* A new empty sequence without a host copy; -ENOSPC when max_seqs are live. */
int engine_seq_new(struct engine *e, int *seq, char *err, size_t errlen);
/* A sequence over a host copy (hostkv.h; borrowed: the caller closes it after
 * engine_seq_free), opened with engine_kv_geom. Every token the sequence runs is written
 * through to it, and each forward step commits the new length with the step's token ids. When
 * the host copy already holds committed tokens (a resume), the policy's state is rebuilt from
 * it and the sequence starts at that length, or one less when no id is kept past it; the ids
 * kept past the sequence's length (sampled, not yet run: at least one after a resume) are the
 * caller's to run next, which gives the logits to continue from. host NULL is engine_seq_new. */
int engine_seq_open(struct engine *e, struct hostkv_seq *host, int *seq, char *err,
		    size_t errlen);
/* Keeps ids sampled for seq but not yet run (positions length..length+n) with its host copy,
 * so that a resume after a crash continues from them. No-op without a host copy. */
int engine_seq_keep(struct engine *e, int seq, const int32_t *ids, int n, char *err,
		    size_t errlen);
/* engine_seq_keep of one id each, ids[i] for seqs[i] (distinct), for a batch's decode step: the
 * sequences whose host copies share a store are kept in one overlapped round trip
 * (hostkv_commit_many). rets[i] is seqs[i]'s result; returns 0 or the first error, its message
 * in err. */
int engine_seqs_keep(struct engine *e, const int *seqs, const int32_t *ids, int n, int *rets,
		     char *err, size_t errlen);
/* The policy's retrieval counters of one layer (zero for policies without them); 0 or
 * -EINVAL. */
int engine_seq_layer_stats(const struct engine *e, int seq, int layer,
			   struct kv_layer_stats *out);
/* The policy's selection at a layer's last compressed decode step (kv_policy_ops.layer_select):
 * pages (n_kv, (B - S - W) / p) or NULL, theta (n_kv) or NULL. -EOPNOTSUPP for a policy
 * without selection, -ENODATA before the layer's first compressed step, -EINVAL. */
int engine_seq_layer_select(const struct engine *e, int seq, int layer, int *pages,
			    float *theta);
/* How often a sequence's speculative token (the argmax of the last step's speculative row)
 * equalled the next token it was given: checked counts the steps that had one to compare. */
struct engine_spec_stats {
	int64_t checked, hits;
};
int engine_seq_spec_stats(const struct engine *e, int seq, struct engine_spec_stats *out);
/* The sequence's policy state (borrowed; NULL for a bad handle), for tests and tools that know
 * which policy runs (policy_specache's specache_fetched). */
void *engine_seq_policy(const struct engine *e, int seq);
void engine_seq_free(struct engine *e, int seq);
/* Committed tokens of a sequence, or -EINVAL for a bad handle. */
int64_t engine_seq_len(const struct engine *e, int seq);
/* The policy's statistics for a sequence; 0 or -EINVAL. */
int engine_seq_stats(const struct engine *e, int seq, struct kv_stats *out);

/* Graphs of decode steps (docs/design.md "The GPU decode step", CUDA Graphs): on where the
 * backend records them (graph_run) and FREEKV_CUDA_GRAPHS is not 0. A decode step's device
 * work between attentions runs as n_layers + 1 graphs, recorded on the second step of a batch
 * shape and launched on every later one. Counts over the engine's life: segments launched as
 * graphs, of them recorded first, and segments run as plain ops because recording failed. */
struct engine_graph_stats {
	bool on;
	int64_t launched, recorded, plain;
};
void engine_graph_stats(const struct engine *e, struct engine_graph_stats *out);

/* Appends n[i] tokens ids[i] to sequence seqs[i] for each of n_items distinct sequences and runs
 * the model over them, chunked into ubatches. logits (host) receives, per item in order, the
 * logits of its last token — (n_items, vocab) — or with all_logits every token's — (Σ n, vocab).
 * logits may be NULL. Errors: -EINVAL (bad handle, id out of range, duplicate sequence),
 * -ENOSPC (context limit). */
int engine_forward(struct engine *e, int n_items, const int *seqs, const int32_t *const *ids,
		   const int *n, float *logits, bool all_logits, char *err, size_t errlen);

/* One sequence: logits of its last token (vocab), or of every token with all_logits. */
int engine_prefill(struct engine *e, int seq, const int32_t *ids, int n, float *logits,
		   bool all_logits, char *err, size_t errlen);
/* One decode step: token tokens[i] appended to seqs[i]; logits (n, vocab). */
int engine_decode(struct engine *e, int n, const int *seqs, const int32_t *tokens, float *logits,
		  char *err, size_t errlen);

#endif
