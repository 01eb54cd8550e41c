// attn_probs — the attention probabilities of one query row, averaged over each KV head's query
// group, over a prefix of the keys (docs/design.md §5 `specache`: the next step's exact rows are
// the top-k of these for the speculative row). The probabilities are those of the row's
// attention over all n_ctx keys; only the first n_prob are written. The CUDA backend's
// attn_kivi runs it on the rows it attended; the CPU twin is the probability output of
// cpu_attn_kivi (worker/backend/backend_cpu_kivi.c).
#pragma once
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// q: (n_heads, d) f32, one query row; k: (n_ctx, n_kv, d) f32; probs: (n_kv, n_prob) f32,
// n_prob <= n_ctx; scratch: (n_heads, n_ctx + 2) f32 caller-owned device memory. Query head h
// reads KV head h / (n_heads / n_kv). cudaErrorInvalidValue for a bad geometry.
cudaError_t attn_probs(float *probs, float *scratch, const float *q, const float *k,
		       long long n_ctx, long long n_prob, int n_heads, int n_kv, int d,
		       float scale, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
