/* cpu_gemm — see cpu_gemm.h. */
#include "cpu_gemm.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_switch.h"

static int g_enabled = -1; /* cpu_switch.h */

void cpu_gemm_enable(bool on)
{
	g_enabled = on;
}

__attribute__((unused)) static bool enabled(void)
{
	return cpu_switch_on(&g_enabled, "FREEKV_CPU_GEMM");
}

/* Sixteen lane sums to one: lanes i and i + 8, then neighbours, then the two halves of what is
 * left — ((h0 + h1) + (h2 + h3)) + ((h4 + h5) + (h6 + h7)) with h_i = v_i + v_(i+8); the order
 * the kernel's reduction of four tiles at once (reduce4) takes. */
static float tree16(const float *v)
{
	float h[8];
	for (int i = 0; i < 8; i++)
		h[i] = v[i] + v[i + 8];
	return ((h[0] + h[1]) + (h[2] + h[3])) + ((h[4] + h[5]) + (h[6] + h[7]));
}

int cpu_gemm_ref(float *y, int64_t ldy, const float *x, int64_t n, const void *w,
		 enum fkv_dtype t, enum fkv_quant q, int64_t cols, int64_t r0, int64_t r1)
{
	float *row = malloc((size_t)cols * sizeof *row);
	if (!row)
		return -ENOMEM;
	const size_t rb = q != FKV_QNONE ? quant_row_bytes(q, cols) : 0;
	const int64_t kc = q != FKV_QNONE ? CPU_GEMM_KCQ : CPU_GEMM_KC;
	for (int64_t r = r0; r < r1; r++) {
		if (q != FKV_QNONE)
			quant_dequant(q, row, (const char *)w + (size_t)r * rb, cols);
		else
			dtype_to_f32(row, (const uint16_t *)w + r * cols, t, (size_t)cols);
		for (int64_t j = 0; j < n; j++) {
			const float *xj = x + j * cols;
			float acc = 0;
			for (int64_t k0 = 0; k0 < cols; k0 += kc) {
				const int64_t k1 = k0 + kc < cols ? k0 + kc : cols;
				float lane[16] = { 0 };
				for (int64_t k = k0; k < k1; k++)
					lane[(k - k0) & 15] = fmaf(xj[k], row[k], lane[(k - k0) & 15]);
				/* the kernel's masked last step: 0 · 0 added to the lanes past
				 * the end (a -0 sum becomes +0) */
				for (int64_t i = (k1 - k0) & 15; i && i < 16; i++)
					lane[i] = fmaf(0.0f, 0.0f, lane[i]);
				const float s = tree16(lane);
				acc = k0 ? acc + s : s;
			}
			y[j * ldy + r] = acc;
		}
	}
	free(row);
	return 0;
}

/* What the register tiles read as weights: 16-bit rows as stored, or an f32 tile. */
enum wkind { W_F16, W_BF16, W_F32 };

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "cpu_quant.h"

#define GEMM_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,f16c,fma")))

bool cpu_gemm_usable(enum fkv_dtype t, enum fkv_quant q)
{
	static int usable = -1;
	if (usable < 0) {
		__builtin_cpu_init();
		usable = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
			 __builtin_cpu_supports("avx512bw");
	}
	const bool kind = q != FKV_QNONE ? CPU_GEMM_KCQ % quant_block_elems(q) == 0
					 : t == FKV_F16 || t == FKV_BF16;
	return kind && usable && enabled();
}

GEMM_TARGET __attribute__((always_inline)) static inline __m512
ld_w(const void *p, __mmask16 m, const enum wkind wk)
{
	if (wk == W_F32)
		return _mm512_maskz_loadu_ps(m, p);
	__m256i h = _mm256_maskz_loadu_epi16(m, p);
	return wk == W_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
			    : _mm512_cvtph_ps(h);
}

/* Four sixteen-lane sums (of rows r .. r + 3 for one activation row) to four floats, each in
 * tree16's order. */
GEMM_TARGET __attribute__((always_inline)) static inline __m128
reduce4(__m512 a, __m512 b, __m512 c, __m512 d)
{
#define HALVES(v) _mm256_add_ps(_mm512_castps512_ps256(v), \
		_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
	const __m256 ha = HALVES(a), hb = HALVES(b), hc = HALVES(c), hd = HALVES(d);
#undef HALVES
	/* hadd(p, q) = [p0+p1, p2+p3, q0+q1, q2+q3 | p4+p5, p6+p7, q4+q5, q6+q7] */
	const __m256 ab = _mm256_hadd_ps(ha, hb), cd = _mm256_hadd_ps(hc, hd);
	/* [a0123, b0123, c0123, d0123 | a4567, b4567, c4567, d4567] */
	const __m256 s = _mm256_hadd_ps(ab, cd);
	return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* Weight rows and activation rows of one register tile. */
#define GW 4
#define GT 5

/* Element k of weight row i of a tile. */
#define WAT(i, k) (wk == W_F32 ? (const void *)((const float *)wr[i] + (k)) \
			       : (const void *)((const uint16_t *)wr[i] + (k)))

/* One step of a register tile: sixteen columns from k (m masks a short last step). */
#define GEMM_STEP(k, m)                                                                      \
	do {                                                                                 \
		__m512 wv[GW];                                                               \
		_Pragma("GCC unroll 4") for (int i = 0; i < GW; i++)                         \
			wv[i] = ld_w(WAT(i, k), (m), wk);                                    \
		_Pragma("GCC unroll 5") for (int j = 0; j < NT; j++) {                       \
			const __m512 xv = _mm512_maskz_loadu_ps((m), xr[j] + (k));           \
			_Pragma("GCC unroll 4") for (int i = 0; i < GW; i++)                 \
				acc[i][j] = _mm512_fmadd_ps(xv, wv[i], acc[i][j]);           \
		}                                                                            \
	} while (0)

/* One register tile: GW weight rows (wr, each at the chunk's first column) by NT activation
 * rows (x at the chunk's first column, a row every cols) over len columns, the sums reduced and
 * stored (first chunk) or added to y for the valid weight rows (mask m). With prefetch, the same
 * 16-bit weight rows' next chunk is fetched, a cache line per row every other step. */
GEMM_TARGET __attribute__((always_inline)) static inline void
tile(float *y, int64_t ldy, const float *x, int64_t cols, const void *const *wr, int64_t len,
     bool first, const int NT, __mmask8 m, const enum wkind wk, const bool prefetch)
{
	const float *xr[GT];
	#pragma GCC unroll 5
	for (int j = 0; j < NT; j++)
		xr[j] = x + j * cols;
	__m512 acc[GW][GT];
	#pragma GCC unroll 4
	for (int i = 0; i < GW; i++)
		#pragma GCC unroll 5
		for (int j = 0; j < NT; j++)
			acc[i][j] = _mm512_setzero_ps();
	const __mmask16 all = 0xffff;
	int64_t k = 0;
	for (; k + 32 <= len; k += 32) {
		if (prefetch)
			#pragma GCC unroll 4
			for (int i = 0; i < GW; i++)
				_mm_prefetch((const char *)WAT(i, k + CPU_GEMM_KC), _MM_HINT_T1);
		GEMM_STEP(k, all);
		GEMM_STEP(k + 16, all);
	}
	if (k + 16 <= len) {
		GEMM_STEP(k, all);
		k += 16;
	}
	if (k < len) {
		const __mmask16 km = (__mmask16)((1u << (len - k)) - 1);
		GEMM_STEP(k, km);
	}
	#pragma GCC unroll 5
	for (int j = 0; j < NT; j++) {
		__m128 s = reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
		float *yj = y + j * ldy;
		if (!first)
			s = _mm_add_ps(_mm_maskz_loadu_ps(m, yj), s);
		_mm_mask_storeu_ps(yj, m, s);
	}
}

/* Every activation row against one group of weight rows over one chunk: full tiles of GT rows,
 * then the short one. */
GEMM_TARGET __attribute__((always_inline)) static inline void
group(float *y, int64_t ldy, const float *x, int64_t n, int64_t cols, const void *const *wr,
      int64_t len, bool first, __mmask8 m, const enum wkind wk, const bool prefetch)
{
	int64_t j = 0;
	for (; j + GT <= n; j += GT)
		tile(y + j * ldy, ldy, x + j * cols, cols, wr, len, first, GT, m, wk, prefetch && !j);
	float *yj = y + j * ldy;
	const float *xj = x + j * cols;
	const bool pf = prefetch && !j;
	switch (n - j) {
	case 4: tile(yj, ldy, xj, cols, wr, len, first, 4, m, wk, pf); break;
	case 3: tile(yj, ldy, xj, cols, wr, len, first, 3, m, wk, pf); break;
	case 2: tile(yj, ldy, xj, cols, wr, len, first, 2, m, wk, pf); break;
	case 1: tile(yj, ldy, xj, cols, wr, len, first, 1, m, wk, pf); break;
	default: break;
	}
}

/* 16-bit weights: chunk by chunk, each group of GW rows (rows past r1 repeat the last one)
 * against every activation row. */
GEMM_TARGET __attribute__((always_inline)) static inline void
rows16(float *y, int64_t ldy, const float *x, int64_t n, const uint16_t *w, int64_t cols,
       int64_t r0, int64_t r1, const enum wkind wk)
{
	for (int64_t k0 = 0; k0 < cols; k0 += CPU_GEMM_KC) {
		const int64_t len = k0 + CPU_GEMM_KC < cols ? CPU_GEMM_KC : cols - k0;
		const bool more = k0 + len < cols;
		for (int64_t r = r0; r < r1; r += GW) {
			const void *wr[GW];
			for (int i = 0; i < GW; i++)
				wr[i] = w + (r + i < r1 ? r + i : r1 - 1) * cols + k0;
			const int valid = r1 - r < GW ? (int)(r1 - r) : GW;
			group(y + r, ldy, x + k0, n, cols, wr, len, !k0, (__mmask8)((1u << valid) - 1),
			      wk, more);
		}
	}
}

/* Quantized weights: the same, each group's chunk first dequantized into an f32 tile of GW rows
 * of CPU_GEMM_KCQ (rows past r1 are not dequantized; their tile rows repeat the last one). */
GEMM_TARGET static void rowsq(float *y, int64_t ldy, const float *x, int64_t n, const void *w,
			      enum fkv_quant q, int64_t cols, int64_t r0, int64_t r1)
{
	float t[GW * CPU_GEMM_KCQ] __attribute__((aligned(64)));
	const size_t rb = quant_row_bytes(q, cols);
	const size_t bb = quant_block_bytes(q);
	const int64_t be = quant_block_elems(q);
	for (int64_t k0 = 0; k0 < cols; k0 += CPU_GEMM_KCQ) {
		const int64_t len = k0 + CPU_GEMM_KCQ < cols ? CPU_GEMM_KCQ : cols - k0;
		for (int64_t r = r0; r < r1; r += GW) {
			const int valid = r1 - r < GW ? (int)(r1 - r) : GW;
			const void *wr[GW];
			for (int i = 0; i < GW; i++) {
				if (i < valid)
					cpu_quant_dequant_rows(t + i * CPU_GEMM_KCQ,
							       (const char *)w + (size_t)(r + i) * rb +
								       (size_t)(k0 / be) * bb,
							       q, len, 0, 1);
				wr[i] = t + (i < valid ? i : valid - 1) * CPU_GEMM_KCQ;
			}
			/* the next group's blocks (or the first group's in the next chunk), to
			 * arrive while this group's tiles run (64 rows of 4096 and 14336 columns
			 * from DRAM: Q8_0 76-85 -> 87-93 GFLOP/s, Q6_K 69 -> 87) */
			const int64_t nr = r + GW < r1 ? r + GW : r0;
			const int64_t nk = r + GW < r1 ? k0 : k0 + CPU_GEMM_KCQ;
			if (nk < cols) {
				const int64_t nlen = nk + CPU_GEMM_KCQ < cols ? CPU_GEMM_KCQ : cols - nk;
				const size_t bytes = (size_t)(nlen / be) * bb;
				for (int64_t i = nr; i < nr + GW && i < r1; i++) {
					const char *p = (const char *)w + (size_t)i * rb +
							(size_t)(nk / be) * bb;
					for (size_t o = 0; o < bytes; o += 64)
						_mm_prefetch(p + o, _MM_HINT_T1);
				}
			}
			group(y + r, ldy, x + k0, n, cols, wr, len, !k0, (__mmask8)((1u << valid) - 1),
			      W_F32, false);
		}
	}
}

GEMM_TARGET void cpu_gemm_rows(float *y, int64_t ldy, const float *x, int64_t n, const void *w,
			       enum fkv_dtype t, enum fkv_quant q, int64_t cols, int64_t r0,
			       int64_t r1)
{
	if (q != FKV_QNONE)
		rowsq(y, ldy, x, n, w, q, cols, r0, r1);
	else if (t == FKV_BF16)
		rows16(y, ldy, x, n, w, cols, r0, r1, W_BF16);
	else
		rows16(y, ldy, x, n, w, cols, r0, r1, W_F16);
}

#else

bool cpu_gemm_usable(enum fkv_dtype t, enum fkv_quant q)
{
	(void)t;
	(void)q;
	return false;
}

void cpu_gemm_rows(float *y, int64_t ldy, const float *x, int64_t n, const void *w,
		   enum fkv_dtype t, enum fkv_quant q, int64_t cols, int64_t r0, int64_t r1)
{
	cpu_gemm_ref(y, ldy, x, n, w, t, q, cols, r0, r1);
}

#endif
