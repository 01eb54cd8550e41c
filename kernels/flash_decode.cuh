// flash_decode — decode attention for one query token over one dense, contiguous KV cache (the
// `full` policy's, docs/design.md §5 "The GPU decode step"): flash-decoding, i.e. the keys are
// split into chunks across blocks (split-K), each block keeps an online softmax per query head
// of its KV head's group over its chunk, and a second kernel merges the chunks' partial
// results. One block per (chunk, KV head), one warp per query head of the group, so a K/V row
// is read from memory once for the whole group; K/V are read in their dtype (f32, f16, bf16)
// and everything accumulates in f32. The split is a pure function of the arguments
// (flash_decode_splits), and the workspace has a fixed upper bound, so a caller can size it
// once and capture the launch in a CUDA graph.
#pragma once
#include <stddef.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// Largest head dim and query group the kernel takes (a warp per query head, 8 dims a lane).
#define FLASH_DECODE_MAX_D 256
#define FLASH_DECODE_MAX_GROUP 32
// Most chunks a KV head's keys are split into.
#define FLASH_DECODE_MAX_SPLITS 128

// Chunks the launcher splits n keys into for n_kv KV heads (1 = unsplit, no merge).
int flash_decode_splits(long long n, int n_kv);

// Bytes of workspace any call with these heads needs at most (whatever n).
size_t flash_decode_workspace_bytes(int n_heads, int d);

// out, q: (n_heads, d) f32; k, v: (n, n_kv, d) in dt, consecutive token rows row_stride
// elements apart (row_stride >= n_kv * d); query head h reads KV head h / (n_heads / n_kv).
// workspace: at least flash_decode_workspace_bytes(n_heads, d) of device memory, not shared
// with a concurrent launch. Returns cudaErrorInvalidValue for a bad geometry (n <= 0, d or the
// group too large, a short workspace), else the launch error.
cudaError_t flash_decode(float *out, const float *q, const void *k, const void *v,
			 enum fkv_dtype dt, long long n, long long row_stride, int n_heads,
			 int n_kv, int d, float scale, void *workspace, size_t workspace_bytes,
			 cudaStream_t stream);

// One sequence of a batched launch (flash_decode_batch): its K/V (n, n_kv, d) as for
// flash_decode, and the row of q and out (rows, n_heads, d) its query and output are.
struct flash_decode_item {
	const void *k, *v;
	long long n;
	long long row;
};

// Chunks each sequence's keys are split into in a batch of `batch` sequences, the longest
// max_n keys (fewer than one sequence alone: the batch fills the grid).
int flash_decode_batch_splits(long long max_n, int n_kv, int batch);

// Bytes of workspace any batched call of `batch` sequences with these heads needs at most.
size_t flash_decode_batch_workspace_bytes(int batch, int n_heads, int n_kv, int d);

// flash_decode for `batch` sequences in one launch (one per layer for a whole decode batch,
// docs/design.md "The GPU decode step"): items (batch) is a device array, each n >= 1 and at
// most max_n; every sequence shares dt, row_stride and the heads. Sequence b equals
// flash_decode over its own K/V up to the split (the chunks differ: summation order).
cudaError_t flash_decode_batch(float *out, const float *q, const struct flash_decode_item *items,
			       int batch, long long max_n, enum fkv_dtype dt, long long row_stride,
			       int n_heads, int n_kv, int d, float scale, void *workspace,
			       size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
