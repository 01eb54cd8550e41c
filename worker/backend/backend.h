/* backend — the compute interface the engine and the KV policies run on: an opaque handle plus
 * an ops table, in the ggml-backend style.
 *
 * Every activation lives in backend memory: buffers come from buf_alloc() and are reached by the
 * caller only through upload/download/copy, so a CUDA backend can hand out device pointers and
 * implement the same table. Index arrays (token ids, positions, row indices) are backend buffers
 * too; only parameter structs (and the span list of attn_decode) are host memory. Activations
 * are f32; weights stay in their file dtype (f32, f16, bf16, or a GGUF block format: quant.h) and KV blocks in the sequence's
 * dtype — ops that read them take the dtype. Weights are made resident with weight_load(): the
 * CPU backend copies matrices into huge pages where the kernel has them and otherwise borrows
 * the model's mapping (cpu_wmem.h), a device backend copies them. Ownership: the backend
 * owns every buffer it allocated and every resident weight until buf_free()/weight_release() or
 * backend_free(); the caller owns the handle. Shapes are row-major with the last index
 * contiguous, written as `// (rows, cols)`.
 *
 * Ops return 0 or a negative errno; they do not check shapes against allocations (the caller
 * sized the buffers), so a wrong shape is a bug, not a bad input. Ops on one backend run in
 * order; sync() waits for all of them. Slots marked "(optional)" may be NULL. */
#ifndef FREEKV_BACKEND_H
#define FREEKV_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "model.h"

/* A weight tensor resident on a backend. data is a backend pointer. 1-D tensors have cols = 1. */
struct backend_mat {
	const void *data;
	enum fkv_dtype dtype;
	int64_t rows, cols;
	void *priv; /* backend-private (e.g. a device allocation to release) */
	/* ggml blocks (docs/quant.md), rows of quant_row_bytes(quant, cols); dtype is then f32,
	 * what they dequantize to. FKV_QNONE: elements of dtype. Only matmul and embed take a
	 * quantized weight; a backend without kernels for it refuses it in weight_load. */
	enum fkv_quant quant;
};

/* Rotary embedding parameters; llama3 scaling applies when scaling_factor > 0. */
struct backend_rope {
	enum fkv_rope_style style;
	float theta;
	float scaling_factor;
	float low_freq_factor;
	float high_freq_factor;
	int original_ctx;
};

/* One contiguous run of cached tokens for decode attention: K and V rows of n tokens, each row
 * (n_kv, d) in the cache dtype, consecutive rows row_stride elements apart. */
struct backend_kv_span {
	const void *k; /* (n, n_kv, d) with row stride row_stride */
	const void *v; /* (n, n_kv, d) with row stride row_stride */
	int64_t n;
	int64_t row_stride; /* elements between token rows; n_kv * d when dense */
};

/* A KIVI copy of one layer's keys and values (docs/design.md §3 "KIVI copy", §5 `specache`):
 * every position quantised to `bits` bits, keys per channel over groups of p tokens (group g is
 * positions [g·p, (g + 1)·p)), values per token over groups of gv = min(p, d) channels of one
 * head (the last group shorter when gv does not divide d). Code c of a group stands for
 * z + s·c, its zero z and scale s kept in f32. Codes are packed 8/bits to a byte: channel c of a
 * row is in byte c·bits/8 at bit (c % (8/bits))·bits. The arrays are backend buffers the caller
 * allocates (for cap positions, cap a multiple of p) and owns; ops borrow them. */
struct backend_kivi {
	uint8_t *kc;	/* (cap, n_kv, d·bits/8) key codes */
	float *kzs;	/* (cap/p, n_kv, 2, d) key z, then s, per group and channel */
	uint8_t *vc;	/* (cap, n_kv, d·bits/8) value codes */
	float *vzs;	/* (cap, n_kv, 2, ceil(d/gv)) value z, then s, per token and group */
	int bits;	/* 1 or 2, with d·bits a multiple of 8 */
	int p;		/* tokens per key group */
	int gv;		/* channels per value group: min(p, d) */
	int n_kv, d;
};

/* The rows one decode step of `specache` attends to (docs/design.md §5): positions
 * [0, n_quant) from the KIVI copy q, except where KV head h has an exact row; positions
 * [n_quant, n_quant + n_dense) exact. Exact rows are in the attention's kv_dtype. */
struct backend_kivi_attn {
	const struct backend_kivi *q;
	int64_t n_quant;
	/* Exact rows fetched for this step: KV head h reads fk, fv (n_kv, n_f, d) row h·n_f + i
	 * at position fpos[h·n_f + i]; fpos (n_kv, n_f) int32 is a backend buffer, -1 marks an
	 * unused row, and a head's positions are distinct and below n_quant. n_f may be 0. */
	const void *fk, *fv;
	const int32_t *fpos;
	int n_f;
	const void *k, *v;	/* (n_dense, n_kv, d): the residual, then the step's rows */
	int64_t n_dense;
	/* (optional, NULL) probs (n_kv, n_prob) f32, a backend buffer: the attention probability
	 * of the last query row at positions [0, n_prob), averaged over the query heads of each KV
	 * head; n_prob <= n_quant + n_dense. */
	float *probs;
	int64_t n_prob;
};

/* Shared geometry of an attention call. */
struct backend_attn {
	int n_heads;	/* query heads */
	int n_kv_heads;
	int head_dim;
	enum fkv_dtype kv_dtype;
	float scale;	/* usually 1/sqrt(head_dim) */
	int64_t window;	/* sliding window (Mistral v0.1): keys a prefill query sees, itself
			 * included; 0 = all. Decode reads what the spans hold. */
};

/* One sequence's query row in a batch-wide decode attention (attn_decode_batch): the row of q
 * and out it is, and either one dense span (slots NULL; as attn_decode with one span) or a
 * slot buffer and its page lists (as attn_decode_slots; list and n_tok host memory). a is
 * the attention as that single call would get it (kv_dtype: the span's or the slots'). */
struct backend_attn_item {
	int64_t row;
	struct backend_kv_span span;
	const void *slots;
	int n_slots, max_pages, p;
	const int32_t *list, *n_tok;
	struct backend_attn a;
};

/* The geometry of a select_pages call: candidates [cand_begin, cand_begin + n_cand) of the
 * page_stride pages a head's summaries hold, k kept per KV head (0 <= k <= n_cand). */
struct backend_select {
	int n_q, n_kv, d;
	int page_stride;
	int cand_begin, n_cand;
	int k;
};

struct backend_graph; /* graph_run's recorded work, the backend's own */

struct backend_ops {
	const char *name;
	/* Backend buffers are host memory: ops may also be handed host pointers (the pinned host
	 * copy's blocks), as refreshkv's full step does on the CPU backend (docs/design.md §5). */
	bool host_memory;
	void (*free)(void *ctx);

	/* Memory. buf_alloc returns NULL when out of memory. */
	void *(*buf_alloc)(void *ctx, size_t bytes);
	void (*buf_free)(void *ctx, void *buf);
	int (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes);
	int (*download)(void *ctx, void *host_dst, const void *src, size_t bytes);
	int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
	/* Converts n f32 values to dtype t (a KV append). */
	int (*convert)(void *ctx, void *dst, enum fkv_dtype t, const float *src, int64_t n);
	/* Copies rows idx[i] of src (rows, cols) to row i of dst; idx (n) is a backend buffer. */
	int (*gather_rows)(void *ctx, float *dst, const float *src, int64_t cols,
			   const int32_t *idx, int64_t n);

	/* (optional) De-interleaves the columns of src (rows, cols[0] + .. + cols[n - 1]) into
	 * dst[i] (rows, cols[i]), i < n, in that order: a fused GEMM's rows [q | k | v] (or
	 * [gate | up]) into the separate matrices the ops after it read (docs/design.md "The GPU
	 * decode step"). No dst may overlap src. */
	int (*split_cols)(void *ctx, float *const *dst, const int64_t *cols, int n,
			  const float *src, int64_t rows);

	/* Weights: make a model tensor resident / release it. */
	int (*weight_load)(void *ctx, const struct fkv_tensor *src, struct backend_mat *dst);
	void (*weight_release)(void *ctx, struct backend_mat *w);
	/* (optional) weight_load for a weight only embed reads (a row per token): a backend may
	 * leave it where it lies where weight_load would copy it (the CPU backend's huge pages).
	 * Without it, weight_load. */
	int (*weight_load_rows)(void *ctx, const struct fkv_tensor *src, struct backend_mat *dst);
	/* (optional) Makes n model tensors of one dtype and one column count resident as one
	 * weight, stacked by rows (the fused QKV and gate/up GEMMs of docs/design.md "The GPU
	 * decode step": one matmul gives a token's [q | k | v] row). The backend owns the copy
	 * until weight_release; the caller may view part i as the rows at its offset (a
	 * backend_mat with priv NULL, which weight_release frees nothing of). -EINVAL when the
	 * parts do not stack, -EOPNOTSUPP when one is quantized (those keep separate GEMMs). */
	int (*weight_concat)(void *ctx, const struct fkv_tensor *const *parts, int n,
			     struct backend_mat *dst);

	/* y (n, w.rows) = x (n, w.cols) · wᵀ, w in its dtype. */
	int (*matmul)(void *ctx, float *y, const float *x, const struct backend_mat *w, int64_t n);
	/* y (n, dim) = x / rms(x) * w, w (dim) in its dtype. y may equal x. */
	int (*rmsnorm)(void *ctx, float *y, const float *x, const struct backend_mat *w,
		       int64_t n, int64_t dim, float eps);
	/* In place on x (n, n_heads, head_dim); pos (n) is a backend buffer of positions. */
	int (*rope)(void *ctx, float *x, int64_t n, int n_heads, int head_dim, const int32_t *pos,
		    const struct backend_rope *r);
	/* out (n) = silu(gate) * up. out may equal gate. */
	int (*silu_mul)(void *ctx, float *out, const float *gate, const float *up, int64_t n);
	/* y (n) += x (n). */
	int (*add)(void *ctx, float *y, const float *x, int64_t n);
	/* y (n, b.rows) += b for every row; b (b.rows) in its dtype. */
	int (*add_bias)(void *ctx, float *y, const struct backend_mat *b, int64_t n);
	/* out (n, table.cols) = table[ids[i]]; ids (n) is a backend buffer, already range-checked. */
	int (*embed)(void *ctx, float *out, const struct backend_mat *table, const int32_t *ids,
		     int64_t n);
	/* Row-wise softmax in place on x (rows, cols). */
	int (*softmax)(void *ctx, float *x, int64_t rows, int64_t cols);
	/* Causal prefill attention for one sequence. q (n_q, n_heads, d) holds the queries of the
	 * last n_q of n_ctx cached tokens; k, v (n_ctx, n_kv, d) dense in a.kv_dtype. Query i sees
	 * keys 0 .. n_ctx - n_q + i (only the last a.window of them with a window). out (n_q,
	 * n_heads, d). */
	int (*attn_prefill)(void *ctx, float *out, const float *q, int64_t n_q, const void *k,
			    const void *v, int64_t n_ctx, const struct backend_attn *a);
	/* Decode attention for one token of one sequence over every key of the spans (the set of KV
	 * positions a policy chose). q (n_heads, d), out (n_heads, d). */
	int (*attn_decode)(void *ctx, float *out, const float *q,
			   const struct backend_kv_span *spans, int n_spans,
			   const struct backend_attn *a);

	/* (optional) Decode attention where each KV head reads its own keys: the spans of KV head
	 * h are spans[first[h] .. first[h + 1]) (first has n_kv + 1 entries, host memory), each
	 * span laid out as for attn_decode (its rows start at head 0; the op adds h * d). Every
	 * query head of the group reads its KV head's spans. Equals attn_decode applied head by
	 * head. q (n_heads, d), out (n_heads, d). */
	int (*attn_decode_heads)(void *ctx, float *out, const float *q,
				 const struct backend_kv_span *spans, const int *first,
				 const struct backend_attn *a);

	/* (optional) Decode attention of one token over whole pages of a slot buffer, the device
	 * layout of the paged policies (docs/design.md §3, §5 step 4): slots (n_slots, 2, p, n_kv,
	 * d) NHD in a->kv_dtype (f32, f16 or bf16; each slot a page's K rows, then its V rows) is
	 * a backend buffer; KV head h reads n_tok[h] tokens from the slots
	 * list[h * max_pages + i] for i < ceil(n_tok[h] / p), in that order — every page full
	 * (p tokens) but the last, which holds the remaining n_tok[h] - (pages - 1) * p tokens —
	 * and every query head of its group reads the same pages. Heads may read different
	 * numbers of pages (hardkv's per-head budgets, §5). list (n_kv, max_pages) and n_tok
	 * (n_kv) are host memory; every entry read in [0, n_slots), every n_tok[h] in
	 * [1, max_pages * p]. Equals attn_decode_heads over the same rows (on CUDA the split-K
	 * flash-decoding kernel, reading 16-bit K/V and accumulating in f32). q (n_heads, d), out
	 * (n_heads, d). -EINVAL for a bad geometry, dtype, count or slot index. */
	int (*attn_decode_slots)(void *ctx, float *out, const float *q, const void *slots,
				 int n_slots, const int32_t *list, int max_pages,
				 const int32_t *n_tok, int p, const struct backend_attn *a);

	/* (optional) Decode attention of n sequences' query rows in one call (one launch per
	 * layer for a decode batch, docs/design.md "The GPU decode step"): item i equals
	 * attn_decode over its span, or attn_decode_slots over its slots, on rows items[i].row
	 * of q and out (rows, n_heads, d); the CPU backend runs exactly those calls, CUDA one
	 * launch for the dense items and one for the slot items (of one geometry; others go
	 * alone). Every host array is read before the call returns. -EINVAL as the single calls
	 * would return it (the CPU backend has run the items before the bad one; CUDA checks
	 * them all first and queues nothing). */
	int (*attn_decode_batch)(void *ctx, float *out, const float *q,
				 const struct backend_attn_item *items, int n);

	/* (optional) refreshkv's full step (docs/design.md §5) as the two passes of decode
	 * attention for one query, over keys given as for attn_decode_heads (KV head g reads
	 * spans[first[g] .. first[g + 1]), keys numbered from 0 across them). attn_scores: s
	 * (n_heads, ld) f32, s[h][j] = scale * q_h . k_j, the very scores attn_decode softmaxes.
	 * attn_accum: out (n_heads, d) = (accumulate: +=) sum_j p[h][j] * v_j in key order, the
	 * very sum attn_decode ends with, so chained calls over consecutive key ranges equal one
	 * call over all of them. With the softmax op between the two: attn_decode's bits. q
	 * (n_heads, d); s, p and out backend buffers. */
	int (*attn_scores)(void *ctx, float *s, int64_t ld, const float *q,
			   const struct backend_kv_span *spans, const int *first,
			   const struct backend_attn *a);
	int (*attn_accum)(void *ctx, float *out, const float *p, int64_t ld,
			  const struct backend_kv_span *spans, const int *first, bool accumulate,
			  const struct backend_attn *a);
	/* (optional) refreshkv's new partial sets on the backend: from probs (n_q, ld) (rows of T
	 * probabilities), per KV head h the B positions of highest u_h, u_h[j] the max of the
	 * group's probabilities over [j-3, j+3] clipped to [0, T), ties to the lower position,
	 * ascending, into pos (n_kv, B) int32 with their u_h in uval (n_kv, B) f32, both host
	 * memory: refresh_topk() of worker/kvcache/refresh_select.c, bit for bit. Without it the
	 * policy downloads probs and runs that function. */
	int (*pool_topk)(void *ctx, int32_t *pos, float *uval, const float *probs, int64_t ld,
			 int n_q, int n_kv, int64_t T, int B);
	/* (optional) Head slices of rows: for each entry (dst_row, src_row, head) of map (n, 3)
	 * int32 (host memory), dst[dst_row][head] (d) = src[src_row][head]; dst and src are
	 * (rows, n_kv, d) f32 backend buffers, possibly the same one, and no two entries write
	 * the same slice or read one another writes. */
	int (*gather_heads)(void *ctx, float *dst, const float *src, const int32_t *map, int n,
			    int n_kv, int d);

	/* (optional) The device half of a recall (docs/design.md §3, §5): n recall units in host memory,
	 * units (n, 2, p, d) in unit_dt (one KV head's K rows, then V rows, as layout.h stores a
	 * head of a block), each scattered into head heads[i] of the NHD slot slots[i]
	 * (2, p, n_kv, d) in slot_dt, a backend address. May be called from one thread besides the one
	 * queueing the other ops (the recall thread); the units are consumed before it returns,
	 * so the caller may reuse them at once. The scatter is ordered after every op queued
	 * before the call and before every op queued after it returns (on CUDA: by events between
	 * the recall streams and the compute stream; on the CPU: done on return) — or, with a
	 * fence `done` (fence_new), only before the ops queued after a fence_stream_wait on it:
	 * the per-layer event of docs/design.md §5 step 6, so a speculative recall of layer l
	 * holds up nothing until step t+1 reaches layer l. No two units may name the same (slot,
	 * head). */
	int (*recall_units)(void *ctx, void *const *slots, const int *heads, const void *units,
			    int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
			    enum fkv_dtype slot_dt, void *done);
	/* (optional) recall_units with every unit read where it lies, no copy on the host
	 * (docs/design.md "The GPU decode step": recall straight from the registered pool):
	 * srcs[i] is unit i (2, p, d) in unit_dt in host memory (a pinned block of the kvstored
	 * pool's mapping; on CUDA a DMA source when host_register covers it, else staged by the
	 * driver), DMA'd into the device staging (cudaMemcpyBatchAsync where the toolkit has it,
	 * else a run of cudaMemcpyAsync) and scattered as recall_units does. Ordered as
	 * recall_units; every source has been read when the call returns, so the caller may
	 * unpin them then. */
	int (*recall_direct)(void *ctx, void *const *slots, const int *heads,
			     const void *const *srcs, int n, int p, int n_kv, int d,
			     enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done);
	/* (optional) recall_direct's zero-copy variant: the device reads every unit itself
	 * through the mapped pool (on CUDA kernels/recall_gather over the aliases host_register
	 * keeps), with no staging and no DMA call per unit. -EOPNOTSUPP, nothing queued, when a
	 * unit lies outside what the backend mapped. The CPU backend's is recall_direct. */
	int (*recall_mapped)(void *ctx, void *const *slots, const int *heads,
			     const void *const *srcs, int n, int p, int n_kv, int d,
			     enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done);
	/* (optional) recall_direct moving each unit as 2p per-token pieces of d values (its K
	 * rows, then its V rows), as a host copy in NHD layout would need: the fragmented
	 * transfers of the layout ablation (docs/design.md §5 "Ablations"), one DMA a piece on
	 * CUDA, a copy a row on the CPU. Same result as recall_direct. */
	int (*recall_fragmented)(void *ctx, void *const *slots, const int *heads,
				 const void *const *srcs, int n, int p, int n_kv, int d,
				 enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done);
	/* (optional) The dtype of the paged policies' slots for a sequence whose KV dtype is kv
	 * (docs/design.md §3 "Device slots"): the CUDA backend keeps the KV dtype itself (half the
	 * bytes of f32 in slot memory, recall scatter and attention); NULL means f32 (the CPU
	 * backend, whose f32 slots hold the KV dtype's values exactly). Either way a slot holds
	 * exactly the values of the host copy. */
	enum fkv_dtype (*slot_dtype)(void *ctx, enum fkv_dtype kv);

	/* (optional) The offload half of a write-through (docs/design.md §3, §5): backend rows k, v
	 * (n_tok, n_kv, d) f32 into host page blocks (HND, dt), token i to block (t0 + i) / p,
	 * row (t0 + i) % p, exactly as layout_store_tokens writes them; blocks (host memory) holds
	 * one pointer per page touched, (t0 + n_tok + p - 1) / p of them, 0 <= t0 < p. The rows
	 * are read after every op queued before the call, and ops queued after it may overwrite
	 * k, v at once (the op owns what it still has to read). The stored bytes are visible on
	 * the host only after sync(), the fence before anything reads them (a COMMIT, a debug
	 * check, a host store to the same block). -EOPNOTSUPP when a block is not where the
	 * backend can write it (on CUDA: outside the ranges of host_register); nothing is
	 * queued then, and the caller downloads the rows instead. */
	int (*store_rows)(void *ctx, void *const *blocks, int t0, const float *k, const float *v,
			  int n_tok, int p, int n_kv, int d, enum fkv_dtype dt);
	/* (optional) Rounds x (n) f32 in place to dtype dt and back (round to nearest even, like
	 * dtype.c), so a slot holds exactly what a block of dt holds. */
	int (*round_to)(void *ctx, float *x, int64_t n, enum fkv_dtype dt);

	/* Selection on the backend (docs/design.md §5 "Selection" and "The GPU decode step"): the
	 * paged policies keep page summaries, queries and the selection's outputs in backend
	 * buffers, so a decode step downloads no query and no page. The CPU backend's ops call
	 * select.c; the CUDA backend's are the kernels page_summary, page_score,
	 * topk_pages_changed and qcos. All pointers but the geometry (and select_pages' resident
	 * mask) are backend buffers. */

	/* (optional) Min and max over the p keys of one NHD slot (2, p, n_kv, d) in slot_dt (its
	 * K rows) into page `page` of kmin, kmax (n_kv, page_stride, d) f32, for every KV head:
	 * select_page_summary head by head, exact. */
	int (*page_summary)(void *ctx, float *kmin, float *kmax, int page_stride, int page,
			    const void *slot, enum fkv_dtype slot_dt, int p, int n_kv, int d);
	/* (optional) select_topk over candidates [g->cand_begin, + g->n_cand): q (n_q, d) f32;
	 * kmin, kmax (n_kv, page_stride, d) f32; pages (n_kv, k) int32, each head's top k
	 * ascending (ties to the lower page); resident (n_kv, page_stride) uint8 — HOST memory,
	 * read before the call returns (staged like attn_decode_slots' list, so the host never
	 * waits for a copy) — non-zero where the head already holds the page on the device;
	 * changed (n_kv, k) int32 the selected pages not resident, ascending, padded with -1, and
	 * n_changed (n_kv) int32 their counts. The page lists equal select_topk's exactly;
	 * -EINVAL for a bad geometry. */
	int (*select_pages)(void *ctx, const struct backend_select *g, const float *q,
			    const float *kmin, const float *kmax, const uint8_t *resident,
			    int32_t *pages, int32_t *changed, int32_t *n_changed);
	/* (optional) FreeKV's correction check: out (n_kv) f32, per KV head the mean over its
	 * query group of cos(q_t, q_prev), q_t, q_prev (n_q, d) f32; select_group_cosine. */
	int (*group_cosine)(void *ctx, float *out, const float *q_t, const float *q_prev, int n_q,
			    int n_kv, int d);

	/* (optional, all five or none) Downloads that do not wait: host_alloc gives host memory a
	 * device can copy into without staging (page-locked on CUDA), released by host_free;
	 * download_async queues a copy of src into such memory after every op queued before and
	 * marks its completion on a fence (fence_new / fence_free; reusable: each call re-arms
	 * it); fence_wait blocks until the last copy marked on the fence has landed, and may be
	 * called from any thread (the recall thread waits there for a selection, never the
	 * compute thread). On the CPU the copy is done on return. */
	void *(*host_alloc)(void *ctx, size_t bytes);
	void (*host_free)(void *ctx, void *p);
	int (*fence_new)(void *ctx, void **fence);
	void (*fence_free)(void *ctx, void *fence);
	int (*download_async)(void *ctx, void *host_dst, const void *src, size_t bytes,
			      void *fence);
	int (*fence_wait)(void *ctx, void *fence);
	/* (optional, with the recall ops' `done`) Orders every op queued after the call after
	 * the last work marked on fence (on CUDA the compute stream waits on its event; nothing
	 * waits on the host). The CPU backend has nothing to order. */
	int (*fence_stream_wait)(void *ctx, void *fence);
	/* (optional) Quantises positions [t0, t0 + n) of q — whole key groups: t0 and n multiples
	 * of q->p — from rows k, v (n, n_kv, d) in dtype dt, as docs/design.md §5 `specache`
	 * defines: per group its min mn and max mx; bits 2: z = mn, s = (mx − mn)/3; bits 1:
	 * z = (3mn + mx)/4, s = (mx − mn)/2; code = clamp(floor((x − z)/s + 0.5), 0, 2^bits − 1),
	 * 0 when s = 0; all of it in double, z and s then stored as f32. -EINVAL for a bad
	 * geometry. */
	int (*kivi_quant)(void *ctx, const struct backend_kivi *q, int64_t t0, const void *k,
			  const void *v, int64_t n, enum fkv_dtype dt);
	/* (optional) Positions [t0, t0 + n) of q into rows k, v (n, n_kv, d) f32: each value
	 * fmaf(s, code, z), one rounding, so every backend gives the same bits. */
	int (*kivi_dequant)(void *ctx, float *k, float *v, const struct backend_kivi *q,
			    int64_t t0, int64_t n);
	/* (optional) Causal attention of the n_q query rows q (n_q, n_heads, d) of one sequence,
	 * at the last n_q positions of ka (query i at position n_quant + n_dense − n_q + i sees
	 * every position up to its own; 1 <= n_q <= n_dense), over the rows ka describes:
	 * dequantised as kivi_dequant gives them, or exact. out (n_q, n_heads, d); with
	 * ka->probs, the last row's probabilities too. Equals attn_prefill over the same rows when
	 * n_quant is 0 (on the CPU bit for bit, and so when every quantised position has an exact
	 * row). a->window must be 0. -EINVAL for a bad geometry or position. */
	int (*attn_kivi)(void *ctx, float *out, const float *q, int n_q,
			 const struct backend_kivi_attn *ka, const struct backend_attn *a);

	/* (optional) Graphs of device work (docs/design.md "The GPU decode step", CUDA Graphs):
	 * runs the ops fn(arg) issues on the compute stream, as a graph recorded once and
	 * replayed. With *g NULL, or recorded before the backend last moved a buffer of its own
	 * (a workspace grown), fn is recorded into a new graph (the old one freed) and launched;
	 * otherwise *g is launched and fn is not called. fn must issue only ops whose arguments
	 * are fixed between calls (buffer addresses and sizes; data that changes, such as
	 * positions, read from backend buffers): no host reads, syncs, downloads or uploads. When
	 * recording fails (an op that cannot be recorded, such as a workspace that must grow),
	 * fn runs as plain ops instead and *g stays NULL. Returns 0 when *g was launched, 2 when
	 * fn was recorded into *g and launched, 1 when fn ran as plain ops, a negative errno on
	 * error. */
	int (*graph_run)(void *ctx, struct backend_graph **g, int (*fn)(void *arg), void *arg);
	/* (optional, with graph_run) Frees a graph of graph_run. Safe on NULL. */
	void (*graph_free)(void *ctx, struct backend_graph *g);

	/* (optional) Waits until every queued op has finished (store_rows included). */
	int (*sync)(void *ctx);
	/* (optional) Sets the number of compute threads. */
	int (*set_threads)(void *ctx, int n);
	/* (optional) The number of compute threads ops use. */
	int (*get_threads)(void *ctx);

	/* (optional) Page-locks the host range [ptr, ptr + bytes) (the worker's mapping of the
	 * kvstored pool) so that copies between it and backend memory run as DMA and store_rows
	 * may write it from the device. On failure
	 * nothing stays registered and err says why (the locked-memory limit, LimitMEMLOCK, when
	 * the system refused). Registrations left at backend_free() are undone. */
	int (*host_register)(void *ctx, void *ptr, size_t bytes, char *err, size_t errlen);
	/* (optional) Undoes host_register(ptr); -ENOENT when ptr was not registered. */
	int (*host_unregister)(void *ctx, void *ptr);
};

/* A backend: ops plus private state. Allocated by the backend's constructor, freed by
 * backend_free(). */
struct backend {
	const struct backend_ops *ops;
	void *ctx;
};

/* The CPU backend (always built): f32 compute with OpenBLAS and OpenMP. threads sets the OpenMP
 * pool (<= 0 keeps its default, one per core); OpenBLAS is set to one thread and called from
 * inside the OpenMP tasks, so only one pool ever runs. The pool is per process: the last
 * thread count set wins for every CPU backend. Returns 0 or -ENOMEM. */
int backend_cpu_new(struct backend **out, int threads);

/* The CUDA backend on device `device` (worker/backend/backend_cuda.c): every op a kernel of kernels/ or
 * a cuBLAS GEMM on a compute stream; recall on streams of its own, ordered by events. -ENODEV
 * when the device does not exist or the build has no CUDA support; -ENOMEM, -EIO when CUDA
 * setup fails (printed to stderr). */
int backend_cuda_new(struct backend **out, int device);

/* CUDA devices usable by backend_cuda_new (0 without CUDA support or a driver). */
int backend_cuda_devices(void);

/* The backend called name: "cpu", "cuda" (device 0) or "auto"/NULL (cuda when a device is
 * present, else cpu). threads goes to the CPU backend. On failure err says why (-ENODEV for
 * cuda without a device, -EINVAL for an unknown name). */
int backend_open(const char *name, int threads, struct backend **out, char *err, size_t errlen);

/* Frees the backend and everything it still owns. Safe on NULL. */
void backend_free(struct backend *be);

#endif
