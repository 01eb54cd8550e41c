/* cpu_qdot8 — see cpu_qdot8.h; the block layouts in docs/quant.md. */
#include "cpu_qdot8.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_switch.h"
#include "dtype.h"

static int g_enabled = -1; /* cpu_switch.h */

void cpu_qdot8_enable(bool on)
{
	g_enabled = on;
}

__attribute__((unused)) static bool enabled(void)
{
	return cpu_switch_on(&g_enabled, "FREEKV_CPU_QDOT8");
}

static bool k_format(enum fkv_quant q)
{
	return q == FKV_Q4_K || q == FKV_Q5_K || q == FKV_Q6_K;
}

/* n values of x as qs · d: d = max|x| / 127, qs rounded to nearest; all zero for zeros. A NaN
 * makes d NaN, so that it reaches the result as it would through the f32 path. */
static float quantize_run(int8_t *qs, const float *x, int n)
{
	float amax = 0;
	bool nan = false;
	for (int i = 0; i < n; i++) {
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
		nan |= x[i] != x[i];
	}
	const float id = amax > 0 && amax <= FLT_MAX ? 127.0f / amax : 0.0f;
	for (int i = 0; i < n; i++) {
		long v = nan ? 0 : lrintf(x[i] * id);
		qs[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
	}
	return nan ? NAN : amax / 127.0f;
}

static void q8k_quantize(struct q8k_block *dst, const float *x, int64_t cols)
{
	for (int64_t b = 0; b < cols / QK_K; b++, x += QK_K) {
		struct q8k_block *o = &dst[b];
		o->d = quantize_run(o->qs, x, QK_K);
		for (int j = 0; j < 16; j++) {
			int s = 0;
			for (int i = 0; i < 16; i++)
				s += o->qs[16 * j + i];
			o->bsums[j] = (int16_t)s;
		}
	}
}

static void q8_32_quantize(struct q8_32_block *dst, const float *x, int64_t cols)
{
	for (int64_t b = 0; b < cols / QK_LEGACY; b++, x += QK_LEGACY) {
		struct q8_32_block *o = &dst[b];
		o->d = quantize_run(o->qs, x, QK_LEGACY);
		o->sum = 0;
		for (int i = 0; i < QK_LEGACY; i++)
			o->sum += o->qs[i];
	}
}

size_t cpu_qdot8_act_bytes(enum fkv_quant q, int64_t cols)
{
	return k_format(q) ? (size_t)(cols / QK_K) * sizeof(struct q8k_block)
			   : (size_t)(cols / QK_LEGACY) * sizeof(struct q8_32_block);
}

void cpu_qdot8_quantize(void *act, const float *x, int64_t cols, enum fkv_quant q)
{
	if (k_format(q))
		q8k_quantize(act, x, cols);
	else
		q8_32_quantize(act, x, cols);
}

/* ---- legacy formats: a block as 32 bytes v with w_i = d·v_i (+ m) ---- */

/* Whether v is signed (w = d·v) or unsigned with a min (w = d·v + m). */
static bool legacy_has_min(enum fkv_quant q)
{
	return q == FKV_Q4_1 || q == FKV_Q5_1;
}

/* The scalar decoder: v[0..32), d and m (0 when none) of block blk. */
static void legacy_values(enum fkv_quant q, const uint8_t *blk, int v[32], uint16_t *d,
			  uint16_t *m)
{
	const uint8_t *qs;
	uint32_t qh = 0;
	*m = 0;
	memcpy(d, blk, 2);
	switch (q) {
	case FKV_Q8_0:
		for (int i = 0; i < 32; i++)
			v[i] = ((const struct blk_q8_0 *)blk)->qs[i];
		return;
	case FKV_Q4_0: qs = ((const struct blk_q4_0 *)blk)->qs; break;
	case FKV_Q4_1: qs = ((const struct blk_q4_1 *)blk)->qs; memcpy(m, blk + 2, 2); break;
	case FKV_Q5_0:
		qs = ((const struct blk_q5_0 *)blk)->qs;
		memcpy(&qh, ((const struct blk_q5_0 *)blk)->qh, 4);
		break;
	default: /* FKV_Q5_1 */
		qs = ((const struct blk_q5_1 *)blk)->qs;
		memcpy(&qh, ((const struct blk_q5_1 *)blk)->qh, 4);
		memcpy(m, blk + 2, 2);
		break;
	}
	const int off = q == FKV_Q4_0 ? 8 : q == FKV_Q5_0 ? 16 : 0;
	for (int i = 0; i < 32; i++)
		v[i] = ((i < 16 ? qs[i] & 15 : qs[i - 16] >> 4) | (int)((qh >> i) & 1) << 4) - off;
}

/* Eight f32 lanes summed as the AVX2 kernel sums them. */
static float hsum8_ref(const float a[8])
{
	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static float legacy_row_ref(const uint8_t *row, const struct q8_32_block *x, enum fkv_quant q,
			    int64_t nb)
{
	const size_t bb = quant_block_bytes(q);
	float acc[8] = { 0 }, accm = 0;
	for (int64_t i = 0; i < nb; i++, row += bb) {
		int v[32];
		uint16_t d, m;
		legacy_values(q, row, v, &d, &m);
		const float dd = x[i].d * f16_to_f32(d);
		for (int l = 0; l < 8; l++) {
			int32_t s = 0;
			for (int k = 4 * l; k < 4 * l + 4; k++)
				s += v[k] * x[i].qs[k];
			acc[l] = fmaf((float)s, dd, acc[l]);
		}
		if (legacy_has_min(q))
			accm = fmaf(x[i].d * f16_to_f32(m), (float)x[i].sum, accm);
	}
	return hsum8_ref(acc) + accm;
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

/* Q4_K/Q5_K, in the kernel's lanes: li[l] = Σ_j sc_j Σ_{b=4l..4l+3} q_(32j+b) x_(32j+b) (eight
 * int32 lanes, four values of each sub-block of 32), and lm[l] = m_2l P_2l + m_(2l+1) P_(2l+1)
 * with P_j = bsums[2j] + bsums[2j+1] (four lanes): their totals are Σ_j sc_j Σ_{i∈j} q_i x_i and
 * Σ_j m_j Σ_{i∈j} x_i. */
static void k45_lanes(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
		      const struct q8k_block *x, int32_t li[8], int32_t lm[4])
{
	uint8_t sc[8], mn[8];
	for (int j = 0; j < 8; j++)
		quant_k_scale_min(scales, j, &sc[j], &mn[j]);
	for (int l = 0; l < 8; l++) {
		li[l] = 0;
		for (int j = 0; j < 8; j++)
			for (int b = 4 * l; b < 4 * l + 4; b++)
				li[l] += sc[j] * k45_value(qs, qh, 32 * j + b) * x->qs[32 * j + b];
	}
	for (int l = 0; l < 4; l++) {
		const int32_t p0 = x->bsums[4 * l] + x->bsums[4 * l + 1];
		const int32_t p1 = x->bsums[4 * l + 2] + x->bsums[4 * l + 3];
		lm[l] = mn[2 * l] * p0 + mn[2 * l + 1] * p1;
	}
}

/* Q6_K, in the kernel's lanes: li[l] = Σ_i sc_(i/16) q_i x_i over the values i with i % 32 in
 * 4l .. 4l + 3, less 32 (sc_2l bsums_2l + sc_(2l+1) bsums_(2l+1)): Σ_j sc_j Σ_{i∈j} (q_i - 32) x_i
 * in all, over the sixteen sub-blocks of 16. */
static void q6k_lanes(const struct blk_q6_k *b, const struct q8k_block *x, int32_t li[8])
{
	for (int l = 0; l < 8; l++) {
		int32_t s = 0;
		for (int i = 0; i < QK_K; i++) {
			if (i % 32 / 4 != l)
				continue;
			const int h = i / 128, k = i % 128 / 32, c = i % 32;
			const uint8_t lo = b->ql[64 * h + 32 * (k % 2) + c];
			const int q = (k < 2 ? lo & 15 : lo >> 4) | ((b->qh[32 * h + c] >> (2 * k)) & 3) << 4;
			s += b->scales[i / 16] * q * x->qs[i];
		}
		const int32_t bias = b->scales[2 * l] * x->bsums[2 * l] +
				     b->scales[2 * l + 1] * x->bsums[2 * l + 1];
		li[l] = s - 32 * bias;
	}
}

/* Four f32 lanes summed as the kernel sums them. */
static float hsum4_ref(const float a[4])
{
	return (a[0] + a[2]) + (a[1] + a[3]);
}

void cpu_qdot8_rows_ref(float *y, const void *act, const void *w, enum fkv_quant q, int64_t cols,
			int64_t r0, int64_t r1)
{
	const size_t rb = quant_row_bytes(q, cols);
	if (!k_format(q)) {
		for (int64_t r = r0; r < r1; r++)
			y[r] = legacy_row_ref((const uint8_t *)w + (size_t)r * rb, act, q,
					      cols / QK_LEGACY);
		return;
	}
	const struct q8k_block *x = act;
	const int64_t nb = cols / QK_K;
	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *row = (const uint8_t *)w + (size_t)r * rb;
		/* per block: acc[l] += li[l]·(dx·d), accm[l] += lm[l]·(dx·dmin), one rounding each */
		float acc[8] = { 0 }, accm[4] = { 0 };
		for (int64_t i = 0; i < nb; i++) {
			int32_t li[8], lm[4] = { 0 };
			uint16_t d, dmin = 0;
			if (q == FKV_Q6_K) {
				const struct blk_q6_k *b = (const struct blk_q6_k *)row + i;
				q6k_lanes(b, &x[i], li);
				d = b->d;
			} else if (q == FKV_Q4_K) {
				const struct blk_q4_k *b = (const struct blk_q4_k *)row + i;
				k45_lanes(b->scales, b->qs, NULL, &x[i], li, lm);
				d = b->d;
				dmin = b->dmin;
			} else {
				const struct blk_q5_k *b = (const struct blk_q5_k *)row + i;
				k45_lanes(b->scales, b->qs, b->qh, &x[i], li, lm);
				d = b->d;
				dmin = b->dmin;
			}
			const float dd = x[i].d * f16_to_f32(d), dm = x[i].d * f16_to_f32(dmin);
			for (int l = 0; l < 8; l++)
				acc[l] = fmaf((float)li[l], dd, acc[l]);
			for (int l = 0; l < 4 && q != FKV_Q6_K; l++)
				accm[l] = fmaf((float)lm[l], dm, accm[l]);
		}
		y[r] = q == FKV_Q6_K ? hsum8_ref(acc) : hsum8_ref(acc) - hsum4_ref(accm);
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
	return usable && quant_known(q) && enabled();
}

/* A K block's f32 step on the lanes (cpu_qdot8_rows_ref's): acc += cvt(li)·(dx·d) and accm +=
 * cvt(lm)·(dx·dmin), one FMA each; F16C converts the scales exactly. */
AI __m256 k_acc_lanes(__m256 acc, __m128 *accm, float dx, uint16_t d, uint16_t dmin, __m256i li,
		      __m128i lm)
{
	*accm = _mm_fmadd_ps(_mm_cvtepi32_ps(lm), _mm_set1_ps(dx * _cvtsh_ss(dmin)), *accm);
	return _mm256_fmadd_ps(_mm256_cvtepi32_ps(li), _mm256_set1_ps(dx * _cvtsh_ss(d)), acc);
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

/* The mins' part of a Q4_K/Q5_K block in four int32 lanes, lane l = m_2l P_2l + m_(2l+1) P_(2l+1)
 * with P_j = bsums[2j] + bsums[2j+1] (pairs of bsums added with vphaddw, then vpmaddwd against
 * the mins). */
AI __m128i k45_mins(const uint8_t mn[8], const struct q8k_block *x)
{
	const __m128i b0 = _mm_loadu_si128((const __m128i *)x->bsums);
	const __m128i b1 = _mm_loadu_si128((const __m128i *)(x->bsums + 8));
	const __m128i pairs = _mm_hadd_epi16(b0, b1);
	const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
	return _mm_madd_epi16(pairs, m);
}

/* vpshufb masks that fill the low 128 bits with int16 lane a of a broadcast 128-bit source and
 * the high 128 bits with lane b: per-sub-block scales as vpmaddwd operands. Rows 0..7: a = b = j
 * (Q4_K/Q5_K, one sub-block of 32 per register); rows 8..11: a = 2k, b = 2k + 1 (Q6_K, two
 * sub-blocks of 16). */
#define PM_HALF(a) 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a),   \
		   2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, \
		   2 * (a), 2 * (a) + 1
#define PM(a, b) { PM_HALF(a), PM_HALF(b) }
static const uint8_t pair_masks[12][32] __attribute__((aligned(32))) = {
	PM(0, 0), PM(1, 1), PM(2, 2), PM(3, 3), PM(4, 4), PM(5, 5), PM(6, 6), PM(7, 7),
	PM(0, 1), PM(2, 3), PM(4, 5), PM(6, 7),
};

AI __m256i pair_mask(int row)
{
	return _mm256_load_si256((const __m256i *)pair_masks[row]);
}

/* One Q4_K or Q5_K block (qh NULL for Q4_K): the lanes li and lm of k45_lanes. Each 32
 * bytes of qs hold sub-blocks 2p (low nibbles) and 2p+1 (high nibbles); vpmaddubsw multiplies
 * the unsigned values with the signed activation (pairs summed in int16: at most 31·127·2), then
 * vpmaddwd applies the sub-block's scale in int32. */
AI void k45_block(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
		  const struct q8k_block *x, __m256i *li, __m128i *lm)
{
	uint8_t sc[8], mn[8];
	k45_unpack(scales, sc, mn);
	const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
	const __m256i hv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
	/* the eight scales as int16, in both halves; one vpshufb gives a sub-block's */
	const __m256i sc16 = _mm256_broadcastsi128_si256(
		_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
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
						     _mm256_shuffle_epi8(sc16, pair_mask(2 * p)));
		const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh),
						     _mm256_shuffle_epi8(sc16, pair_mask(2 * p + 1)));
		acc = _mm256_add_epi32(acc, _mm256_add_epi32(pl, ph));
	}
	*li = acc;
	*lm = k45_mins(mn, x);
}

/* One Q6_K block: the lanes of q6k_lanes, Σ_j sc_j (Σ q_i x_i - 32 bsums_j) in all, the -32
 * applied through the sums. Each half
 * of 128 values: 64 bytes of ql (low nibbles, then high) and 32 of qh (two bits per value). */
AI __m256i q6k_block(const struct blk_q6_k *b, const struct q8k_block *x)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
	__m256i acc = _mm256_setzero_si256();
	for (int h = 0; h < 2; h++) {
		/* this half's eight scales as int16, in both halves of a register */
		const __m256i sc16 = _mm256_broadcastsi128_si256(
			_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(b->scales + 8 * h))));
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
			const __m256i scv = _mm256_shuffle_epi8(sc16, pair_mask(8 + k));
			acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(v, xv),
								      scv));
		}
	}
	/* Σ_j sc_j bsums_j, in int32 lanes: vpmaddwd of the scales (int16) and the sums */
	const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
	const __m256i bias = _mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i *)x->bsums));
	return _mm256_sub_epi32(acc, _mm256_slli_epi32(bias, 5));
}

/* A legacy block's 32 values as bytes (legacy_values), in order: the low nibbles of qs are
 * values 0..15, the high ones 16..31; the fifth bits of Q5_0/Q5_1 spread from the 32-bit qh
 * (byte i of a broadcast selected by vpshufb, bit i % 8 tested). */
AI __m256i legacy_bytes(enum fkv_quant q, const uint8_t *blk)
{
	if (q == FKV_Q8_0)
		return _mm256_loadu_si256((const __m256i *)((const struct blk_q8_0 *)blk)->qs);
	const size_t qs_off = q == FKV_Q4_0 ? 2 : q == FKV_Q4_1 ? 4 : q == FKV_Q5_0 ? 6 : 8;
	const __m128i m4 = _mm_set1_epi8(0x0f);
	const __m128i b = _mm_loadu_si128((const __m128i *)(blk + qs_off));
	__m256i v = _mm256_setr_m128i(_mm_and_si128(b, m4),
				      _mm_and_si128(_mm_srli_epi16(b, 4), m4));
	if (q == FKV_Q5_0 || q == FKV_Q5_1) {
		uint32_t qh;
		memcpy(&qh, blk + (q == FKV_Q5_0 ? 2 : 4), 4);
		const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
						     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
		const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
		__m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel);
		h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
		v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(16)));
	}
	if (q == FKV_Q4_0)
		v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
	else if (q == FKV_Q5_0)
		v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
	return v;
}

/* Eight int32 lanes, lane l = Σ v_i x_i over i = 4l .. 4l + 3: vpmaddubsw takes unsigned
 * bytes first, so signed values go in as |v| with x given v's sign (vpsignb). */
AI __m256i legacy_lanes(__m256i v, __m256i x, bool has_min)
{
	const __m256i p = has_min ? _mm256_maddubs_epi16(v, x)
				  : _mm256_maddubs_epi16(_mm256_sign_epi8(v, v),
							 _mm256_sign_epi8(x, v));
	return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

AI float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
	return _mm_cvtss_f32(s);
}

AI float hsum4(__m128 v)
{
	v = _mm_add_ps(v, _mm_movehl_ps(v, v));
	return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

AI float legacy_row(const uint8_t *row, const struct q8_32_block *x, enum fkv_quant q,
		    int64_t nb, size_t bb, bool has_min)
{
	__m256 acc = _mm256_setzero_ps();
	float accm = 0;
	for (int64_t i = 0; i < nb; i++, row += bb) {
		uint16_t d;
		memcpy(&d, row, 2);
		const __m256i xv = _mm256_loadu_si256((const __m256i *)x[i].qs);
		const __m256 s = _mm256_cvtepi32_ps(legacy_lanes(legacy_bytes(q, row), xv, has_min));
		acc = _mm256_fmadd_ps(s, _mm256_set1_ps(x[i].d * _cvtsh_ss(d)), acc);
		if (has_min) {
			uint16_t m;
			memcpy(&m, row + 2, 2);
			accm = fmaf(x[i].d * _cvtsh_ss(m), (float)x[i].sum, accm);
		}
	}
	return hsum8(acc) + accm;
}

/* Block i of a K-format row (q folds away) into the row's f32 lanes acc (and, Q4_K and Q5_K,
 * its mins' lanes accm): the one-row loop's step. */
AI void k_block_acc(enum fkv_quant q, const uint8_t *row, int64_t i, const struct q8k_block *x,
		    __m256 *acc, __m128 *accm)
{
	__m256i li;
	__m128i lm;
	if (q == FKV_Q6_K) {
		const struct blk_q6_k *b = (const struct blk_q6_k *)row + i;
		*acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q6k_block(b, &x[i])),
				       _mm256_set1_ps(x[i].d * _cvtsh_ss(b->d)), *acc);
	} else if (q == FKV_Q5_K) {
		const struct blk_q5_k *b = (const struct blk_q5_k *)row + i;
		k45_block(b->scales, b->qs, b->qh, &x[i], &li, &lm);
		*acc = k_acc_lanes(*acc, accm, x[i].d, b->d, b->dmin, li, lm);
	} else {
		const struct blk_q4_k *b = (const struct blk_q4_k *)row + i;
		k45_block(b->scales, b->qs, NULL, &x[i], &li, &lm);
		*acc = k_acc_lanes(*acc, accm, x[i].d, b->d, b->dmin, li, lm);
	}
}

/* K-format rows r0 .. r1 (rb bytes each): four at a time, block by block, each row with its
 * own lanes (the one-row loop's sum, bit for bit), the rows QDOT8_AHEAD ahead prefetched into
 * L2 at the same block (as cpu_q4k.c's decode; the Q6_K tensors of the 8B-geometry Q4_K_M file
 * took 4-7 % off its decode step), the rest one at a time. */
#define QDOT8_AHEAD 8

AI void k_rows(float *y, const struct q8k_block *x, const uint8_t *w, size_t rb, int64_t nb,
	       enum fkv_quant q, int64_t r0, int64_t r1)
{
	const size_t bb = quant_block_bytes(q);
	int64_t r = r0;
	for (; r + 4 <= r1; r += 4) {
		const uint8_t *row = w + (size_t)r * rb;
		__m256 acc[4];
		__m128 accm[4];
		for (int k = 0; k < 4; k++) {
			acc[k] = _mm256_setzero_ps();
			accm[k] = _mm_setzero_ps();
		}
		for (int64_t i = 0; i < nb; i++) {
			const char *p = (const char *)row + QDOT8_AHEAD * rb + (size_t)i * bb;
			for (int k = 0; k < 4; k++)
				for (size_t o = 0; o < bb; o += 64)
					_mm_prefetch(p + k * rb + o, _MM_HINT_T1);
			#pragma GCC unroll 4
			for (int k = 0; k < 4; k++)
				k_block_acc(q, row + k * rb, i, x, &acc[k], &accm[k]);
		}
		for (int k = 0; k < 4; k++)
			y[r + k] = q == FKV_Q6_K ? hsum8(acc[k]) : hsum8(acc[k]) - hsum4(accm[k]);
	}
	for (; r < r1; r++) {
		const uint8_t *row = w + (size_t)r * rb;
		__m256 acc = _mm256_setzero_ps();
		__m128 accm = _mm_setzero_ps();
		for (int64_t i = 0; i < nb; i++)
			k_block_acc(q, row, i, x, &acc, &accm);
		y[r] = q == FKV_Q6_K ? hsum8(acc) : hsum8(acc) - hsum4(accm);
	}
}

/* One instance per format, so that legacy_bytes' branches fold away. */
#define LEGACY_ROWS(Q)                                                                          \
	for (int64_t r = r0; r < r1; r++)                                                        \
		y[r] = legacy_row((const uint8_t *)w + (size_t)r * rb, act, Q, cols / QK_LEGACY, \
				  quant_block_bytes(Q), legacy_has_min(Q));

QDOT8_TARGET void cpu_qdot8_rows(float *y, const void *act, const void *w, enum fkv_quant q,
				 int64_t cols, int64_t r0, int64_t r1)
{
	const size_t rb = quant_row_bytes(q, cols);
	switch (q) {
	case FKV_Q8_0: LEGACY_ROWS(FKV_Q8_0) return;
	case FKV_Q4_0: LEGACY_ROWS(FKV_Q4_0) return;
	case FKV_Q4_1: LEGACY_ROWS(FKV_Q4_1) return;
	case FKV_Q5_0: LEGACY_ROWS(FKV_Q5_0) return;
	case FKV_Q5_1: LEGACY_ROWS(FKV_Q5_1) return;
	default: break;
	}
	const struct q8k_block *x = act;
	const int64_t nb = cols / QK_K;
	switch (q) {
	case FKV_Q4_K: k_rows(y, x, (const uint8_t *)w, rb, nb, FKV_Q4_K, r0, r1); return;
	case FKV_Q5_K: k_rows(y, x, (const uint8_t *)w, rb, nb, FKV_Q5_K, r0, r1); return;
	default: k_rows(y, x, (const uint8_t *)w, rb, nb, FKV_Q6_K, r0, r1); return;
	}
}

#else /* not x86-64 with GCC: the integer path does not run */

bool cpu_qdot8_usable(enum fkv_quant q)
{
	(void)q;
	return false;
}

void cpu_qdot8_rows(float *y, const void *act, const void *w, enum fkv_quant q, int64_t cols,
		    int64_t r0, int64_t r1)
{
	(void)y, (void)act, (void)w, (void)q, (void)cols, (void)r0, (void)r1;
}

#endif
