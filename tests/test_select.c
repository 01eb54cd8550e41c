/* Tests worker/backend/select.c: page layouts worked out by hand, scores and top-k against a float64
 * reference that sorts every candidate, ties to the lower page, group cosine. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "select.h"

static void test_geom_check(void **state)
{
	(void)state;
	struct select_geom g = {.n_q = 8, .n_kv = 4, .d = 8, .p = 8, .sink = 8, .window = 16, .budget = 64};
	assert_int_equal(select_geom_check(&g), 0);
	g.n_q = 6;
	assert_int_equal(select_geom_check(&g), -EINVAL);
	g.n_q = 8;
	g.window = 12;
	assert_int_equal(select_geom_check(&g), -EINVAL);
	g.window = 16;
	g.budget = 16;
	assert_int_equal(select_geom_check(&g), -EINVAL);
}

static void test_layouts_by_hand(void **state)
{
	(void)state;
	/* p=8, S=8 (1 page), W=16 (2 pages), B=64 (k=5) */
	struct select_geom g = {.n_q = 8, .n_kv = 4, .d = 8, .p = 8, .sink = 8, .window = 16, .budget = 64};
	struct select_layout l;
	select_layout_of(&g, 64, &l); /* == budget: not compressed */
	assert_false(l.compressed);
	select_layout_of(&g, 100, &l); /* 12 full pages + 4-token tail */
	assert_true(l.compressed);
	assert_int_equal(l.n_full, 12);
	assert_int_equal(l.tail_tokens, 4);
	assert_int_equal(l.n_sink, 1);
	/* window = tail + 1 most recent full page (11) -> candidates 1..10 */
	assert_int_equal(l.cand_begin, 1);
	assert_int_equal(l.cand_end, 11);
	assert_int_equal(l.k, 5);
	select_layout_of(&g, 96, &l); /* 12 full pages, empty tail: window = pages 10, 11 */
	assert_int_equal(l.tail_tokens, 0);
	assert_int_equal(l.cand_end, 10);
	assert_int_equal(l.k, 5);
	select_layout_of(&g, 20, &l); /* short: 2 full pages, sink 1, window tail+page 1 */
	assert_int_equal(l.cand_begin, 1);
	assert_int_equal(l.cand_end, 1);
	assert_int_equal(l.k, 0);
}

/* float64 reference: score every candidate, softmax per query head, group mean, then a full
 * selection sort by (score desc, page asc). */
static void ref_topk(const struct select_geom *g, const struct select_layout *l, const float *q,
		     const float *kmin, const float *kmax, int stride, int *pages, double *scores)
{
	int G = g->n_q / g->n_kv, n = l->cand_end - l->cand_begin;
	for (int kv = 0; kv < g->n_kv; kv++) {
		double *mean = scores + (size_t)kv * n;
		for (int j = 0; j < n; j++)
			mean[j] = 0;
		for (int h = kv * G; h < (kv + 1) * G; h++) {
			double s[512], mx = -1e300, sum = 0;
			for (int j = 0; j < n; j++) {
				s[j] = 0;
				for (int i = 0; i < g->d; i++) {
					size_t b = ((size_t)kv * stride + l->cand_begin + j) * g->d + i;
					double a1 = (double)q[h * g->d + i] * kmax[b];
					double a2 = (double)q[h * g->d + i] * kmin[b];
					s[j] += a1 > a2 ? a1 : a2;
				}
				s[j] /= sqrt((double)g->d);
				if (s[j] > mx)
					mx = s[j];
			}
			for (int j = 0; j < n; j++)
				sum += exp(s[j] - mx);
			for (int j = 0; j < n; j++)
				mean[j] += exp(s[j] - mx) / sum / G;
		}
		char used[512] = {0};
		int *sel = pages + (size_t)kv * l->k;
		for (int r = 0; r < l->k; r++) {
			int best = -1;
			for (int j = 0; j < n; j++)
				if (!used[j] && (best < 0 || mean[j] > mean[best]))
					best = j;
			used[best] = 1;
			sel[r] = l->cand_begin + best;
		}
		for (int a = 0; a < l->k; a++) /* ascending page order */
			for (int b = a + 1; b < l->k; b++)
				if (sel[b] < sel[a]) {
					int t = sel[a];
					sel[a] = sel[b];
					sel[b] = t;
				}
	}
}

static void random_case(uint64_t *rng, const struct select_geom *g, int len)
{
	struct select_layout l;
	select_layout_of(g, len, &l);
	int stride = l.n_full + 1;
	size_t sz = (size_t)g->n_kv * stride * g->d;
	float *kmin = malloc(sz * 4), *kmax = malloc(sz * 4), *q = malloc((size_t)g->n_q * g->d * 4);
	for (size_t i = 0; i < sz; i++) {
		float a = test_randf(rng) * 2, b = test_randf(rng) * 2;
		kmin[i] = a < b ? a : b;
		kmax[i] = a < b ? b : a;
	}
	for (int i = 0; i < g->n_q * g->d; i++)
		q[i] = test_randf(rng) * 3;
	int n = l.cand_end - l.cand_begin;
	float *scratch = malloc(select_scratch_floats(g, n) * 4);
	float *scores = malloc((size_t)g->n_kv * (n ? n : 1) * 4);
	double *ref_scores = malloc((size_t)g->n_kv * (n ? n : 1) * 8);
	int *pages = malloc((size_t)g->n_kv * (l.k ? l.k : 1) * sizeof(int));
	int *ref = malloc((size_t)g->n_kv * (l.k ? l.k : 1) * sizeof(int));
	select_scores(g, &l, q, kmin, kmax, stride, scores, scratch);
	select_topk(g, &l, q, kmin, kmax, stride, pages, scratch);
	ref_topk(g, &l, q, kmin, kmax, stride, ref, ref_scores);
	for (int i = 0; i < g->n_kv * n; i++)
		assert_true(fabs(scores[i] - ref_scores[i]) <= 1e-5 * (fabs(ref_scores[i]) + 1e-3));
	assert_memory_equal(pages, ref, (size_t)g->n_kv * l.k * sizeof(int));
	free(kmin);
	free(kmax);
	free(q);
	free(scratch);
	free(scores);
	free(ref_scores);
	free(pages);
	free(ref);
}

static void test_topk_matches_reference(void **state)
{
	(void)state;
	uint64_t rng = 2024;
	struct select_geom small = {.n_q = 8, .n_kv = 4, .d = 8, .p = 8, .sink = 8, .window = 16, .budget = 64};
	struct select_geom llama = {.n_q = 32, .n_kv = 8, .d = 128, .p = 32, .sink = 64, .window = 128, .budget = 512};
	for (int len = 65; len < 500; len += 7)
		random_case(&rng, &small, len);
	for (int len = 600; len < 5000; len += 733)
		random_case(&rng, &llama, len);
}

static void test_ties_go_to_lower_page(void **state)
{
	(void)state;
	struct select_geom g = {.n_q = 2, .n_kv = 1, .d = 4, .p = 4, .sink = 4, .window = 4, .budget = 16};
	struct select_layout l;
	select_layout_of(&g, 40, &l); /* 10 full pages; candidates 1..8, k = 2 */
	assert_int_equal(l.cand_begin, 1);
	assert_int_equal(l.cand_end, 9);
	assert_int_equal(l.k, 2);
	float kmin[10 * 4], kmax[10 * 4], q[2 * 4] = {1, 0, 0, 0, 1, 0, 0, 0};
	for (int j = 0; j < 10; j++)
		for (int i = 0; i < 4; i++) {
			kmin[j * 4 + i] = -1;
			kmax[j * 4 + i] = (j == 6 && i == 0) ? 2.0f : 1.0f; /* page 6 best, rest tied */
		}
	float scratch[64];
	int pages[2];
	select_topk(&g, &l, q, kmin, kmax, 10, pages, scratch);
	assert_int_equal(pages[0], 1); /* lowest of the tied pages */
	assert_int_equal(pages[1], 6);
}

static void test_group_cosine(void **state)
{
	(void)state;
	struct select_geom g = {.n_q = 4, .n_kv = 2, .d = 2, .p = 4, .sink = 4, .window = 4, .budget = 16};
	float a[8] = {1, 0, 0, 1, 1, 1, 0, 0};
	float b[8] = {1, 0, 0, -1, 2, 2, 0, 0};
	float out[2];
	select_group_cosine(&g, a, b, out);
	assert_true(fabsf(out[0] - 0.0f) < 1e-6f); /* (1 + -1) / 2 */
	assert_true(fabsf(out[1] - 1.0f) < 1e-6f); /* (1 + zero-with-zero 1) / 2 */
}

static void test_page_summary(void **state)
{
	(void)state;
	float k[3 * 5] = {1, -2, 3, 9, 9, -4, 5, 0, 9, 9, 2, 2, 2, 9, 9}; /* stride 5, d 3 */
	float mn[3], mx[3];
	select_page_summary(3, 3, k, 5, mn, mx);
	assert_true(mn[0] == -4 && mn[1] == -2 && mn[2] == 0);
	assert_true(mx[0] == 2 && mx[1] == 5 && mx[2] == 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_geom_check),
		cmocka_unit_test(test_layouts_by_hand),
		cmocka_unit_test(test_topk_matches_reference),
		cmocka_unit_test(test_ties_go_to_lower_page),
		cmocka_unit_test(test_group_cosine),
		cmocka_unit_test(test_page_summary),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
