// topk — per KV head, the k best-scoring candidate pages, ties to the lower page, listed in
// ascending page order: the selection step of select_topk() (worker/backend/select.c) run on the
// scores of page_score(). Exact for any candidate count: a 4-pass radix select finds the k-th
// largest score, then one ordered pass lists every page above it and the lowest-indexed pages
// equal to it.
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// scores: (n_kv, n_cand) f32, not NaN (page cand_begin + j scores scores[.][j]);
// pages: (n_kv, k) int32, each head's selection as absolute page indices, ascending.
// 0 <= k <= n_cand. Returns cudaErrorInvalidValue for a bad geometry, else the launch error.
cudaError_t topk_pages(int32_t *pages, const float *scores, int n_kv, int n_cand, int cand_begin,
		       int k, cudaStream_t stream);

// As topk_pages, and also lists the selected pages that still have to be recalled.
// resident: (n_kv, mask_stride) uint8, non-zero where that head's slice of the page is already
// on the device (indexed by absolute page; cand_begin + n_cand <= mask_stride); such pages are
// never returned as changed. changed: (n_kv, k) int32, each head's non-resident selected pages
// ascending, padded with -1; n_changed: (n_kv) int32 counts.
cudaError_t topk_pages_changed(int32_t *pages, int32_t *changed, int32_t *n_changed,
			       const float *scores, const uint8_t *resident, int mask_stride,
			       int n_kv, int n_cand, int cand_begin, int k, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
