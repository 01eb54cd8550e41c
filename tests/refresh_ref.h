/* refresh_ref — an independent float64 model of the refreshkv policy's semantics
 * (docs/design.md §5 "refreshkv — exact semantics"), written for the tests from the design text
 * and sharing no code with worker/kvcache/: which decode steps are full, the full step's sets
 * (softmax over all T keys, group max, max-pool kernel 7, top-B ties to the lower position),
 * the partial step's eviction (carried members by u ascending, ties to the higher position,
 * then the lowest position). Sets are kept as plain member lists and scanned, never as slots
 * or queues.
 *
 * The caller feeds it, step by step and layer by layer, the query the policy saw and the keys
 * of the host copy, and compares its decisions and sets with the policy's. Each call returns
 * how close the decision or selection came to a tie (in float64), so a caller can tell a
 * disagreement that float32 rounding explains from a wrong policy. Owns its arrays
 * (rref_init / rref_free). */
#ifndef FREEKV_REFRESH_REF_H
#define FREEKV_REFRESH_REF_H

#include <stdbool.h>
#include <stdint.h>

struct rref_member {
	int32_t pos;
	double u;	/* pooled score at the last full step (carried members) */
	bool carried;	/* from the last full step, not added since */
};

struct rref_layer {
	bool have_full;
	int64_t c;
	double *qbar;		  /* (d) */
	struct rref_member *m;	  /* (n_kv, B + 1) members of each head's set */
	int *n;			  /* (n_kv) members held */
	double *u;		  /* (n_kv, uT) the last full step's pooled scores */
	int64_t uT;
};

struct rref {
	int n_layers, n_q, n_kv, d, B, Q;
	double s, scale;
	struct rref_layer *L;
};

int rref_init(struct rref *r, int n_layers, int n_q, int n_kv, int d, int B, int Q, double s);
void rref_free(struct rref *r);

/* The decision at a step past the budget at layer l with query q (n_q, d): true for full.
 * *margin is |cos - s| of the comparison made (infinity when no comparison decided it). Does
 * not change the state: rref_full or rref_partial does. */
bool rref_decide(const struct rref *r, int l, const float *q, double *margin);

/* A full step: K (T, n_kv, d) the layer's keys; the sets become the top B by u (kept in the
 * layer's u, (n_kv, T), for the caller to inspect), q-bar the mean query, c 0. */
int rref_full(struct rref *r, int l, const float *q, const double *K, int64_t T);

/* A partial step at T tokens: position T-1 joins each set, members leave while a set is over B.
 * evicted (n_kv) gets each head's evicted position (-1: none) and *margin the smallest relative
 * u gap between an evicted carried member and another carried one (infinity without one). */
void rref_partial(struct rref *r, int l, int64_t T, int32_t *evicted, double *margin);

/* Replaces head h's set by pos[0..n) (e.g. the policy's, after a tie float32 broke the other
 * way): members of the current set keep their record, the others join as carried members with
 * their u of the last full step. */
void rref_adopt(struct rref *r, int l, int h, const int32_t *pos, int n);

#endif
