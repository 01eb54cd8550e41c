/* dataplane_priv — the data plane's state, shared by its source files: dataplane.c (ring ops,
 * leases, demotion, promotion), dataplane_persist.c (group commit and journal records),
 * dataplane_swap.c (DRAM <-> NVMe swaps when both tiers are full)
 * and dataplane_thread.c (the data-plane thread and its lock). Private to those files; everyone
 * else uses dataplane.h. */
#ifndef FREEKV_DATAPLANE_PRIV_H
#define FREEKV_DATAPLANE_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dataplane.h"
#include "pool.h"
#include "prefix.h"
#include "ring.h"
#include "tier.h"
#include "tier_prewrite.h"

#define DP_RECALL_MAX 32u
#define DP_DEMOTE_QUEUE 64u		/* sequences whose explicit demotion is still going */
#define DP_SWAP_MAX 8u			/* swaps in flight at once */
#define DP_SWAP_RETRY_US 100000u	/* between attempts to write a page back after a failed swap */
#define DP_ALLOC_RETRY_MS 10		/* an op waiting for room is retried at least this often */
#define DP_DEMOTE_INFLIGHT 32u	/* watermark demotions writing at once */
#define DP_DEMOTE_UNWRITTEN_CALL 256u	/* a sequence's blocks taken back by their kept copies
					 * in one call (Demote), the rest in later passes */
#define DP_REAP_MAX 32u		/* tier completions one pass of the thread reaps (dp_run) */

/* Tier request cookies: kind << 32 | block id (or swap slot for DP_COOKIE_SWAP). */
enum { DP_COOKIE_WRITE = 1, DP_COOKIE_READ = 2, DP_COOKIE_SWAP = 3, DP_COOKIE_OFFREAD = 4,
       DP_COOKIE_ZERO = 5 /* tier_prewrite's piece */ };
#define DP_OFFLOAD_MAX 64u		/* NVMe -> remote moves in flight at once */

/* One NVMe -> remote move: the block's bytes, read from NVMe, on their way to Redis. */
struct dp_offload {
	uint32_t block;
	void *buf;			/* NULL: the slot is free */
	uint64_t remote_id;
};

struct dp_lease {
	uint32_t block;	/* POOL_NO_BLOCK when the slot is free */
	uint32_t gen;
	uint64_t seq_id;	/* the sequence it was taken through (a shared block has several) */
};

/* A ring op that waits: an ALLOC for room, a RECALL for promotions (or for room). */
struct dp_pending {
	struct ring_entry e;
	uint32_t blocks[DP_RECALL_MAX];
	uint64_t lease_ids[DP_RECALL_MAX];	/* 0: not leased yet */
	uint64_t t0_us;
	uint64_t deadline_us;			/* waiting for room: fails with ENOSPC past this (0: none) */
	bool room;				/* waited for room (room_wait): may keep units for its class */
	unsigned room_cls;			/* that class (valid with room) */
	struct dp_pending *next;
};

/* One swap (dataplane_swap.c): block moves NVMe -> DRAM into victim's slot, victim moves to
 * block's extent. READ: block's extent -> bounce (crc checked); WRITE: victim's DRAM bytes ->
 * the extent; then the bounce is copied into the victim's slot and both descriptors commit.
 * RESTORE: the write failed, the bounce (block's verified bytes) is being written back. */
enum dp_swap_phase { DP_SWAP_FREE = 0, DP_SWAP_READ, DP_SWAP_WRITE, DP_SWAP_RESTORE };

struct dp_swap {
	uint8_t phase;			/* enum dp_swap_phase */
	bool restore_waiting;		/* RESTORE: no write in flight, retry at restore_at_us */
	uint32_t block, victim;
	uint64_t nvme_off;
	uint32_t bytes;
	uint32_t restore_tries;
	uint64_t restore_at_us;
	void *bounce;			/* (bounce_bytes,) TIER_ALIGN-aligned, kept for the next swap */
	uint32_t bounce_bytes;
};

struct dp_worker {
	uint32_t wid;
	struct ring *ring;
	struct dp_lease *leases;	/* (cap,) */
	uint32_t *free_slots;		/* (cap,) stack of free lease slots */
	uint32_t cap, n_free, n_leases;
	struct dp_pending *pending;
	bool corrupt_logged;		/* "ring corrupted" was logged for this worker */
	uint64_t last_op_ms;		/* when its ring last carried an op (dp_now_us clock) */
};

/* A completion waiting for the journal's group commit (see dp_flush_completions). */
struct dp_done {
	uint32_t wid;
	uint64_t t0_us;			/* when the submission was popped (dp_now_us clock) */
	uint64_t gen;			/* the journal sync generation that covers it (persist_need) */
	struct ring_entry e;
};

/* NVMe extents freed by a move whose record is not durable yet (dp_extent_free): reused only
 * once a sync covers it (docs/design.md §4). [0, tagged) carry the generation that does;
 * [tagged, n) were freed in this pass and are tagged at its end, after its records. */
struct dp_limbo_ext {
	uint64_t off, gen;
	uint32_t len;
};

struct dp_limbo {
	struct dp_limbo_ext *v;
	size_t head, tagged, n, cap;
};

struct persist;

/* Demotion victims found by one walk of the pool's lru list and used over several passes
 * (demote_to): on a full pool whose blocks all belong to attached sequences the walk cannot
 * stop early, so it is paid once per DP_VQ_MAX victims, not once per pass. The walk itself is
 * spread over the data plane's passes, DP_VQ_STEP blocks each (a whole walk of half a million
 * blocks took 10-37 ms, which every ring op and control request waited out; 8192 a step still
 * took 0.3-1 ms), and starts when
 * the queue runs low, so the next queue is ready before this one is used up. */
#define DP_VQ_MAX 16384
#define DP_VQ_MAX_AGE_MS 1000
#define DP_VQ_STEP 2048

struct dp_vq {
	uint32_t *id;
	uint64_t *lru;			/* as found: a block touched since is no victim */
	size_t n, at;
	uint64_t t_ms;			/* when found */
	struct pool_scan scan;		/* the next queue, while scanning */
	bool scanning;
};

struct dp {
	const struct cfg *cfg;
	struct persist *ps;		/* durable metadata; NULL: persistence off (borrowed) */
	struct dp_done *outbox;		/* (cap_outbox,) completions not posted yet */
	size_t n_outbox, cap_outbox;
	struct dp_limbo limbo;
	struct seq_table *seqs;
	struct pool *pool;
	struct tier *tier;
	struct dp_vq vq;
	pthread_mutex_t lock;		/* see dp_lock */
	pthread_t thread;
	bool thread_running;		/* written by the control-plane thread only */
	_Atomic bool thread_stop;
	_Atomic uint32_t kick;		/* private futex word: wakes the sleeping data-plane thread */
	_Atomic uint32_t ctl_waiting;	/* control-plane threads waiting in dp_lock */
	struct dp_worker *w;		/* (max_workers,) slots with ring NULL are free */
	size_t max_w;
	uint64_t demoted, promoted, crc_errors, demoting;
	uint64_t demoted_unwritten;	/* of demoted: onto the extent their promotion kept */
	uint64_t kept_reclaimed;	/* kept extents let go because the tier was full */
	bool wm_demoting;		/* above the high watermark, not yet down to the low one */
	struct dp_opstat ops[DP_N_OPS];
	char ring_prefix[CFG_STR_MAX];
	uint64_t demote_q[DP_DEMOTE_QUEUE];	/* sequence ids, see demote_queue_run */
	size_t n_demote_q;
	struct dp_swap swaps[DP_SWAP_MAX];
	uint64_t swapped, swap_failures;
	uint64_t reclaims;		/* blocks demoted to give a slab unit to another class */
	struct tpw *tpw;		/* zeros still to write over the tier file; NULL: none */
	struct rio *rio;		/* remote tier below NVMe (dataplane_offload.c); NULL: none */
	struct dp_offload offl[DP_OFFLOAD_MAX];
	uint64_t next_remote_id;	/* the last remote_id given (journaled with its block) */
	uint64_t offloading, fetching, offloaded, fetched, remote_errors;
	bool offload_err_logged, pfx_err_logged;
	uint64_t offload_pause_until_us;	/* after a failed move: no watermark moves before */
	uint64_t offload_backoff_us;	/* doubles with each failure (1 s to 30 s), 0 after a success */
	uint64_t offload_q[DP_DEMOTE_QUEUE];	/* sequences an explicit remote demotion goes on for */
	size_t n_offload_q;
	struct prefix_index px;		/* dataplane_share.c */
	struct dp_prefix_stats pxs;	/* counters; indexed_pages and shared_blocks filled on read */
};

uint64_t dp_now_us(void);
/* The slot of worker wid (one with a ring), or NULL. */
struct dp_worker *dp_find_worker(const struct dp *dp, uint32_t wid);

/* The demotion and remote offload queues (demote_q, offload_q): whether sequence id waits in
 * one, and adding it (once; not when the queue is full). */
bool dp_queue_has(const uint64_t *q, size_t n, uint64_t id);
void dp_queue_add(uint64_t *q, size_t *n, uint64_t id);

/* The blocks an explicit demotion to NVMe moves, and those a remote offload moves (the walks
 * that move them, the replies' counts and ShowSequence's in_flight all ask these). */
static inline bool dp_demote_moves(const struct pool_block *b)
{
	return b->tier == POOL_TIER_DRAM && b->committed && !b->leases;
}

static inline bool dp_offload_moves(const struct pool_block *b)
{
	return b->tier == POOL_TIER_NVME && b->committed && !b->doomed && b->has_crc;
}
/* Posts the completions queued since: a worker never hears of a COMMIT, or gets a slot a move
 * freed (an ALLOC), before the journal sync that covers it is done. With the data-plane thread
 * running that sync runs on the journal's thread (persist_sync_start) and those completions
 * wait in the outbox meanwhile, the others go out at once; without it, the caller syncs. */
void dp_flush_completions(struct dp *dp);
/* Frees an NVMe extent that a move (journaled before the end of this pass) left: at once
 * without the data-plane thread (its passes sync before they submit I/O), else once a sync
 * covers the move. */
void dp_extent_free(struct dp *dp, uint64_t off, uint32_t len);
/* Lets go of block id's kept NVMe extent, if it has one (dp_extent_free). */
void dp_unkeep(struct dp *dp, uint32_t id);
/* End of a pass: tags this pass's freed extents, frees those a finished sync covers, writes the
 * journal's buffer and starts a sync when records wait for one. */
size_t dp_persist_pass(struct dp *dp); /* returns the extents it freed (dp_extent_free) */
/* Called on the journal's sync thread after each sync: wakes the data-plane thread. */
void dp_synced(void *ctx);
/* Stamps completion e as posted now, popped at t0_us (ring.h "Timing"). */
void dp_stamp_posted(struct ring_entry *e, uint64_t t0_us);
/* Journals block id of s where it is now (persist_block). */
void dp_log_block(struct dp *dp, uint32_t id);
/* The committed length of s moved from old: journals the blocks whose committed rows changed
 * (every layer's pages from the old tail page to the new one). dataplane_persist.c. */
void dp_log_committed(struct dp *dp, struct seq *s, uint64_t old);
/* Demotion's ranking of a DRAM block as a victim (pool_victims): -1 never (uncommitted), 0 a
 * detached or orphaned sequence's, 1 an attached one's; the swap ranks the same way. */
struct pool_block;
int dp_rank_victim(void *ctx, const struct pool_block *b);
/* dataplane_share.c. s stops referencing its block at (layer, page), which leaves its map: the
 * last reference frees the block (dooms it while its I/O runs), taking its page out of the
 * prefix index first; an earlier one leaves the block to the other sequences. */
void dp_block_unref(struct dp *dp, struct seq *s, uint32_t layer, uint32_t page);
/* A new committed DRAM block of class cls holding a copy of bytes[0..len), for sequence seq_id
 * at (layer, page), one reference; cached prefix pages give way when the pool is full.
 * -ENOSPC when there is no room even so. */
int dp_block_copy_new(struct dp *dp, unsigned cls, const void *bytes, uint32_t len,
		      uint64_t seq_id, uint32_t layer, uint32_t page, uint32_t *id);
/* Whether s maps block id (at the block's own layer and page). */
bool dp_seq_holds(const struct seq *s, const struct pool_block *b, uint32_t id);
/* A shared or indexed block: never written again (COMMIT refuses it with EROFS). */
bool dp_block_readonly(struct dp *dp, uint32_t id);
/* Takes block id's page out of the prefix index, dropping the index's reference on each of
 * its blocks (a block no sequence holds is freed). */
void dp_unindex(struct dp *dp, uint32_t id);
/* Calls fn for every sequence that maps block id (one scan of the table when it is shared). */
void dp_each_holder(struct dp *dp, uint32_t id, void (*fn)(struct dp *, struct seq *, uint32_t));
/* dataplane_offload.c: the remote tier. dp_remote_start opens its I/O thread when remote_url and
 * remote_tier are set (-EINVAL without an NVMe tier). dp_block_drop_storage frees a settled
 * block (DRAM, NVMe or remote) and its NVMe extent or Redis key. dp_fetch_start begins a RECALL's
 * read of a REMOTE block into DRAM (-ENOSPC: no slot; -EBUSY: queue full). */
int dp_remote_start(struct dp *dp, char *err, size_t errlen);
void dp_remote_stop(struct dp *dp);
int dp_remote_fd(const struct dp *dp);
int dp_remote_reap(struct dp *dp);
void dp_block_drop_storage(struct dp *dp, uint32_t id, struct pool_block *b);
int dp_fetch_start(struct dp *dp, uint32_t id);
/* remote_prefix: a copy of the page just indexed goes to Redis under its content key. */
void dp_prefix_remote_put(struct dp *dp, const uint8_t key[32], const uint32_t *blocks,
			  uint32_t n_layers);
void dp_offload_read_done(struct dp *dp, const struct tier_result *r);
void dp_offload_watermark(struct dp *dp);
void dp_offload_queue_run(struct dp *dp);
/* A block dropped while it moved (doomed) is freed once it has settled (dataplane.c). */
void dp_free_if_doomed(struct dp *dp, uint32_t id);
/* Every RECALL waiting for block fails with status (dataplane.c). */
void dp_fail_recalls_of(struct dp *dp, uint32_t block, int status);
/* block is DRAM-resident now: the RECALLs waiting for it take their leases at once. */
void dp_retry_recalls_of(struct dp *dp, uint32_t block);

/* dataplane_swap.c. dp_swap_start: block (NVMe-resident) cannot get a DRAM slot and nothing can
 * be demoted: start swapping it with the coldest unleased committed DRAM block of its class.
 * 0 started, -EBUSY no swap slot or tier request free now (try later), -ENOSPC no victim. */
int dp_swap_start(struct dp *dp, uint32_t block);
/* A tier completion whose cookie kind is DP_COOKIE_SWAP. */
void dp_swap_done(struct dp *dp, const struct tier_result *r);
/* Resubmits restore writes that failed (at most every DP_SWAP_RETRY_US). */
void dp_swap_retry(struct dp *dp);
/* True while block's swap failed half-way and its bytes are being written back. */
bool dp_swap_restoring(const struct dp *dp, uint32_t block);
/* Frees the bounce buffers (after the tier has drained). */
void dp_swap_shutdown(struct dp *dp);

/* Whether a victim scan is under way (the data-plane thread keeps running passes until it
 * ends). */
bool dp_scanning(const struct dp *dp);
void dp_vq_step(struct dp *dp);

#endif
