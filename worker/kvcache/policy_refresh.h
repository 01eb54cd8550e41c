/* policy_refresh — the state of the refreshkv policy (docs/design.md §5 "refreshkv — exact
 * semantics"), shared by its two files: policy_refresh.c (the seam's ops, the decision between
 * a full and a partial step, partial steps, prefill, restore, counters) and refresh_full.c (the
 * full step).
 *
 * Per sequence and retrieval layer, on the backend: B token slots per KV head, slots (2, B,
 * n_kv, d) f32 (K rows, then V rows; slot i of head h holds position set[h][i]) and the step's
 * appended row cur (2, n_kv, d), rounded to the KV dtype as the host copy holds it. While
 * T <= B, slot i holds position i for every head. On the host: the partial sets, the order in
 * which partial steps evict their members, q-bar (the mean query of the last full step) and
 * c_l. A full step reads the layer's whole host copy: directly on a backend whose buffers are
 * host memory (the pinned blocks are the spans of attn_scores and attn_accum), else streamed
 * page by page through the recall double buffer into a staging area of slots (recall.h). The
 * first `full_layers` layers are a nested `full` state. Everything here is owned by the
 * policy state (create / destroy). */
#ifndef FREEKV_POLICY_REFRESH_H
#define FREEKV_POLICY_REFRESH_H

#include <stdbool.h>
#include <stdint.h>

#include "kv_writethrough.h"
#include "kvcache.h"
#include "recall.h"

/* Pages of the host copy a full step reads per chunk: one pin batch on the direct path, one
 * staging half on the streamed path. */
#define REFRESH_CHUNK_PAGES 32

struct rlayer {
	float *slots;	   /* backend (2, B, n_kv, d) f32 */
	float *cur;	   /* backend (2, n_kv, d) f32: this step's K row, then its V row */
	int32_t *set;	   /* (n_kv, B) position held by each slot, -1: none */
	int *evq;	   /* (n_kv, B) slots in eviction order, from the last full step */
	int ev_next;	   /* partial steps since the last full step */
	float *qbar;	   /* (d) mean query of the last full step */
	int64_t c;	   /* decode steps past the budget since the last full step */
	bool need_full;	   /* the next step past the budget is full (first, resume, prefill) */
	int64_t last_T;	   /* the last decode step done here, and whether it was full: a */
	bool last_full;	   /* retried step repeats it instead of deciding again */
	struct kv_layer_stats st;
};

struct refresh {
	struct kv_seq_params p;
	int B, Q;		/* budget (slots per head, capped at max_tokens), stride */
	float thr;		/* s */
	int n_q, n_kv, d, G, P; /* heads, head dim, group size, page size */
	size_t row;		/* n_kv * d */
	int full_layers;
	void *full;		/* nested `full` state, or NULL */
	struct rlayer *L;	/* n_layers; below full_layers unused */
	struct kv_wt wt;
	int64_t len, pending, attended;
	bool direct;		/* full steps read the pinned host blocks in place */
	float *hq, *qm;		/* host (n_q, d) query, (d) its mean */
	/* Full-step scratch. */
	float *logits;		/* backend (n_q, cap) scores, then probabilities, row stride T */
	float *hprobs;		/* host (n_q, cap) */
	int64_t prob_cap;
	float *sel;		/* refresh_topk scratch, refresh_scratch_floats(cap) */
	int32_t *npos;		/* (n_kv, B) the new sets, ascending */
	float *nu;		/* (n_kv, B) their pooled scores */
	int32_t *nslot;		/* (n_kv, B) the slot each new member takes */
	int32_t *fetch;		/* (n_kv, B, 2) fetches per head: (slot, position), by position */
	int n_fetch;
	int *order, *tmp;	/* (B) eviction-order scratch */
	int32_t *map;		/* (2 * n_kv * B, 3) gather_heads entries */
	struct backend_kv_span *spans; /* (n_kv * chunk) */
	int *first;		/* (n_kv + 1) */
	float *hrow;		/* host (2, d) one fetched row, or one downloaded slot row */
	/* Streamed full steps (no host-memory backend). */
	struct recall *rc;
	float *stream;		/* backend (2, chunk, 2, p, n_kv, d) f32: two staging halves */
	struct recall_unit *units; /* (2, chunk * n_kv) */
	/* Prefill. */
	float *dense_k, *dense_v; /* backend (dense_cap, n_kv, d) f32 */
	int64_t dense_cap;
};

/* The full step of docs/design.md §5 at layer l for the query q (backend, (n_q, d); host copy
 * s->hq) with T tokens: dense attention over the host copy into out, the new partial sets,
 * the positions new to them fetched into the slots, the eviction order; then q-bar := mean
 * query, c := 0. 0 or -errno; on failure the layer's sets are forgotten (need_full). */
int refresh_full_step(struct refresh *s, int l, float *out, const float *q, int64_t T);

/* Grows the full-step scratch to T tokens. */
int refresh_reserve(struct refresh *s, int64_t T);

/* Element offset of head h of row `row` in a (rows, n_kv, d) f32 buffer; in the slots, slot i's
 * K row is row i and its V row is row B + i. */
static inline size_t refresh_slot_off(const struct refresh *s, int64_t row, int h)
{
	return ((size_t)row * s->n_kv + (size_t)h) * (size_t)s->d;
}

#endif
