/* recall — the double-buffered recall stream of docs/design.md §5: copies one KV head's recall
 * unit per (layer, page, head) from the host copy into a staging buffer (a copy thread) while
 * the other staging buffer is converted HND -> NHD into the device slots (a convert thread):
 * with a backend, by its recall_units op (CPU: layout_scatter_unit; CUDA: an H2D copy and the
 * recall_scatter kernel queued on the backend's stream), else by layout_scatter_unit on host
 * slots (tests). With a backend that has recall_direct (recall_opts.path, below), the copy
 * thread copies nothing: a staging buffer holds where each pinned unit lies, and the convert
 * thread has the backend read it there (on CUDA a DMA from the registered pool, or a gather
 * kernel through the mapped pool). The two threads hand the two buffers back and forth with
 * explicit full/empty flags, so no buffer is written while it is being read.
 *
 * Work arrives as jobs in FIFO order; each job gets a ticket, and recall_wait(ticket) is the
 * completion event of that job (jobs complete in order, but for urgent jobs, which go first).
 * A job may carry a prepare callback that the copy thread runs first: it decides the job's
 * units (speculative selection runs there, beside the compute thread). A job borrows its unit
 * array, the slots it writes and the callback argument until its ticket completes; the caller
 * must not touch them before recall_wait.
 *
 * Ownership: recall_new() allocates the engine, its staging buffers and starts both threads;
 * recall_free() drains the queue, joins the threads and frees everything. Errors are 0 or
 * -errno; a failed job reports its error through recall_wait(), later jobs still run. */
#ifndef FREEKV_RECALL_H
#define FREEKV_RECALL_H

#include <stdbool.h>
#include <stdint.h>

#include "layout.h"

struct backend;
struct hostkv_seq;
struct recall;

/* How the units of a staging buffer reach a backend (docs/design.md "The GPU decode step"):
 * RECALL_MAPPED, the default: the device reads each unit where it lies in the pool, through
 * the pool's mapping (recall_mapped: a gather kernel; recall_direct for a buffer it cannot
 * map); RECALL_DMA: read where they lie, no host copy (recall_direct: on CUDA a batched DMA
 * into the device staging); RECALL_STAGED: copied into a host staging buffer first
 * (recall_units). A backend without the op a path needs takes the next one down (mapped, dma,
 * staged). Mapped is the default since it measured faster (bench/RESULTS.md, H200: 16 KiB
 * units at 0.91 of one large copy against 0.39 for batched DMA). */
enum recall_path { RECALL_MAPPED = 0, RECALL_STAGED = 1, RECALL_DMA = 2 };

/* One recall unit: head `head` of host page `page` of `layer` into head `head` of `slot`. */
struct recall_unit {
	int layer;
	int page;
	int head;
	void *slot; /* NHD (2, p, n_kv, d) in recall_opts.slot_dt: a backend address when
		     * recall_opts.be is set */
};

/* Runs on the copy thread before the job's units are copied; sets *units / *n (may be 0).
 * Returns 0 or -errno (the job then fails with it). */
typedef int (*recall_prepare_fn)(void *arg, struct recall_unit **units, int *n);

/* Where recall_unit pages come from: host, pinned a staging buffer's worth of units at a time
 * (hostkv_pin_many, one call per layer; unpinned once they are copied), or (tests) a callback,
 * per unit. */
typedef int (*recall_src_fn)(void *arg, int layer, int page, const void **block);

struct recall_opts {
	struct kv_geom g;	  /* host block geometry */
	int units_per_buffer;	  /* staging capacity in units; 0 = 64 */
	/* Jobs submitted and not yet waited for, plus those submitted while one of them waits:
	 * the job ring's size (tickets map to ticket % max_jobs; a submission whose entry is still
	 * unwaited blocks until it is). 0 = 64. */
	int max_jobs;
	struct hostkv_seq *host;  /* source of blocks; or src/src_arg when host is NULL */
	recall_src_fn src;
	void *src_arg;
	bool poison;		  /* fill a staging buffer with NaN bytes once converted (tests) */
	struct backend *be;	  /* borrowed: its recall_units op writes the slots; NULL: host */
	enum fkv_dtype slot_dt;	  /* the slots' dtype (backend slot_dtype); f32 without be */
	enum recall_path path;	  /* how units reach the backend (below) */
	/* Ablations (docs/design.md §5 "Ablations"): each unit moved as 2p per-token pieces, as
	 * from an NHD host layout (staged: a host copy a row; direct: the backend's
	 * recall_fragmented, -EOPNOTSUPP at recall_new without it; never mapped); one staging
	 * buffer instead of two, so that copying and converting take turns. */
	bool fragmented;
	bool single_buffer;
};

struct recall_done {
	int64_t units;		/* units copied */
	int64_t bytes;
	int64_t ns_busy;	/* copy-thread + convert-thread time copying and converting the
				 * job's units (not its prepare step) */
	int64_t ns_waited;	/* time recall_wait blocked */
	int64_t ns_hidden;	/* wall time from the first copy to the last conversion that
				 * recall_wait did not block for: the recall hidden beside the caller */
};

int recall_new(const struct recall_opts *o, struct recall **out);
void recall_free(struct recall *r);

/* Queues a job: units[0..n) or, with prepare, whatever it produces. *ticket identifies it. */
int recall_submit(struct recall *r, struct recall_unit *units, int n, recall_prepare_fn prepare,
		  void *arg, uint64_t *ticket);
/* recall_submit whose backend scatters do not order the backend's later ops at once: their
 * completion is marked on `done`, a fence of the backend's (fence_new), and the caller orders
 * what touches the job's slots after it with fence_stream_wait once the job is waited for
 * (docs/design.md §5 step 6: the per-layer recall event step t+1 waits on at layer l). The
 * fence is the job's until then. -EINVAL without a backend that has fence_stream_wait. */
int recall_submit_fenced(struct recall *r, struct recall_unit *units, int n,
			 recall_prepare_fn prepare, void *arg, void *done, uint64_t *ticket);
/* Queues a job that must not wait behind others (docs/design.md §5 step 3: a correction's
 * blocking recall): the copy thread takes it before any job not yet started (a job already
 * being copied finishes first); urgent jobs keep their own order. No prepare step. At most 4
 * urgent jobs unwaited at once (a fifth submission blocks until one is waited for). */
int recall_submit_urgent(struct recall *r, struct recall_unit *units, int n, uint64_t *ticket);
/* Blocks until the job of ticket has finished (a ticket of 0 is done at once); its result, and
 * its accounting in *done when not NULL. A ticket is waited for once. */
int recall_wait(struct recall *r, uint64_t ticket, struct recall_done *done);

#endif
