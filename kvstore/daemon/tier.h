/* tier — kvstored's NVMe tier: one preallocated file (or block device) opened O_DIRECT, an
 * extent allocator over it, and asynchronous block I/O on io_uring.
 *
 * The file at path is created when absent and preallocated to bytes (fallocate); a block device
 * is used as it is. I/O goes through one io_uring with the file registered and, when the caller
 * passes the pool mapping, that mapping registered as fixed buffers in chunks of at most 1 GiB
 * (when registration fails, e.g. RLIMIT_MEMLOCK, a note goes to stderr and plain buffers are
 * used). Writes (demotion) record the crc32c of the bytes written; reads (promotion) verify the
 * crc32c the caller passes and complete with -EBADMSG (and a stderr line naming the offset and
 * both checksums) on a mismatch. A full submission queue, -EAGAIN and short transfers are
 * handled inside: requests wait in a software queue, are resubmitted, or continued.
 *
 * Asynchronous use (the daemon's event loop): tier_write / tier_read queue requests with a
 * caller cookie; tier_flush submits them; poll tier_eventfd (zmq_poll) and call tier_reap, which
 * invokes the callback once per finished request. Synchronous use (tests, tools):
 * tier_write_sync / tier_read_sync, only while nothing else is in flight.
 *
 * Buffers: O_DIRECT needs buf and file offset aligned to TIER_ALIGN, and transfers whole
 * TIER_ALIGN units: a request of len bytes moves len rounded up to TIER_ALIGN (buf must have
 * that much room; a read overwrites the padding), while the checksum covers len bytes only (a
 * pool block's stride is already a multiple of TIER_ALIGN). The caller keeps a buffer alive
 * and unchanged (writes) / unread (reads) until its request completes.
 *
 * Ownership: tier_open allocates struct tier, the ring and the request table; tier_close waits
 * for in-flight I/O, then frees everything and closes the file (the file itself stays). Not
 * thread-safe: one thread drives a tier. */
#ifndef FREEKV_TIER_H
#define FREEKV_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TIER_ALIGN 4096u
#define TIER_ERR_LEN 256u
#define TIER_CHUNK_MAX (1ull << 30)   /* largest registered buffer */

struct tier_config {
	const char *path;
	uint64_t bytes;            /* file size to preallocate (ignored for a block device) */
	unsigned queue_depth;      /* io_uring entries; 0 means 64 */
	unsigned max_requests;     /* requests queued + in flight; 0 means 4 * queue_depth */
	void *reg_base;            /* optional: memory to register as fixed buffers (the pool) */
	uint64_t reg_bytes;
	bool allow_buffered;       /* O_DIRECT unsupported -> open buffered instead of failing */
};

enum tier_op {
	TIER_OP_WRITE = 1,
	TIER_OP_READ = 2,
};

struct tier_result {
	uint64_t cookie;       /* as given to tier_write / tier_read */
	uint64_t file_off;
	void *buf;
	uint32_t len;
	uint8_t op;            /* enum tier_op */
	int status;            /* 0, -EBADMSG (checksum), or the I/O error */
	uint32_t crc;          /* crc32c of the bytes (written, or read) */
	uint32_t crc_expected; /* reads: what the caller passed */
};

/* Called from tier_reap / tier_wait once per finished request. It may queue new requests
 * (tier_write / tier_read, submitted when the reap ends) and free extents, but must not call
 * tier_reap, tier_wait, the sync helpers or tier_close. */
typedef void (*tier_done_fn)(void *ctx, const struct tier_result *res);

struct tier_usage {
	uint64_t bytes;            /* usable file size (whole TIER_ALIGN units) */
	uint64_t used_bytes;       /* bytes in allocated extents */
	uint64_t extents;          /* allocated extents */
	uint64_t free_runs;        /* free extents (fragmentation) */
	uint64_t queued;           /* requests waiting for a submission slot */
	uint64_t inflight;         /* requests submitted, not reaped */
	uint64_t writes, reads;    /* completed requests */
	uint64_t write_bytes, read_bytes;
	uint64_t retries;          /* -EAGAIN resubmissions and short-transfer continuations */
	uint64_t crc_errors;
	bool direct;               /* O_DIRECT in use */
	bool fixed_file, fixed_buffers;
};

struct tier;

/* Opens or creates the file, preallocates it, sets up io_uring. Errors: -EINVAL from
 * open(O_DIRECT) without allow_buffered ("O_DIRECT not supported on this file system
 * (tmpfs?)"), -ENOSPC from fallocate, io_uring setup errors. */
int tier_open(const struct tier_config *cfg, struct tier **out, char *err, size_t err_len);
/* Drains in-flight I/O (results are dropped), tears down the ring, closes the file. */
void tier_close(struct tier *t);

/* Extents: len is rounded up to TIER_ALIGN; the offset is a multiple of that rounded length when
 * such a free position exists (one block size per host packs exactly), else any aligned free
 * position. -ENOSPC when nothing fits, -EINVAL len 0. */
int tier_extent_alloc(struct tier *t, uint64_t len, uint64_t *off);
/* Marks [off, off+len) allocated, as an extent a previous daemon recorded (restart, see
 * persist.h). -EINVAL misaligned or outside the file, -EEXIST when it overlaps one in use. */
int tier_extent_adopt(struct tier *t, uint64_t off, uint64_t len);
/* The first free run of the file that ends past from: *off (maybe below from) and *len.
 * -ENOENT when none. */
int tier_free_run(const struct tier *t, uint64_t from, uint64_t *off, uint64_t *len);
/* Whether [off, off+len) is exactly an extent in use. */
bool tier_extent_taken(const struct tier *t, uint64_t off, uint64_t len);
/* -EINVAL when [off, off+len) is not exactly allocated (double free, wrong length). */
int tier_extent_free(struct tier *t, uint64_t off, uint64_t len);

/* Queues a write of buf[0, len) to file_off; its crc32c is reported in the result (computed
 * while the write is in flight: buf must not change until it completes). -EINVAL misaligned or out of the file, -EBUSY when max_requests are outstanding
 * (reap first). */
int tier_write(struct tier *t, const void *buf, uint64_t file_off, uint32_t len, uint64_t cookie);
/* Queues a read into buf; the result's status is -EBADMSG when crc32c(buf) != crc. */
int tier_read(struct tier *t, void *buf, uint64_t file_off, uint32_t len, uint32_t crc,
	      uint64_t cookie);
/* Moves queued requests into the submission queue and submits; queued reads go before queued
 * writes (each kind in the order queued). Returns the number submitted
 * (>= 0) or -errno. */
int tier_flush(struct tier *t);

/* eventfd signalled when completions are ready (io_uring_register_eventfd); -1 when the kernel
 * refused it (then call tier_reap periodically). */
int tier_eventfd(const struct tier *t);
/* Whether completions signal the eventfd (on by default). A thread that polls tier_ready while
 * it is busy turns it off, and on again before it sleeps; while it is off, tier_reap leaves the
 * eventfd to whoever watches it. false when the kernel cannot toggle it (it stays on). */
bool tier_notify(struct tier *t, bool on);
/* Completions wait to be reaped (no system call). */
bool tier_ready(const struct tier *t);
/* Drains the completion queue without blocking: retries are resubmitted, finished requests are
 * reported through done. Returns the number reported or -errno. */
int tier_reap(struct tier *t, tier_done_fn done, void *ctx);
/* tier_reap of at most max completions; the rest stay ready (tier_ready) for the next call.
 * submit false: what the callbacks queue waits for the caller's tier_flush (which may first
 * make durable what those callbacks journaled). */
int tier_reap_some(struct tier *t, unsigned max, bool submit, tier_done_fn done, void *ctx);
/* Blocks until at least one completion is available or timeout_ms passes (-1: forever), then
 * reaps like tier_reap. Returns the number reported (0 on timeout) or -errno. */
int tier_wait(struct tier *t, int timeout_ms, tier_done_fn done, void *ctx);
/* Requests queued or in flight. */
unsigned tier_pending(const struct tier *t);
/* Requests that could be queued now (more: -EBUSY). */
unsigned tier_room(const struct tier *t);

/* One write / read, waited for. -EBUSY when other requests are outstanding. */
int tier_write_sync(struct tier *t, const void *buf, uint64_t file_off, uint32_t len,
		    uint32_t *crc);
int tier_read_sync(struct tier *t, void *buf, uint64_t file_off, uint32_t len, uint32_t crc);

/* Fault injection for tests of the callers' error paths: the next n requests of op that would
 * succeed complete with err instead (the transfer itself did happen: a failed write may have
 * changed the file). The daemon never calls it. */
void tier_inject_error(struct tier *t, enum tier_op op, unsigned n, int err);

void tier_usage(const struct tier *t, struct tier_usage *u);
int tier_fd(const struct tier *t);

#endif
