/* remote_io — the remote tier's I/O thread (docs/design.md §8): the data plane queues block
 * writes, reads and deletes (remote.h, remote_tier_batch) and reaps their completions from an
 * eventfd it polls, as it does the NVMe tier's; the Redis calls, pipelined in batches, block
 * only this thread. It has its own Redis connection (hiredis contexts are not shared between
 * threads).
 *
 * Buffers: a PUT's buf must stay unchanged, and a GET's buf may not be read, until the request
 * completes. Ownership: rio_start allocates everything; rio_stop joins the thread, completes
 * nothing more and frees it (queued requests are dropped: the caller drains first). */
#ifndef FREEKV_REMOTE_IO_H
#define FREEKV_REMOTE_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "remote.h"

#define RIO_MAX_QUEUE 1024u

struct rio_result {
	uint64_t cookie;
	void *buf;		/* as submitted */
	uint8_t kind;		/* enum remote_tier_kind */
	int status;
	char err[160];
};

struct rio;

int rio_start(const struct remote_config *c, struct rio **out, char *err, size_t errlen);
void rio_stop(struct rio *r);
int rio_eventfd(const struct rio *r);
/* -EBUSY when RIO_MAX_QUEUE requests are queued or in flight. key NULL: the tier's key of id;
 * else that key (a published block's, remote_published_key). ttl_s as in remote_tier_op. */
int rio_submit(struct rio *r, uint8_t kind, uint64_t id, const char *key, uint32_t ttl_s,
	       void *buf, uint32_t len, uint32_t crc, uint64_t cookie);
void rio_prefix_key(struct rio *r, const uint8_t key[32], uint32_t layer, char *out, size_t len);
/* The published-block key of (name, gen, layer, page), as this thread's connection spells it. */
void rio_published_key(struct rio *r, const char *name, uint64_t gen, uint32_t layer,
		       uint32_t page, char *key, size_t len);
/* Calls fn for each finished request (in the caller's thread); returns how many. */
int rio_reap(struct rio *r, void (*fn)(void *ctx, const struct rio_result *res), void *ctx);
/* Requests queued or in flight. */
size_t rio_pending(struct rio *r);
/* Waits up to timeout_ms for every request to finish, reaping as rio_reap does. */
void rio_drain(struct rio *r, int timeout_ms, void (*fn)(void *ctx, const struct rio_result *res),
	       void *ctx);
void rio_stats(struct rio *r, struct remote_stats *st);

#endif
