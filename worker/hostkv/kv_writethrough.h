/* kv_writethrough — how every KV policy keeps the host copy complete (docs/design.md §3): each appended
 * token's K and V go into its page block (HND, the sequence's dtype) as soon as the layer
 * produces them, the partial tail page rewritten step by step; and how a policy reads that copy
 * back (resume, recall, the debug checks).
 *
 * Two ways in. kv_wt_put() hands backend rows to the backend's store_rows op (the offload
 * stream on CUDA: the device writes the registered pool mapping, no download on the decode
 * path) and falls back, when the backend has no such op or cannot reach the blocks, to
 * kv_wt_fetch() + kv_wt_store(): a download into host scratch, converted on the host. Stores
 * through store_rows land asynchronously; kv_wt_fence() (the backend's sync) makes them
 * visible, and every host read or write of the copy in this module fences first. A COMMIT
 * must follow a fence too: the engine syncs the backend once per ubatch before committing.
 *
 * struct kv_wt is embedded in a policy state: kv_wt_init() borrows the host sequence (NULL: no
 * host copy, every store is a no-op) and allocates host scratch rows and the block pointer list
 * that kv_wt_free() frees. Backend buffers are reached only through backend ops, so the module
 * works on any backend. */
#ifndef FREEKV_KV_WRITETHROUGH_H
#define FREEKV_KV_WRITETHROUGH_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "layout.h"

struct hostkv_seq;

struct kv_wt {
	struct hostkv_seq *host; /* borrowed; NULL = no host copy */
	struct backend *be;	 /* borrowed */
	struct kv_geom g;	 /* block geometry: n_kv, page, head dim, KV dtype */
	float *k, *v;		 /* host scratch: (cap, n_kv, d) each */
	int64_t cap;
	void **blocks;		 /* store_rows block list: (cap_blocks) host pointers */
	int cap_blocks;
	bool dirty;		 /* store_rows queued since the last fence */
};

/* 0 or -ENOMEM / -EINVAL (page <= 0). */
int kv_wt_init(struct kv_wt *w, struct backend *be, struct hostkv_seq *host,
	       const struct backend_attn *a, int page);
void kv_wt_free(struct kv_wt *w);

/* Downloads n rows of backend k, v (n, n_kv, d) f32 into the scratch; *hk, *hv borrow it until
 * the next call. */
int kv_wt_fetch(struct kv_wt *w, const float *k, const float *v, int64_t n, const float **hk,
		const float **hv);
/* Writes host rows k, v (n, n_kv, d) f32 of positions [pos, pos + n) of a layer into their
 * page blocks (after a fence when stores are pending). No-op without a host copy. */
int kv_wt_store(struct kv_wt *w, int layer, int64_t pos, const float *k, const float *v,
		int64_t n);
/* Writes backend rows k, v (n, n_kv, d) f32 of positions [pos, pos + n) of a layer into their
 * page blocks: through store_rows when the backend has it and reaches the blocks (visible after
 * kv_wt_fence), else kv_wt_fetch + kv_wt_store. The backend may overwrite k, v with the next
 * op. No-op without a host copy. */
int kv_wt_put(struct kv_wt *w, int layer, int64_t pos, const float *k, const float *v,
	      int64_t n);
/* Waits until every store queued by kv_wt_put is in the host copy (the backend's sync); a
 * no-op when none is pending. */
int kv_wt_fence(struct kv_wt *w);
/* Reads positions [t0, t1) of a layer, every head, into rows k, v (t1 - t0, n_kv, d) f32: any
 * allocated block, committed or not (-ENOENT past them), pinned up to 32 pages at a time while
 * it is read (hostkv_pin_many: the pages not leased come back in one ring batch). -EINVAL
 * without a host copy. */
int kv_wt_load(struct kv_wt *w, int layer, int64_t t0, int64_t t1, float *k, float *v);

#endif
