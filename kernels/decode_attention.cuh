// decode_attention — one query token per sequence over its attended KV (docs/design.md §5 step 4): GQA,
// softmax scale given (usually 1/sqrt(d)), split-K flash decoding.
//
// Every attended page is a device slot: per sequence and KV head, slot_list names the slots
// that head reads — the sink pages, its own selected pages (per-head slot indirection: each
// head's slice of a slot may hold a different host page) and the window pages, with the
// partial tail page last. A head's n_tok tokens fill ceil(n_tok / p) of its list entries, all
// full but the last; heads may read different numbers of pages (hardkv's per-head budgets). The pages are split into chunks across blocks (flash decoding); each block
// keeps an online softmax over its chunk, and a second kernel merges the chunks when there is
// more than one. Sizing is a pure function of the arguments (decode_attention_splits), so the
// caller can size the workspace once and capture the launch in a CUDA graph.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// Number of page chunks the launcher splits each (sequence, KV head) into.
int decode_attention_splits(int batch, int n_kv, int max_pages);

// Bytes of device workspace decode_attention needs for these arguments (0 when unsplit).
size_t decode_attention_workspace_bytes(int batch, int n_q, int n_kv, int d, int max_pages);

// q: (batch, n_q, d) f32; out: (batch, n_q, d) f32; slots: (n_slots, 2, p, n_kv, d) in dt;
// slot_list: (batch, n_kv, max_pages) device int32; n_tok: (batch, n_kv) device int32, the
// tokens each KV head reads, clamped to [0, max_pages * p] (a head with none gets zeros). workspace: at least
// decode_attention_workspace_bytes() of device memory, not shared with a concurrent launch.
// Returns cudaErrorInvalidValue for a bad geometry or a short workspace, else the launch error.
cudaError_t decode_attention(float *out, const float *q, const void *slots, enum fkv_dtype dt,
			     const int32_t *slot_list, const int32_t *n_tok, int batch, int n_q,
			     int n_kv, int d, int p, int max_pages, float scale, void *workspace,
			     size_t workspace_bytes, cudaStream_t stream);

// The same over one slot buffer per sequence (the batch-wide launch of attn_decode_batch):
// sequence b reads seq_slots[b] (a device array of batch device pointers) and its query and
// output are row rows[b] (device int32) of q, out (rows, n_q, d). aligned: every seq_slots[b]
// is 16-byte aligned (the caller checked it on the host), so K/V rows are read 16 bytes at a
// time where d allows.
cudaError_t decode_attention_seqs(float *out, const float *q, const int32_t *rows,
				  const void *const *seq_slots, bool aligned, enum fkv_dtype dt,
				  const int32_t *slot_list, const int32_t *n_tok, int batch,
				  int n_q, int n_kv, int d, int p, int max_pages, float scale,
				  void *workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
