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
 * that finds its ring empty spins briefly, then sets sleeping, re-checks, and FUTEX_WAITs with a
 * timeout; ring_push does FUTEX_WAKE only when the consumer announced it sleeps (seq_cst order
 * of tail and sleeping on both sides closes the lost-wakeup window). The daemon, which polls many rings from one
 * zmq_poll loop, runs ring_watch_start per ring: a small thread that sleeps on the submission
 * doorbell and writes 1 to an eventfd the caller polls (one eventfd may serve all rings) each
 * time new submissions arrive; the loop then pops every ring until empty.
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
 * Ownership: ring_create (daemon) creates the segment (mode 0660, optional group) and returns a
 * handle that ring_destroy unmaps and unlinks; ring_open (worker) maps an existing segment and
 * ring_close unmaps it. The handle owns the mapping and, while running, its watch thread.
 * ring_push / ring_pop / ring_wait are called by one thread per side. */
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
	uint32_t reserved0;
	uint64_t reserved1;
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

#endif
