/* quant — ggml's block-quantized weight formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K): their block geometry and the reference dequantization.
 *
 * A quantized row of n weights is n / block_elems consecutive blocks of block_bytes each; a
 * block never straddles rows. The layouts are documented byte by byte in docs/quant.md; the
 * functions here follow that text literally (scalar code, one value at a time) and are the
 * reference every faster path is tested against (the CPU backend's dot products and tiles,
 * the CUDA kernels). Dequantized values are exactly what ggml computes in f32: every format's
 * value is one product or one multiply-add of exactly representable terms, so the f32 result is
 * the float64 result rounded once (docs/quant.md, "Exactness").
 *
 * Enum values are ggml's type ids, so a GGUF tensor's type maps by value; FKV_QNONE (0, ggml's
 * F32) means "not quantized: the tensor's fkv_dtype says what it holds". Pure functions: nothing
 * is allocated or owned; pointers are borrowed for the call. The host is little-endian. */
#ifndef FREEKV_QUANT_H
#define FREEKV_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum fkv_quant {
	FKV_QNONE = 0,
	FKV_Q4_0 = 2,
	FKV_Q4_1 = 3,
	FKV_Q5_0 = 6,
	FKV_Q5_1 = 7,
	FKV_Q8_0 = 8,
	FKV_Q4_K = 12,
	FKV_Q5_K = 13,
	FKV_Q6_K = 14,
};

/* Elements per super-block of the K formats. */
#define QK_K 256
/* Elements per block of the legacy formats. */
#define QK_LEGACY 32

/* The block structs, packed as ggml writes them (docs/quant.md). d, m, dmin are IEEE f16 bits. */
struct blk_q8_0 { uint16_t d; int8_t qs[32]; };
struct blk_q4_0 { uint16_t d; uint8_t qs[16]; };
struct blk_q4_1 { uint16_t d, m; uint8_t qs[16]; };
struct blk_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct blk_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct blk_q4_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct blk_q5_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct blk_q6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };

/* True for the formats above (not FKV_QNONE). */
bool quant_known(enum fkv_quant q);
/* The format with ggml type id `ggml_type`: 0 and *out, or -EPROTO when freekv has no kernels
 * for that type (F32/F16/BF16 are not quant formats either). */
int quant_from_ggml(uint32_t ggml_type, enum fkv_quant *out);
/* "Q8_0", ...; "none" for FKV_QNONE, "?" for others. */
const char *quant_name(enum fkv_quant q);
/* Elements and bytes of one block; 0 for an unknown format. */
int quant_block_elems(enum fkv_quant q);
size_t quant_block_bytes(enum fkv_quant q);
/* Bytes of a row of cols elements; 0 when cols is not a whole number of blocks. */
size_t quant_row_bytes(enum fkv_quant q, int64_t cols);

/* Reference dequantization of n elements (a whole number of blocks) at src into dst. */
void quant_dequant(enum fkv_quant q, float *dst, const void *src, int64_t n);

/* The K formats' packed 6-bit scale and min of sub-block j (0..7) from scales[12]
 * (docs/quant.md, Q4_K). Inline: the kernels call it once per 32 values. */
static inline void quant_k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
		*m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
	}
}

#endif
