/* Tests kernels/embedding.cu against the CPU backend's embed op, for every table dtype: the
 * conversion is exact, so the bound is 0. Ids out of range give NaN rows, not stray reads; an
 * unknown dtype is refused. */
#include "gpu_test.h"

#include "backend.h"
#include "embedding.cuh"

static void test_embedding_matches_cpu(void **state)
{
	(void)state;
	const int vocab = 300, dim = 200, n = 50;
	uint64_t rng = 77;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 1), 0);
	float *table = malloc((size_t)vocab * dim * 4), *ref = malloc((size_t)n * dim * 4);
	float *got = malloc((size_t)n * dim * 4);
	int32_t ids[50];
	for (int i = 0; i < n; i++)
		ids[i] = (int32_t)(test_rand(&rng) % vocab);
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++) {
		enum fkv_dtype dt = gpu_test_dtypes[t];
		gpu_test_fill(table, (size_t)vocab * dim, 2.0f, &rng);
		void *ht = gpu_test_to_dtype(table, dt, (size_t)vocab * dim);
		struct backend_mat m = { .data = ht, .dtype = dt, .rows = vocab, .cols = dim };
		assert_int_equal(cpu->ops->embed(cpu->ctx, ref, &m, ids, n), 0);
		void *dtab = gpu_test_put(ht, (size_t)vocab * dim * dtype_size(dt));
		int32_t *dids = gpu_test_put(ids, sizeof ids);
		float *dout = gpu_test_poisoned((size_t)n * dim * 4);
		CU(embedding_rows(dout, dtab, dt, dids, n, dim, vocab, 0));
		gpu_test_get(got, dout, (size_t)n * dim * 4);
		GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, (size_t)n * dim), 0.0, dtype_name(dt));
		cudaFree(dtab);
		cudaFree(dids);
		cudaFree(dout);
		free(ht);
	}
	free(table);
	free(ref);
	free(got);
	backend_free(cpu);
}

static void test_embedding_bad_id_is_nan(void **state)
{
	(void)state;
	const int vocab = 10, dim = 33;
	float table[10 * 33];
	uint64_t rng = 5;
	gpu_test_fill(table, sizeof table / 4, 1.0f, &rng);
	int32_t ids[4] = { 3, -1, 10, 9 };
	float got[4 * 33];
	float *dtab = gpu_test_put(table, sizeof table);
	int32_t *dids = gpu_test_put(ids, sizeof ids);
	float *dout = gpu_test_poisoned(sizeof got);
	assert_int_equal(embedding_rows(dout, dtab, (enum fkv_dtype)7, dids, 4, dim, vocab, 0),
			 cudaErrorInvalidValue);
	CU(embedding_rows(dout, dtab, FKV_F32, dids, 4, dim, vocab, 0));
	gpu_test_get(got, dout, sizeof got);
	for (int i = 0; i < dim; i++) {
		assert_true(got[i] == table[3 * dim + i]);
		assert_true(isnan(got[dim + i]));
		assert_true(isnan(got[2 * dim + i]));
		assert_true(got[3 * dim + i] == table[9 * dim + i]);
	}
	cudaFree(dtab);
	cudaFree(dids);
	cudaFree(dout);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_embedding_matches_cpu),
		cmocka_unit_test(test_embedding_bad_id_is_nan),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
