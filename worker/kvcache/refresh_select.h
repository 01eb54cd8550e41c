/* refresh_select — the arithmetic of the refreshkv policy's full steps and decisions
 * (docs/design.md §5 "refreshkv — exact semantics"), as pure functions on caller-owned arrays:
 * the policy (policy_refresh.c) runs them on the host, and they are the CPU twins the CUDA
 * kernel kernels/refresh_topk.cu is tested against.
 *
 * A full step at a layer turns the attention probabilities of every query head over all T
 * tokens into one partial set per KV head: s_h[j] = max over the head's query group of
 * a_i[j]; u_h[j] = max of s_h over [j-3, j+3] clipped to [0, T) (max-pool, kernel 7); the set
 * is the B positions with the highest u_h, ties to the lower position. Between full steps a
 * partial step evicts the carried member with the lowest u_h (ties: the higher position), then,
 * once none is left, the lowest position: refresh_evict_order lists the members in that order.
 * Nothing here allocates; refresh_topk takes scratch of refresh_scratch_floats() floats. */
#ifndef FREEKV_REFRESH_SELECT_H
#define FREEKV_REFRESH_SELECT_H

#include <stddef.h>
#include <stdint.h>

/* Pooling radius: kernel 7 covers j-3 .. j+3 (docs/design.md §5). */
#define REFRESH_POOL_RADIUS 3

size_t refresh_scratch_floats(int64_t T);

/* Group max and max-pool of one KV head: s (T) = max over rows probs[h0 .. h0+G) (each of ld
 * floats, the first T used), u (T) the pooled s. s and u must not alias probs. */
void refresh_pool(const float *probs, int64_t ld, int h0, int G, int64_t T, float *s, float *u);

/* The partial sets of a full step. probs: (n_q, ld) f32, row i the softmax of query head i
 * over the T keys. For every KV head h (query heads h*G .. h*G+G-1, G = n_q / n_kv): pos
 * (n_kv, B) int32 the B positions of highest u_h, ascending, and uval (n_kv, B) their u_h.
 * Requires 1 <= B <= T. scratch: refresh_scratch_floats(T) floats. */
void refresh_topk(const float *probs, int64_t ld, int n_q, int n_kv, int64_t T, int B,
		  int32_t *pos, float *uval, float *scratch);

/* Eviction order of one set of n members: order (n) lists indices into pos/uval from the first
 * to go to the last, by u ascending, ties to the higher position. tmp: n ints of scratch. */
void refresh_evict_order(const int32_t *pos, const float *uval, int n, int *order, int *tmp);

/* Mean of the n_q query rows q (n_q, d) into out (d), summed in double. */
void refresh_qmean(const float *q, int n_q, int d, float *out);

/* Cosine of a and b (d), in double; 1 when both are zero, 0 when one is. */
double refresh_cos(const float *a, const float *b, int d);

#endif
