// qcos — FreeKV's correction check (docs/design.md §5 step 2): per KV head, the mean over its query
// group of cos(q_t, q_{t-1}), exactly as select_group_cosine() (worker/backend/select.c): accumulated in
// double; a zero vector has cosine 1 with another zero vector and 0 with anything else.
#pragma once
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// q_t, q_prev: (batch, n_q, d) f32; out: (batch, n_kv) f32. Returns cudaErrorInvalidValue for a
// bad geometry, else the launch error.
cudaError_t qcos_group(float *out, const float *q_t, const float *q_prev, int batch, int n_q,
		       int n_kv, int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
