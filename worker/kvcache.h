/* kvcache — the seam between the engine and a KV retrieval policy (DESIGN §5).
 *
 * One policy state per sequence holds that sequence's keys and values of every layer (after
 * RoPE) and decides which cached positions attention reads: `full` reads all of them; later
 * policies (streaming, quest, freekv) keep a budget on the device and recall the rest. The
 * engine drives every policy the same way and never learns which one runs:
 *
 *   step_begin(n)                      a forward pass will add n tokens
 *     for each layer: layer_begin, append(k, v, n), attend(q, n) -> out, layer_end
 *   step_end()                         the n tokens are committed (length += n)
 *
 * A step that fails before step_end leaves the committed length unchanged: whatever append wrote
 * past it is overwritten by the next step, so a failed step loses nothing. The policy allocates
 * its storage on the backend it is given and frees it in destroy(); k, v, q and out are backend
 * buffers the caller owns and the policy only borrows for the call. Shapes: k, v (n, n_kv, d),
 * q and out (n, n_heads, d), f32. Slots marked "(optional)" may be NULL. */
#ifndef FREEKV_KVCACHE_H
#define FREEKV_KVCACHE_H

#include <stdint.h>

#include "backend.h"

/* Retrieval settings (DESIGN §3, §5); 0 means the policy's default. `full` ignores them. */
struct kv_policy_opts {
	int page;	 /* p, tokens per page */
	int budget;	 /* B, tokens attended per decode step */
	int sink;	 /* S, tokens */
	int window;	 /* W, tokens */
	int full_layers; /* first layers that keep full attention */
	float tau;	 /* correction threshold on the cosine of adjacent queries */
};

struct kv_seq_params {
	struct backend *be;	 /* borrowed; outlives the state */
	int n_layers;
	struct backend_attn attn; /* heads, head_dim, kv dtype, scale */
	int64_t max_tokens;	 /* context limit: step_begin refuses to go past it */
	struct kv_policy_opts opts;
};

struct kv_stats {
	int64_t tokens;		/* committed length */
	int64_t capacity;	/* tokens storable without growing, per layer */
	int64_t device_bytes;	/* KV bytes held on the backend, all layers */
	int64_t attended;	/* keys read by the last query of each attend call, summed */
};

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
	int (*layer_end)(void *st, int layer); /* (optional) */
	void (*step_end)(void *st);
	int64_t (*length)(void *st);
	void (*stats)(void *st, struct kv_stats *out);
};

/* The `full` policy: every token's K and V kept on the backend in attn.kv_dtype. */
extern const struct kv_policy_ops kv_policy_full;

/* Looks a policy up by name in the table of built policies; NULL when unknown. */
const struct kv_policy_ops *kvcache_policy(const char *name);
/* Comma-separated names of the built policies, for usage messages. */
const char *kvcache_policy_names(void);

#endif
