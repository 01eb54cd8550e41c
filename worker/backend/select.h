/* select — page-wise, group-consistent top-k selection (docs/design.md §5 "Selection"), the reference
 * the CPU backend's selection ops call (backend_cpu_select.c; the policies reach it through
 * those ops) and every kernel test compares with.
 *
 * Pages are p consecutive positions. For a sequence of len tokens: the sink is the first S/p
 * pages; the window is the tail page (partial, or absent when len % p == 0) plus the most recent
 * full pages, W/p pages in all counting a non-empty tail; candidates are the full pages that are
 * neither. Each KV head keeps k = (B - S - W)/p candidates: the score of page j for query head h
 * is sum_i max(q_i*max_ji, q_i*min_ji) / sqrt(d), softmaxed over the candidates per query head,
 * averaged over the G query heads of the KV head; the k best win, ties to the lower page.
 * Pure functions on caller-owned arrays; select_topk() takes a caller-provided scratch buffer of
 * select_scratch_floats() floats so the decode loop allocates nothing. */
#ifndef FREEKV_SELECT_H
#define FREEKV_SELECT_H

#include <stdbool.h>
#include <stddef.h>

struct select_geom {
	int n_q;	/* query heads */
	int n_kv;	/* KV heads; n_q % n_kv == 0 */
	int d;		/* head dim */
	int p;		/* page size in tokens */
	int sink;	/* S, tokens, multiple of p */
	int window;	/* W, tokens, multiple of p, >= p */
	int budget;	/* B, tokens, multiple of p, >= S + W */
};

/* Where the pages of a len-token sequence fall. Candidate pages are [cand_begin, cand_end). */
struct select_layout {
	bool compressed;  /* len > budget: selection applies; otherwise attend to everything */
	int n_full;	  /* full pages: len / p */
	int tail_tokens;  /* len % p */
	int n_sink;	  /* sink pages (clipped to n_full) */
	int cand_begin;
	int cand_end;
	int k;		  /* pages kept per KV head: min((B-S-W)/p, cand_end - cand_begin) */
};

/* Checks the geometry's constraints; returns 0 or -EINVAL. */
int select_geom_check(const struct select_geom *g);
void select_layout_of(const struct select_geom *g, int len, struct select_layout *out);

size_t select_scratch_floats(const struct select_geom *g, int n_pages);

/* Group-mean softmaxed Quest scores for every candidate page.
 * q: (n_q, d) f32; kmin, kmax: (n_kv, page_stride, d) f32 page summaries;
 * out: (n_kv, cand_end - cand_begin). scratch: select_scratch_floats() floats. */
void select_scores(const struct select_geom *g, const struct select_layout *lay, const float *q,
		   const float *kmin, const float *kmax, int page_stride, float *out, float *scratch);

/* Top-k per KV head over the candidates. pages: (n_kv, lay->k) page indices, each head's list in
 * ascending page order. scratch as above. */
void select_topk(const struct select_geom *g, const struct select_layout *lay, const float *q,
		 const float *kmin, const float *kmax, int page_stride, int *pages, float *scratch);

/* Per KV head: mean over its query group of cos(q_t, q_prev). q_t, q_prev: (n_q, d);
 * out: (n_kv). A zero vector has cosine 1 with itself and 0 with anything else. */
void select_group_cosine(const struct select_geom *g, const float *q_t, const float *q_prev,
			 float *out);

/* Element-wise min and max over the p keys of one page of one KV head.
 * k: p rows of d floats with row stride k_stride floats; kmin, kmax: (d). */
void select_page_summary(int p, int d, const float *k, size_t k_stride, float *kmin, float *kmax);

#endif
