/* cpu_dot16 — the decode GEMV on 16-bit weights with AVX2, FMA and F16C (docs/quant.md
 * "16-bit weights"): each weight converted in one instruction (vcvtph2ps for f16, a widening
 * shift for bf16), four weight rows at a time with their accumulators in registers, one or two
 * activation rows in the same pass over the weights. The same operations in the same order as
 * the portable loop of backend_cpu.c (dot_rows_t) built for x86-64-v3: eight-lane FMA sums per
 * row, the same horizontal sum, the same scalar tail, so the bits agree with it. */
#ifndef FREEKV_CPU_DOT16_H
#define FREEKV_CPU_DOT16_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"

/* Whether this path runs: the CPU has AVX2, FMA and F16C (checked once), and it is not turned
 * off (FREEKV_CPU_DOT16=0 in the environment, read once, or cpu_dot16_enable(false)); off, the
 * portable loop of backend_cpu.c runs instead. */
bool cpu_dot16_usable(void);
/* Turns the path on or off for the whole process (tests and benchmarks compare the two). */
void cpu_dot16_enable(bool on);

/* Rows [r0, r1) of y[j] = w · x[j], j < nx (1 or 2), w (rows, cols) of 16-bit dtype t (f16 or
 * bf16). Call only when cpu_dot16_usable(). */
void cpu_dot16_rows(float *const *y, const float *const *x, int nx, const uint16_t *w,
		    int64_t cols, int64_t r0, int64_t r1, enum fkv_dtype t);

#endif
