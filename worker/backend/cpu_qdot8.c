/* cpu_qdot8 — see cpu_qdot8.h; the block layouts in docs/quant.md. */
#include "cpu_qdot8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

static int g_enabled = -1; /* -1: not decided yet (FREEKV_CPU_QDOT8 is read at first use) */

void cpu_qdot8_enable(bool on)
{
	g_enabled = on;
}

__attribute__((unused)) static bool enabled(void)
{
	if (g_enabled < 0) {
		const char *e = getenv("FREEKV_CPU_QDOT8");
		g_enabled = !(e && !strcmp(e, "0"));
	}
	return g_enabled;
}

static bool k_format(enum fkv_quant q)
{
	return q == FKV_Q4_K || q == FKV_Q5_K || q == FKV_Q6_K;
}

void cpu_q8k_quantize(struct q8k_block *dst, const float *x, int64_t cols)
{
	for (int64_t b = 0; b < cols / QK_K; b++, x += QK_K) {
		struct q8k_block *o = &dst[b];
		float amax = 0;
		for (int i = 0; i < QK_K; i++)
			amax = fmaxf(amax, fabsf(x[i]));
		o->d = amax / 127.0f;
		const float id = amax > 0 ? 127.0f / amax : 0.0f;
		for (int i = 0; i < QK_K; i++) {
			long v = lrintf(x[i] * id);
			o->qs[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
		}
		for (int j = 0; j < 16; j++) {
			int s = 0;
			for (int i = 0; i < 16; i++)
				s += o->qs[16 * j + i];
			o->bsums[j] = (int16_t)s;
		}
	}
}

/* ---- the scalar reference: one block's integer sums, then the shared f32 step ---- */

/* Value i (0..255) of a Q4_K/Q5_K block before scale and min: its nibble, and its fifth bit. */
static int k45_value(const uint8_t *qs, const uint8_t *qh, int i)
{
	const int j = i / 32, l = i % 32;
	int v = j % 2 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 15;
	if (qh)
		v |= ((qh[l] >> j) & 1) << 4;
	return v;
}

/* Q4_K/Q5_K: Σ_j sc_j Σ_{i∈j} q_i x_i and Σ_j m_j Σ_{i∈j} x_i over the eight sub-blocks of 32. */
static void k45_sums(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
		     const struct q8k_block *x, int32_t *sumi, int32_t *summ)
{
	*sumi = *summ = 0;
	for (int j = 0; j < 8; j++) {
		uint8_t sc, m;
		quant_k_scale_min(scales, j, &sc, &m);
		int32_t s = 0;
		for (int l = 0; l < 32; l++)
			s += k45_value(qs, qh, 32 * j + l) * x->qs[32 * j + l];
		*sumi += sc * s;
		*summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
	}
}

/* Q6_K: Σ_j sc_j Σ_{i∈j} (q_i - 32) x_i over the sixteen sub-blocks of 16. */
static int32_t q6k_sum(const struct blk_q6_k *b, const struct q8k_block *x)
{
	int32_t sumi = 0;
	for (int i = 0; i < QK_K; i++) {
		const int h = i / 128, k = i % 128 / 32, l = i % 32;
		const uint8_t lo = b->ql[64 * h + 32 * (k % 2) + l];
		const int q = (k < 2 ? lo & 15 : lo >> 4) | ((b->qh[32 * h + l] >> (2 * k)) & 3) << 4;
		sumi += b->scales[i / 16] * (q - 32) * x->qs[i];
	}
	return sumi;
}

/* The f32 step, shared by both paths: acc + dx·d·sumi - dx·dmin·summ, each one rounding. */
__attribute__((always_inline)) static inline float k_acc(float acc, float dx, uint16_t d,
							 uint16_t dmin, int32_t sumi, int32_t summ)
{
	acc = fmaf(dx * f16_to_f32(d), (float)sumi, acc);
	return fmaf(-(dx * f16_to_f32(dmin)), (float)summ, acc);
}

void cpu_qdot8_rows_ref(float *y, const struct q8k_block *x, const void *w, enum fkv_quant q,
			int64_t cols, int64_t r0, int64_t r1)
{
	const size_t rb = quant_row_bytes(q, cols);
	const int64_t nb = cols / QK_K;
	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *row = (const uint8_t *)w + (size_t)r * rb;
		float acc = 0;
		for (int64_t i = 0; i < nb; i++) {
			int32_t sumi, summ;
			if (q == FKV_Q6_K) {
				const struct blk_q6_k *b = (const struct blk_q6_k *)row + i;
				acc = k_acc(acc, x[i].d, b->d, 0, q6k_sum(b, &x[i]), 0);
			} else if (q == FKV_Q4_K) {
				const struct blk_q4_k *b = (const struct blk_q4_k *)row + i;
				k45_sums(b->scales, b->qs, NULL, &x[i], &sumi, &summ);
				acc = k_acc(acc, x[i].d, b->d, b->dmin, sumi, summ);
			} else {
				const struct blk_q5_k *b = (const struct blk_q5_k *)row + i;
				k45_sums(b->scales, b->qs, b->qh, &x[i], &sumi, &summ);
				acc = k_acc(acc, x[i].d, b->d, b->dmin, sumi, summ);
			}
		}
		y[r] = acc;
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define QDOT8_TARGET __attribute__((target("avx2,fma,f16c")))
#define AI QDOT8_TARGET __attribute__((always_inline)) static inline

bool cpu_qdot8_usable(enum fkv_quant q)
{
	static int usable = -1;
	if (usable < 0) {
		__builtin_cpu_init();
		usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
			 __builtin_cpu_supports("f16c");
	}
	return usable && k_format(q) && enabled();
}

AI int32_t hsum_i32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

/* The f32 step of k_acc, with F16C's exact conversion instead of the library call: the same
 * values, the same roundings. */
AI float k_acc_f16c(float acc, float dx, uint16_t d, uint16_t dmin, int32_t sumi, int32_t summ)
{
	acc = fmaf(dx * _cvtsh_ss(d), (float)sumi, acc);
	return fmaf(-(dx * _cvtsh_ss(dmin)), (float)summ, acc);
}

/* The twelve scale bytes of a Q4_K/Q5_K block as eight 6-bit scales (sc, bytes 0..7) and eight
 * 6-bit mins (mn), all at once: sub-blocks 0..3 keep the low six bits of bytes 0..3 (scales)
 * and 4..7 (mins); sub-blocks 4..7 take their low four bits from bytes 8..11 (scales: low
 * nibbles, mins: high nibbles) and their top two from the top bits of bytes 0..3 and 4..7
 * (docs/quant.md, as quant_k_scale_min reads them one at a time). */
AI void k45_unpack(const uint8_t *scales, uint8_t sc[8], uint8_t mn[8])
{
	uint32_t u[3], o[4];
	memcpy(u, scales, 12);
	o[0] = u[0] & 0x3f3f3f3fu;
	o[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
	o[2] = u[1] & 0x3f3f3f3fu;
	o[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
	memcpy(sc, o, 8);
	memcpy(mn, o + 2, 8);
}

/* Σ_j m_j (bsums[2j] + bsums[2j+1]): the mins' part of a Q4_K/Q5_K block (pairs of bsums added
 * with vphaddw, then vpmaddwd against the mins). */
AI int32_t k45_mins(const uint8_t mn[8], const struct q8k_block *x)
{
	const __m128i b0 = _mm_loadu_si128((const __m128i *)x->bsums);
	const __m128i b1 = _mm_loadu_si128((const __m128i *)(x->bsums + 8));
	const __m128i pairs = _mm_hadd_epi16(b0, b1);
	const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
	__m128i s = _mm_madd_epi16(pairs, m);
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

/* One Q4_K or Q5_K block (qh NULL for Q4_K): sumi and summ as k45_sums computes them. Each 32
 * bytes of qs hold sub-blocks 2p (low nibbles) and 2p+1 (high nibbles); vpmaddubsw multiplies
 * the unsigned values with the signed activation (pairs summed in int16: at most 31·127·2), then
 * vpmaddwd applies the sub-block's scale in int32. */
AI void k45_block(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
		  const struct q8k_block *x, int32_t *sumi, int32_t *summ)
{
	uint8_t sc[8], mn[8];
	k45_unpack(scales, sc, mn);
	const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
	const __m256i hv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
	__m256i acc = _mm256_setzero_si256();
	for (int p = 0; p < 4; p++) {
		const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
		__m256i lo = _mm256_and_si256(q, m4);
		__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
		if (qh) { /* bit j of qh[l]: the fifth bit of value l of sub-block j */
			const __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * p), one);
			const __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * p + 1), one);
			lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
			hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
		}
		const __m256i xl = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * p));
		const __m256i xh = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * p + 32));
		const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl),
						     _mm256_set1_epi16(sc[2 * p]));
		const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh),
						     _mm256_set1_epi16(sc[2 * p + 1]));
		acc = _mm256_add_epi32(acc, _mm256_add_epi32(pl, ph));
	}
	*sumi = hsum_i32(acc);
	*summ = k45_mins(mn, x);
}

/* One Q6_K block: Σ_j sc_j (Σ q_i x_i - 32 bsums_j), the -32 applied through the sums. Each half
 * of 128 values: 64 bytes of ql (low nibbles, then high) and 32 of qh (two bits per value). */
AI int32_t q6k_block(const struct blk_q6_k *b, const struct q8k_block *x)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
	__m256i acc = _mm256_setzero_si256();
	for (int h = 0; h < 2; h++) {
		const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
		const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
		const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
		__m256i q[4];
		q[0] = _mm256_and_si256(l0, m4);
		q[1] = _mm256_and_si256(l1, m4);
		q[2] = _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4);
		q[3] = _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4);
		for (int k = 0; k < 4; k++) {
			const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
			const __m256i v = _mm256_or_si256(q[k], _mm256_slli_epi16(hb, 4));
			const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->qs + 128 * h +
										  32 * k));
			const int8_t *s = b->scales + 8 * h + 2 * k;
			const __m256i scv = _mm256_setr_m128i(_mm_set1_epi16(s[0]),
							      _mm_set1_epi16(s[1]));
			acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(v, xv),
								      scv));
		}
	}
	int32_t bias = 0;
	for (int j = 0; j < 16; j++)
		bias += b->scales[j] * x->bsums[j];
	return hsum_i32(acc) - 32 * bias;
}

QDOT8_TARGET void cpu_qdot8_rows(float *y, const struct q8k_block *x, const void *w,
				 enum fkv_quant q, int64_t cols, int64_t r0, int64_t r1)
{
	const size_t rb = quant_row_bytes(q, cols);
	const int64_t nb = cols / QK_K;
	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *row = (const uint8_t *)w + (size_t)r * rb;
		float acc = 0;
		int32_t sumi, summ;
		switch (q) {
		case FKV_Q4_K:
			for (int64_t i = 0; i < nb; i++) {
				const struct blk_q4_k *b = (const struct blk_q4_k *)row + i;
				k45_block(b->scales, b->qs, NULL, &x[i], &sumi, &summ);
				acc = k_acc_f16c(acc, x[i].d, b->d, b->dmin, sumi, summ);
			}
			break;
		case FKV_Q5_K:
			for (int64_t i = 0; i < nb; i++) {
				const struct blk_q5_k *b = (const struct blk_q5_k *)row + i;
				k45_block(b->scales, b->qs, b->qh, &x[i], &sumi, &summ);
				acc = k_acc_f16c(acc, x[i].d, b->d, b->dmin, sumi, summ);
			}
			break;
		default: /* FKV_Q6_K */
			for (int64_t i = 0; i < nb; i++) {
				const struct blk_q6_k *b = (const struct blk_q6_k *)row + i;
				acc = k_acc_f16c(acc, x[i].d, b->d, 0, q6k_block(b, &x[i]), 0);
			}
			break;
		}
		y[r] = acc;
	}
}

#else /* not x86-64 with GCC: the integer path does not run */

bool cpu_qdot8_usable(enum fkv_quant q)
{
	(void)q;
	(void)k_format;
	return false;
}

void cpu_qdot8_rows(float *y, const struct q8k_block *x, const void *w, enum fkv_quant q,
		    int64_t cols, int64_t r0, int64_t r1)
{
	(void)y, (void)x, (void)w, (void)q, (void)cols, (void)r0, (void)r1;
}

#endif
