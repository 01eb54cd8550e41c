// kv_append — writes new tokens' K and V rows into device slots (NHD, docs/design.md §3), converting
// from f32 to the slot dtype. A decode step appends one token per sequence to its window page;
// the caller picks the slot and row, so the same call serves a batch.
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// slots: (n_slots, 2, p, n_kv, d) in dt; k, v: (n_tok, n_kv, d) f32 (after RoPE);
// slot_pos: (n_tok) device int32, slot * p + row, where token i's rows go. Returns cudaSuccess
// or the launch error.
cudaError_t kv_append(void *slots, enum fkv_dtype dt, const float *k, const float *v,
		      const int32_t *slot_pos, int n_tok, int n_kv, int p, int d,
		      cudaStream_t stream);

#ifdef __cplusplus
}
#endif
