/* Tests kernels/page_score.cu against select_scores() (worker/backend/select.c): random queries and
 * page summaries (min <= max), the candidate range of select_layout_of() for a long sequence,
 * Llama-3.1-8B geometry, a GQA-free one and a tiny head. Bound 1e-5: f32 sums in a different
 * order, expf by ulps. */
#include "gpu_test.h"

#include "page_score.cuh"
#include "select.h"

static void check_case(const struct select_geom *g, int len, uint64_t *rng)
{
	struct select_layout lay;
	assert_int_equal(select_geom_check(g), 0);
	select_layout_of(g, len, &lay);
	const int page_stride = lay.n_full + 1, n = lay.cand_end - lay.cand_begin;
	assert_true(n > 0);
	const size_t sum_elems = (size_t)g->n_kv * page_stride * g->d;
	float *q = malloc((size_t)g->n_q * g->d * 4), *kmin = malloc(sum_elems * 4);
	float *kmax = malloc(sum_elems * 4), *ref = malloc((size_t)g->n_kv * n * 4);
	float *got = malloc((size_t)g->n_kv * n * 4);
	float *scratch = malloc(select_scratch_floats(g, n) * 4);
	gpu_test_fill(q, (size_t)g->n_q * g->d, 2.0f, rng);
	for (size_t i = 0; i < sum_elems; i++) {
		float a = test_randf(rng) * 3.0f, b = test_randf(rng) * 3.0f;
		kmin[i] = a < b ? a : b;
		kmax[i] = a < b ? b : a;
	}
	select_scores(g, &lay, q, kmin, kmax, page_stride, ref, scratch);
	float *dq = gpu_test_put(q, (size_t)g->n_q * g->d * 4);
	float *dmin = gpu_test_put(kmin, sum_elems * 4), *dmax = gpu_test_put(kmax, sum_elems * 4);
	float *dout = gpu_test_poisoned((size_t)g->n_kv * n * 4);
	float *dscratch = gpu_test_poisoned((size_t)g->n_q * n * 4);
	CU(page_score(dout, dscratch, dq, dmin, dmax, page_stride, lay.cand_begin, n, g->n_q,
		      g->n_kv, g->d, 0));
	gpu_test_get(got, dout, (size_t)g->n_kv * n * 4);
	GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, (size_t)g->n_kv * n), 1e-5, "page_score");
	/* each KV head's scores are a mean of softmaxes: they sum to 1 */
	for (int h = 0; h < g->n_kv; h++) {
		double s = 0;
		for (int j = 0; j < n; j++)
			s += got[(size_t)h * n + j];
		assert_true(fabs(s - 1.0) < 1e-4);
	}
	cudaFree(dq);
	cudaFree(dmin);
	cudaFree(dmax);
	cudaFree(dout);
	cudaFree(dscratch);
	free(q);
	free(kmin);
	free(kmax);
	free(ref);
	free(got);
	free(scratch);
}

static void test_page_score_matches_select(void **state)
{
	(void)state;
	uint64_t rng = 51;
	const struct select_geom llama = { 32, 8, 128, 32, 512, 512, 2048 };
	const struct select_geom mha = { 8, 8, 64, 16, 32, 64, 256 };
	const struct select_geom tiny = { 8, 4, 8, 4, 4, 8, 32 };
	check_case(&llama, 32768 + 17, &rng);
	check_case(&llama, 2049, &rng);
	check_case(&mha, 5000, &rng);
	check_case(&tiny, 100, &rng);
}

static void test_page_score_rejects_bad_geometry(void **state)
{
	(void)state;
	/* candidates past the summaries' page stride; n_q not a multiple of n_kv */
	assert_int_equal(page_score(NULL, NULL, NULL, NULL, NULL, 10, 5, 6, 8, 8, 64, 0),
			 cudaErrorInvalidValue);
	assert_int_equal(page_score(NULL, NULL, NULL, NULL, NULL, 10, 0, 6, 6, 4, 64, 0),
			 cudaErrorInvalidValue);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_page_score_matches_select),
		cmocka_unit_test(test_page_score_rejects_bad_geometry),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
