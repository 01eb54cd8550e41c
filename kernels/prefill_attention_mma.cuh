// prefill_attention_mma — prefill_attention (prefill_attention.cuh: the same arguments, the
// same causal and sliding-window semantics) on tensor cores for 16-bit K/V: WMMA tiles, Q and
// the probabilities rounded to the K/V type, everything accumulated in f32 (docs/design.md
// "The GPU decode step": dense prefill on the device, bf16 in, f32 accumulate, no O(L^2)
// buffer). The CUDA-core kernel stays the reference it is tested against and the path for f32
// K/V and head dims it does not take.
#pragma once
#include <stdbool.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// Whether this kernel takes dt and d on the current device: f16 or bf16, d a multiple of 16,
// compute capability 8.0 or later, and its tiles within the opt-in shared memory.
bool prefill_attention_mma_takes(enum fkv_dtype dt, int d);

// As prefill_attention; cudaErrorInvalidValue where prefill_attention_mma_takes is false or
// for a bad geometry, else the launch error.
cudaError_t prefill_attention_mma(float *out, const float *q, const void *k, const void *v,
				  enum fkv_dtype dt, int n_q, int n_ctx, int n_heads, int n_kv,
				  int d, float scale, int window, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
