/* kvload's latency histogram (bench/load/load_stats.c) against the plain reference: the samples
 * sorted, the percentile read off by rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "load.h"

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Every value lands in a bucket whose range holds it; consecutive buckets tile the values with
 * no gap and no overlap; a bucket is no wider than 1/LH_SUB of the values it holds. */
static void test_buckets_tile(void **state)
{
	(void)state;
	uint64_t prev_top = 0;
	for (unsigned b = 0; b < hist_bucket(UINT64_MAX); b++) {
		uint64_t top = hist_bucket_top(b), bottom = b ? prev_top + 1 : 0;
		assert_true(top >= bottom);
		assert_int_equal(hist_bucket(bottom), b);
		assert_int_equal(hist_bucket(top), b);
		assert_true((top - bottom) * LH_SUB <= bottom);
		prev_top = top;
	}
	assert_int_equal(hist_bucket_top(hist_bucket(UINT64_MAX)), UINT64_MAX);
	for (uint64_t v = 0; v < 2 * LH_SUB; v++) /* one value a bucket: exact */
		assert_int_equal(hist_bucket_top(hist_bucket(v)), v);
}

/* Log-uniform samples from 1 ns to about 17 s: each percentile is the exact one or at most
 * 1/LH_SUB above it, never below. */
static void test_percentiles_match_sorted(void **state)
{
	(void)state;
	enum { N = 200000 };
	static uint64_t v[N];
	static struct hist h;
	memset(&h, 0, sizeof h);
	uint64_t s = 0x2545f4914f6cdd1dull;
	for (int i = 0; i < N; i++) {
		v[i] = rnd(&s) >> (30 + rnd(&s) % 34);
		hist_add(&h, v[i]);
	}
	qsort(v, N, sizeof v[0], cmp_u64);
	const double qs[] = { 0, 0.5, 0.9, 0.99, 0.999, 0.9999, 1 };
	for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
		size_t rank = (size_t)(qs[i] * N);
		if (rank >= N)
			rank = N - 1;
		uint64_t exact = v[rank], got = hist_pct(&h, qs[i]);
		assert_true(got >= exact);
		assert_true(got - exact <= exact / LH_SUB);
	}
	/* Merged halves read the same as the whole. */
	static struct hist a, b;
	memset(&a, 0, sizeof a);
	memset(&b, 0, sizeof b);
	for (int i = 0; i < N; i++)
		hist_add(i % 2 ? &a : &b, v[i]);
	hist_merge(&a, &b);
	assert_int_equal(a.n, h.n);
	assert_memory_equal(a.b, h.b, sizeof h.b);
	memset(&b, 0, sizeof b);
	assert_int_equal(hist_pct(&b, 0.99), 0); /* empty */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_buckets_tile),
		cmocka_unit_test(test_percentiles_match_sorted),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
