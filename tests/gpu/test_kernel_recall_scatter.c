/* Tests kernels/recall_scatter.cu against layout_scatter_unit() (common/layout.c): HND recall
 * units scattered into NHD head slices of slots, same-dtype and 16-bit-to-f32, on two
 * geometries. Copies and widenings are exact (bound: equality); slices no unit names keep their
 * prior random contents. */
#include "gpu_test.h"

#include "layout.h"
#include "recall_scatter.cuh"

static void check_case(enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, int n_kv, int p, int d,
		       uint64_t *rng)
{
	const int n_slots = 7, n_units = 9;
	const struct kv_geom g = { n_kv, p, d, unit_dt };
	const size_t unit_elems = 2 * (size_t)p * d, slot_elems = unit_elems * n_kv;
	const size_t total = n_slots * slot_elems;
	/* distinct (slot, head) pairs */
	int32_t dst[2 * 9];
	for (int u = 0; u < n_units; u++) {
		int again;
		do {
			dst[2 * u] = (int32_t)(test_rand(rng) % n_slots);
			dst[2 * u + 1] = (int32_t)(test_rand(rng) % n_kv);
			again = 0;
			for (int w = 0; w < u; w++)
				again |= dst[2 * w] == dst[2 * u] && dst[2 * w + 1] == dst[2 * u + 1];
		} while (again);
	}
	float *units = malloc(n_units * unit_elems * 4), *ref = malloc(total * 4);
	gpu_test_fill(units, n_units * unit_elems, 3.0f, rng);
	gpu_test_fill(ref, total, 3.0f, rng);
	gpu_test_round(ref, slot_dt, total);
	void *hslots = gpu_test_to_dtype(ref, slot_dt, total);
	void *hunits = gpu_test_to_dtype(units, unit_dt, n_units * unit_elems);
	for (int u = 0; u < n_units; u++)
		layout_scatter_unit(&g, ref + dst[2 * u] * slot_elems, dst[2 * u + 1],
				    (const uint8_t *)hunits + u * unit_elems * dtype_size(unit_dt));
	void *dslots = gpu_test_put(hslots, total * dtype_size(slot_dt));
	void *dunits = gpu_test_put(hunits, n_units * unit_elems * dtype_size(unit_dt));
	int32_t *ddst = gpu_test_put(dst, sizeof dst);
	CU(recall_scatter(dslots, slot_dt, dunits, unit_dt, ddst, n_units, n_kv, p, d, 0));
	gpu_test_get(hslots, dslots, total * dtype_size(slot_dt));
	float *got = malloc(total * 4);
	dtype_to_f32(got, hslots, slot_dt, total);
	assert_memory_equal(got, ref, total * 4);
	cudaFree(dslots);
	cudaFree(dunits);
	cudaFree(ddst);
	free(units);
	free(ref);
	free(hslots);
	free(hunits);
	free(got);
}

static void test_recall_scatter(void **state)
{
	(void)state;
	const enum fkv_dtype pairs[][2] = {
		{ FKV_F32, FKV_F32 }, { FKV_F16, FKV_F16 },  { FKV_BF16, FKV_BF16 },
		{ FKV_F16, FKV_F32 }, { FKV_BF16, FKV_F32 },
	};
	uint64_t rng = 31;
	for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
		check_case(pairs[i][0], pairs[i][1], 8, 32, 128, &rng);
		check_case(pairs[i][0], pairs[i][1], 4, 4, 8, &rng);
	}
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_recall_scatter),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
