// kivi — the KIVI copy of `specache` (docs/design.md §3 "KIVI copy", §5 `specache`): whole key
// groups and value rows quantised to packed 2- or 1-bit codes, dequantisation, and the two
// helpers the CUDA backend's attn_kivi composes with prefill_attention: exact rows put in place
// of dequantised ones, and rows widened to f32. The device twins of worker/backend/
// backend_cpu_kivi.c (cpu_kivi_quant, cpu_kivi_dequant): the same codes bit for bit (computed
// in double, no contraction), the same values (fmaf(s, code, z)).
//
// Layout (worker/backend/backend.h struct backend_kivi): codes (cap, n_kv, d·bits/8) bytes,
// channel c of a row in byte c·bits/8 at bit (c % (8/bits))·bits; key zero and scale
// (cap/p, n_kv, 2, d) f32; value zero and scale (cap, n_kv, 2, ceil(d/gv)) f32, gv = min(p, d).
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// Positions [t0, t0 + n) (t0, n multiples of p) from rows k, v (n, n_kv, d) in dt into the copy:
// kc, vc (cap, n_kv, d·bits/8); kzs (cap/p, n_kv, 2, d); vzs (cap, n_kv, 2, ceil(d/gv)).
// cudaErrorInvalidValue for a bad geometry.
cudaError_t kivi_quant(uint8_t *kc, float *kzs, uint8_t *vc, float *vzs, const void *k,
		       const void *v, enum fkv_dtype dt, long long t0, long long n, int n_kv, int d,
		       int p, int bits, cudaStream_t stream);

// Positions [t0, t0 + n) of the copy into rows k, v (n, n_kv, d) f32.
cudaError_t kivi_dequant(float *k, float *v, const uint8_t *kc, const float *kzs,
			 const uint8_t *vc, const float *vzs, long long t0, long long n, int n_kv,
			 int d, int p, int bits, cudaStream_t stream);

// Exact rows over dequantised ones: row (h, i) of rows (n_kv, n_f, d) in dt goes to head h of
// position pos[h·n_f + i] of dst (positions, n_kv, d) f32; pos -1 is skipped.
cudaError_t kivi_put_rows(float *dst, const void *rows, enum fkv_dtype dt, const int32_t *pos,
			  int n_kv, int n_f, int d, cudaStream_t stream);

// dst (n) f32 = src (n) in dt.
cudaError_t kivi_widen(float *dst, const void *src, enum fkv_dtype dt, long long n,
		       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
