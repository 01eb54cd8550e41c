/* Tests kernels/kv_append.cu: new K/V rows land at the named (slot, row) of NHD slots in every
 * dtype, rounded exactly like dtype_from_f32 (bound: byte equality), and every other byte of
 * the slots keeps its prior (random) value. */
#include "gpu_test.h"

#include "kv_append.cuh"

static void test_kv_append_rows(void **state)
{
	(void)state;
	const int n_slots = 5, p = 32, n_kv = 4, d = 64, n_tok = 6;
	const size_t hd = (size_t)n_kv * d, slot_elems = 2 * (size_t)p * hd;
	const size_t total = n_slots * slot_elems;
	const int32_t slot_pos[6] = { 0, 31, 2 * 32 + 5, 4 * 32 + 31, 3 * 32, 1 * 32 + 17 };
	uint64_t rng = 11;
	float *init = malloc(total * 4), *k = malloc(n_tok * hd * 4), *v = malloc(n_tok * hd * 4);
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++) {
		enum fkv_dtype dt = gpu_test_dtypes[t];
		const size_t es = dtype_size(dt);
		gpu_test_fill(init, total, 3.0f, &rng);
		gpu_test_fill(k, n_tok * hd, 3.0f, &rng);
		gpu_test_fill(v, n_tok * hd, 3.0f, &rng);
		uint8_t *ref = gpu_test_to_dtype(init, dt, total);
		for (int i = 0; i < n_tok; i++) {
			int slot = slot_pos[i] / p, row = slot_pos[i] % p;
			dtype_from_f32(ref + (slot * slot_elems + row * hd) * es, k + i * hd, dt, hd);
			dtype_from_f32(ref + (slot * slot_elems + (p + row) * hd) * es, v + i * hd, dt,
				       hd);
		}
		void *hinit = gpu_test_to_dtype(init, dt, total);
		void *dslots = gpu_test_put(hinit, total * es);
		float *dk = gpu_test_put(k, n_tok * hd * 4), *dv = gpu_test_put(v, n_tok * hd * 4);
		int32_t *dpos = gpu_test_put(slot_pos, sizeof slot_pos);
		CU(kv_append(dslots, dt, dk, dv, dpos, n_tok, n_kv, p, d, 0));
		uint8_t *got = malloc(total * es);
		gpu_test_get(got, dslots, total * es);
		assert_memory_equal(got, ref, total * es);
		cudaFree(dslots);
		cudaFree(dk);
		cudaFree(dv);
		cudaFree(dpos);
		free(got);
		free(ref);
		free(hinit);
	}
	free(init);
	free(k);
	free(v);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kv_append_rows),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
