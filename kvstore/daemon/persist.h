/* persist — kvstored's durable metadata (docs/design.md §4 "Restart without loss").
 *
 * What the pool and the NVMe tier hold survives a daemon's death by itself (the shared-memory
 * segment stays in /dev/shm, the tier is a file); what is lost is the daemon's private metadata:
 * which sequences exist, their token ids and committed lengths, and which block of which page
 * sits at which pool offset or NVMe extent. persist journals that metadata (journal.h) as it
 * changes: a sequence opened, token ids and committed lengths, a block committed (with its pool
 * offset, its slab and the crc32c of its committed rows), demoted, promoted or swapped, a
 * sequence dropped. Uncommitted blocks are never journaled: after a restart their slots are
 * free. The caller syncs (persist_sync) before it posts a COMMIT completion or answers a
 * request that changed the metadata, so what a worker was told is committed is on disk.
 *
 * At start, persist_restore replays the journal into the sequence table, then adopts every
 * block of every committed page: a DRAM block in the re-adopted pool segment at its old offset
 * (its slab rebuilt where it was), an NVMe block at its old extent, each verified first (the
 * crc32c of the block's committed rows in DRAM; the tier's whole-block crc32c on NVMe, by a
 * read). A block that fails, or cannot be adopted, is never served: its sequence's committed
 * length is cut to the start of that page (the token ids past it are kept, so a resume runs
 * them again) and the sequence is marked damaged. Every sequence comes back detached. The
 * journal is then compacted into a snapshot of what was adopted; a journal with a damaged tail
 * keeps its valid prefix, the rest is reported and the old file kept as <journal>.damaged.
 *
 * The crc32c of a DRAM block covers its committed rows only, in row order (row r of every head,
 * K then V), so it extends as the tail page fills and is not disturbed by the worker writing the
 * next, uncommitted rows into the same block.
 *
 * Ownership: persist_open allocates struct persist and opens nothing yet (persist_restore
 * opens the journal); persist_close closes it. Every hook is a no-op on a NULL handle
 * (persistence off). Not thread-safe: called under the data-plane lock. */
#ifndef FREEKV_PERSIST_H
#define FREEKV_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "config.h"
#include "seq.h"

struct persist;
struct pool;
struct tier;

/* *out is NULL when persistence is off (persist = false, or no nvme_path and no journal_path);
 * why then says so in one line for the log. -ENOMEM. */
int persist_open(const struct cfg *cfg, struct persist **out, char *why, size_t whylen);
void persist_close(struct persist *ps);
const char *persist_journal_path(const struct persist *ps);

/* Replays the journal and adopts its blocks into seqs, pool and tier (tier may be NULL), as the
 * header says, then compacts. Damage is logged to stderr and counted, never an error: an error
 * (-errno with err) means the journal cannot be read or written at all. */
int persist_restore(struct persist *ps, struct seq_table *seqs, struct pool *pool,
		    struct tier *tier, char *err, size_t errlen);

/* Hooks: each appends one record (or a few). A failure to buffer is logged once and turns the
 * handle's `failed` flag on (persist_stats). While a compaction runs, a record of a sequence
 * the snapshot has written (or that opens meanwhile) also goes to the new journal. */
void persist_seq_open(struct persist *ps, struct seq *s);
/* ids[0..n) at positions first.. were kept and the committed length is s's now. */
void persist_seq_tokens(struct persist *ps, const struct seq *s, uint64_t first,
			const uint32_t *ids, size_t n);
void persist_seq_committed(struct persist *ps, const struct seq *s);
/* Its remote-tier state: owned or published, and the generation (docs/design.md §8). */
void persist_seq_remote(struct persist *ps, const struct seq *s);
/* Its prefix-sharing state (ubatch, publish limit, covered length, the key chain's start). */
void persist_seq_prefix(struct persist *ps, const struct seq *s);
void persist_seq_remove(struct persist *ps, const struct seq *s);
/* Block id of s is committed and where pool says it is now (DRAM: its committed rows are
 * checksummed, extending the block's rows_crc; NVMe: the tier's crc). */
void persist_block(struct persist *ps, struct pool *pool, const struct seq *s, uint32_t id);

/* Group commit: makes every record so far durable. 0, or -errno (logged). */
int persist_sync(struct persist *ps);
bool persist_dirty(const struct persist *ps);
/* The same group commit on the journal's sync thread (journal_sync_start): returns at once;
 * persist_synced reaches persist_need once it is done, and fn (persist_on_synced) runs on that
 * thread. persist_write only writes the buffer (a crash of the daemon then loses none of it).
 * With persistence off, need and synced are 0 and the rest does nothing. */
int persist_sync_start(struct persist *ps);
int persist_write(struct persist *ps);
uint64_t persist_need(const struct persist *ps);
uint64_t persist_appended(const struct persist *ps);
void persist_wait_synced(struct persist *ps, uint64_t gen, int timeout_ms);
uint64_t persist_synced(const struct persist *ps);
void persist_on_synced(struct persist *ps, void (*fn)(void *ctx), void *ctx);
/* Compaction (docs/design.md §4): persist_maintain, called at every turn of the control loop,
 * starts one when the journal passed journal_compact_bytes (read live from cfg) and twice the
 * last snapshot, and puts the new journal in place once its snapshot is written and synced:
 * true when it just did (every record so far durable: a generation ended). In between the data
 * plane writes the snapshot, journal_compact_step records or so at a time, with
 * persist_compact_step, while persist_snapshotting. persist_compacting: one is under way. */
bool persist_compacting(const struct persist *ps);
bool persist_snapshotting(const struct persist *ps);
void persist_compact_step(struct persist *ps, const struct seq_table *seqs, struct pool *pool);
bool persist_maintain(struct persist *ps, struct pool *pool);

struct persist_stats {
	bool enabled;
	uint64_t journal_bytes;
	uint64_t records;		/* in the journal now */
	uint64_t syncs;
	uint64_t compactions;
	time_t last_compaction;		/* 0: none */
	uint64_t replayed;		/* records replayed at start */
	uint64_t replay_ms;		/* replay, verification and adoption at start */
	uint64_t adopted_seqs, adopted_blocks, damaged_seqs, damaged_blocks;
	uint64_t ignored_bytes;		/* of a damaged journal tail */
	bool failed;			/* a record could not be journaled since start */
};
void persist_stats(const struct persist *ps, struct persist_stats *st);

/* crc32c of rows [from, to) of a block of geometry g, continuing crc (the checksum of rows
 * [0, from)); see the header for the order. */
uint32_t persist_rows_crc(const void *block, const struct seq_geometry *g, uint32_t from,
			  uint32_t to, uint32_t crc);

#endif
