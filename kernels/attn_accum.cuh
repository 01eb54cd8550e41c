// attn_accum — the weighted sum of values that ends decode attention, from probabilities
// computed apart (refreshkv's full step, docs/design.md §5): device twin of the backend's
// attn_accum op (worker/backend/backend.h; CPU: backend_cpu.c). Spans as for attn_scores.
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>
#include "dtype.h"
#include "span_attention.cuh"
#ifdef __cplusplus
extern "C" {
#endif
// out: (n_heads, d) f32, = (accumulate: +=) sum_j p[h][j] * v_j over the keys of h's KV
// head, in key order; p: (n_heads, ld) f32; spans, first as for attn_scores. Returns
// cudaErrorInvalidValue for a bad geometry, else the launch error.
cudaError_t attn_accum(float *out, const float *p, long long ld, const struct span_desc *spans,
		       const int32_t *first, int accumulate, enum fkv_dtype dt, int n_heads,
		       int n_kv, int d, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
