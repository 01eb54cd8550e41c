/* ring — the data-plane transport between kvstored and one worker: a shared-memory segment with
 * a submission ring (worker -> daemon) and a completion ring (daemon -> worker).
 *
 * Each ring is single-producer / single-consumer with C11 atomic head and tail (free-running
 * 32-bit counters; slot = counter & (entries - 1)). The producer fills a slot, then publishes
 * tail with release order; the consumer reads tail with acquire order, COPIES the slot out, then
 * publishes head. Both sides trust only their private copy of the geometry and check every index
 * they read from the segment: a peer that writes garbage gets -EPROTO, never an out-of-bounds
 * access. Popped entries are validated: an unknown op or n_payload > RING_PAYLOAD_MAX comes back
 * as op RING_OP_INVALID (user_data kept, n_payload 0) so the daemon can answer it with -EINVAL.
 *
 * Doorbells: each ring has a futex word (bell) and a sleeping flag in the segment. A consumer
 * that finds its ring empty spins briefly (RING_SPIN_NS), then sets sleeping, re-checks, and
 * FUTEX_WAITs with a timeout; ring_push does FUTEX_WAKE only when the consumer announced it
 * sleeps (seq_cst order of tail and sleeping on both sides closes the lost-wakeup window), so a
 * consumer that is spinning costs its producer no system call. The daemon serves many rings from
 * one data-plane thread: it spins over all of them, then announces sleep on every submission
 * ring (ring_sleep_prepare) and sleeps on all their doorbells at once (ring_bells_wait, which is
 * futex_waitv) plus a private kick word of its own. ring_watch_start is the alternative for a
 * caller that wants an eventfd instead: a small thread per ring that sleeps on the submission
 * doorbell and writes 1 to an eventfd each time new submissions arrive.
 *
 * Protocol: every submission yields exactly one completion with the same user_data. A worker
 * keeps at most `entries` operations outstanding, so the daemon's completion push cannot find
 * the completion ring full unless the worker misbehaves (then ring_push pushes fewer than asked,
 * possibly 0, and the daemon keeps or drops the rest — its choice).
 *
 * Entry conventions (the daemon implements the semantics; these are the agreed layouts):
 *   ALLOC   sq: seq_id, layer, first_page, count = n pages (<= 64)
 *           cq: status; payload[i] = pool offset of page first_page + i; n_payload = count
 *   COMMIT  sq: seq_id, committed_tokens; payload[i] = pool offsets of the blocks now written
 *               (n_payload = count <= 64; count 0 only moves committed_tokens)
 *           cq: status
 *   RECALL  sq: seq_id, layer; pairs payload[2i] = page, payload[2i+1] = KV-head mask
 *               (bit h = head h); count = pages (<= 32), n_payload = 2 * count
 *           cq: status; payload[2i] = pool offset, payload[2i+1] = lease id
 *   RELEASE sq: payload[i] = lease ids; count = n_payload (<= 64)
 *           cq: status
 *
 * Timing: every completion carries served_us, the microseconds from the daemon's pop of the
 * submission to the post of its completion (saturating; it includes waiting for room and the
 * journal's group commit), and posted_ns, the CLOCK_MONOTONIC nanoseconds of the post. Both sides
 * run on one host, so a worker that stamps its push and its pop splits a round trip into waiting
 * for the daemon to pop, the daemon's service, and its own wake-up (kvs_ring_last_timing).
 *
 * Ownership: ring_create (daemon) creates the segment (mode 0660, optional group) and returns a
 * handle that ring_destroy unmaps and unlinks; ring_open (worker) maps an existing segment and
 * ring_close unmaps it. The handle owns the mapping and, while running, its watch thread.
 * ring_push / ring_pop / ring_wait are called by one thread per side at a time (kvstored's two
 * threads that serve rings take its data-plane lock around them). */
#ifndef FREEKV_RING_H
#define FREEKV_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define RING_PAYLOAD_MAX 64u
#define RING_ENTRIES_MIN 2u
#define RING_ENTRIES_MAX 65536u
#define RING_ERR_LEN 256u
#define RING_MAGIC 0x474e5246u /* "FRNG" */
#define RING_VERSION 1u

/* Segment layout, the ABI both sides share (byte offsets; indices are 32-bit words):
 *   0     header: magic, version, entries, entry_bytes (u32 each), seg_bytes (u64)
 *   64    submission ring: head @64, tail @128, bell @192, sleeping @196
 *   256   completion ring: head @256, tail @320, bell @384, sleeping @388
 *   4096  submission slots [entries], then completion slots [entries] */
#define RING_OFF_SQ_HEAD 64u
#define RING_OFF_SQ_TAIL 128u
#define RING_OFF_SQ_SLEEPING 196u
#define RING_OFF_CQ_HEAD 256u
#define RING_OFF_CQ_TAIL 320u
#define RING_OFF_CQ_SLEEPING 388u
#define RING_OFF_SLOTS 4096u

enum ring_op {
	RING_OP_INVALID = 0,
	RING_OP_ALLOC = 1,
	RING_OP_COMMIT = 2,
	RING_OP_RECALL = 3,
	RING_OP_RELEASE = 4,
	RING_OP_MAX = RING_OP_RELEASE,
};

/* One slot, identical in both rings; 576 bytes (9 cache lines). */
struct ring_entry {
	uint32_t op;               /* enum ring_op */
	int32_t status;            /* completions: 0 or -errno; submissions: 0 */
	uint64_t user_data;        /* the worker's; echoed in the completion */
	uint64_t seq_id;
	uint64_t committed_tokens; /* COMMIT */
	uint32_t layer;
	uint32_t first_page;
	uint32_t count;            /* op-specific item count, see above */
	uint32_t n_payload;        /* payload u64s in use, <= RING_PAYLOAD_MAX */
	uint32_t flags;            /* reserved, 0 */
	uint32_t served_us;        /* completions: see "Timing" above; submissions: 0 */
	uint64_t posted_ns;        /* completions: see "Timing" above; submissions: 0 */
	uint64_t payload[RING_PAYLOAD_MAX];
};

enum ring_role {
	RING_ROLE_DAEMON = 1, /* pushes completions, pops submissions */
	RING_ROLE_WORKER = 2, /* pushes submissions, pops completions */
};

struct ring;

struct ring_config {
	const char *shm_name;  /* "/freekv-ring-3" style */
	uint32_t entries;      /* per ring, a power of two in [RING_ENTRIES_MIN, RING_ENTRIES_MAX] */
	mode_t mode;           /* 0 means 0660 */
	const char *group;     /* optional */
	bool unlink_existing;
};

/* Segment size for a given number of entries (header page + both rings). */
uint64_t ring_segment_bytes(uint32_t entries);

/* Daemon side. -EINVAL bad entries or name, -EEXIST name taken (see unlink_existing). */
int ring_create(const struct ring_config *cfg, struct ring **out, char *err, size_t err_len);
/* Stops the watch thread, unmaps, unlinks. NULL is fine. */
void ring_destroy(struct ring *r);

/* Worker side: maps an existing segment and checks magic, version, entry size and that the
 * segment is as large as its header says. -ENOENT, -EPROTO (not a ring / wrong version). */
int ring_open(const char *shm_name, struct ring **out, char *err, size_t err_len);
void ring_close(struct ring *r);

enum ring_role ring_role(const struct ring *r);
uint32_t ring_entries(const struct ring *r);
const char *ring_name(const struct ring *r);

/* Copies up to n entries into the ring this side produces, publishes them with one tail store
 * and wakes the peer if it sleeps. Returns the number pushed (0 when full) or -EPROTO when the
 * peer corrupted the indices, -EINVAL for an entry with n_payload > RING_PAYLOAD_MAX. */
int ring_push(struct ring *r, const struct ring_entry *e, unsigned n);
/* Copies up to max entries out of the ring this side consumes (validated as described above)
 * and frees their slots. Returns the number popped (0 when empty) or -EPROTO. */
int ring_pop(struct ring *r, struct ring_entry *out, unsigned max);
/* Entries ready to pop (0 also when the indices are corrupt). */
unsigned ring_ready(const struct ring *r);
/* Free slots in the ring this side produces. */
unsigned ring_space(const struct ring *r);

/* Waits until the consumed ring is non-empty: spins briefly, then sleeps on the doorbell.
 * timeout_ms < 0 waits forever. 0 when entries are ready, -ETIMEDOUT, -EINTR, -EPROTO. */
int ring_wait(struct ring *r, int timeout_ms);

/* One doorbell to sleep on: a futex word and the value it had when the sleep was announced.
 * private_word: the word lives in this process only (a kick word), not in a shared segment. */
struct ring_bell {
	_Atomic uint32_t *word;
	uint32_t seen;
	bool private_word;
};

/* Most doorbells one ring_bells_wait takes (the kernel's futex_waitv limit). */
#define RING_BELLS_MAX 128u

/* Daemon side, before sleeping on many rings: announces sleep on r's submission ring and
 * re-checks it. 1 when entries are ready (nothing announced: do not sleep), 0 when announced
 * (*b filled; call ring_sleep_end after the wait), -EPROTO. */
int ring_sleep_prepare(struct ring *r, struct ring_bell *b);
/* Withdraws the announcement, so that producers stop paying for FUTEX_WAKE. */
void ring_sleep_end(struct ring *r);
/* Sleeps until one bell moves, is woken, or timeout_ms passes (< 0: no timeout); n <=
 * RING_BELLS_MAX. The words may belong to segments unmapped meanwhile: that returns at once.
 * 0 (re-check the rings), -EINTR, -EINVAL (n too large), -ENOSYS (kernel before 5.16). */
int ring_bells_wait(const struct ring_bell *b, size_t n, int timeout_ms);
/* Bumps a private kick word and wakes its sleeper. */
void ring_kick(_Atomic uint32_t *word);

/* Daemon side: starts a thread that writes (uint64_t)1 to efd whenever new submissions arrive
 * (including ones already waiting now). -EBUSY when already watching, -EINVAL on a worker
 * handle. ring_watch_stop joins it (called by ring_destroy as well). */
int ring_watch_start(struct ring *r, int efd);
void ring_watch_stop(struct ring *r);

/* Counters of this handle: entries pushed/popped, futex wakes sent, sleeps taken. */
struct ring_stats {
	uint64_t pushed, popped, invalid;
	uint64_t wakes, sleeps;
};
void ring_stats(const struct ring *r, struct ring_stats *s);

/* A spin-loop hint for the bounded spins on both sides of a ring (worker completion waits and
 * the daemon's data-plane thread); their clock is common/clock.h. */
static inline void ring_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

#endif
