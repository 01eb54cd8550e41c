/* cpu_q4k — see cpu_q4k.h. */
#include "cpu_q4k.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_qdot8.h"
#include "cpu_switch.h"
#include "dtype.h"
#include "quant.h"

/* Activation rows of one tile (measured: 4, 6 and 8 rows at 4.5, 3.9 and 4.0 ns per block and
 * row, 64 rows of 4096 columns). */
#define Q4K_TILE 6

static int g_enabled = -1; /* cpu_switch.h */

void cpu_q4k_enable(bool on)
{
	g_enabled = on;
}

__attribute__((unused)) static bool enabled(void)
{
	return cpu_switch_on(&g_enabled, "FREEKV_CPU_Q4K");
}

/* The sub-blocks in the two halves of register k (cpu_q4k.h). */
static const int pair_j[4][2] = { { 0, 2 }, { 1, 3 }, { 4, 6 }, { 5, 7 } };

size_t cpu_q4k_act_bytes(int64_t cols)
{
	return (size_t)(cols / QK_K) * sizeof(struct q8k_pair);
}

void cpu_q4k_quantize(void *act, const float *x, int64_t cols)
{
	struct q8k_pair *o = act;
	for (int64_t b = 0; b < cols / QK_K; b++, o++) {
		struct q8k_block k;
		cpu_qdot8_quantize(&k, x + b * QK_K, QK_K, FKV_Q4_K);
		o->d = k.d;
		for (int j = 0; j < 8; j++)
			o->psums[j] = (int16_t)(k.bsums[2 * j] + k.bsums[2 * j + 1]);
		for (int r = 0; r < 4; r++)
			for (int h = 0; h < 2; h++)
				memcpy(o->qs + 64 * r + 32 * h, k.qs + 32 * pair_j[r][h], 32);
	}
}

/* ---- the scalar reference ---- */

/* Lane L of the sixteen int32 lanes of a block: half h = L / 8 of each register k, bytes 4l ..
 * 4l + 3 (l = L % 8) of sub-block pair_j[k][h], each sub-block's products times its scale. And
 * the four lanes of the mins: lm[l] = m_2l psums_2l + m_(2l+1) psums_(2l+1). */
static void block_lanes(const struct blk_q4_k *b, const struct q8k_pair *x, int32_t li[16],
			int32_t lm[4])
{
	uint8_t sc[8], mn[8];
	for (int j = 0; j < 8; j++)
		quant_k_scale_min(b->scales, j, &sc[j], &mn[j]);
	for (int L = 0; L < 16; L++) {
		const int h = L / 8, l = L % 8;
		li[L] = 0;
		for (int k = 0; k < 4; k++) {
			const int j = pair_j[k][h];
			for (int c = 4 * l; c < 4 * l + 4; c++) {
				/* value c of sub-block j: nibble of qs[32 (j / 2) + c] */
				const uint8_t byte = b->qs[32 * (j / 2) + c];
				const int q = j % 2 ? byte >> 4 : byte & 15;
				li[L] += sc[j] * q * x->qs[64 * k + 32 * h + c];
			}
		}
	}
	for (int l = 0; l < 4; l++)
		lm[l] = mn[2 * l] * x->psums[2 * l] + mn[2 * l + 1] * x->psums[2 * l + 1];
}

/* Sixteen lanes summed as the kernel sums them: halves first, then ((h0 + h4) + (h2 + h6)) +
 * ((h1 + h5) + (h3 + h7)). */
static float hsum16_ref(const float a[16])
{
	float h[8];
	for (int i = 0; i < 8; i++)
		h[i] = a[i] + a[i + 8];
	return ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
}

void cpu_q4k_rows_ref(float *y, int64_t ldy, const void *act, int64_t n, const void *w,
		      int64_t cols, int64_t r0, int64_t r1)
{
	const int64_t nb = cols / QK_K;
	for (int64_t j = 0; j < n; j++) {
		const struct q8k_pair *x = (const struct q8k_pair *)act + j * nb;
		for (int64_t r = r0; r < r1; r++) {
			const struct blk_q4_k *row = (const struct blk_q4_k *)w + r * nb;
			float acc[16] = { 0 }, accm[4] = { 0 };
			for (int64_t i = 0; i < nb; i++) {
				int32_t li[16], lm[4];
				block_lanes(&row[i], &x[i], li, lm);
				const float dd = x[i].d * f16_to_f32(row[i].d);
				const float dm = x[i].d * f16_to_f32(row[i].dmin);
				for (int L = 0; L < 16; L++)
					acc[L] = fmaf((float)li[L], dd, acc[L]);
				for (int l = 0; l < 4; l++)
					accm[l] = fmaf((float)lm[l], dm, accm[l]);
			}
			y[j * ldy + r] = hsum16_ref(acc) - ((accm[0] + accm[2]) + (accm[1] + accm[3]));
		}
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define Q4K_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define AI Q4K_TARGET __attribute__((always_inline)) static inline

bool cpu_q4k_usable(void)
{
	static int usable = -1;
	if (usable < 0) {
		__builtin_cpu_init();
		usable = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
			 __builtin_cpu_supports("avx512vl") &&
			 __builtin_cpu_supports("avx512vnni");
	}
	return usable && enabled() && cpu_qdot8_usable(FKV_Q4_K);
}

/* One weight block unpacked: the four registers of 4-bit values, their int16 scales, the mins
 * as int16, d and dmin. */
struct wblock {
	__m512i v[4], s[4];
	__m128i mn;
	float d, dmin;
};

AI void unpack(struct wblock *o, const struct blk_q4_k *b)
{
	/* the twelve scale bytes as eight 6-bit scales and mins (cpu_qdot8.c's k45_unpack) */
	uint32_t u[3], t[4];
	memcpy(u, b->scales, 12);
	t[0] = u[0] & 0x3f3f3f3fu;
	t[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
	t[2] = u[1] & 0x3f3f3f3fu;
	t[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
	const __m128i sc = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)t));
	o->mn = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(t + 2)));
	/* the eight int16 scales in each 128-bit lane; one vpshufb per register fills int16 lanes
	 * 0..15 with the scale of pair_j[k][0] and 16..31 with that of pair_j[k][1] */
	const __m512i sc4 = _mm512_broadcast_i32x4(sc);
	#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		const __m128i lo = _mm_set1_epi16((short)(0x0101 * (2 * pair_j[k][0]) + 0x0100));
		const __m128i hi = _mm_set1_epi16((short)(0x0101 * (2 * pair_j[k][1]) + 0x0100));
		const __m512i idx = _mm512_inserti64x4(
			_mm512_castsi256_si512(_mm256_broadcastsi128_si256(lo)),
			_mm256_broadcastsi128_si256(hi), 1);
		o->s[k] = _mm512_shuffle_epi8(sc4, idx);
	}
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512i q0 = _mm512_loadu_si512(b->qs), q1 = _mm512_loadu_si512(b->qs + 64);
	o->v[0] = _mm512_and_si512(q0, m4);
	o->v[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
	o->v[2] = _mm512_and_si512(q1, m4);
	o->v[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
	o->d = _cvtsh_ss(b->d);
	o->dmin = _cvtsh_ss(b->dmin);
}

/* One activation row's block against an unpacked weight block, into its f32 lanes. */
AI void block_dot(const struct wblock *wb, const struct q8k_pair *x, __m512 *acc, __m128 *accm)
{
	__m512i s = _mm512_setzero_si512();
	#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		const __m512i xv = _mm512_loadu_si512(x->qs + 64 * k);
		s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(wb->v[k], xv), wb->s[k]);
	}
	const __m128i lm = _mm_madd_epi16(_mm_loadu_si128((const __m128i *)x->psums), wb->mn);
	*acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(x->d * wb->d), *acc);
	*accm = _mm_fmadd_ps(_mm_cvtepi32_ps(lm), _mm_set1_ps(x->d * wb->dmin), *accm);
}

AI float row_sum(__m512 a, __m128 m)
{
	const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
				       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
	m = _mm_add_ps(m, _mm_movehl_ps(m, m));
	m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
	return _mm_cvtss_f32(s) - _mm_cvtss_f32(m);
}

/* Rows r0 .. r1 against NT activation rows (x, nb blocks apart). */
AI void tile(float *y, int64_t ldy, const struct q8k_pair *x, const int NT, const struct blk_q4_k *w,
	     int64_t nb, int64_t r0, int64_t r1)
{
	for (int64_t r = r0; r < r1; r++) {
		const struct blk_q4_k *row = w + r * nb;
		__m512 acc[Q4K_TILE];
		__m128 accm[Q4K_TILE];
		#pragma GCC unroll 6
		for (int j = 0; j < NT; j++) {
			acc[j] = _mm512_setzero_ps();
			accm[j] = _mm_setzero_ps();
		}
		for (int64_t i = 0; i < nb; i++) {
			struct wblock wb;
			unpack(&wb, &row[i]);
			#pragma GCC unroll 6
			for (int j = 0; j < NT; j++)
				block_dot(&wb, &x[j * nb + i], &acc[j], &accm[j]);
		}
		#pragma GCC unroll 6
		for (int j = 0; j < NT; j++)
			y[j * ldy + r] = row_sum(acc[j], accm[j]);
	}
}

/* Decode (one activation row): four weight rows at a time, block by block, each row with its
 * own lanes (so every row gets tile()'s sum, bit for bit), and the rows Q4K_AHEAD ahead
 * prefetched into L2 at the same block. One row at a time the loads stall on memory (the 8B
 * geometry's Q4_K_M file read 12 GB/s); four rows without the prefetch confuse the hardware
 * prefetcher (slower still); with it, decode went from 41-49 to 50-55 tok/s (bench/RESULTS.md
 * "Quantized decode four rows at a time"). */
#define Q4K_AHEAD 8

AI void rows4(float *y, const struct q8k_pair *x, const struct blk_q4_k *w, int64_t nb,
	      int64_t r0, int64_t r1)
{
	int64_t r = r0;
	for (; r + 4 <= r1; r += 4) {
		const struct blk_q4_k *row = w + r * nb;
		__m512 acc[4];
		__m128 accm[4];
		for (int k = 0; k < 4; k++) {
			acc[k] = _mm512_setzero_ps();
			accm[k] = _mm_setzero_ps();
		}
		for (int64_t i = 0; i < nb; i++) {
			const char *p = (const char *)(row + Q4K_AHEAD * nb + i);
			for (int k = 0; k < 4; k++)
				for (size_t o = 0; o < sizeof *row; o += 64)
					_mm_prefetch(p + k * nb * sizeof *row + o, _MM_HINT_T1);
			#pragma GCC unroll 4
			for (int k = 0; k < 4; k++) {
				struct wblock wb;
				unpack(&wb, &row[k * nb + i]);
				block_dot(&wb, &x[i], &acc[k], &accm[k]);
			}
		}
		for (int k = 0; k < 4; k++)
			y[r + k] = row_sum(acc[k], accm[k]);
	}
	if (r < r1)
		tile(y, 0, x, 1, w, nb, r, r1);
}

Q4K_TARGET void cpu_q4k_rows(float *y, int64_t ldy, const void *act, int64_t n, const void *w,
			     int64_t cols, int64_t r0, int64_t r1)
{
	const int64_t nb = cols / QK_K;
	const struct q8k_pair *x = act;
	if (n == 1) {
		rows4(y, x, w, nb, r0, r1);
		return;
	}
	for (int64_t j = 0; j < n; j += Q4K_TILE) {
		const struct q8k_pair *xj = x + j * nb;
		float *yj = y + j * ldy;
		switch (n - j < Q4K_TILE ? n - j : Q4K_TILE) {
		case 6: tile(yj, ldy, xj, 6, w, nb, r0, r1); break;
		case 5: tile(yj, ldy, xj, 5, w, nb, r0, r1); break;
		case 4: tile(yj, ldy, xj, 4, w, nb, r0, r1); break;
		case 3: tile(yj, ldy, xj, 3, w, nb, r0, r1); break;
		case 2: tile(yj, ldy, xj, 2, w, nb, r0, r1); break;
		default: tile(yj, ldy, xj, 1, w, nb, r0, r1); break;
		}
	}
}

#else

bool cpu_q4k_usable(void)
{
	return false;
}

void cpu_q4k_rows(float *y, int64_t ldy, const void *act, int64_t n, const void *w, int64_t cols,
		  int64_t r0, int64_t r1)
{
	cpu_q4k_rows_ref(y, ldy, act, n, w, cols, r0, r1);
}

#endif
