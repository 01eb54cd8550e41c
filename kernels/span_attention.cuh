// span_attention — decode attention for one query token over lists of contiguous K/V spans:
// the device twin of the backend's attn_decode / attn_decode_heads (worker/backend/backend.h), used by
// policies that keep dense per-layer caches (`full`) rather than paged slots (those use
// decode_attention). GQA: query head h reads KV head h / (n_heads / n_kv); KV head g reads the
// spans first[g] .. first[g + 1] of the list, each at element offset g * d of its rows. One block
// per query head walks its keys in tiles with an online softmax, so any span length works.
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>
#include "dtype.h"
#ifdef __cplusplus
extern "C" {
#endif
// One span: n token rows of K and V, consecutive rows row_stride elements apart (device
// pointers into a dense cache).
struct span_desc {
	const void *k; // (n, n_kv, d) with row stride row_stride
	const void *v; // (n, n_kv, d) with row stride row_stride
	long long n;
	long long row_stride;
};
// Largest head dim span_attention accepts.
#define SPAN_ATTN_MAX_D 1024
// out, q: (n_heads, d) f32; spans: (n_spans) device span_desc; first: (n_kv + 1) device int32.
// Every KV head must have at least one key (the caller checks). Returns cudaErrorInvalidValue
// for a bad geometry, else the launch error.
cudaError_t span_attention(float *out, const float *q, const struct span_desc *spans,
			   const int32_t *first, enum fkv_dtype dt, int n_heads, int n_kv, int d,
			   float scale, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
