/* Tests kernels/topk.cu. Exact equality throughout:
 * - page_score + topk_pages against select_topk() (worker/backend/select.c) on random inputs whose
 *   k-th and (k+1)-th group scores are well apart (no near-ties, so f32 rounding cannot flip
 *   the choice);
 * - against a sort-based reference on scores with many exact ties (and -0 vs +0), which must
 *   go to the lower page, at small and large candidate counts, k from 1 to n_cand;
 * - topk_pages_changed: the same selection, plus the selected pages not marked resident. */
#include "gpu_test.h"

#include "page_score.cuh"
#include "select.h"
#include "topk.cuh"

static const float *cmp_scores;

static int by_score_then_page(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	if (cmp_scores[i] > cmp_scores[j])
		return -1;
	if (cmp_scores[i] < cmp_scores[j])
		return 1;
	return i < j ? -1 : i > j;
}

static int ascending(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	return i < j ? -1 : i > j;
}

/* pages (k): the k best of s (n), ties to the lower index, ascending, offset by begin. */
static void topk_ref(int32_t *pages, const float *s, int n, int begin, int k)
{
	int *idx = malloc(n * sizeof *idx);
	for (int j = 0; j < n; j++)
		idx[j] = j;
	cmp_scores = s;
	qsort(idx, n, sizeof *idx, by_score_then_page);
	qsort(idx, k, sizeof *idx, ascending);
	for (int j = 0; j < k; j++)
		pages[j] = begin + idx[j];
	free(idx);
}

/* Smallest gap between the k-th and (k+1)-th score of any head, relative to the k-th. */
static double min_gap(const float *s, int n_kv, int n, int k)
{
	double gap = INFINITY;
	int *idx = malloc(n * sizeof *idx);
	for (int h = 0; h < n_kv; h++) {
		for (int j = 0; j < n; j++)
			idx[j] = j;
		cmp_scores = s + (size_t)h * n;
		qsort(idx, n, sizeof *idx, by_score_then_page);
		if (k < n) {
			double a = cmp_scores[idx[k - 1]], b = cmp_scores[idx[k]];
			if ((a - b) / a < gap)
				gap = (a - b) / a;
		}
	}
	free(idx);
	return gap;
}

static void test_topk_matches_select(void **state)
{
	(void)state;
	const struct select_geom g = { 32, 8, 128, 32, 512, 512, 2048 };
	const int len = 20000;
	struct select_layout lay;
	select_layout_of(&g, len, &lay);
	const int n = lay.cand_end - lay.cand_begin, ps = lay.n_full + 1;
	const size_t sum_elems = (size_t)g.n_kv * ps * g.d;
	float *q = malloc((size_t)g.n_q * g.d * 4), *kmin = malloc(sum_elems * 4);
	float *kmax = malloc(sum_elems * 4), *scores = malloc((size_t)g.n_kv * n * 4);
	float *scratch = malloc(select_scratch_floats(&g, n) * 4);
	int32_t *ref = malloc((size_t)g.n_kv * lay.k * 4), *got = malloc((size_t)g.n_kv * lay.k * 4);
	uint64_t rng = 71;
	int tried = 0;
	do { /* draw until no head has a near-tie at its k-th place */
		assert_true(tried++ < 50);
		gpu_test_fill(q, (size_t)g.n_q * g.d, 2.0f, &rng);
		for (size_t i = 0; i < sum_elems; i++) {
			float a = test_randf(&rng) * 3.0f, b = test_randf(&rng) * 3.0f;
			kmin[i] = a < b ? a : b;
			kmax[i] = a < b ? b : a;
		}
		select_scores(&g, &lay, q, kmin, kmax, ps, scores, scratch);
	} while (min_gap(scores, g.n_kv, n, lay.k) < 1e-3);
	select_topk(&g, &lay, q, kmin, kmax, ps, ref, scratch);
	float *dq = gpu_test_put(q, (size_t)g.n_q * g.d * 4);
	float *dmin = gpu_test_put(kmin, sum_elems * 4), *dmax = gpu_test_put(kmax, sum_elems * 4);
	float *dscores = gpu_test_poisoned((size_t)g.n_kv * n * 4);
	float *dscratch = gpu_test_poisoned((size_t)g.n_q * n * 4);
	int32_t *dpages = gpu_test_poisoned((size_t)g.n_kv * lay.k * 4);
	CU(page_score(dscores, dscratch, dq, dmin, dmax, ps, lay.cand_begin, n, g.n_q, g.n_kv, g.d,
		      0));
	CU(topk_pages(dpages, dscores, g.n_kv, n, lay.cand_begin, lay.k, 0));
	gpu_test_get(got, dpages, (size_t)g.n_kv * lay.k * 4);
	assert_memory_equal(got, ref, (size_t)g.n_kv * lay.k * 4);
	cudaFree(dq);
	cudaFree(dmin);
	cudaFree(dmax);
	cudaFree(dscores);
	cudaFree(dscratch);
	cudaFree(dpages);
	free(q);
	free(kmin);
	free(kmax);
	free(scores);
	free(scratch);
	free(ref);
	free(got);
}

/* Scores with heavy ties: a few levels, both signs, -0 and +0. */
static void tied_scores(float *s, size_t n, uint64_t *rng)
{
	for (size_t i = 0; i < n; i++) {
		int level = (int)(test_rand(rng) % 9) - 4;
		s[i] = level == 0 ? ((test_rand(rng) & 1) ? -0.0f : 0.0f) : (float)level * 0.125f;
	}
}

static void check_ties(int n_kv, int n, int begin, int k, uint64_t *rng)
{
	float *s = malloc((size_t)n_kv * n * 4);
	int32_t *ref = malloc((size_t)n_kv * k * 4 + 4), *got = malloc((size_t)n_kv * k * 4 + 4);
	tied_scores(s, (size_t)n_kv * n, rng);
	for (int h = 0; h < n_kv; h++)
		topk_ref(ref + (size_t)h * k, s + (size_t)h * n, n, begin, k);
	float *ds = gpu_test_put(s, (size_t)n_kv * n * 4);
	int32_t *dp = gpu_test_poisoned((size_t)n_kv * k * 4);
	CU(topk_pages(dp, ds, n_kv, n, begin, k, 0));
	gpu_test_get(got, dp, (size_t)n_kv * k * 4);
	assert_memory_equal(got, ref, (size_t)n_kv * k * 4);
	cudaFree(ds);
	cudaFree(dp);
	free(s);
	free(ref);
	free(got);
}

static void test_topk_ties_to_lower_page(void **state)
{
	(void)state;
	uint64_t rng = 73;
	check_ties(8, 1000, 16, 37, &rng);
	check_ties(8, 1000, 16, 1, &rng);
	check_ties(4, 1000, 0, 1000, &rng);
	check_ties(2, 513, 3, 500, &rng);
	check_ties(8, 40000, 16, 48, &rng);
	check_ties(1, 7, 0, 3, &rng);
}

static void test_topk_distinct_large(void **state)
{
	(void)state;
	const int n_kv = 8, n = 40000, k = 100;
	float *s = malloc((size_t)n_kv * n * 4);
	int32_t *ref = malloc((size_t)n_kv * k * 4), *got = malloc((size_t)n_kv * k * 4);
	for (size_t i = 0; i < (size_t)n_kv * n; i++) /* distinct values */
		s[i] = (float)((i * 2654435761u) % 1000003u) / 1000003.0f - 0.5f;
	for (int h = 0; h < n_kv; h++)
		topk_ref(ref + (size_t)h * k, s + (size_t)h * n, n, 16, k);
	float *ds = gpu_test_put(s, (size_t)n_kv * n * 4);
	int32_t *dp = gpu_test_poisoned((size_t)n_kv * k * 4);
	CU(topk_pages(dp, ds, n_kv, n, 16, k, 0));
	gpu_test_get(got, dp, (size_t)n_kv * k * 4);
	assert_memory_equal(got, ref, (size_t)n_kv * k * 4);
	cudaFree(ds);
	cudaFree(dp);
	free(s);
	free(ref);
	free(got);
}

static void test_topk_changed_excludes_resident(void **state)
{
	(void)state;
	const int n_kv = 8, n = 3000, begin = 16, k = 48, stride = begin + n + 5;
	uint64_t rng = 77;
	float *s = malloc((size_t)n_kv * n * 4);
	uint8_t *res = malloc((size_t)n_kv * stride);
	int32_t *ref = malloc((size_t)n_kv * k * 4), *got = malloc((size_t)n_kv * k * 4);
	int32_t *gch = malloc((size_t)n_kv * k * 4), gn[8];
	tied_scores(s, (size_t)n_kv * n, &rng);
	for (size_t i = 0; i < (size_t)n_kv * stride; i++)
		res[i] = (test_rand(&rng) % 3) == 0 ? (uint8_t)(1 + test_rand(&rng) % 255) : 0;
	for (int h = 0; h < n_kv; h++)
		topk_ref(ref + (size_t)h * k, s + (size_t)h * n, n, begin, k);
	float *ds = gpu_test_put(s, (size_t)n_kv * n * 4);
	uint8_t *dres = gpu_test_put(res, (size_t)n_kv * stride);
	int32_t *dp = gpu_test_poisoned((size_t)n_kv * k * 4);
	int32_t *dch = gpu_test_poisoned((size_t)n_kv * k * 4), *dn = gpu_test_poisoned(sizeof gn);
	CU(topk_pages_changed(dp, dch, dn, ds, dres, stride, n_kv, n, begin, k, 0));
	gpu_test_get(got, dp, (size_t)n_kv * k * 4);
	gpu_test_get(gch, dch, (size_t)n_kv * k * 4);
	gpu_test_get(gn, dn, sizeof gn);
	assert_memory_equal(got, ref, (size_t)n_kv * k * 4);
	int some_resident = 0;
	for (int h = 0; h < n_kv; h++) {
		int m = 0;
		for (int i = 0; i < k; i++) {
			int32_t pg = ref[(size_t)h * k + i];
			if (res[(size_t)h * stride + pg]) {
				some_resident = 1;
				continue;
			}
			assert_int_equal(gch[(size_t)h * k + m], pg);
			m++;
		}
		assert_int_equal(gn[h], m);
		for (int i = m; i < k; i++)
			assert_int_equal(gch[(size_t)h * k + i], -1);
	}
	assert_true(some_resident); /* the exclusion was exercised */
	cudaFree(ds);
	cudaFree(dres);
	cudaFree(dp);
	cudaFree(dch);
	cudaFree(dn);
	free(s);
	free(res);
	free(ref);
	free(got);
	free(gch);
}

static void test_topk_rejects_bad_k(void **state)
{
	(void)state;
	assert_int_equal(topk_pages(NULL, NULL, 8, 10, 0, 11, 0), cudaErrorInvalidValue);
	assert_int_equal(topk_pages_changed(NULL, NULL, NULL, NULL, NULL, 12, 8, 10, 4, 5, 0),
			 cudaErrorInvalidValue);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_topk_matches_select),
		cmocka_unit_test(test_topk_ties_to_lower_page),
		cmocka_unit_test(test_topk_distinct_large),
		cmocka_unit_test(test_topk_changed_excludes_resident),
		cmocka_unit_test(test_topk_rejects_bad_k),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
