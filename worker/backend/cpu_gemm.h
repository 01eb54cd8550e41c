/* cpu_gemm — the prefill GEMM of the CPU backend on 16-bit and block-quantized weights, with
 * AVX-512 (docs/quant.md "Prefill GEMM"): y (n, rows) = x (n, cols) · wᵀ, x f32, w (rows, cols)
 * f16 or bf16 as stored, or in one of the eight quantized formats.
 *
 * Both operands are read along cols, where each is contiguous, so nothing is packed: a register
 * tile of 4 weight rows × 5 activation rows keeps 20 sixteen-lane f32 sums, and each weight
 * vector, converted once in registers (vcvtph2ps for f16, a widening shift for bf16), multiplies
 * the 5 activation rows. cols is cut into chunks (CPU_GEMM_KC for 16-bit weights, CPU_GEMM_KCQ for
 * quantized ones) so that the activation chunk stays in L2 while a task's weight rows stream
 * past it; each chunk's sums are reduced and added to y in chunk order. Quantized weights are dequantized (cpu_quant_dequant_rows, exact) one group of
 * 4 rows × one chunk at a time into an f32 tile in L1, which the same register tiles read.
 *
 * cpu_gemm_ref is the scalar reference: per output the same sixteen lanes (fmaf in column order,
 * a masked tail adding 0 · 0), the same reduction tree, the same chunk order, on the weights'
 * exact values, so the kernel's bits equal it. Results do not depend on n, the tile a row falls
 * in, or the thread count. Nothing is allocated; single-threaded over the rows given (the caller
 * splits rows over threads). */
#ifndef FREEKV_CPU_GEMM_H
#define FREEKV_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"
#include "quant.h"

/* Columns per chunk (see above) of 16-bit weights, and of quantized ones (a multiple of every
 * format's block; the dequantized tile of 4 rows then fits L1): measured best of 512, 1024,
 * 2048 and 4096 on 4096- and 14336-column f16 and Q4_K/Q8_0/Q6_K weights, 64 activation rows. */
#define CPU_GEMM_KC 2048
#define CPU_GEMM_KCQ 1024

/* Whether this path runs for weights of dtype t / format q: f16, bf16 or a quantized format
 * whose rows are whole chunks or end in a whole block (always, for the eight), the CPU has
 * AVX-512F/VL/BW (checked once), and it is not turned off (FREEKV_CPU_GEMM=0 in the environment,
 * read once, or cpu_gemm_enable(false)); off, backend_cpu.c's converted tiles + sgemm run. */
bool cpu_gemm_usable(enum fkv_dtype t, enum fkv_quant q);
/* Turns the path on or off for the whole process (tests and benchmarks compare the two). */
void cpu_gemm_enable(bool on);

/* Columns [r0, r1) of y (n, ldy) = x (n, cols) · wᵀ, w (rows, cols) of dtype t (f16 or bf16),
 * or in format q when q is not FKV_QNONE: y[j * ldy + r] for r in [r0, r1). Call only when
 * cpu_gemm_usable(t, q). */
void cpu_gemm_rows(float *y, int64_t ldy, const float *x, int64_t n, const void *w,
		   enum fkv_dtype t, enum fkv_quant q, int64_t cols, int64_t r0, int64_t r1);
/* The same sums with scalar operations (any CPU; allocates a row). Returns -ENOMEM or 0. */
int cpu_gemm_ref(float *y, int64_t ldy, const float *x, int64_t n, const void *w,
		 enum fkv_dtype t, enum fkv_quant q, int64_t cols, int64_t r0, int64_t r1);

#endif
