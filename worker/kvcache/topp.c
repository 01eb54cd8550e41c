/* topp — see topp.h. */
#include "topp.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

double topp_theta(int k)
{
	return exp2((double)k / 2.0);
}

size_t topp_scratch_doubles(const struct select_geom *g, int n_pages)
{
	(void)g;
	/* the scores of one query head, and the group mean */
	return 2 * (size_t)(n_pages > 0 ? n_pages : 1);
}

/* Scores of the candidates of lay for one query head qh (d) against one KV head's summaries:
 * out (cand_end - cand_begin). */
static void head_scores(const struct select_geom *g, const struct select_layout *lay,
			const float *qh, const float *kmin, const float *kmax, double *out)
{
	const int d = g->d, n = lay->cand_end - lay->cand_begin;
	const double inv_sqrt_d = 1.0 / sqrt((double)d);
	for (int j = 0; j < n; j++) {
		const float *mx = kmax + (size_t)(lay->cand_begin + j) * d;
		const float *mn = kmin + (size_t)(lay->cand_begin + j) * d;
		double acc = 0.0;
		for (int c = 0; c < d; c++) {
			double a = (double)qh[c] * mx[c], b = (double)qh[c] * mn[c];
			acc += a > b ? a : b;
		}
		out[j] = acc * inv_sqrt_d;
	}
}

/* pi (n) += softmax(s / theta) / G. */
static void add_softmax(const double *s, int n, double theta, int G, double *pi)
{
	double mx = -INFINITY, sum = 0.0;
	for (int j = 0; j < n; j++)
		mx = s[j] / theta > mx ? s[j] / theta : mx;
	for (int j = 0; j < n; j++)
		sum += exp(s[j] / theta - mx);
	for (int j = 0; j < n; j++)
		pi[j] += exp(s[j] / theta - mx) / sum / G;
}

void topp_probs(const struct select_geom *g, const struct select_layout *lay, const float *q,
		const float *kmin, const float *kmax, int page_stride, double theta, double *pi,
		double *scratch)
{
	(void)page_stride;
	const int G = g->n_q / g->n_kv, n = lay->cand_end - lay->cand_begin;
	for (int j = 0; j < n; j++)
		pi[j] = 0.0;
	for (int gi = 0; gi < G; gi++) {
		head_scores(g, lay, q + (size_t)gi * g->d, kmin, kmax, scratch);
		add_softmax(scratch, n, theta, G, pi);
	}
}

void topp_select(const struct select_geom *g, const struct select_layout *lay, const float *q,
		 const float *kmin, const float *kmax, int page_stride, const int8_t *theta_k,
		 double top_p, int *pages, double *scratch)
{
	const int n = lay->cand_end - lay->cand_begin, k = lay->k, cb = lay->cand_begin;
	const int G = g->n_q / g->n_kv;
	if (k <= 0)
		return;
	double *pi = scratch + n;
	for (int kv = 0; kv < g->n_kv; kv++) {
		const size_t at = (size_t)kv * page_stride * g->d;
		topp_probs(g, lay, q + (size_t)kv * G * g->d, kmin + at, kmax + at, page_stride,
			   topp_theta(theta_k[kv]), pi, scratch);
		/* The k most probable, ordered by (pi desc, page asc): the prefix is at most k
		 * long, so the order past the k-th never matters. */
		int *sel = pages + (size_t)kv * k, m = 0;
		for (int j = 0; j < n; j++) {
			double v = pi[j];
			if (m == k && !(v > pi[sel[m - 1] - cb]))
				continue;
			int pos = m < k ? m++ : k - 1;
			while (pos > 0 && v > pi[sel[pos - 1] - cb]) {
				sel[pos] = sel[pos - 1];
				pos--;
			}
			sel[pos] = cb + j;
		}
		int c = m;
		if (top_p < 1.0) {
			double cum = 0.0;
			for (c = 0; c < m;) {
				cum += pi[sel[c++] - cb];
				if (cum >= top_p)
					break;
			}
		}
		/* ascending page order for the caller, the unused entries -1 */
		for (int a = 1; a < c; a++) {
			int v = sel[a], b = a;
			while (b > 0 && sel[b - 1] > v) {
				sel[b] = sel[b - 1];
				b--;
			}
			sel[b] = v;
		}
		for (int a = c; a < k; a++)
			sel[a] = -1;
	}
}

void topp_logits(const struct select_geom *g, const float *q, const float *keys, int t0, int n,
		 int len, double *z)
{
	const int G = g->n_q / g->n_kv, d = g->d, H = g->n_kv;
	const double inv_sqrt_d = 1.0 / sqrt((double)d);
	for (int i = 0; i < g->n_q; i++) {
		const float *qi = q + (size_t)i * d;
		double *zi = z + (size_t)i * len + t0;
		for (int t = 0; t < n; t++) {
			const float *kt = keys + ((size_t)t * H + i / G) * d;
			double acc = 0.0;
			for (int c = 0; c < d; c++)
				acc += (double)qi[c] * kt[c];
			zi[t] = acc * inv_sqrt_d;
		}
	}
}

int topp_calibrate(const struct select_geom *g, const struct select_layout *lay, const float *q,
		   double *z, int len, const float *kmin, const float *kmax, int page_stride,
		   int8_t *theta_k)
{
	const int G = g->n_q / g->n_kv, d = g->d, H = g->n_kv, P = g->p;
	const int n = lay->cand_end - lay->cand_begin, cb = lay->cand_begin;
	if (n <= 0 || len <= 0)
		return 0;
	double *S = malloc((size_t)G * n * sizeof *S), *m = malloc((size_t)n * sizeof *m);
	double *pi = malloc((size_t)n * sizeof *pi);
	int8_t *out = malloc((size_t)H * sizeof *out);
	int ret = S && m && pi && out ? 0 : -ENOMEM;
	for (int kv = 0; kv < H && !ret; kv++) {
		const size_t at = (size_t)kv * page_stride * d;
		for (int j = 0; j < n; j++)
			m[j] = 0.0;
		for (int gi = 0; gi < G; gi++) {
			/* a_i = softmax over all len tokens, in place */
			double *zi = z + (size_t)(kv * G + gi) * len, zmax = -INFINITY, sum = 0.0;
			for (int t = 0; t < len; t++)
				zmax = zi[t] > zmax ? zi[t] : zmax;
			for (int t = 0; t < len; t++) {
				zi[t] = exp(zi[t] - zmax);
				sum += zi[t];
			}
			for (int j = 0; j < n; j++) {
				double mass = 0.0;
				for (int t = (cb + j) * P; t < (cb + j + 1) * P; t++)
					mass += zi[t];
				m[j] += mass / sum / G;
			}
			head_scores(g, lay, q + (size_t)(kv * G + gi) * d, kmin + at, kmax + at,
				    S + (size_t)gi * n);
		}
		/* group mean first (above), renormalisation over the candidates second */
		double tot = 0.0;
		for (int j = 0; j < n; j++)
			tot += m[j];
		for (int j = 0; j < n && tot > 0.0; j++)
			m[j] /= tot;
		double best = INFINITY;
		int bk = TOPP_GRID_MIN;
		for (int k = TOPP_GRID_MIN; k <= TOPP_GRID_MAX; k++) {
			const double th = topp_theta(k);
			for (int j = 0; j < n; j++)
				pi[j] = 0.0;
			for (int gi = 0; gi < G; gi++)
				add_softmax(S + (size_t)gi * n, n, th, G, pi);
			double kl = 0.0;
			for (int j = 0; j < n; j++)
				if (m[j] > 0.0)
					kl += m[j] * (log(m[j]) - log(pi[j]));
			/* strictly smaller: ties go to the smaller theta, met first */
			if (kl < best) {
				best = kl;
				bk = k;
			}
		}
		out[kv] = (int8_t)bk;
	}
	for (int kv = 0; kv < H && !ret; kv++)
		theta_k[kv] = out[kv];
	free(S);
	free(m);
	free(pi);
	free(out);
	return ret;
}
