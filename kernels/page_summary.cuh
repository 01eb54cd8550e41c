// page_summary — element-wise min and max over a page's p keys, per KV head: the Quest page
// summaries of docs/design.md §3 ("updated when a page fills"), stored f32 for scoring.
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// Summarises n pages at once. Page i's keys are the p rows starting at element
// src[i] * k_page_stride of k, consecutive rows n_kv * d elements apart, head h at offset h * d
// within a row: device slots (n_slots, 2, p, n_kv, d) use k_page_stride = 2 * p * n_kv * d, dense
// prefill keys (n_ctx, n_kv, d) use p * n_kv * d. Results go to page dst[i] of
// kmin, kmax: (n_kv, page_stride, d) f32. src, dst: (n) device int32.
// Returns cudaSuccess or the launch error.
cudaError_t page_summary(float *kmin, float *kmax, int page_stride, const void *k,
			 enum fkv_dtype dt, long long k_page_stride, const int32_t *src,
			 const int32_t *dst, int n, int n_kv, int p, int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
