/* journal — an append-only file of checksummed records: the on-disk form of kvstored's metadata
 * (docs/design.md §4 "Restart without loss"). It knows nothing of what the records mean
 * (persist.c does); it frames them, writes them in order and makes them durable.
 *
 * File: a 16-byte header ("FKVJRNL1", format version, reserved), then records. A record is a
 * 12-byte header — payload length, crc32c of (type, payload), type — and the payload, and maybe
 * zeros after the last record (journal_preallocate), which replay takes for the end. Appends go
 * to a buffer; journal_sync() writes the buffer and fdatasyncs, so one sync covers every record
 * appended since the last (group commit: the caller syncs once per batch of COMMITs, before it
 * tells anyone they are durable). Replay reads records in order and stops at the first one that
 * is truncated, too long or fails its checksum: the prefix before it is valid, the rest is
 * reported (offset, bytes) and never interpreted. Compaction writes a snapshot (the caller's
 * records) to <path>.tmp, syncs it, renames it over the journal and syncs the directory, so a
 * crash at any point leaves either the old journal or the new one whole. A running daemon
 * compacts in steps (journal_compact_begin), the journal going on meanwhile.
 *
 * Ownership: journal_open allocates struct journal (file descriptor, buffer, and later its sync
 * thread); journal_close joins the thread, syncs what is buffered and frees it. Not thread-safe
 * apart from journal_synced and journal_wait_synced: the daemon calls it under the data-plane
 * lock. Errors are 0 or -errno, with a message where an err buffer is taken. */
#ifndef FREEKV_JOURNAL_H
#define FREEKV_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define JOURNAL_HEADER_BYTES 16u
#define JOURNAL_RECORD_HEADER 12u
#define JOURNAL_MAX_RECORD (64u << 20)	/* a longer length field is corruption */

struct journal;

/* What a replay found. valid_bytes is where the valid prefix ends (header included). */
struct journal_replay {
	uint64_t records;	/* records handed to the callback */
	uint64_t valid_bytes;
	uint64_t file_bytes;
	uint64_t zero_bytes;	/* zeros that end the file, past the valid prefix */
	bool damaged;		/* bytes after the valid prefix, not all zeros, were ignored */
	char why[256];		/* what was wrong there, when damaged */
};

/* Called once per valid record, in file order. A non-zero return (e.g. -EINVAL for a record
 * whose payload makes no sense) ends the replay there as damage, with the callback's message
 * copied from msg (may be left empty). */
typedef int (*journal_record_fn)(void *ctx, uint32_t type, const void *payload, uint32_t len,
				 char *msg, size_t msglen);

/* Replays path. -ENOENT when there is no journal (a first start); -EINVAL when the file is not
 * a journal at all (bad header: nothing is replayed, why says so); other -errno from reading. */
int journal_replay(const char *path, journal_record_fn fn, void *ctx, struct journal_replay *r,
		   char *err, size_t errlen);

/* Opens path for appending at append_at (the end of the valid prefix; 0 or a missing file: a new
 * journal with only its header). Bytes past append_at are cut off. */
int journal_open(const char *path, uint64_t append_at, struct journal **out, char *err,
		 size_t errlen);
/* Keeps about ahead bytes (at least 4 MiB; 0: none, the default) of zeros on the disk past the
 * records' end, written by a thread of the journal's own a stretch at a time, so that records
 * overwrite zeros instead of growing the file: the fdatasync of a group commit then flushes
 * data only, without a commit of the filesystem's journal for the new size and blocks. Starts
 * at the first journal_sync_start (which makes the threads). A compaction's new
 * journal writes none while the snapshot is written; once in place, it does. */
void journal_preallocate(struct journal *j, uint64_t ahead);
/* Syncs what is buffered (errors are logged) and frees everything. NULL is fine. */
void journal_close(struct journal *j);

/* Buffers one record (-ENOMEM, -E2BIG over JOURNAL_MAX_RECORD). Large buffers are written out
 * early, unsynced: order is all replay needs. */
int journal_append(struct journal *j, uint32_t type, const void *payload, uint32_t len);
/* Writes the buffer and fdatasyncs, in the caller; first waits for a thread sync under way. 0 at
 * once when nothing is pending. */
int journal_sync(struct journal *j);
/* Something is buffered, written but not synced, or a sync is under way. */
bool journal_dirty(const struct journal *j);

/* Asynchronous group commit. Each sync — journal_sync in the caller, or journal_sync_start in
 * the journal's own thread — is a generation, and covers every record appended before it
 * started. journal_sync_start writes the buffer and hands the fdatasync to the thread (made at
 * the first call), so the caller goes on appending while the disk works; it does nothing when
 * nothing is pending; while a thread sync is under way, the thread begins the next one the
 * moment it ends, without waiting for the caller.
 * journal_need: the generation that covers everything appended so far; journal_synced: the last
 * generation finished (either path; a failed one too, its error returned by the next call of
 * journal_sync_start or journal_sync, and what it covered synced again). journal_on_synced: fn
 * runs on the sync thread after each of its syncs (never again once it is replaced). journal_write: writes the buffer to the file
 * without syncing (a crash of the process then loses none of it). */
int journal_sync_start(struct journal *j);
/* Waits up to timeout_ms while a thread sync runs and generation gen is not done; returns when
 * it is, or when no thread sync runs (then start one). Safe beside a caller of the rest. */
void journal_wait_synced(struct journal *j, uint64_t gen, int timeout_ms);
/* Records appended since open: a caller that compares it before and after its work knows
 * whether that work journaled anything. */
uint64_t journal_appended(const struct journal *j);
int journal_write(struct journal *j);
uint64_t journal_need(const struct journal *j);
uint64_t journal_synced(const struct journal *j);
typedef void (*journal_synced_fn)(void *ctx);
void journal_on_synced(struct journal *j, journal_synced_fn fn, void *ctx);

/* Writes the records that fill() appends to the journal it is given into a fresh file and puts
 * that file in place of j's, as the header explains. Pending records of j are synced first. On
 * failure j is unchanged and the temporary file removed. */
typedef int (*journal_fill_fn)(void *ctx, struct journal *snap);
int journal_compact(struct journal *j, journal_fill_fn fill, void *ctx, char *err, size_t errlen);

/* The same in steps, for a running daemon, whose lock a snapshot of a million blocks would hold
 * for a fifth of a second. journal_compact_begin makes <path>.tmp a new journal and hands it to
 * the caller, who appends the snapshot to it a part at a time between its other work, and
 * meanwhile appends every change to a part already written to both journals (docs/design.md §4
 * says why the result replays to the same state). journal_compact_seal: the snapshot is whole;
 * its sync starts on the new journal's thread. journal_compact_finish, called from time to time
 * after that: JOURNAL_COMPACT_RUNNING while that sync runs; then syncs what was appended since
 * (a little), renames the file over the journal, syncs the directory and appends to it from then
 * on, every record appended so far durable (a generation ends), the replaced file closed on the
 * sync thread: JOURNAL_COMPACT_DONE. -errno with a message when that fails; the compaction is
 * then dropped and the journal goes on unchanged, as after journal_compact_abort. journal_compact
 * and journal_close drop one under way. */
#define JOURNAL_COMPACT_RUNNING 1
#define JOURNAL_COMPACT_DONE 2
int journal_compact_begin(struct journal *j, struct journal **snap, char *err, size_t errlen);
bool journal_compacting(const struct journal *j);
int journal_compact_seal(struct journal *j);
bool journal_compact_sealed(const struct journal *j);
int journal_compact_finish(struct journal *j, char *err, size_t errlen);
void journal_compact_abort(struct journal *j);

struct journal_stats {
	uint64_t bytes;		/* file size, buffered records included */
	uint64_t records;	/* records appended since open or the last compaction */
	uint64_t syncs;		/* fdatasyncs since open */
	uint64_t compactions;
	time_t last_compaction;	/* 0: none since start */
};
void journal_stats(const struct journal *j, struct journal_stats *st);
const char *journal_path(const struct journal *j);

#endif
