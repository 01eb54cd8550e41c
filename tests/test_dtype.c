/* Tests common/dtype.c against double-precision references: round to nearest even, subnormals,
 * overflow, NaN/Inf, and an exhaustive f16 -> f32 -> f16 round trip. */
#include "test_util.h"

#include <math.h>

#include "dtype.h"

/* Reference: nearest representable f16 by brute-force search over all finite halves. */
static uint16_t f16_ref(float f)
{
	static float all[0x7c00];
	static int ready;
	if (!ready) {
		for (uint32_t h = 0; h < 0x7c00; h++)
			all[h] = f16_to_f32((uint16_t)h);
		ready = 1;
	}
	double a = fabs((double)f);
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	if (a >= 65520.0)
		return sign | 0x7c00;
	uint32_t lo = 0, hi = 0x7bff;
	while (lo < hi) { /* largest h with all[h] <= a */
		uint32_t mid = (lo + hi + 1) / 2;
		if ((double)all[mid] <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	uint32_t h = lo;
	if (h < 0x7bff) {
		double d0 = a - all[h], d1 = (double)all[h + 1] - a;
		if (d1 < d0 || (d1 == d0 && (h & 1)))
			h++;
	}
	return (uint16_t)(sign | h);
}

static void test_f16_exhaustive_roundtrip(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x10000; h++) {
		uint32_t exp = (h >> 10) & 0x1f;
		if (exp == 0x1f && (h & 0x3ff))
			continue; /* NaN payloads checked separately */
		assert_int_equal(f32_to_f16(f16_to_f32((uint16_t)h)), h);
	}
	assert_true(isnan(f16_to_f32(0x7e00)));
	assert_true(isnan(f16_to_f32(f32_to_f16(NAN))));
	assert_true(isinf(f16_to_f32(f32_to_f16(INFINITY))));
}

static void test_f16_rounding_matches_reference(void **state)
{
	(void)state;
	uint64_t rng = 42;
	for (int i = 0; i < 200000; i++) {
		float scale = ldexpf(1.0f, (int)(test_rand(&rng) % 40) - 28);
		float f = test_randf(&rng) * scale;
		assert_int_equal(f32_to_f16(f), f16_ref(f));
	}
	assert_int_equal(f32_to_f16(1e6f), 0x7c00);
	assert_int_equal(f32_to_f16(-1e6f), 0xfc00);
	assert_int_equal(f32_to_f16(65504.0f), 0x7bff);
	assert_int_equal(f32_to_f16(5.9604644775390625e-8f), 0x0001);
	assert_int_equal(f32_to_f16(2.9802322387695312e-8f), 0x0000); /* tie to even (zero) */
}

static void test_bf16(void **state)
{
	(void)state;
	assert_true(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
	assert_int_equal(f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);	/* tie -> even */
	assert_int_equal(f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82); /* tie -> even up */
	assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
	uint64_t rng = 7;
	for (int i = 0; i < 100000; i++) {
		float f = test_randf(&rng) * 1000.0f;
		float g = bf16_to_f32(f32_to_bf16(f));
		assert_true(fabsf(f - g) <= fabsf(f) * ldexpf(1.0f, -8));
	}
}

static void test_bulk_conversions(void **state)
{
	(void)state;
	float src[257], back[257];
	uint16_t mid[257];
	uint64_t rng = 99;
	for (int i = 0; i < 257; i++)
		src[i] = test_randf(&rng) * 10.0f;
	for (int t = FKV_F32; t <= FKV_BF16; t++) {
		dtype_from_f32(mid, src, (enum fkv_dtype)t, t == FKV_F32 ? 0 : 257);
		if (t == FKV_F32)
			continue;
		dtype_to_f32(back, mid, (enum fkv_dtype)t, 257);
		for (int i = 0; i < 257; i++) {
			float expect = t == FKV_F16 ? f16_to_f32(f32_to_f16(src[i]))
						    : bf16_to_f32(f32_to_bf16(src[i]));
			assert_true(back[i] == expect);
		}
	}
	enum fkv_dtype d;
	assert_int_equal(dtype_parse("bf16", &d), 0);
	assert_int_equal(d, FKV_BF16);
	assert_int_equal(dtype_parse("f8", &d), -22);
	assert_int_equal(dtype_size(FKV_F16), 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_f16_exhaustive_roundtrip),
		cmocka_unit_test(test_f16_rounding_matches_reference),
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_bulk_conversions),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
