// offload_gather — the device half of an offload (docs/design.md §3): NHD rows are converted to HND
// page blocks [n_kv][2][p][d] in the pool's dtype, either from device slots (a window page that
// filled) or from f32 K/V rows (prefill, and the per-step write-through of the tail page). The
// device twins of layout_gather_unit and layout_store_tokens (common/layout.c).
//
// Block i is written at element offset dst_off[i] of blocks: a staging buffer for a following
// cudaMemcpyAsync (dst_off[i] = i * n_kv * 2 * p * d), or the device alias of a registered pool
// mapping (cudaHostGetDevicePointer) to write the pool directly. Only the named token rows of a
// block are written; the others keep their bytes.
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// Tokens [t0, t1) of n blocks from slots: block i from slot src_slot[i].
// slots: (n_slots, 2, p, n_kv, d) in slot_dt; blocks: HND blocks (n_kv, 2, p, d) in block_dt at
// dst_off; src_slot: (n) device int32; dst_off: (n) device int64.
cudaError_t offload_gather_slots(void *blocks, enum fkv_dtype block_dt, const int64_t *dst_off,
				 const void *slots, enum fkv_dtype slot_dt, const int32_t *src_slot,
				 int n, int t0, int t1, int n_kv, int p, int d,
				 cudaStream_t stream);

// n_tok consecutive tokens from f32 rows, the first at row t0 (< p) of block 0: token i goes to
// block (t0 + i) / p, row (t0 + i) % p. k, v: (n_tok, n_kv, d) f32; dst_off: one int64 per block
// touched, (t0 + n_tok + p - 1) / p of them.
cudaError_t offload_store_rows(void *blocks, enum fkv_dtype block_dt, const int64_t *dst_off,
			       const float *k, const float *v, int n_tok, int t0, int n_kv, int p,
			       int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
