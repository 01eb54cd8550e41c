/* select — see select.h. */
#include "select.h"

#include <errno.h>
#include <float.h>
#include <math.h>

int select_geom_check(const struct select_geom *g)
{
	if (g->n_q <= 0 || g->n_kv <= 0 || g->n_q % g->n_kv || g->d <= 0 || g->p <= 0)
		return -EINVAL;
	if (g->sink < 0 || g->sink % g->p || g->window < g->p || g->window % g->p)
		return -EINVAL;
	if (g->budget % g->p || g->budget < g->sink + g->window)
		return -EINVAL;
	return 0;
}

void select_layout_of(const struct select_geom *g, int len, struct select_layout *out)
{
	out->compressed = len > g->budget;
	out->n_full = len / g->p;
	out->tail_tokens = len % g->p;
	int sink_pages = g->sink / g->p;
	out->n_sink = sink_pages < out->n_full ? sink_pages : out->n_full;
	int window_full = g->window / g->p - (out->tail_tokens ? 1 : 0);
	int first_window = out->n_full - window_full;
	if (first_window < out->n_sink)
		first_window = out->n_sink;
	out->cand_begin = out->n_sink;
	out->cand_end = first_window;
	int k = (g->budget - g->sink - g->window) / g->p;
	int n_cand = out->cand_end - out->cand_begin;
	out->k = k < n_cand ? k : n_cand;
}

size_t select_scratch_floats(const struct select_geom *g, int n_pages)
{
	/* per-query-head scores for one KV group, plus the group mean */
	return (size_t)(g->n_q / g->n_kv + 1) * (size_t)(n_pages > 0 ? n_pages : 1);
}

void select_scores(const struct select_geom *g, const struct select_layout *lay, const float *q,
		   const float *kmin, const float *kmax, int page_stride, float *out, float *scratch)
{
	const int G = g->n_q / g->n_kv, d = g->d;
	const int n = lay->cand_end - lay->cand_begin;
	const float inv_sqrt_d = 1.0f / sqrtf((float)d);
	if (n <= 0)
		return;
	for (int kv = 0; kv < g->n_kv; kv++) {
		float *mean = out + (size_t)kv * n;
		for (int j = 0; j < n; j++)
			mean[j] = 0.0f;
		for (int gi = 0; gi < G; gi++) {
			const float *qh = q + (size_t)(kv * G + gi) * d;
			float *s = scratch;
			float mx = -FLT_MAX;
			for (int j = 0; j < n; j++) {
				size_t base = ((size_t)kv * page_stride + lay->cand_begin + j) * d;
				float acc = 0.0f;
				for (int i = 0; i < d; i++) {
					float a = qh[i] * kmax[base + i], b = qh[i] * kmin[base + i];
					acc += a > b ? a : b;
				}
				s[j] = acc * inv_sqrt_d;
				if (s[j] > mx)
					mx = s[j];
			}
			float sum = 0.0f;
			for (int j = 0; j < n; j++) {
				s[j] = expf(s[j] - mx);
				sum += s[j];
			}
			for (int j = 0; j < n; j++)
				mean[j] += s[j] / sum;
		}
		for (int j = 0; j < n; j++)
			mean[j] /= (float)G;
	}
}

void select_topk(const struct select_geom *g, const struct select_layout *lay, const float *q,
		 const float *kmin, const float *kmax, int page_stride, int *pages, float *scratch)
{
	const int n = lay->cand_end - lay->cand_begin, k = lay->k;
	const int G = g->n_q / g->n_kv;
	if (k <= 0)
		return;
	float *mean = scratch + (size_t)G * n;
	for (int kv = 0; kv < g->n_kv; kv++) {
		struct select_layout one = *lay;
		struct select_geom g1 = *g;
		g1.n_q = G;
		g1.n_kv = 1;
		select_scores(&g1, &one, q + (size_t)kv * G * g->d,
			      kmin + (size_t)kv * page_stride * g->d,
			      kmax + (size_t)kv * page_stride * g->d, page_stride, mean, scratch);
		int *sel = pages + (size_t)kv * k;
		/* Keep the k best as a list sorted by (score desc, page asc): insertion is O(n k),
		 * fine for k in the tens to hundreds and exact about ties. */
		int m = 0;
		for (int j = 0; j < n; j++) {
			float s = mean[j];
			if (m == k && !(s > mean[sel[m - 1] - lay->cand_begin]))
				continue;
			int pos = m < k ? m++ : k - 1;
			while (pos > 0 && s > mean[sel[pos - 1] - lay->cand_begin]) {
				sel[pos] = sel[pos - 1];
				pos--;
			}
			sel[pos] = lay->cand_begin + j;
		}
		/* ascending page order for the caller */
		for (int a = 1; a < k; a++) {
			int v = sel[a], b = a;
			while (b > 0 && sel[b - 1] > v) {
				sel[b] = sel[b - 1];
				b--;
			}
			sel[b] = v;
		}
	}
}

void select_group_cosine(const struct select_geom *g, const float *q_t, const float *q_prev,
			 float *out)
{
	const int G = g->n_q / g->n_kv, d = g->d;
	for (int kv = 0; kv < g->n_kv; kv++) {
		double sum = 0.0;
		for (int gi = 0; gi < G; gi++) {
			const float *a = q_t + (size_t)(kv * G + gi) * d;
			const float *b = q_prev + (size_t)(kv * G + gi) * d;
			double ab = 0, aa = 0, bb = 0;
			for (int i = 0; i < d; i++) {
				ab += (double)a[i] * b[i];
				aa += (double)a[i] * a[i];
				bb += (double)b[i] * b[i];
			}
			if (aa == 0.0 || bb == 0.0)
				sum += (aa == 0.0 && bb == 0.0) ? 1.0 : 0.0;
			else
				sum += ab / sqrt(aa * bb);
		}
		out[kv] = (float)(sum / G);
	}
}

void select_page_summary(int p, int d, const float *k, size_t k_stride, float *kmin, float *kmax)
{
	for (int i = 0; i < d; i++) {
		kmin[i] = k[i];
		kmax[i] = k[i];
	}
	for (int t = 1; t < p; t++) {
		const float *row = k + (size_t)t * k_stride;
		for (int i = 0; i < d; i++) {
			if (row[i] < kmin[i])
				kmin[i] = row[i];
			if (row[i] > kmax[i])
				kmax[i] = row[i];
		}
	}
}
