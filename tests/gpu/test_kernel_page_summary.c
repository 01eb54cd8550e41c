/* Tests kernels/page_summary.cu against select_page_summary() (worker/backend/select.c) for pages held
 * in NHD slots and in dense prefill keys, every dtype. Min and max are exact (bound: equality);
 * summary pages not named stay untouched (still the poison). */
#include "gpu_test.h"

#include "page_summary.cuh"
#include "select.h"

static void check_case(enum fkv_dtype dt, int dense, uint64_t *rng)
{
	const int n_src = 6, p = 32, n_kv = 8, d = 128, page_stride = 10, n = 4;
	const size_t hd = (size_t)n_kv * d;
	const long long k_page_stride = dense ? (long long)p * hd : 2LL * p * hd;
	const size_t total = (size_t)n_src * k_page_stride;
	const int32_t src[4] = { 5, 0, 3, 2 }, dst[4] = { 9, 1, 4, 0 };
	float *keys = malloc(total * 4);
	gpu_test_fill(keys, total, 4.0f, rng);
	gpu_test_round(keys, dt, total);
	void *hk = gpu_test_to_dtype(keys, dt, total);
	void *dk = gpu_test_put(hk, total * dtype_size(dt));
	const size_t sum_elems = (size_t)n_kv * page_stride * d;
	float *dmin = gpu_test_poisoned(sum_elems * 4), *dmax = gpu_test_poisoned(sum_elems * 4);
	int32_t *dsrc = gpu_test_put(src, sizeof src), *ddst = gpu_test_put(dst, sizeof dst);
	CU(page_summary(dmin, dmax, page_stride, dk, dt, k_page_stride, dsrc, ddst, n, n_kv, p, d,
			0));
	float *gmin = malloc(sum_elems * 4), *gmax = malloc(sum_elems * 4);
	gpu_test_get(gmin, dmin, sum_elems * 4);
	gpu_test_get(gmax, dmax, sum_elems * 4);
	float rmin[128], rmax[128];
	for (int h = 0; h < n_kv; h++)
		for (int pg = 0; pg < page_stride; pg++) {
			const float *gm = gmin + ((size_t)h * page_stride + pg) * d;
			const float *gx = gmax + ((size_t)h * page_stride + pg) * d;
			int i = -1;
			for (int j = 0; j < n; j++)
				if (dst[j] == pg)
					i = j;
			if (i < 0) {
				for (int c = 0; c < d; c++)
					assert_true(isnan(gm[c]) && isnan(gx[c]));
				continue;
			}
			select_page_summary(p, d, keys + src[i] * k_page_stride + (size_t)h * d, hd,
					    rmin, rmax);
			assert_memory_equal(gm, rmin, d * 4);
			assert_memory_equal(gx, rmax, d * 4);
		}
	cudaFree(dk);
	cudaFree(dmin);
	cudaFree(dmax);
	cudaFree(dsrc);
	cudaFree(ddst);
	free(keys);
	free(hk);
	free(gmin);
	free(gmax);
}

static void test_page_summary_slots(void **state)
{
	(void)state;
	uint64_t rng = 21;
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++)
		check_case(gpu_test_dtypes[t], 0, &rng);
}

static void test_page_summary_dense(void **state)
{
	(void)state;
	uint64_t rng = 22;
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++)
		check_case(gpu_test_dtypes[t], 1, &rng);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_page_summary_slots),
		cmocka_unit_test(test_page_summary_dense),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
