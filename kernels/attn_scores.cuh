// attn_scores — the scores of one decode query over lists of K spans, unnormalised: the first
// pass of decode attention, which refreshkv's full step runs apart (docs/design.md §5) so it can
// pool the probabilities and stream the keys chunk by chunk. Device twin of the backend's
// attn_scores op (worker/backend/backend.h; CPU: backend_cpu.c). KV head g reads the spans
// first[g] .. first[g + 1] of the list, each at element offset g * d of its rows (span_desc,
// as span_attention reads them); its keys are numbered from 0 across its spans.
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>
#include "dtype.h"
#include "span_attention.cuh"
#ifdef __cplusplus
extern "C" {
#endif
// s: (n_heads, ld) f32, s[h][j] = scale * q_h . k_j for the keys j of h's KV head (group
// n_heads / n_kv); q: (n_heads, d) f32; spans: (n_spans) device span_desc; first: (n_kv + 1)
// device int32; max_keys: the most keys any KV head has (<= ld). Returns
// cudaErrorInvalidValue for a bad geometry, else the launch error.
cudaError_t attn_scores(float *s, long long ld, const float *q, const struct span_desc *spans,
			const int32_t *first, long long max_keys, enum fkv_dtype dt, int n_heads,
			int n_kv, int d, float scale, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
