// pool_topk — refreshkv's new partial sets from a full step's probabilities
// (docs/design.md §5), exactly refresh_topk() of worker/kvcache/refresh_select.c: per KV head
// h, s_h[j] = max over its query group of a_i[j], u_h[j] = max of s_h over [j-3, j+3] clipped
// to [0, T), the B positions of highest u_h (ties to the lower position) listed ascending with
// their u_h. Max is exact in f32, so the result equals the CPU twin's bit for bit.
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
// probs: (n_q, ld) f32, the first T of each row used; u: (n_kv, T) f32 device scratch
// (the pooled scores, left there); pos: (n_kv, B) int32; uval: (n_kv, B) f32. 1 <= B <= T,
// T < 2^31. Returns cudaErrorInvalidValue for a bad geometry, else the launch error.
cudaError_t pool_topk(int32_t *pos, float *uval, float *u, const float *probs, long long ld,
			 int n_q, int n_kv, int T, int B, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
