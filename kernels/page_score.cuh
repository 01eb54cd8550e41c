// page_score — Quest page scores for one sequence's decode query, exactly the semantics of
// select_scores() (worker/backend/select.c, docs/design.md §5 "Selection"): the score of candidate page j for
// query head h is sum_i max(q_i * max_ji, q_i * min_ji) / sqrt(d), softmaxed over the candidates
// per query head, then averaged over the G = n_q / n_kv query heads of each KV head.
#pragma once
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// q: (n_q, d) f32; kmin, kmax: (n_kv, page_stride, d) f32 summaries; candidates are pages
// [cand_begin, cand_begin + n_cand) (cand_begin + n_cand <= page_stride).
// out: (n_kv, n_cand) f32 group-mean softmax scores; scratch: (n_q, n_cand) f32, caller-owned
// device memory for the raw per-head scores. Returns cudaErrorInvalidValue for a bad geometry,
// else the launch error.
cudaError_t page_score(float *out, float *scratch, const float *q, const float *kmin,
		       const float *kmax, int page_stride, int cand_begin, int n_cand, int n_q,
		       int n_kv, int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
