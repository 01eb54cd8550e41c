/* refresh_select — see refresh_select.h. */
#include "refresh_select.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t refresh_scratch_floats(int64_t T)
{
	return (size_t)3 * (size_t)(T > 0 ? T : 1);
}

void refresh_pool(const float *probs, int64_t ld, int h0, int G, int64_t T, float *s, float *u)
{
	const float *r0 = probs + (size_t)h0 * (size_t)ld;
	memcpy(s, r0, (size_t)T * sizeof *s);
	for (int g = 1; g < G; g++) {
		const float *r = r0 + (size_t)g * (size_t)ld;
		for (int64_t j = 0; j < T; j++)
			if (r[j] > s[j])
				s[j] = r[j];
	}
	for (int64_t j = 0; j < T; j++) {
		int64_t a = j - REFRESH_POOL_RADIUS > 0 ? j - REFRESH_POOL_RADIUS : 0;
		int64_t b = j + REFRESH_POOL_RADIUS < T - 1 ? j + REFRESH_POOL_RADIUS : T - 1;
		float m = s[a];
		for (int64_t i = a + 1; i <= b; i++)
			if (s[i] > m)
				m = s[i];
		u[j] = m;
	}
}

/* The k-th largest (k from 1) of x[0..n), reordering x: quickselect, median of three. */
static float kth_largest(float *x, int64_t n, int64_t k)
{
	int64_t lo = 0, hi = n - 1, want = k - 1; /* index in descending order */
	while (lo < hi) {
		int64_t mid = lo + (hi - lo) / 2;
		float a = x[lo], b = x[mid], c = x[hi];
		float piv = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
		int64_t i = lo, j = hi;
		while (i <= j) {
			while (x[i] > piv)
				i++;
			while (x[j] < piv)
				j--;
			if (i <= j) {
				float t = x[i];
				x[i++] = x[j];
				x[j--] = t;
			}
		}
		if (want <= j)
			hi = j;
		else if (want >= i)
			lo = i;
		else
			return x[want];
	}
	return x[want];
}

void refresh_topk(const float *probs, int64_t ld, int n_q, int n_kv, int64_t T, int B,
		  int32_t *pos, float *uval, float *scratch)
{
	const int G = n_q / n_kv;
	float *s = scratch, *u = s + T, *tmp = u + T;
	for (int h = 0; h < n_kv; h++) {
		refresh_pool(probs, ld, h * G, G, T, s, u);
		memcpy(tmp, u, (size_t)T * sizeof *tmp);
		const float thr = kth_largest(tmp, T, B);
		/* Every position above the B-th value, and the lowest positions equal to it. */
		int64_t above = 0;
		for (int64_t j = 0; j < T; j++)
			above += u[j] > thr;
		int64_t eq_left = B - above;
		int32_t *ph = pos + (size_t)h * B;
		float *uh = uval + (size_t)h * B;
		int n = 0;
		for (int64_t j = 0; j < T && n < B; j++) {
			if (u[j] > thr || (u[j] == thr && eq_left > 0)) {
				if (u[j] == thr)
					eq_left--;
				ph[n] = (int32_t)j;
				uh[n++] = u[j];
			}
		}
	}
}

/* Whether member a goes before member b: lower u first, ties to the higher position. */
static int ev_before(const int32_t *pos, const float *uval, int a, int b)
{
	return uval[a] < uval[b] || (uval[a] == uval[b] && pos[a] > pos[b]);
}

void refresh_evict_order(const int32_t *pos, const float *uval, int n, int *order, int *tmp)
{
	for (int i = 0; i < n; i++)
		order[i] = i;
	/* Bottom-up merge sort: O(n log n) for n = B in the thousands, no allocation. */
	for (int w = 1; w < n; w *= 2) {
		for (int lo = 0; lo < n; lo += 2 * w) {
			int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
			int i = lo, j = mid, k = lo;
			while (i < mid && j < hi)
				tmp[k++] = ev_before(pos, uval, order[j], order[i]) ? order[j++]
										  : order[i++];
			while (i < mid)
				tmp[k++] = order[i++];
			while (j < hi)
				tmp[k++] = order[j++];
		}
		memcpy(order, tmp, (size_t)n * sizeof *order);
	}
}

void refresh_qmean(const float *q, int n_q, int d, float *out)
{
	for (int i = 0; i < d; i++) {
		double acc = 0.0;
		for (int h = 0; h < n_q; h++)
			acc += q[(size_t)h * d + i];
		out[i] = (float)(acc / n_q);
	}
}

double refresh_cos(const float *a, const float *b, int d)
{
	double ab = 0.0, aa = 0.0, bb = 0.0;
	for (int i = 0; i < d; i++) {
		ab += (double)a[i] * b[i];
		aa += (double)a[i] * a[i];
		bb += (double)b[i] * b[i];
	}
	if (aa == 0.0 || bb == 0.0)
		return aa == 0.0 && bb == 0.0 ? 1.0 : 0.0;
	return ab / sqrt(aa * bb);
}
