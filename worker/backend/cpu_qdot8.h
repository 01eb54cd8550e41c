/* cpu_qdot8 — the decode GEMV on K-quant weights (Q4_K, Q5_K, Q6_K) with integer dot products
 * (docs/quant.md "Integer dot products"): the activation row is quantized once per matmul to 8
 * bits in blocks of 256 (ggml's Q8_K: one f32 scale, 256 int8 values and the sums of each 16),
 * and each weight block's 4-, 5- or 6-bit values multiply those int8 values with AVX2's
 * vpmaddubsw, the sub-block scales applied in int32 (vpmaddwd); one block's integer sum becomes
 * f32 once. Against cpu_quant_dot_rows (exact weights times the f32 activation) the result
 * carries the activation's rounding to 8 bits, as ggml's does; the weights are still exact.
 *
 * cpu_qdot8_rows_ref is the scalar reference: the same integer sums (exact, in any order) and the
 * same f32 operations (fmaf), so the AVX2 kernel's bits equal it. Nothing is allocated;
 * single-threaded (the caller splits rows over threads). */
#ifndef FREEKV_CPU_QDOT8_H
#define FREEKV_CPU_QDOT8_H

#include <stdbool.h>
#include <stdint.h>

#include "quant.h"

/* 256 activation values: x[i] ≈ d · qs[i], bsums[j] = Σ qs[16j .. 16j + 15]. */
struct q8k_block {
	float d;
	int16_t bsums[16];
	int8_t qs[256];
};

/* Whether the integer path runs for weights of format q: q is Q4_K, Q5_K or Q6_K, the CPU has
 * AVX2 (checked once), and it is not turned off (FREEKV_CPU_QDOT8=0 in the environment, read
 * once, or cpu_qdot8_enable(false)); off, cpu_quant_dot_rows runs instead. */
bool cpu_qdot8_usable(enum fkv_quant q);
/* Turns the path on or off for the whole process (tests and benchmarks compare the two). */
void cpu_qdot8_enable(bool on);

/* dst[0 .. cols/256) from x (cols, a multiple of 256): d = max|x| / 127, qs = x / d rounded to
 * nearest (ties to even), all zero for a zero block. */
void cpu_q8k_quantize(struct q8k_block *dst, const float *x, int64_t cols);

/* y[r] = Σ_c w[r][c] · x[c] for rows r0 <= r < r1 of w (rows, cols) in K-quant format q, x
 * quantized by cpu_q8k_quantize. Call only when cpu_qdot8_usable(q). */
void cpu_qdot8_rows(float *y, const struct q8k_block *x, const void *w, enum fkv_quant q,
		    int64_t cols, int64_t r0, int64_t r1);
/* The same, scalar: the reference the kernel is tested against (any CPU). */
void cpu_qdot8_rows_ref(float *y, const struct q8k_block *x, const void *w, enum fkv_quant q,
			int64_t cols, int64_t r0, int64_t r1);

#endif
