/* topp — top-p page selection on calibrated scores (docs/design.md §5 "hardkv"), shared by the
 * hardkv policy and by freekv with --kv-top-p.
 *
 * The page scores are select.h's: score of candidate j for query head i is
 * sum_c max(q_ic*max_jc, q_ic*min_jc) / sqrt(d). A KV head h has a temperature theta_h from the
 * grid {2^(k/2) : k = TOPP_GRID_MIN..TOPP_GRID_MAX}, stored as its exponent k; its calibrated
 * page probabilities are pi_h[j] = mean over the head's query group of softmax_j(score_ij /
 * theta_h) over the candidates.
 *   - Calibration (topp_calibrate): with the current query, the true page mass
 *     m_h[j] = mean_i sum_{t in page j} a_i[t] (a_i the softmax over every token of the layer),
 *     taken for the candidates and renormalised over them; theta_h is the grid value that
 *     minimises sum_{m>0} m (log m - log pi_h(theta)), ties to the smaller theta.
 *   - Selection (topp_select): the candidates ordered by pi_h (ties to the lower page), the
 *     shortest prefix whose cumulative mass is >= P (P >= 1: every candidate up to k), at least
 *     1 page and at most lay->k.
 * Pure functions on caller-owned arrays, computed in double from the f32 inputs, so a float64
 * evaluation of §5's formulas gives the same temperatures and pages (up to summation order).
 * topp_select takes caller scratch (topp_scratch_doubles), so the decode loop allocates
 * nothing; topp_calibrate, which runs once every R steps beside a read of the whole layer,
 * allocates its own (O(candidates) beside the caller's logits). */
#ifndef FREEKV_TOPP_H
#define FREEKV_TOPP_H

#include <stddef.h>
#include <stdint.h>

#include "select.h"

#define TOPP_GRID_MIN (-4) /* theta = 2^(k/2), k = TOPP_GRID_MIN .. TOPP_GRID_MAX */
#define TOPP_GRID_MAX 8

/* The temperature of grid exponent k: 2^(k/2). */
double topp_theta(int k);

size_t topp_scratch_doubles(const struct select_geom *g, int n_pages);

/* Calibrated group-mean page probabilities of one KV head over the candidates of lay.
 * q: (G, d) the head's query group; kmin, kmax: (page_stride, d) the head's summaries;
 * pi: (cand_end - cand_begin); scratch: cand_end - cand_begin doubles. */
void topp_probs(const struct select_geom *g, const struct select_layout *lay, const float *q,
		const float *kmin, const float *kmax, int page_stride, double theta, double *pi,
		double *scratch);

/* Top-p selection for every KV head. q: (n_q, d); kmin, kmax: (n_kv, page_stride, d);
 * theta_k: (n_kv) grid exponents; top_p in (0, 1]. pages: (n_kv, lay->k), each head's pages in
 * ascending order, then -1 up to lay->k. scratch: topp_scratch_doubles() doubles. */
void topp_select(const struct select_geom *g, const struct select_layout *lay, const float *q,
		 const float *kmin, const float *kmax, int page_stride, const int8_t *theta_k,
		 double top_p, int *pages, double *scratch);

/* Calibration, in two halves so that the keys can be read a run of pages at a time. First, for
 * each run of keys (n, n_kv, d) at positions [t0, t0 + n) of the layer, topp_logits writes the
 * attention logits q_i . k_t / sqrt(d) of every query head of q (n_q, d) into z (n_q, len),
 * len the layer's tokens (the current one included). Then topp_calibrate, once z holds all
 * len positions, writes every KV head's temperature to theta_k (n_kv); lay is the layout at
 * len tokens, the summaries as above; z is overwritten. 0, or -ENOMEM (theta_k untouched). */
void topp_logits(const struct select_geom *g, const float *q, const float *keys, int t0, int n,
		 int len, double *z);
int topp_calibrate(const struct select_geom *g, const struct select_layout *lay, const float *q,
		   double *z, int len, const float *kmin, const float *kmax, int page_stride,
		   int8_t *theta_k);

#endif
