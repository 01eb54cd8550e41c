/* specache — the state of the `specache` KV policy (docs/design.md §5 "`specache` — exact
 * semantics"), for policy_specache.c and the tests, and the policy's two helpers the tests
 * call.
 *
 * Per sequence and layer l >= full_layers, on the backend: a KIVI copy (backend.h struct
 * backend_kivi) of positions [0, tq), tq = max(0, ⌊(len − W)/p⌋·p); the residual, positions
 * [tq, len) plus the rows of the step in progress, in the KV dtype; and k exact rows per KV head
 * (fk, fv, with their positions fpos), the rows this step reads instead of dequantised ones. A
 * layer below full_layers keeps every position in its residual (tq stays 0). Groups of p
 * positions are quantised when a step begins and the previous steps left them below tq: from
 * the residual's rows, which are then compacted into its twin buffer.
 *
 * A decode step (step_begin_keep) attends with attn_kivi; from the last row's probabilities it
 * selects, per KV head, the k positions below the next step's tq (specache_topk) and hands the
 * ones not already held to the fetch stream (specache_fetch.h), which copies them from the host
 * copy into the layer's staging beside the rest of the step; the next step waits for that job
 * when it reaches the layer and uploads the staging. A pre-step (keep 0) attends with no exact
 * row. A dense step (step_begin: prefill) attends exactly, reading positions below tq from the
 * host copy, and forgets the exact rows.
 *
 * Everything is owned by the state (create / destroy); the fetch thread borrows the staging and
 * row lists of the layers it has jobs for. */
#ifndef FREEKV_SPECACHE_H
#define FREEKV_SPECACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "kv_writethrough.h"
#include "kvcache.h"
#include "specache_fetch.h"

struct spec_layer {
	bool full;		/* below full_layers: exact attention, tq stays 0 */
	int64_t tq;		/* positions in the KIVI copy */
	struct backend_kivi q;	/* its buffers hold qcap positions (a multiple of p) */
	int64_t qcap;
	void *rk, *rv;		/* residual (rcap, n_kv, d) KV dtype: row i is position tq + i */
	void *ak, *av;		/* the twin the residual is compacted into */
	int64_t rcap;
	void *fk, *fv;		/* exact rows (n_kv, k, d) KV dtype */
	int32_t *fpos_b;	/* (n_kv, k) backend: the position of each exact row, -1 */
	int32_t *fpos;		/* host: the same, or the next step's once a step selected */
	bool stale;		/* fpos / the staging changed since they were uploaded */
	struct kv_layer_stats st;
};

struct specache {
	struct kv_seq_params p;
	int P, W, K, bits;	/* page (key group), residual window, rows per head, KIVI bits */
	int full_layers;
	int64_t len, pending, keep;
	bool spec;		/* the step in progress came through step_begin_keep */
	size_t row_bytes;	/* one position's K (or V) row, all heads, KV dtype */
	struct spec_layer *L;	/* (n_layers) */
	struct kv_wt wt;
	struct sfetch *fetch;
	float *probs_b;		/* backend (n_kv, pcap): the last row's probabilities */
	int64_t pcap;
	float *probs_h;		/* host twin */
	int32_t *want, *heap;	/* (k) selection scratch */
	int32_t *pairs;		/* (k, 2) (position, slot) of the rows held */
	void *dense_k, *dense_v; /* backend (dense_cap, n_kv, d) KV dtype: prefill, restore */
	int64_t dense_cap;
	float *hk, *hv;		/* host (hcap, n_kv, d) f32: loads of the host copy */
	void *ht;		/* host (hcap, n_kv, d) KV dtype: one of them converted */
	int64_t hcap;
	int64_t attended;
};

/* tq for a sequence of T cached tokens: max(0, ⌊(T − W)/p⌋·p). */
static inline int64_t specache_tq(const struct specache *s, int64_t T)
{
	return T < s->W ? 0 : (T - s->W) / s->P * s->P;
}

/* The k highest of prob[0..n) — ties to the lower index — in ascending order into out (k
 * entries); all of [0, n) when n <= k. Returns how many. heap: k entries of scratch. */
int specache_topk(const float *prob, int64_t n, int k, int32_t *out, int32_t *heap);

/* The positions whose exact rows the next decode step reads at a layer for a KV head, as the
 * last step selected them, ascending, into pos (k entries); returns how many, or -EINVAL. st
 * is the state of a specache sequence (engine_seq_policy()); for tests and the debug checks. */
int specache_fetched(void *st, int layer, int head, int32_t *pos);

#endif
