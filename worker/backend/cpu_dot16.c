/* cpu_dot16 — see cpu_dot16.h. */
#include "cpu_dot16.h"

#include <stdlib.h>
#include <string.h>

#include "cpu_switch.h"

static int g_enabled = -1; /* cpu_switch.h */

void cpu_dot16_enable(bool on)
{
	g_enabled = on;
}

__attribute__((unused)) static bool enabled(void)
{
	return cpu_switch_on(&g_enabled, "FREEKV_CPU_DOT16");
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define DOT16_TARGET __attribute__((target("avx2,fma,f16c")))

bool cpu_dot16_usable(void)
{
	static int usable = -1;
	if (usable < 0) {
		__builtin_cpu_init();
		usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
			 __builtin_cpu_supports("f16c");
	}
	return usable && enabled();
}

DOT16_TARGET __attribute__((always_inline)) static inline __m256 ld_w(const uint16_t *p, bool bf16)
{
	__m128i h = _mm_loadu_si128((const __m128i *)p);
	return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
		    : _mm256_cvtph_ps(h);
}

/* ((x0 + x4) + (x1 + x5)) + ((x2 + x6) + (x3 + x7)): backend_cpu.c's hsum8. */
DOT16_TARGET __attribute__((always_inline)) static inline float hsum(__m256 v)
{
	float x[8];
	_mm256_storeu_ps(x, v);
	return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

static inline float val16(uint16_t h, bool bf16)
{
	uint32_t u;
	float f;
	if (bf16) {
		u = (uint32_t)h << 16;
		memcpy(&f, &u, sizeof f);
		return f;
	}
	return f16_to_f32(h);
}

DOT16_TARGET __attribute__((always_inline)) static inline void
rows_t(float *const *y, const float *const *x, const int nx, const uint16_t *w, int64_t cols,
       int64_t r0, int64_t r1, const bool bf16)
{
	for (int64_t r = r0; r < r1; r += 4) {
		const uint16_t *w0 = w + r * cols;
		const uint16_t *w1 = w + (r + 1 < r1 ? r + 1 : r1 - 1) * cols;
		const uint16_t *w2 = w + (r + 2 < r1 ? r + 2 : r1 - 1) * cols;
		const uint16_t *w3 = w + (r + 3 < r1 ? r + 3 : r1 - 1) * cols;
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
		__m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
		int64_t c = 0;
		for (; c + 8 <= cols; c += 8) {
			/* The rows two groups ahead, a cache line each per line read here, into
			 * L2: an L1 prefetch holds one of the few L1 miss buffers until its line
			 * arrives, an L2 one does not. On 576-column rows (SmolLM2) this read 9
			 * GB/s with the next group into L1 and 20 GB/s with this; 15 and 18-21
			 * on 4096 columns. */
			if (!(c & 31)) {
				_mm_prefetch((const char *)(w3 + 5 * cols + c), _MM_HINT_T1);
				_mm_prefetch((const char *)(w3 + 6 * cols + c), _MM_HINT_T1);
				_mm_prefetch((const char *)(w3 + 7 * cols + c), _MM_HINT_T1);
				_mm_prefetch((const char *)(w3 + 8 * cols + c), _MM_HINT_T1);
			}
			const __m256 v0 = ld_w(w0 + c, bf16), v1 = ld_w(w1 + c, bf16);
			const __m256 v2 = ld_w(w2 + c, bf16), v3 = ld_w(w3 + c, bf16);
			const __m256 x0 = _mm256_loadu_ps(x[0] + c);
			a0 = _mm256_fmadd_ps(v0, x0, a0);
			a1 = _mm256_fmadd_ps(v1, x0, a1);
			a2 = _mm256_fmadd_ps(v2, x0, a2);
			a3 = _mm256_fmadd_ps(v3, x0, a3);
			if (nx == 2) {
				const __m256 x1 = _mm256_loadu_ps(x[1] + c);
				b0 = _mm256_fmadd_ps(v0, x1, b0);
				b1 = _mm256_fmadd_ps(v1, x1, b1);
				b2 = _mm256_fmadd_ps(v2, x1, b2);
				b3 = _mm256_fmadd_ps(v3, x1, b3);
			}
		}
		const uint16_t *wr[4] = { w0, w1, w2, w3 };
		for (int j = 0; j < nx; j++) {
			float acc[4] = { hsum(j ? b0 : a0), hsum(j ? b1 : a1), hsum(j ? b2 : a2),
					 hsum(j ? b3 : a3) };
			for (int64_t cc = c; cc < cols; cc++)
				for (int k = 0; k < 4; k++)
					acc[k] += val16(wr[k][cc], bf16) * x[j][cc];
			for (int k = 0; k < 4 && r + k < r1; k++)
				y[j][r + k] = acc[k];
		}
	}
}

DOT16_TARGET void cpu_dot16_rows(float *const *y, const float *const *x, int nx, const uint16_t *w,
				 int64_t cols, int64_t r0, int64_t r1, enum fkv_dtype t)
{
	const bool bf16 = t == FKV_BF16;
	if (nx == 2 && bf16)
		rows_t(y, x, 2, w, cols, r0, r1, true);
	else if (nx == 2)
		rows_t(y, x, 2, w, cols, r0, r1, false);
	else if (bf16)
		rows_t(y, x, 1, w, cols, r0, r1, true);
	else
		rows_t(y, x, 1, w, cols, r0, r1, false);
}

#else

bool cpu_dot16_usable(void)
{
	return false;
}

void cpu_dot16_rows(float *const *y, const float *const *x, int nx, const uint16_t *w,
		    int64_t cols, int64_t r0, int64_t r1, enum fkv_dtype t)
{
	(void)y, (void)x, (void)nx, (void)w, (void)cols, (void)r0, (void)r1, (void)t;
}

#endif
