/* Tests kvstore/lib/crc32c.c: published check values, the hardware path against the software
 * reference over random lengths and alignments, and chaining. */
#include "test_util.h"

#include "crc32c.h"

static void test_check_values(void **state)
{
	(void)state;
	/* RFC 3720 B.4 and the standard "123456789" check value. */
	assert_int_equal(crc32c(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(crc32c_sw(0, "123456789", 9), 0xE3069283u);
	unsigned char zeros[32] = {0}, ones[32];
	memset(ones, 0xff, sizeof ones);
	assert_int_equal(crc32c(0, zeros, 32), 0x8A9136AAu);
	assert_int_equal(crc32c(0, ones, 32), 0x62A8AB43u);
	assert_int_equal(crc32c(0, "", 0), 0u);
}

static void test_hw_matches_reference(void **state)
{
	(void)state;
	/* Up to 64 KiB: long buffers take the three-stream path of the hardware version. */
	static unsigned char buf[65536 + 16];
	uint64_t rng = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (unsigned char)(test_rand(&rng) >> 24);
	for (int iter = 0; iter < 500; iter++) {
		size_t off = test_rand(&rng) % 16;
		size_t len = test_rand(&rng) % (iter < 250 ? 4096 : 65536);
		uint32_t seed = iter % 2 ? (uint32_t)test_rand(&rng) : 0;
		assert_int_equal(crc32c(seed, buf + off, len), crc32c_sw(seed, buf + off, len));
	}
}

static void test_chaining(void **state)
{
	(void)state;
	const char *s = "the quick brown fox jumps over the lazy dog";
	size_t n = strlen(s);
	for (size_t cut = 0; cut <= n; cut++)
		assert_int_equal(crc32c(crc32c(0, s, cut), s + cut, n - cut), crc32c(0, s, n));
}

static void test_detects_single_bit_flip(void **state)
{
	(void)state;
	unsigned char buf[512];
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (unsigned char)i;
	uint32_t good = crc32c(0, buf, sizeof buf);
	for (size_t bit = 0; bit < sizeof buf * 8; bit += 37) {
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		assert_int_not_equal(crc32c(0, buf, sizeof buf), good);
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_values),
		cmocka_unit_test(test_hw_matches_reference),
		cmocka_unit_test(test_chaining),
		cmocka_unit_test(test_detects_single_bit_flip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
