/* dataplane — kvstored's block operations: the pool, the NVMe tier and one ring per worker,
 * driven from the daemon's single event loop.
 *
 * It serves the ring ops of ring.h (ALLOC, COMMIT, RECALL, RELEASE) for each registered worker
 * and checks every sequence id, layer, page, offset and lease id a worker sends against that
 * worker's own attachments, allocations and leases: a wrong one is an error completion, never
 * another sequence's block. Leases are recorded per worker (lease id = generation << 32 | slot).
 * A RECALL of NVMe-resident blocks promotes them through the tier and completes later; an ALLOC
 * that finds the pool full waits while demotion makes room and fails with -ENOSPC only when
 * nothing more can be demoted. When a promotion finds DRAM full and demotion can make no room
 * (the NVMe tier is full too), the page swaps places with an unleased committed DRAM block of
 * its class, chosen as demotion chooses (detached sequences first, then least recently used;
 * two tier I/Os through a bounce buffer, dataplane_swap.c); a failed read or write leaves both
 * pages intact where they were and fails the RECALL with that error. At most a ring's worth
 * of ops wait per worker (more get -EBUSY); a RECALL whose sequence is detached while it waits
 * fails with -ENOENT; an ALLOC of a page that would hold tokens at or past max_tokens gets -ERANGE.
 * Demotion runs between
 * dram_high_watermark and dram_low_watermark (read live from the config), choosing unleased
 * committed blocks, detached sequences first, then least recently used; its writes carry a
 * crc32c that every promotion verifies.
 *
 * Ownership: dp_init creates the pool (named shared memory), opens the tier and owns both, the
 * per-worker rings and lease tables; dp_shutdown drains in-flight I/O, destroys the rings and
 * unlinks the pool. The config and the sequence table are borrowed: dp edits sequences' block
 * maps and committed lengths but never frees a sequence.
 *
 * Threads: without dp_start everything runs on the caller's thread and nothing watches the ring
 * doorbells: the caller runs dp_run when it knows submissions arrived (the embedded store does,
 * after each push). After
 * dp_start a data-plane thread serves the rings: it spins over all submission rings for
 * DP_SPIN_NS after the last op, then sleeps on all their doorbells at once (futex_waitv), and
 * serves ring ops directly, so a ring round trip costs no eventfd or control-loop wake-up. The
 * pool, the tier, the rings' daemon side, the lease tables, the sequence table and the config
 * are then shared state under one mutex: the thread holds it while it serves, and the other
 * thread must hold it (dp_lock) around every dp_* call and every access to the sequence table
 * or the config — kvstored's control loop holds it except while it sleeps in zmq_poll. */
#ifndef FREEKV_DATAPLANE_H
#define FREEKV_DATAPLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "remote.h"
#include "seq.h"

struct dp;

enum dp_opstat_kind { DP_OP_ALLOC = 0, DP_OP_COMMIT, DP_OP_RECALL, DP_OP_RELEASE, DP_OP_INVALID, DP_N_OPS };

struct dp_opstat {
	uint64_t calls, errors, total_us;
};

struct dp_stats {
	uint64_t dram_bytes, dram_used_bytes, nvme_bytes, nvme_used_bytes;
	uint64_t blocks_dram, blocks_nvme, blocks_inflight;
	uint64_t demoted, promoted, crc_errors;
	uint64_t demoted_unwritten;	/* of demoted: no write, the promotion's extent was kept */
	uint64_t blocks_kept, nvme_kept_bytes;	/* DRAM blocks whose NVMe copy is kept, its bytes */
	uint64_t kept_reclaimed;	/* kept copies let go for room on a full tier */
	uint64_t nvme_unwritten_bytes;	/* of the tier file, still to be written over with zeros */
	uint64_t swaps, swap_failures;	/* DRAM <-> NVMe swaps done / given up (not in demoted, promoted) */
	uint64_t blocks_remote, offloaded, fetched, remote_errors;	/* the remote tier */
	bool remote_tier;
	struct remote_stats remote_io;	/* its Redis connection's counters */
	uint64_t leases, pending_ops, tier_pending;
	struct dp_opstat ops[DP_N_OPS];
};

struct dp_seq_usage {
	uint64_t dram, nvme, in_flight, leases, remote;
	uint64_t shared;	/* pages (of layer 0) whose block another sequence references too */
};

/* Prefix sharing counters (docs/design.md §4): lookups (opens that asked, with ids), hits (one
 * page or more attached), misses, pages attached, tokens covered at open, pages indexed now,
 * blocks referenced by more than one sequence now, forks. */
struct dp_prefix_stats {
	uint64_t lookups, hits, misses, pages_attached, tokens_saved, indexed_pages, shared_blocks,
		 forks, cached_blocks, evicted_pages;
	uint64_t remote_published, remote_pages;	/* pages written to / found in Redis */
};

int dp_init(struct dp **out, const struct cfg *cfg, struct seq_table *seqs, char *err, size_t errlen);
void dp_shutdown(struct dp *dp);

struct persist;
/* Restart without loss (persist.h): replays ps's journal into the sequence table, adopting the
 * blocks it names in the pool (mapped as the previous daemon left it: dp_init adopts a segment
 * when cfg->persist) and the tier; from then on every metadata change is journaled and every
 * completion waits for the group commit, and the pool segment outlives dp_shutdown. ps NULL:
 * nothing (persistence off). ps is borrowed and must outlive dp. */
int dp_restore(struct dp *dp, struct persist *ps, char *err, size_t errlen);
/* Upkeep from every turn of the control loop: journal compaction when it is due, and the end of
 * one running in the background. */
void dp_maintain(struct dp *dp);
/* The committed length of s moved (CommitTokens): journal the blocks whose committed rows grew.
 * The caller journals the ids and the length. */
void dp_seq_committed(struct dp *dp, struct seq *s, uint64_t old_committed);

const char *dp_pool_name(const struct dp *dp);
uint64_t dp_pool_bytes(const struct dp *dp);

/* Creates worker wid's ring (name written to ring_name). -EEXIST for a known wid. */
int dp_worker_add(struct dp *dp, uint32_t wid, char *ring_name, size_t len, char *err, size_t errlen);
/* A worker left or died: pending ops are dropped, its leases released, the uncommitted blocks
 * it allocated freed (and removed from their sequences), its ring destroyed. Unknown wid: no-op. */
void dp_worker_gone(struct dp *dp, uint32_t wid);
/* wid detaches seq (or closes it): its leases on seq's blocks are released and the blocks it
 * allocated there but never committed are freed. */
void dp_worker_detach(struct dp *dp, uint32_t wid, struct seq *s);

/* Starts / stops (joins) the data-plane thread. dp_shutdown stops it too. */
int dp_start(struct dp *dp, char *err, size_t errlen);
void dp_stop(struct dp *dp);
void dp_lock(struct dp *dp);
void dp_unlock(struct dp *dp);

/* Descriptors for zmq_poll (the tier's eventfd); returns how many. */
size_t dp_pollfds(const struct dp *dp, int *fds, size_t max);
/* One pass: serve every ring, reap tier completions, retry waiting ops, demote above the high
 * watermark, submit I/O. Never blocks. */
void dp_run(struct dp *dp);
/* Milliseconds the event loop may sleep: 0 while I/O must be polled without an eventfd, 1 while
 * a journal compaction needs this loop (its steps without the data-plane thread, then putting
 * the new journal in place: dp_maintain). */
int dp_poll_timeout(const struct dp *dp, int dflt);
/* Returns once journal sync generation gen (persist_need) is done. Called with the lock held,
 * returns with it held; while the data-plane thread runs, the journal's thread syncs and the
 * caller lets go of the lock meanwhile, so ring ops go on. */
void dp_wait_durable(struct dp *dp, uint64_t gen);
/* After the event loop's poll, with those of dp_pollfds that were readable (n may be 0): runs
 * dp_run. While the data-plane thread runs, it only clears the tier's eventfd and kicks the
 * thread, which reaps tier completions itself (the loop leaves the ring work to it); the
 * remote tier's socket still runs dp_run here. Lock held. */
void dp_poll_done(struct dp *dp, const int *ready, size_t n);

/* Demote seq's unleased committed DRAM blocks to the tier. *blocks counts them all: the writes
 * started now and, when the tier's request table fills up, those later dp_run passes start.
 * -ENODEV without a tier; -ENOSPC when the tier is full before anything could start. */
int dp_demote_seq(struct dp *dp, struct seq *s, uint64_t *blocks, char *err, size_t errlen);
/* Free every block of seq (DRAM slots and NVMe extents). -EBUSY while one is leased or has I/O
 * in flight (nothing is freed then). *blocks counts the blocks freed. */
int dp_drop_seq(struct dp *dp, struct seq *s, uint64_t *blocks, char *err, size_t errlen);

void dp_seq_usage(struct dp *dp, const struct seq *s, struct dp_seq_usage *u);
/* Moves seq's committed NVMe-resident blocks to the remote tier (docs/design.md §8); *blocks
 * counts them (the moves go on as slots free up). -ENODEV without a remote tier. */
int dp_offload_seq(struct dp *dp, struct seq *s, uint64_t *blocks, char *err, size_t errlen);

/* Prefix sharing (dataplane_share.c, docs/design.md §4). dp_prefix_open: s was just created
 * with its prompt's ids (n_prompt of them); it joins the namespace of (its model, geometry,
 * ubatch, salt, variant), attaches the longest run of leading pages published there (cut to a
 * multiple of the ubatch and the page, below n_prompt), which becomes its committed length,
 * and may publish its own pages up to the whole ubatches of its prompt. -EIO (hashing), -ENOMEM. */
int dp_prefix_open(struct dp *dp, struct seq *s, uint32_t ubatch, const char *salt,
		   const uint8_t *variant, size_t variant_len, size_t n_prompt, char *err,
		   size_t errlen);
/* Indexes the pages of s that became publishable (every layer committed, its ids kept, below
 * its publish limit); a committed length cut below indexed pages takes them out. */
void dp_prefix_publish(struct dp *dp, struct seq *s);
/* dst (new, no blocks) shares every full committed page of src and gets its own copy of the
 * partial tail page; its ids and committed length become src's. -EBUSY when the tail page is
 * not in DRAM (moving) or the pool has no room for the copy, -EINVAL for another geometry. */
int dp_fork(struct dp *dp, struct seq *src, struct seq *dst, char *err, size_t errlen);
void dp_prefix_stats(struct dp *dp, struct dp_prefix_stats *st);
/* Beyond one host (dataplane_remote.c, docs/design.md §8). dp_seq_export copies the blocks of
 * s's committed pages, every layer, page-major, into *out (n = layers × pages; free with
 * dp_blocks_free): from DRAM, or read from NVMe and checked; -EBUSY while one is moving. Blocks
 * in the tier below NVMe are left for the caller to read from Redis without the lock:
 * *fetch[0..n_fetch) are GETs into their out buffers (free the array; NULL when none).
 * dp_seq_import gives s (new, no blocks) blocks b[0..n) — allocated, filled, committed and
 * journaled with its committed length — or nothing (-ENOSPC when the pool has no room). */
struct remote_block;
struct remote_tier_op;
int dp_seq_export(struct dp *dp, const struct seq *s, struct remote_block **out, size_t *n,
		  struct remote_tier_op **fetch, size_t *n_fetch,
		  char *err, size_t errlen);
int dp_seq_import(struct dp *dp, struct seq *s, const struct remote_block *b, size_t n,
		  char *err, size_t errlen);
void dp_blocks_free(struct remote_block *b, size_t n);
/* With the tier below NVMe (remote_tier): s (new, no blocks, its remote_gen set) gets blocks for
 * pages [0, pages) of every layer that stay in Redis as the publisher left them, read when a
 * RECALL names them (dataplane_offload.c). */
bool dp_has_remote_tier(const struct dp *dp);
/* remote_prefix, at open: the content keys of the pages s may still find beyond what it
 * attached (pages [s->n_keys, returned)), computed into s->keys. 0: nothing to look for. */
uint32_t dp_prefix_ahead(struct dp *dp, struct seq *s, size_t n_prompt);
/* Attaches pages [s->n_keys, s->n_keys + got) from their fetched bytes b (page-major, every
 * layer; checked), indexing them, and cuts the covered length to whole ubatches. */
int dp_prefix_attach_remote(struct dp *dp, struct seq *s, size_t n_prompt, uint32_t got,
			    const struct remote_block *b, char *err, size_t errlen);
int dp_seq_import_published(struct dp *dp, struct seq *s, uint32_t pages, char *err,
			    size_t errlen);
/* Lets go of cached pages (indexed, held by no sequence), least recently used first, until at
 * least want blocks are freed or none is left; returns the blocks freed. */
uint64_t dp_prefix_evict(struct dp *dp, uint64_t want);
uint64_t dp_worker_leases(const struct dp *dp, uint32_t wid);
/* When the worker's ring last carried an op (ms, monotonic), 0 never: ring traffic proves a
 * worker alive as well as a heartbeat does. Call with the dp lock held. */
uint64_t dp_worker_last_op_ms(const struct dp *dp, uint32_t wid);
void dp_stats(struct dp *dp, struct dp_stats *st);
const char *dp_op_name(enum dp_opstat_kind k);

/* Wait up to timeout_ms for in-flight tier I/O to finish, completing what finishes (shutdown). */
void dp_drain(struct dp *dp, int timeout_ms);

#endif
