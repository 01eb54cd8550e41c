// embedding — out[i] = table[ids[i]] converted to f32, one row per token.
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// out: (n, dim) f32; table: (vocab, dim) in dt; ids: (n) device int32. An id outside
// [0, vocab) is a caller bug (the backend range-checks token ids on the host first); its row is
// written as NaN rather than read out of bounds. Returns cudaSuccess or the launch error.
cudaError_t embedding_rows(float *out, const void *table, enum fkv_dtype dt, const int32_t *ids,
			   int n, int dim, int vocab, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
