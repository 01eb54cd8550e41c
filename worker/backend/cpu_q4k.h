/* cpu_q4k — Q4_K weights times 8-bit activations with AVX-512 (BW, VNNI), for decode and prefill
 * alike (docs/quant.md "Q4_K with AVX-512"): the activation rows are quantized once per matmul as
 * for cpu_qdot8 (blocks of 256, d = max|x| / 127), their bytes stored in the order the weight's
 * nibbles come out of a 64-byte load, and each weight block is unpacked once per tile of up to 6
 * activation rows: four 64-byte registers of 4-bit values (two sub-blocks of 32 each), four of
 * their int16 scales. Per activation row and block, vpmaddubsw multiplies the unsigned values with
 * the signed activation bytes (pairs in int16, at most 15·127·2) and vpdpwssd applies the
 * sub-block scales into sixteen int32 lanes; one FMA adds them to sixteen f32 lanes scaled by
 * d_x·d, and the mins (Σ_j m_j Σ_{i∈j} x_i, from the activation's sums per sub-block) go into four
 * more by d_x·dmin. A row's lanes are summed once at its end.
 *
 * cpu_q4k_rows_ref is the scalar reference: the same integer lanes (exact) and the same f32
 * operations in the same order (fmaf), so the kernel's bits equal it. A result depends on neither
 * the number of activation rows, the tile, nor the thread count. Nothing is allocated;
 * single-threaded over the rows given (the caller splits rows over threads). */
#ifndef FREEKV_CPU_Q4K_H
#define FREEKV_CPU_Q4K_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 256 activation values, bytes in register order: qs[64k + c] is value 32·j0(k) + c for c < 32
 * and 32·j1(k) + c - 32 after, (j0, j1) = (0, 2), (1, 3), (4, 6), (5, 7) for k = 0..3; x ≈ d · q;
 * psums[j] = Σ of the q of sub-block j (32 values). */
struct q8k_pair {
	float d;
	int16_t psums[8];
	int8_t qs[256];
};

/* Whether this path runs: the CPU has AVX-512F/BW/VL and VNNI (checked once), the integer path
 * is on (cpu_qdot8_usable(FKV_Q4_K): FREEKV_CPU_QDOT8=0 keeps exact f32 activations), and it is
 * not turned off (FREEKV_CPU_Q4K=0 in the environment, read once, or cpu_q4k_enable(false)). */
bool cpu_q4k_usable(void);
/* Turns the path on or off for the whole process (tests and benchmarks compare the two). */
void cpu_q4k_enable(bool on);

/* Bytes of one quantized activation row of cols values (whole blocks of 256). */
size_t cpu_q4k_act_bytes(int64_t cols);
/* act (cpu_q4k_act_bytes) from x (cols): the values and scale of cpu_qdot8_quantize for Q4_K,
 * in register order. */
void cpu_q4k_quantize(void *act, const float *x, int64_t cols);

/* y[j · ldy + r] = Σ_c w[r][c] · x_j[c] for rows r0 <= r < r1 of the Q4_K matrix w (rows, cols)
 * and the n activation rows in act (one cpu_q4k_act_bytes(cols) apart). Call only when
 * cpu_q4k_usable(). */
void cpu_q4k_rows(float *y, int64_t ldy, const void *act, int64_t n, const void *w, int64_t cols,
		  int64_t r0, int64_t r1);
/* The same, scalar: the reference the kernel is tested against (any CPU). */
void cpu_q4k_rows_ref(float *y, int64_t ldy, const void *act, int64_t n, const void *w,
		      int64_t cols, int64_t r0, int64_t r1);

#endif
