/* Tests common/layout.c: HND offsets checked element by element against the formula of
 * docs/design.md §3, and store -> recall unit -> scatter reproducing the NHD rows (exact in f32, dtype-rounded
 * otherwise). */
#include "test_util.h"

#include "layout.h"

static void test_sizes(void **state)
{
	(void)state;
	struct kv_geom g = {.n_kv = 8, .p = 32, .d = 128, .dtype = FKV_BF16};
	assert_int_equal(layout_unit_bytes(&g), 16384); /* the 16 KiB recall unit */
	/* 8 heads x 16 KiB = 128 KiB per page and layer (docs/design.md §7). */
	assert_int_equal(layout_block_bytes(&g), 128 * 1024);
}

static void test_store_matches_formula(void **state)
{
	(void)state;
	struct kv_geom g = {.n_kv = 3, .p = 4, .d = 5, .dtype = FKV_F32};
	float k[4 * 3 * 5], v[4 * 3 * 5], block[3 * 2 * 4 * 5];
	for (int i = 0; i < 60; i++) {
		k[i] = (float)i;
		v[i] = (float)(1000 + i);
	}
	memset(block, 0, sizeof block);
	layout_store_tokens(&g, block, 0, 2, k, v);	     /* tokens 0, 1 */
	layout_store_tokens(&g, block, 2, 4, k + 30, v + 30); /* tokens 2, 3 later (write-through) */
	for (int h = 0; h < 3; h++)
		for (int t = 0; t < 4; t++)
			for (int i = 0; i < 5; i++) {
				assert_true(block[((h * 2 + 0) * 4 + t) * 5 + i] == k[(t * 3 + h) * 5 + i]);
				assert_true(block[((h * 2 + 1) * 4 + t) * 5 + i] == v[(t * 3 + h) * 5 + i]);
			}
	float kh[4 * 5], vh[4 * 5];
	layout_load_head(&g, block, 2, 1, 3, kh, vh);
	for (int t = 0; t < 2; t++)
		for (int i = 0; i < 5; i++) {
			assert_true(kh[t * 5 + i] == k[((t + 1) * 3 + 2) * 5 + i]);
			assert_true(vh[t * 5 + i] == v[((t + 1) * 3 + 2) * 5 + i]);
		}
}

static void test_unit_scatter_gather_roundtrip(void **state)
{
	(void)state;
	uint64_t rng = 11;
	for (int dt = FKV_F32; dt <= FKV_BF16; dt++) {
		struct kv_geom g = {.n_kv = 4, .p = 8, .d = 16, .dtype = (enum fkv_dtype)dt};
		size_t n = (size_t)8 * 4 * 16;
		float *k = malloc(n * 4), *v = malloc(n * 4);
		for (size_t i = 0; i < n; i++) {
			k[i] = test_randf(&rng);
			v[i] = test_randf(&rng);
		}
		void *block = malloc(layout_block_bytes(&g));
		layout_store_tokens(&g, block, 0, 8, k, v);
		float *slot = malloc(2 * n * 4);
		for (size_t i = 0; i < 2 * n; i++)
			slot[i] = -999.0f; /* poison */
		for (int h = 0; h < 4; h++) /* head h's unit is contiguous at h * unit_bytes */
			layout_scatter_unit(&g, slot, h, (uint8_t *)block + h * layout_unit_bytes(&g));
		for (int t = 0; t < 8; t++)
			for (int h = 0; h < 4; h++)
				for (int i = 0; i < 16; i++) {
					size_t row = ((size_t)t * 4 + h) * 16 + i;
					float ek = k[row], ev = v[row];
					if (dt == FKV_F16) {
						ek = f16_to_f32(f32_to_f16(ek));
						ev = f16_to_f32(f32_to_f16(ev));
					} else if (dt == FKV_BF16) {
						ek = bf16_to_f32(f32_to_bf16(ek));
						ev = bf16_to_f32(f32_to_bf16(ev));
					}
					assert_true(slot[row] == ek);		/* K half of the slot */
					assert_true(slot[n + row] == ev);	/* V half */
				}
		void *unit = malloc(layout_unit_bytes(&g));
		for (int h = 0; h < 4; h++) {
			layout_gather_unit(&g, unit, h, slot);
			assert_memory_equal(unit, (uint8_t *)block + h * layout_unit_bytes(&g),
					    layout_unit_bytes(&g));
		}
		free(unit);
		free(slot);
		free(block);
		free(k);
		free(v);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_store_matches_formula),
		cmocka_unit_test(test_unit_scatter_gather_roundtrip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
