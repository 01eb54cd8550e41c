/* cpu_quant — see cpu_quant.h; layouts and the choice of kernel in docs/quant.md.
 *
 * Every format has one block decoder, an always-inlined function that turns a block into
 * sixteen-lane f32 vectors holding exactly quant_dequant()'s values (same operations in the same
 * order: each value is one rounding of an exact product or multiply-add, so vector or scalar,
 * FMA-contracted or not, the bits agree). The dot and tile kernels are one template each,
 * instantiated per format, so the decoder is compiled into every clone. */
#include "cpu_quant.h"

#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi" /* vectors by value, only between inlined statics */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint8_t v16b __attribute__((vector_size(16)));
typedef int8_t v16sb __attribute__((vector_size(16)));

/* AVX-512, AVX2+FMA (x86-64-v3, with F16C) or the baseline, picked by the loader (GCC function
 * multiversioning); see CPU_HOT in backend_cpu.c for why TSan builds go without. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define QHOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QHOT
#endif

#define AI __attribute__((always_inline)) static inline

/* f16 bits -> f32 without branches (exact for every finite value, subnormals included). */
AI float h2f(uint16_t h)
{
	uint32_t em = h & 0x7fffu, r, u = em << 13;
	float f;
	memcpy(&f, &u, sizeof f);
	f *= 0x1p112f;
	memcpy(&r, &f, sizeof r);
	r |= (em >= 0x7c00u ? 0x7f800000u : 0u) | (uint32_t)(h & 0x8000u) << 16;
	memcpy(&f, &r, sizeof f);
	return f;
}

AI v16b ldb(const uint8_t *p)
{
	v16b v;
	memcpy(&v, p, sizeof v);
	return v;
}

AI v16f ldf(const float *p)
{
	v16f v;
	memcpy(&v, p, sizeof v);
	return v;
}

AI v16i b2i(v16b v)
{
	return __builtin_convertvector(v, v16i);
}

/* Through int32: GCC turns a byte-to-float vector conversion into one scalar vcvtsi2ss per lane,
 * a byte-to-int32 one into vpmovzxbd and the int32-to-float one into vcvtdq2ps (same values). */
AI v16f b2f(v16b v)
{
	return __builtin_convertvector(b2i(v), v16f);
}

/* Signed bytes: GCC scalarizes a signed byte-to-int32 conversion too, so offset to unsigned
 * (x ^ 0x80 = x + 128), widen with zero extension and subtract 128 in int32 (exact). */
AI v16f sb2f(v16sb v)
{
	v16b u = (v16b)v ^ 0x80;
	return __builtin_convertvector(b2i(u) - 128, v16f);
}

/* Lanes 0..15 of the fifth bits in a legacy qh word: bit (first + lane). */
AI v16i qh_bits(const uint8_t qh[4], int first)
{
	static const v16u lane = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
	uint32_t w;
	memcpy(&w, qh, sizeof w);
	v16u bits = ((w >> (uint32_t)first) >> lane) & 1u;
	return (v16i)(bits << 4);
}

/* ---- block decoders: out[k] = values 16k .. 16k + 15 of the block ---- */

AI void dec_q8_0(const void *blk, v16f *out)
{
	const struct blk_q8_0 *b = blk;
	const float d = h2f(b->d);
	v16sb a, c;
	memcpy(&a, b->qs, 16);
	memcpy(&c, b->qs + 16, 16);
	out[0] = sb2f(a) * d;
	out[1] = sb2f(c) * d;
}

AI void dec_q4_0(const void *blk, v16f *out)
{
	const struct blk_q4_0 *b = blk;
	const float d = h2f(b->d);
	v16b q = ldb(b->qs);
	out[0] = __builtin_convertvector(b2i(q & 15) - 8, v16f) * d;
	out[1] = __builtin_convertvector(b2i(q >> 4) - 8, v16f) * d;
}

AI void dec_q4_1(const void *blk, v16f *out)
{
	const struct blk_q4_1 *b = blk;
	const float d = h2f(b->d), m = h2f(b->m);
	v16b q = ldb(b->qs);
	out[0] = b2f(q & 15) * d + m;
	out[1] = b2f(q >> 4) * d + m;
}

AI void dec_q5_0(const void *blk, v16f *out)
{
	const struct blk_q5_0 *b = blk;
	const float d = h2f(b->d);
	v16b q = ldb(b->qs);
	out[0] = __builtin_convertvector((b2i(q & 15) | qh_bits(b->qh, 0)) - 16, v16f) * d;
	out[1] = __builtin_convertvector((b2i(q >> 4) | qh_bits(b->qh, 16)) - 16, v16f) * d;
}

AI void dec_q5_1(const void *blk, v16f *out)
{
	const struct blk_q5_1 *b = blk;
	const float d = h2f(b->d), m = h2f(b->m);
	v16b q = ldb(b->qs);
	out[0] = __builtin_convertvector(b2i(q & 15) | qh_bits(b->qh, 0), v16f) * d + m;
	out[1] = __builtin_convertvector(b2i(q >> 4) | qh_bits(b->qh, 16), v16f) * d + m;
}

AI void dec_q4_k(const void *blk, v16f *out)
{
	const struct blk_q4_k *b = blk;
	const float d = h2f(b->d), dmin = h2f(b->dmin);
	for (int p = 0; p < 4; p++) {
		v16b q0 = ldb(b->qs + 32 * p), q1 = ldb(b->qs + 32 * p + 16);
		uint8_t sc, m;
		quant_k_scale_min(b->scales, 2 * p, &sc, &m);
		float d1 = d * sc, m1 = dmin * m;
		out[4 * p + 0] = d1 * b2f(q0 & 15) - m1;
		out[4 * p + 1] = d1 * b2f(q1 & 15) - m1;
		quant_k_scale_min(b->scales, 2 * p + 1, &sc, &m);
		d1 = d * sc;
		m1 = dmin * m;
		out[4 * p + 2] = d1 * b2f(q0 >> 4) - m1;
		out[4 * p + 3] = d1 * b2f(q1 >> 4) - m1;
	}
}

AI void dec_q5_k(const void *blk, v16f *out)
{
	const struct blk_q5_k *b = blk;
	const float d = h2f(b->d), dmin = h2f(b->dmin);
	const v16b h0 = ldb(b->qh), h1 = ldb(b->qh + 16);
	for (int j = 0; j < 8; j++) {
		const uint8_t *qs = b->qs + 32 * (j / 2);
		v16b q0 = ldb(qs), q1 = ldb(qs + 16);
		if (j % 2) {
			q0 >>= 4;
			q1 >>= 4;
		} else {
			q0 &= 15;
			q1 &= 15;
		}
		q0 |= ((h0 >> j) & 1) << 4;
		q1 |= ((h1 >> j) & 1) << 4;
		uint8_t sc, m;
		quant_k_scale_min(b->scales, j, &sc, &m);
		const float d1 = d * sc, m1 = dmin * m;
		out[2 * j + 0] = d1 * b2f(q0) - m1;
		out[2 * j + 1] = d1 * b2f(q1) - m1;
	}
}

AI void dec_q6_k(const void *blk, v16f *out)
{
	const struct blk_q6_k *b = blk;
	const float d = h2f(b->d);
	for (int h = 0; h < 2; h++) {
		const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
		for (int k = 0; k < 4; k++)
			for (int g = 0; g < 2; g++) {
				v16b lo = ldb(ql + 32 * (k % 2) + 16 * g);
				lo = k < 2 ? lo & 15 : lo >> 4;
				v16b hi = (ldb(qh + 16 * g) >> (2 * k)) & 3;
				v16i v = b2i(lo | hi << 4) - 32;
				const float s = d * (float)b->scales[8 * h + 2 * k + g];
				out[8 * h + 2 * k + g] = s * __builtin_convertvector(v, v16f);
			}
	}
}

/* ---- the two templates ---- */

/* One row of nb blocks against x: the block's values times x, summed in two accumulators. */
#define DOT_ROW(DEC, BE, BB)                                                                     \
	AI float dot_row_##DEC(const uint8_t *row, const float *x, int64_t nb)                   \
	{                                                                                        \
		v16f a0 = { 0 }, a1 = { 0 }, v[(BE) / 16];                                       \
		for (int64_t i = 0; i < nb; i++, row += (BB), x += (BE)) {                       \
			DEC(row, v);                                                             \
			for (int k = 0; k < (BE) / 16; k += 2) {                                 \
				a0 += v[k] * ldf(x + 16 * k);                                    \
				a1 += v[k + 1] * ldf(x + 16 * k + 16);                           \
			}                                                                        \
		}                                                                                \
		a0 += a1;                                                                        \
		float s = 0;                                                                     \
		for (int l = 0; l < 16; l++)                                                     \
			s += a0[l];                                                              \
		return s;                                                                        \
	}                                                                                        \
	AI void deq_row_##DEC(float *dst, const uint8_t *row, int64_t nb)                        \
	{                                                                                        \
		v16f v[(BE) / 16];                                                               \
		for (int64_t i = 0; i < nb; i++, row += (BB), dst += (BE)) {                     \
			DEC(row, v);                                                             \
			memcpy(dst, v, sizeof v);                                                \
		}                                                                                \
	}

DOT_ROW(dec_q8_0, QK_LEGACY, sizeof(struct blk_q8_0))
DOT_ROW(dec_q4_0, QK_LEGACY, sizeof(struct blk_q4_0))
DOT_ROW(dec_q4_1, QK_LEGACY, sizeof(struct blk_q4_1))
DOT_ROW(dec_q5_0, QK_LEGACY, sizeof(struct blk_q5_0))
DOT_ROW(dec_q5_1, QK_LEGACY, sizeof(struct blk_q5_1))
DOT_ROW(dec_q4_k, QK_K, sizeof(struct blk_q4_k))
DOT_ROW(dec_q5_k, QK_K, sizeof(struct blk_q5_k))
DOT_ROW(dec_q6_k, QK_K, sizeof(struct blk_q6_k))

#define EACH_FORMAT(X)                 \
	X(FKV_Q8_0, dec_q8_0)          \
	X(FKV_Q4_0, dec_q4_0)          \
	X(FKV_Q4_1, dec_q4_1)          \
	X(FKV_Q5_0, dec_q5_0)          \
	X(FKV_Q5_1, dec_q5_1)          \
	X(FKV_Q4_K, dec_q4_k)          \
	X(FKV_Q5_K, dec_q5_k)          \
	X(FKV_Q6_K, dec_q6_k)

QHOT void cpu_quant_dot_rows(float *y, const float *x, const void *w, enum fkv_quant q, int64_t cols,
			     int64_t r0, int64_t r1)
{
	const size_t rb = quant_row_bytes(q, cols);
	const int64_t nb = cols / (quant_block_elems(q) ? quant_block_elems(q) : 1);
	const uint8_t *base = w;
	switch (q) {
#define DOT_CASE(Q, DEC)                                                  \
	case Q:                                                           \
		for (int64_t r = r0; r < r1; r++)                         \
			y[r] = dot_row_##DEC(base + (size_t)r * rb, x, nb); \
		break;
		EACH_FORMAT(DOT_CASE)
#undef DOT_CASE
	case FKV_QNONE:
		break;
	}
}

QHOT void cpu_quant_dequant_rows(float *dst, const void *w, enum fkv_quant q, int64_t cols,
				 int64_t r0, int64_t m)
{
	const size_t rb = quant_row_bytes(q, cols);
	const int64_t nb = cols / (quant_block_elems(q) ? quant_block_elems(q) : 1);
	const uint8_t *base = (const uint8_t *)w + (size_t)r0 * rb;
	switch (q) {
#define DEQ_CASE(Q, DEC)                                                          \
	case Q:                                                                   \
		for (int64_t r = 0; r < m; r++)                                   \
			deq_row_##DEC(dst + r * cols, base + (size_t)r * rb, nb); \
		break;
		EACH_FORMAT(DEQ_CASE)
#undef DEQ_CASE
	case FKV_QNONE:
		break;
	}
}
