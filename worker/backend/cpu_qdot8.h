/* cpu_qdot8 — the decode GEMV on block-quantized weights with integer dot products
 * (docs/quant.md "Integer dot products"): the activation row is quantized once per matmul to 8
 * bits — in blocks of 256 for the K formats (ggml's Q8_K: one f32 scale, 256 int8 values, the
 * sums of each 16), in blocks of 32 for the legacy ones (one f32 scale, 32 int8 values and their
 * sum) — and each weight block's values multiply those int8 values with AVX2's vpmaddubsw. K
 * formats apply their sub-block scales in int32 (vpmaddwd) and make one block's integer sum f32
 * once; legacy blocks keep eight int32 lanes (four values each) that one FMA per block scales
 * into eight f32 lanes. Against cpu_quant_dot_rows (exact weights times the f32 activation)
 * the result carries the activation's rounding to 8 bits, as ggml's does; the weights are exact.
 *
 * cpu_qdot8_rows_ref is the scalar reference: the same integer sums (exact, in any order) and the
 * same f32 operations in the same order (fmaf), so the AVX2 kernel's bits equal it. Nothing is
 * allocated; single-threaded (the caller splits rows over threads). */
#ifndef FREEKV_CPU_QDOT8_H
#define FREEKV_CPU_QDOT8_H

#include <stdbool.h>
#include <stdint.h>

#include "quant.h"

/* 256 activation values: x[i] ≈ d · qs[i], bsums[j] = Σ qs[16j .. 16j + 15] (K formats). */
struct q8k_block {
	float d;
	int16_t bsums[16];
	int8_t qs[256];
};

/* 32 activation values: x[i] ≈ d · qs[i], sum = Σ qs (legacy formats). */
struct q8_32_block {
	float d;
	int32_t sum;
	int8_t qs[32];
};

/* Whether the integer path runs for weights of format q: any of the eight formats, the CPU has
 * AVX2 (checked once), and it is not turned off (FREEKV_CPU_QDOT8=0 in the environment, read
 * once, or cpu_qdot8_enable(false)); off, cpu_quant_dot_rows runs instead. */
bool cpu_qdot8_usable(enum fkv_quant q);
/* Turns the path on or off for the whole process (tests and benchmarks compare the two). */
void cpu_qdot8_enable(bool on);

/* Bytes of one quantized activation row of cols values for weights of format q. */
size_t cpu_qdot8_act_bytes(enum fkv_quant q, int64_t cols);
/* act (cpu_qdot8_act_bytes) from x (cols, whole blocks of q): per block d = max|x| / 127 and
 * qs = x / d rounded to nearest (ties to even); all zero for a zero block. */
void cpu_qdot8_quantize(void *act, const float *x, int64_t cols, enum fkv_quant q);

/* y[r] = Σ_c w[r][c] · x[c] for rows r0 <= r < r1 of w (rows, cols) in format q, x quantized
 * by cpu_qdot8_quantize for q. Call only when cpu_qdot8_usable(q). */
void cpu_qdot8_rows(float *y, const void *act, const void *w, enum fkv_quant q, int64_t cols,
		    int64_t r0, int64_t r1);
/* The same, scalar: the reference the kernel is tested against (any CPU). */
void cpu_qdot8_rows_ref(float *y, const void *act, const void *w, enum fkv_quant q, int64_t cols,
			int64_t r0, int64_t r1);

#endif
