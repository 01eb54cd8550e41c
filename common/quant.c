/* quant — see quant.h; the layouts are docs/quant.md's. */
#include "quant.h"

#include <errno.h>

#include "dtype.h"

_Static_assert(sizeof(struct blk_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(struct blk_q4_0) == 18, "Q4_0 block");
_Static_assert(sizeof(struct blk_q4_1) == 20, "Q4_1 block");
_Static_assert(sizeof(struct blk_q5_0) == 22, "Q5_0 block");
_Static_assert(sizeof(struct blk_q5_1) == 24, "Q5_1 block");
_Static_assert(sizeof(struct blk_q4_k) == 144, "Q4_K block");
_Static_assert(sizeof(struct blk_q5_k) == 176, "Q5_K block");
_Static_assert(sizeof(struct blk_q6_k) == 210, "Q6_K block");

static const struct {
	enum fkv_quant q;
	const char *name;
	int elems;
	size_t bytes;
} formats[] = {
	{ FKV_Q4_0, "Q4_0", QK_LEGACY, sizeof(struct blk_q4_0) },
	{ FKV_Q4_1, "Q4_1", QK_LEGACY, sizeof(struct blk_q4_1) },
	{ FKV_Q5_0, "Q5_0", QK_LEGACY, sizeof(struct blk_q5_0) },
	{ FKV_Q5_1, "Q5_1", QK_LEGACY, sizeof(struct blk_q5_1) },
	{ FKV_Q8_0, "Q8_0", QK_LEGACY, sizeof(struct blk_q8_0) },
	{ FKV_Q4_K, "Q4_K", QK_K, sizeof(struct blk_q4_k) },
	{ FKV_Q5_K, "Q5_K", QK_K, sizeof(struct blk_q5_k) },
	{ FKV_Q6_K, "Q6_K", QK_K, sizeof(struct blk_q6_k) },
};
#define N_FORMATS (sizeof formats / sizeof formats[0])

static int find(enum fkv_quant q)
{
	for (size_t i = 0; i < N_FORMATS; i++)
		if (formats[i].q == q)
			return (int)i;
	return -1;
}

bool quant_known(enum fkv_quant q)
{
	return find(q) >= 0;
}

int quant_from_ggml(uint32_t ggml_type, enum fkv_quant *out)
{
	for (size_t i = 0; i < N_FORMATS; i++)
		if ((uint32_t)formats[i].q == ggml_type) {
			*out = formats[i].q;
			return 0;
		}
	return -EPROTO;
}

const char *quant_name(enum fkv_quant q)
{
	int i = find(q);
	return q == FKV_QNONE ? "none" : i < 0 ? "?" : formats[i].name;
}

int quant_block_elems(enum fkv_quant q)
{
	int i = find(q);
	return i < 0 ? 0 : formats[i].elems;
}

size_t quant_block_bytes(enum fkv_quant q)
{
	int i = find(q);
	return i < 0 ? 0 : formats[i].bytes;
}

size_t quant_row_bytes(enum fkv_quant q, int64_t cols)
{
	int i = find(q);
	if (i < 0 || cols <= 0 || cols % formats[i].elems)
		return 0;
	return (size_t)(cols / formats[i].elems) * formats[i].bytes;
}

/* Bit j (0..31) of the legacy 5-bit formats' qh word: the fifth bit of element j. */
static int qh_bit(const uint8_t qh[4], int j)
{
	return (qh[j / 8] >> (j % 8)) & 1;
}

static void deq_q8_0(float *y, const struct blk_q8_0 *b)
{
	const float d = f16_to_f32(b->d);
	for (int j = 0; j < 32; j++)
		y[j] = (float)b->qs[j] * d;
}

static void deq_q4_0(float *y, const struct blk_q4_0 *b)
{
	const float d = f16_to_f32(b->d);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)((b->qs[j] & 0x0f) - 8) * d;
		y[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
	}
}

static void deq_q4_1(float *y, const struct blk_q4_1 *b)
{
	const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)(b->qs[j] & 0x0f) * d + m;
		y[j + 16] = (float)(b->qs[j] >> 4) * d + m;
	}
}

static void deq_q5_0(float *y, const struct blk_q5_0 *b)
{
	const float d = f16_to_f32(b->d);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)(((b->qs[j] & 0x0f) | qh_bit(b->qh, j) << 4) - 16) * d;
		y[j + 16] = (float)(((b->qs[j] >> 4) | qh_bit(b->qh, j + 16) << 4) - 16) * d;
	}
}

static void deq_q5_1(float *y, const struct blk_q5_1 *b)
{
	const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)((b->qs[j] & 0x0f) | qh_bit(b->qh, j) << 4) * d + m;
		y[j + 16] = (float)((b->qs[j] >> 4) | qh_bit(b->qh, j + 16) << 4) * d + m;
	}
}

/* Sub-block j of 32: nibbles (low for even j, high for odd) of qs[32 * (j / 2) ..] */
static void deq_q4_k(float *y, const struct blk_q4_k *b)
{
	const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
	for (int j = 0; j < 8; j++) {
		uint8_t sc, m;
		quant_k_scale_min(b->scales, j, &sc, &m);
		const float d1 = d * sc, m1 = dmin * m;
		const uint8_t *q = b->qs + 32 * (j / 2);
		for (int l = 0; l < 32; l++)
			y[32 * j + l] = d1 * (float)(j % 2 ? q[l] >> 4 : q[l] & 0x0f) - m1;
	}
}

static void deq_q5_k(float *y, const struct blk_q5_k *b)
{
	const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
	for (int j = 0; j < 8; j++) {
		uint8_t sc, m;
		quant_k_scale_min(b->scales, j, &sc, &m);
		const float d1 = d * sc, m1 = dmin * m;
		const uint8_t *q = b->qs + 32 * (j / 2);
		for (int l = 0; l < 32; l++) {
			int v = (j % 2 ? q[l] >> 4 : q[l] & 0x0f) | ((b->qh[l] >> j) & 1) << 4;
			y[32 * j + l] = d1 * (float)v - m1;
		}
	}
}

/* Two halves of 128; in each, element 32 * k + l (k = 0..3) takes its low four bits from
 * ql[l + 32 * (k % 2)] (low nibble for k < 2, high for k >= 2) and its high two from bits
 * 2k, 2k+1 of qh[l]; its scale is scales[8 * half + 2 * k + l / 16]. */
static void deq_q6_k(float *y, const struct blk_q6_k *b)
{
	const float d = f16_to_f32(b->d);
	for (int h = 0; h < 2; h++) {
		const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
		const int8_t *sc = b->scales + 8 * h;
		for (int k = 0; k < 4; k++)
			for (int l = 0; l < 32; l++) {
				int lo = k < 2 ? ql[l + 32 * (k % 2)] & 0x0f : ql[l + 32 * (k % 2)] >> 4;
				int v = (lo | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
				y[128 * h + 32 * k + l] = d * (float)sc[2 * k + l / 16] * (float)v;
			}
	}
}

void quant_dequant(enum fkv_quant q, float *dst, const void *src, int64_t n)
{
	const int be = quant_block_elems(q);
	const size_t bb = quant_block_bytes(q);
	if (!be)
		return;
	const uint8_t *s = src;
	for (int64_t i = 0; i < n / be; i++, s += bb, dst += be) {
		switch (q) {
		case FKV_Q8_0: deq_q8_0(dst, (const void *)s); break;
		case FKV_Q4_0: deq_q4_0(dst, (const void *)s); break;
		case FKV_Q4_1: deq_q4_1(dst, (const void *)s); break;
		case FKV_Q5_0: deq_q5_0(dst, (const void *)s); break;
		case FKV_Q5_1: deq_q5_1(dst, (const void *)s); break;
		case FKV_Q4_K: deq_q4_k(dst, (const void *)s); break;
		case FKV_Q5_K: deq_q5_k(dst, (const void *)s); break;
		case FKV_Q6_K: deq_q6_k(dst, (const void *)s); break;
		case FKV_QNONE: return;
		}
	}
}
