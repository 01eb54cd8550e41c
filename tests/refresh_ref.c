/* refresh_ref — see refresh_ref.h. Plain loops in float64, no attempt at speed. */
#include "refresh_ref.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int rref_init(struct rref *r, int n_layers, int n_q, int n_kv, int d, int B, int Q, double s)
{
	*r = (struct rref){ .n_layers = n_layers, .n_q = n_q, .n_kv = n_kv, .d = d, .B = B,
			    .Q = Q, .s = s, .scale = 1.0 / sqrt((double)d) };
	r->L = calloc((size_t)n_layers, sizeof *r->L);
	if (!r->L)
		return -ENOMEM;
	for (int l = 0; l < n_layers; l++) {
		struct rref_layer *L = &r->L[l];
		L->qbar = calloc((size_t)d, sizeof *L->qbar);
		L->m = calloc((size_t)n_kv * (B + 1), sizeof *L->m);
		L->n = calloc((size_t)n_kv, sizeof *L->n);
		if (!L->qbar || !L->m || !L->n)
			return -ENOMEM;
	}
	return 0;
}

void rref_free(struct rref *r)
{
	for (int l = 0; r->L && l < r->n_layers; l++) {
		free(r->L[l].qbar);
		free(r->L[l].m);
		free(r->L[l].n);
		free(r->L[l].u);
	}
	free(r->L);
	memset(r, 0, sizeof *r);
}

static void mean_query(const struct rref *r, const float *q, double *out)
{
	for (int i = 0; i < r->d; i++) {
		out[i] = 0.0;
		for (int h = 0; h < r->n_q; h++)
			out[i] += q[h * r->d + i];
		out[i] /= r->n_q;
	}
}

bool rref_decide(const struct rref *r, int l, const float *q, double *margin)
{
	const struct rref_layer *L = &r->L[l];
	*margin = INFINITY;
	if (!L->have_full)
		return true;
	if ((L->c + 1) % r->Q != 0)
		return false;
	double m[r->d], ab = 0, aa = 0, bb = 0;
	mean_query(r, q, m);
	for (int i = 0; i < r->d; i++) {
		ab += m[i] * L->qbar[i];
		aa += m[i] * m[i];
		bb += L->qbar[i] * L->qbar[i];
	}
	double cos = aa == 0 || bb == 0 ? (aa == bb ? 1.0 : 0.0) : ab / sqrt(aa * bb);
	*margin = fabs(cos - r->s);
	return cos < r->s;
}

int rref_full(struct rref *r, int l, const float *q, const double *K, int64_t T)
{
	struct rref_layer *L = &r->L[l];
	const int d = r->d, G = r->n_q / r->n_kv;
	double *uu = realloc(L->u, (size_t)r->n_kv * (size_t)T * sizeof *uu);
	if (!uu)
		return -ENOMEM;
	L->u = uu;
	L->uT = T;
	double *a = malloc((size_t)T * sizeof *a), *sh = malloc((size_t)T * sizeof *sh);
	if (!a || !sh) {
		free(a);
		free(sh);
		return -ENOMEM;
	}
	for (int h = 0; h < r->n_kv; h++) {
		for (int64_t j = 0; j < T; j++)
			sh[j] = 0.0;
		for (int g = 0; g < G; g++) {
			const float *qi = q + (size_t)(h * G + g) * d;
			double mx = -INFINITY, sum = 0.0;
			for (int64_t j = 0; j < T; j++) {
				const double *k = K + ((size_t)j * r->n_kv + h) * d;
				double dot = 0.0;
				for (int i = 0; i < d; i++)
					dot += qi[i] * k[i];
				a[j] = dot * r->scale;
				mx = a[j] > mx ? a[j] : mx;
			}
			for (int64_t j = 0; j < T; j++)
				sum += (a[j] = exp(a[j] - mx));
			for (int64_t j = 0; j < T; j++)
				sh[j] = fmax(sh[j], a[j] / sum);
		}
		double *u = L->u + (size_t)h * T;
		for (int64_t j = 0; j < T; j++) {
			u[j] = 0.0;
			for (int64_t i = j - 3; i <= j + 3; i++)
				if (i >= 0 && i < T)
					u[j] = fmax(u[j], sh[i]);
		}
		/* Top B: repeatedly the highest u not taken, the lowest position on a tie. */
		struct rref_member *m = L->m + (size_t)h * (r->B + 1);
		char *taken = calloc((size_t)T, 1);
		if (!taken) {
			free(a);
			free(sh);
			return -ENOMEM;
		}
		for (int b = 0; b < r->B; b++) {
			int64_t best = -1;
			for (int64_t j = 0; j < T; j++)
				if (!taken[j] && (best < 0 || u[j] > u[best]))
					best = j;
			taken[best] = 1;
			m[b] = (struct rref_member){ .pos = (int32_t)best, .u = u[best],
						     .carried = true };
		}
		free(taken);
		L->n[h] = r->B;
	}
	free(a);
	free(sh);
	mean_query(r, q, L->qbar);
	L->c = 0;
	L->have_full = true;
	return 0;
}

void rref_partial(struct rref *r, int l, int64_t T, int32_t *evicted, double *margin)
{
	struct rref_layer *L = &r->L[l];
	*margin = INFINITY;
	L->c++;
	for (int h = 0; h < r->n_kv; h++) {
		struct rref_member *m = L->m + (size_t)h * (r->B + 1);
		m[L->n[h]++] = (struct rref_member){ .pos = (int32_t)(T - 1), .carried = false };
		evicted[h] = -1;
		while (L->n[h] > r->B) {
			int e = -1;
			for (int i = 0; i < L->n[h]; i++)
				if (m[i].carried && (e < 0 || m[i].u < m[e].u ||
						     (m[i].u == m[e].u && m[i].pos > m[e].pos)))
					e = i;
			/* How far the runner-up was: float32 may order a near tie the other way. */
			for (int i = 0; e >= 0 && i < L->n[h]; i++)
				if (i != e && m[i].carried)
					*margin = fmin(*margin, (m[i].u - m[e].u) / m[i].u);
			if (e < 0)
				for (int i = 0; i < L->n[h]; i++)
					if (e < 0 || m[i].pos < m[e].pos)
						e = i;
			evicted[h] = m[e].pos;
			m[e] = m[--L->n[h]];
		}
	}
}

void rref_adopt(struct rref *r, int l, int h, const int32_t *pos, int n)
{
	struct rref_layer *L = &r->L[l];
	struct rref_member *m = L->m + (size_t)h * (r->B + 1), nm[r->B + 1];
	const int64_t T = L->uT;
	for (int k = 0; k < n; k++) {
		nm[k] = (struct rref_member){ .pos = pos[k], .u = pos[k] < T ? L->u[(size_t)h * T +
										   pos[k]] : 0.0,
					      .carried = true };
		for (int i = 0; i < L->n[h]; i++)
			if (m[i].pos == pos[k])
				nm[k] = m[i];
	}
	memcpy(m, nm, (size_t)n * sizeof *m);
	L->n[h] = n;
}
