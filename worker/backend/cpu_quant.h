/* cpu_quant — the CPU backend's kernels on ggml block-quantized weights (docs/quant.md): row dot
 * products for decode and dequantized tiles for prefill.
 *
 * Both decode blocks in vector registers the same way (docs/quant.md, "CPU kernels"): a block
 * becomes its f32 values exactly as the reference quant_dequant() computes them, which the tile
 * path stores and the dot path multiplies with the f32 activation at once. The activation is
 * not quantized (ggml quantizes it to Q8 for integer dot products): the result is then the dot
 * product of the exact weights, so a quantized model differs from its dequantized F32 copy by
 * summation order only. Each function is compiled for AVX-512, AVX2+FMA and the baseline and the
 * loader picks the clone the CPU runs. Single-threaded: the caller splits rows over threads.
 * Nothing is allocated; every pointer is borrowed for the call. */
#ifndef FREEKV_CPU_QUANT_H
#define FREEKV_CPU_QUANT_H

#include <stdint.h>

#include "quant.h"

/* y[r] = Σ_c w[r][c] x[c] for rows r0 <= r < r1 of w (rows, cols) in format q; x (cols). */
void cpu_quant_dot_rows(float *y, const float *x, const void *w, enum fkv_quant q, int64_t cols,
			int64_t r0, int64_t r1);

/* dst (m, cols) = rows r0 .. r0 + m of w (rows, cols), dequantized; equal bit for bit to
 * quant_dequant() of the same rows. */
void cpu_quant_dequant_rows(float *dst, const void *w, enum fkv_quant q, int64_t cols, int64_t r0,
			    int64_t m);

#endif
