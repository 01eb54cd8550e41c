// prefill_attention — causal attention for a prompt (or a chunk of one), flash-attention style:
// tiles of queries against tiles of keys with an online softmax, so memory is O(tile), never
// O(L^2), and 32K-token prompts fit. GQA: query head h reads KV head h / (n_heads / n_kv).
// Same semantics as the backend's attn_prefill: q holds the last n_q of n_ctx positions, and
// query i (at position n_ctx - n_q + i) sees keys 0 .. its position, or with a sliding window
// (Mistral v0.1) only the last `window` of those, itself included.
#pragma once
#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// q: (n_q, n_heads, d) f32; k, v: (n_ctx, n_kv, d) in dt, dense; out: (n_q, n_heads, d) f32.
// n_q <= n_ctx; window: 0 for full causal attention, else the keys each query sees. Returns cudaErrorInvalidValue for a bad geometry (or a head dim whose tiles
// exceed the device's shared memory), else the launch error.
cudaError_t prefill_attention(float *out, const float *q, const void *k, const void *v,
			      enum fkv_dtype dt, int n_q, int n_ctx, int n_heads, int n_kv, int d,
			      float scale, int window, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
