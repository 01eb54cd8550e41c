/* Tests for common/quant.c: the reference dequantization of every block format against a
 * float64 reading of docs/quant.md written independently here (one element at a time, from
 * the byte offsets the page gives), on random blocks, bit for bit; the block geometry; and the
 * mapping from ggml type ids. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "dtype.h"
#include "quant.h"

static uint64_t seed = 0x9a17;

static const enum fkv_quant test_formats[] = { FKV_Q8_0, FKV_Q4_0, FKV_Q4_1, FKV_Q5_0,
					FKV_Q5_1, FKV_Q4_K, FKV_Q5_K, FKV_Q6_K };
#define N_FMT (sizeof test_formats / sizeof test_formats[0])

static uint16_t rand_f16(void)
{
	/* finite, both signs, magnitudes 2^-20 .. 2^2 (subnormal f16 included) */
	float v = ldexpf(test_randf(&seed), -(int)(test_rand(&seed) % 22));
	return f32_to_f16(v * 4.0f);
}

/* Random bytes with every f16 field (docs/quant.md's offsets) set to a random finite value. */
static void rand_blocks(enum fkv_quant q, uint8_t *p, int64_t nblk)
{
	const size_t bb = quant_block_bytes(q);
	for (size_t i = 0; i < bb * (size_t)nblk; i++)
		p[i] = (uint8_t)test_rand(&seed);
	for (int64_t b = 0; b < nblk; b++, p += bb) {
		uint16_t h[2] = { rand_f16(), rand_f16() };
		switch (q) {
		case FKV_Q4_1: case FKV_Q5_1: case FKV_Q4_K: case FKV_Q5_K:
			memcpy(p, h, 4); /* d, then m or dmin */
			break;
		case FKV_Q6_K:
			memcpy(p + 208, h, 2);
			break;
		default:
			memcpy(p, h, 2);
		}
	}
}

static double f16at(const uint8_t *p, size_t off)
{
	uint16_t h;
	memcpy(&h, p + off, 2);
	return f16_to_f32(h);
}

/* The fourth bit of element i < 32 in a 32-bit little-endian qh at p. */
static int bit32(const uint8_t *p, int i)
{
	uint32_t w;
	memcpy(&w, p, 4);
	return (int)((w >> i) & 1);
}

/* Element i of a legacy block's 4-bit field qs at p: low nibbles are 0..15, high 16..31. */
static int nib(const uint8_t *qs, int i)
{
	return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
}

static void k_sm(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] % 64;
		*m = s[j + 4] % 64;
	} else {
		*sc = (s[j + 4] % 16) + (s[j - 4] / 64) * 16;
		*m = (s[j + 4] / 16) + (s[j] / 64) * 16;
	}
}

/* Element i of block b, in float64, as docs/quant.md describes it. */
static double ref_value(enum fkv_quant q, const uint8_t *b, int i)
{
	switch (q) {
	case FKV_Q8_0: return f16at(b, 0) * (int8_t)b[2 + i];
	case FKV_Q4_0: return f16at(b, 0) * (nib(b + 2, i) - 8);
	case FKV_Q4_1: return f16at(b, 0) * nib(b + 4, i) + f16at(b, 2);
	case FKV_Q5_0: return f16at(b, 0) * (nib(b + 6, i) + 16 * bit32(b + 2, i) - 16);
	case FKV_Q5_1: return f16at(b, 0) * (nib(b + 8, i) + 16 * bit32(b + 4, i)) + f16at(b, 2);
	case FKV_Q4_K:
	case FKV_Q5_K: {
		const int j = i / 32, l = i % 32;
		const uint8_t *qs = b + (q == FKV_Q4_K ? 16 : 48);
		int sc, m, v = qs[32 * (j / 2) + l];
		v = j % 2 ? v >> 4 : v & 15;
		if (q == FKV_Q5_K)
			v += 16 * ((b[16 + l] >> j) & 1);
		k_sm(b + 4, j, &sc, &m);
		return f16at(b, 0) * sc * v - f16at(b, 2) * m;
	}
	case FKV_Q6_K: {
		const int h = i / 128, k = i % 128 / 32, l = i % 32;
		const int lo = b[64 * h + 32 * (k % 2) + l];
		const int v = (k < 2 ? lo & 15 : lo >> 4) + 16 * ((b[128 + 32 * h + l] >> (2 * k)) & 3) - 32;
		return f16at(b, 208) * (int8_t)b[192 + 8 * h + 2 * k + l / 16] * v;
	}
	case FKV_QNONE: break;
	}
	fail();
	return 0;
}

static void test_geometry(void **state)
{
	(void)state;
	static const struct { enum fkv_quant q; uint32_t ggml; int elems; size_t bytes; const char *name; } g[] = {
		{ FKV_Q8_0, 8, 32, 34, "Q8_0" }, { FKV_Q4_0, 2, 32, 18, "Q4_0" },
		{ FKV_Q4_1, 3, 32, 20, "Q4_1" }, { FKV_Q5_0, 6, 32, 22, "Q5_0" },
		{ FKV_Q5_1, 7, 32, 24, "Q5_1" }, { FKV_Q4_K, 12, 256, 144, "Q4_K" },
		{ FKV_Q5_K, 13, 256, 176, "Q5_K" }, { FKV_Q6_K, 14, 256, 210, "Q6_K" },
	};
	for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
		enum fkv_quant q;
		assert_int_equal(quant_from_ggml(g[i].ggml, &q), 0);
		assert_int_equal(q, g[i].q);
		assert_int_equal(quant_block_elems(q), g[i].elems);
		assert_int_equal(quant_block_bytes(q), g[i].bytes);
		assert_string_equal(quant_name(q), g[i].name);
		assert_true(quant_known(q));
		assert_int_equal(quant_row_bytes(q, 4 * g[i].elems), 4 * g[i].bytes);
		assert_int_equal(quant_row_bytes(q, g[i].elems + 16), 0);
		assert_int_equal(quant_row_bytes(q, 0), 0);
	}
	enum fkv_quant q;
	/* F32, F16, Q2_K, Q3_K, IQ2_XXS, BF16: no kernels */
	static const uint32_t refused[] = { 0, 1, 10, 11, 16, 30, 9999 };
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
		assert_int_equal(quant_from_ggml(refused[i], &q), -EPROTO);
	assert_false(quant_known(FKV_QNONE));
	assert_string_equal(quant_name(FKV_QNONE), "none");
}

static void test_dequant_exact(void **state)
{
	(void)state;
	for (size_t f = 0; f < N_FMT; f++) {
		const enum fkv_quant q = test_formats[f];
		const int be = quant_block_elems(q), nblk = 64;
		const size_t bb = quant_block_bytes(q);
		uint8_t *blk = malloc(bb * nblk);
		float *y = malloc(sizeof(float) * (size_t)(be * nblk));
		assert_non_null(blk);
		assert_non_null(y);
		rand_blocks(q, blk, nblk);
		quant_dequant(q, y, blk, (int64_t)be * nblk);
		int64_t nonzero = 0;
		for (int b = 0; b < nblk; b++)
			for (int i = 0; i < be; i++) {
				float want = (float)ref_value(q, blk + b * bb, i), got = y[b * be + i];
				if (memcmp(&want, &got, sizeof got))
					fail_msg("%s block %d element %d: got %a, float64 reference %a", quant_name(q),
						 b, i, (double)got, (double)want);
				nonzero += got != 0;
			}
		assert_true(nonzero > be * nblk / 2); /* random data, not a block of zeros */
		free(blk);
		free(y);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_geometry),
		cmocka_unit_test(test_dequant_exact),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
