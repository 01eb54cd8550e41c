/* A float64 reference of the `specache` policy on a Llama-family model, written from
 * docs/design.md §5 "`specache` — exact semantics" and sharing nothing with worker/ (the model's
 * layers come from test_ref_model.h): the KIVI formulas, the mix of dequantised and exact rows,
 * the two-row step with its causal speculative row, the pre-step, and the selection of the next
 * step's rows (group-mean probabilities of the last row, top-k, ties to the lower position).
 *
 * It keeps every position's K and V rounded to f32 (the KV dtype of the test model, so what
 * the host copy holds), the dequantised values of the positions below tq in double, and the
 * rows selected for the next step. The caller drives it as the engine drives the policy:
 * sref_dense() for each prompt token but the last, then sref_step() per decode step (one row
 * with keep 0 for a pre-step, two with keep 1 for a step). Header-only; include after
 * test_util.h. */
#ifndef FREEKV_TEST_SPECACHE_REF_H
#define FREEKV_TEST_SPECACHE_REF_H

#include <math.h>
#include <stdbool.h>

#include "model.h"
#include "test_ref_model.h"

struct sref {
	const struct fkv_model *m;
	int P, W, K, bits, full_layers, max;
	int n;		/* committed tokens */
	int tq;		/* quantised positions at the layers past full_layers */
	double *k, *v;	/* (L, max + 2, kvd): rows, f32-rounded */
	double *dk, *dv; /* (L, max, kvd): dequantised rows below tq */
	int32_t *F;	/* (L, n_kv, K): the next step's exact rows, ascending */
	int *nF;	/* (L, n_kv) */
	double logits[2][1024];
	int hits, checked;
};

static inline void sref_init(struct sref *r, const struct fkv_model *m, int P, int W, int K,
			     int bits, int full_layers, int max)
{
	const struct fkv_model_config *c = &m->cfg;
	const size_t kvd = (size_t)c->n_kv_heads * c->head_dim, L = (size_t)c->n_layers;
	*r = (struct sref){ .m = m, .P = P, .W = W, .K = K, .bits = bits,
			    .full_layers = full_layers, .max = max };
	r->k = calloc(L * (max + 2) * kvd, sizeof *r->k);
	r->v = calloc(L * (max + 2) * kvd, sizeof *r->v);
	r->dk = calloc(L * max * kvd, sizeof *r->dk);
	r->dv = calloc(L * max * kvd, sizeof *r->dv);
	r->F = calloc(L * c->n_kv_heads * K, sizeof *r->F);
	r->nF = calloc(L * c->n_kv_heads, sizeof *r->nF);
	assert_true(r->k && r->v && r->dk && r->dv && r->F && r->nF);
	assert_true(c->vocab_size <= 1024);
}

static inline void sref_free(struct sref *r)
{
	free(r->k);
	free(r->v);
	free(r->dk);
	free(r->dv);
	free(r->F);
	free(r->nF);
}

static inline int sref_tq(const struct sref *r, int T)
{
	return T < r->W ? 0 : (T - r->W) / r->P * r->P;
}

/* One KIVI group of n values x (stride apart) into their dequantised values y (stride apart). */
static inline void sref_group(const double *x, double *y, int n, size_t stride, int bits)
{
	double mn = x[0], mx = x[0];
	for (int i = 1; i < n; i++) {
		mn = fmin(mn, x[i * stride]);
		mx = fmax(mx, x[i * stride]);
	}
	double z = bits == 2 ? mn : (3 * mn + mx) / 4, s = bits == 2 ? (mx - mn) / 3 : (mx - mn) / 2;
	for (int i = 0; i < n; i++) {
		double c = s == 0 ? 0 : floor((x[i * stride] - z) / s + 0.5);
		c = c < 0 ? 0 : c > (1 << bits) - 1 ? (1 << bits) - 1 : c;
		y[i * stride] = z + s * c;
	}
}

/* Quantises the groups below tq(n) that are not yet: keys per channel over p tokens, values per
 * token over min(p, d) channels. */
static inline void sref_quantise(struct sref *r)
{
	const struct fkv_model_config *c = &r->m->cfg;
	const int KV = c->n_kv_heads, d = c->head_dim, kvd = KV * d, gv = r->P < d ? r->P : d;
	const int target = sref_tq(r, r->n);
	for (int l = r->full_layers; l < c->n_layers; l++) {
		double *k = r->k + (size_t)l * (r->max + 2) * kvd, *v = r->v + (size_t)l * (r->max + 2) * kvd;
		double *dk = r->dk + (size_t)l * r->max * kvd, *dv = r->dv + (size_t)l * r->max * kvd;
		for (int t0 = r->tq; t0 < target; t0 += r->P)
			for (int e = 0; e < kvd; e++)
				sref_group(k + (size_t)t0 * kvd + e, dk + (size_t)t0 * kvd + e, r->P,
					   (size_t)kvd, r->bits);
		for (int t = r->tq; t < target; t++)
			for (int h = 0; h < KV; h++)
				for (int c0 = 0; c0 < d; c0 += gv)
					sref_group(v + (size_t)t * kvd + h * d + c0,
						   dv + (size_t)t * kvd + h * d + c0,
						   c0 + gv < d ? gv : d - c0, 1, r->bits);
	}
	r->tq = target > r->tq ? target : r->tq;
}

/* The k positions of prob[0..n) with the highest values, ties to the lower position, into out
 * in ascending order; all of them when n <= k. A selection sort: slow and obviously right. */
static inline int sref_topk(const double *prob, int n, int k, int32_t *out)
{
	if (n <= k) {
		for (int i = 0; i < n; i++)
			out[i] = i;
		return n;
	}
	bool *taken = calloc((size_t)n, 1);
	assert_non_null(taken);
	for (int i = 0; i < k; i++) {
		int best = -1;
		for (int j = 0; j < n; j++)
			if (!taken[j] && (best < 0 || prob[j] > prob[best]))
				best = j;
		taken[best] = true;
	}
	int m = 0;
	for (int j = 0; j < n; j++)
		if (taken[j])
			out[m++] = j;
	free(taken);
	return m;
}

/* Rows ids[0..rows) at positions n .. n + rows - 1, causal among them. dense: every position
 * exact (a prefill row). Otherwise positions below tq read the dequantised copy, or the exact
 * row where the KV head has one and use_F; and the next step's rows are selected from the last
 * row's probabilities below tq(n + keep). Logits of each row into r->logits; n += keep. */
static inline void sref_rows(struct sref *r, const int32_t *ids, int rows, int keep, bool dense,
			     bool use_F)
{
	const struct fkv_model *m = r->m;
	const struct fkv_model_config *c = &m->cfg;
	const int D = c->dim, H = c->n_heads, KV = c->n_kv_heads, d = c->head_dim, Fd = c->ffn_dim;
	const int G = H / KV, kvd = KV * d, qd = H * d, n = r->n;
	const int n_prob = dense ? 0 : sref_tq(r, n + keep);
	double x[2][256], xb[256], q[2][256], att[256], o[256], h1[512], h2[512];
	double *s = malloc((size_t)(n + rows) * sizeof *s);
	double *pg = calloc((size_t)KV * (n_prob ? n_prob : 1), sizeof *pg);
	int32_t *Fn = malloc((size_t)KV * r->K * sizeof *Fn);
	int nFn[64] = { 0 };
	assert_true(s && pg && Fn && D <= 256 && qd <= 256 && Fd <= 512 && KV <= 64 && rows <= 2);
	for (int i = 0; i < rows; i++)
		for (int e = 0; e < D; e++)
			x[i][e] = ref_el(&m->tok_embd, (int64_t)ids[i] * D + e);
	for (int l = 0; l < c->n_layers; l++) {
		const struct fkv_layer_weights *w = &m->layers[l];
		double *K = r->k + (size_t)l * (r->max + 2) * kvd, *V = r->v + (size_t)l * (r->max + 2) * kvd;
		const double *dK = r->dk + (size_t)l * r->max * kvd, *dV = r->dv + (size_t)l * r->max * kvd;
		const bool full = l < r->full_layers;
		for (int i = 0; i < rows; i++) {
			ref_norm(xb, x[i], &w->attn_norm, D, c->norm_eps);
			ref_linear(q[i], &w->wq, xb);
			ref_linear(K + (size_t)(n + i) * kvd, &w->wk, xb);
			ref_linear(V + (size_t)(n + i) * kvd, &w->wv, xb);
			ref_rotate(q[i], H, c, n + i);
			ref_rotate(K + (size_t)(n + i) * kvd, KV, c, n + i);
			for (int e = 0; e < kvd; e++) { /* the KV dtype, f32 */
				K[(size_t)(n + i) * kvd + e] = (float)K[(size_t)(n + i) * kvd + e];
				V[(size_t)(n + i) * kvd + e] = (float)V[(size_t)(n + i) * kvd + e];
			}
		}
		for (int i = 0; i < rows; i++) {
			for (int h = 0; h < H; h++) {
				const int g = h / G;
				const int32_t *Fg = r->F + ((size_t)l * KV + g) * r->K;
				const int nf = use_F ? r->nF[l * KV + g] : 0;
				double mx = -INFINITY, z = 0;
				for (int j = 0; j <= n + i; j++) {
					const double *kr = K + (size_t)j * kvd + g * d;
					if (!dense && !full && j < r->tq) {
						kr = dK + (size_t)j * kvd + g * d;
						for (int f = 0; f < nf; f++)
							if (Fg[f] == j)
								kr = K + (size_t)j * kvd + g * d;
					}
					s[j] = 0;
					for (int e = 0; e < d; e++)
						s[j] += q[i][h * d + e] * kr[e];
					s[j] /= sqrt((double)d);
					mx = fmax(mx, s[j]);
				}
				for (int j = 0; j <= n + i; j++)
					z += (s[j] = exp(s[j] - mx));
				for (int e = 0; e < d; e++)
					att[h * d + e] = 0;
				for (int j = 0; j <= n + i; j++) {
					const double *vr = V + (size_t)j * kvd + g * d;
					if (!dense && !full && j < r->tq) {
						vr = dV + (size_t)j * kvd + g * d;
						for (int f = 0; f < nf; f++)
							if (Fg[f] == j)
								vr = V + (size_t)j * kvd + g * d;
					}
					for (int e = 0; e < d; e++)
						att[h * d + e] += s[j] / z * vr[e];
				}
				for (int j = 0; i == rows - 1 && !full && j < n_prob; j++)
					pg[(size_t)g * n_prob + j] += s[j] / z / G;
			}
			ref_linear(o, &w->wo, att);
			for (int e = 0; e < D; e++)
				x[i][e] += o[e];
			ref_norm(xb, x[i], &w->ffn_norm, D, c->norm_eps);
			ref_linear(h1, &w->w_gate, xb);
			ref_linear(h2, &w->w_up, xb);
			for (int e = 0; e < Fd; e++)
				h1[e] = h1[e] / (1 + exp(-h1[e])) * h2[e];
			ref_linear(o, &w->w_down, h1);
			for (int e = 0; e < D; e++)
				x[i][e] += o[e];
		}
		if (!full && !dense) {
			for (int g = 0; g < KV; g++) {
				nFn[g] = n_prob ? sref_topk(pg + (size_t)g * n_prob, n_prob, r->K,
							    Fn + (size_t)g * r->K) : 0;
				memcpy(r->F + ((size_t)l * KV + g) * r->K, Fn + (size_t)g * r->K,
				       (size_t)nFn[g] * sizeof *Fn);
				r->nF[l * KV + g] = nFn[g];
			}
			memset(pg, 0, (size_t)KV * (n_prob ? n_prob : 1) * sizeof *pg);
		}
	}
	for (int i = 0; i < rows; i++) {
		ref_norm(xb, x[i], &m->out_norm, D, c->norm_eps);
		ref_linear(r->logits[i], &m->output, xb);
	}
	if (dense) /* positions moved on: no exact row is held */
		for (int i = 0; i < c->n_layers * KV; i++)
			r->nF[i] = 0;
	r->n += keep;
	free(s);
	free(pg);
	free(Fn);
}

static inline int32_t sref_argmax(const double *x, int n)
{
	int32_t b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* A prompt token that is not the last one: exact. */
static inline void sref_dense(struct sref *r, int32_t id)
{
	sref_rows(r, &id, 1, 1, true, false);
}

/* A decode step of token id: the pre-step first when pre, then the two rows; returns the
 * speculative token the next step runs, *spec the one this step ran. Row 0's logits stay in
 * r->logits[0]. */
static inline int32_t sref_step(struct sref *r, int32_t id, int32_t next_spec, bool pre,
				int32_t *spec)
{
	const int V = r->m->cfg.vocab_size;
	sref_quantise(r);
	if (pre) {
		sref_rows(r, &id, 1, 0, false, false);
		next_spec = sref_argmax(r->logits[0], V);
	}
	int32_t two[2] = { id, next_spec };
	sref_rows(r, two, 2, 1, false, true);
	*spec = next_spec;
	return sref_argmax(r->logits[1], V);
}

#endif
