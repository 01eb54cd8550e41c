/* embed — kvstored inside another process, for one-off runs that need no daemon: the daemon's
 * own sequence table (seq.c) and data plane (dataplane.c: pool, slab classes, a ring, leases,
 * every offset check) run in the caller, and this module plays the part of the control plane
 * (rpc.c) with direct calls. Same code, no IPC: block ops still travel through a ring, served by
 * the data plane right after they are pushed. There is no NVMe tier, so every op completes in
 * that one pass.
 *
 * This is the only daemon header a client may include (the worker's embedded host copy does);
 * everything it needs besides is kvstore/lib/ (struct kvs_geometry, struct ring_entry).
 *
 * The pool and ring segments get private names (pid and a counter) and are unlinked as soon as
 * they are mapped: nothing is left in /dev/shm however the process ends.
 *
 * Ownership: kvs_embed_open allocates the store and maps its pool; kvs_embed_close frees both
 * (the pool mapping returned by open dies with it). Not thread-safe: the caller serialises. */
#ifndef FREEKV_EMBED_H
#define FREEKV_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "freekv_store.h"

/* Ring entries one kvs_embed_ring call may carry. */
#define KVS_EMBED_RING_MAX 32u

struct kvs_embed;

/* Opens a store with a pool of about pool_bytes (0: a default of 64 MiB; rounded up to whole
 * 2 MiB units, at least 4 MiB). *base and *bytes are the pool as a worker maps it. */
int kvs_embed_open(uint64_t pool_bytes, struct kvs_embed **out, uint8_t **base, uint64_t *bytes,
		   char *err, size_t errlen);
void kvs_embed_close(struct kvs_embed *m);

/* OpenSequence: *id is the store's sequence id. */
int kvs_embed_open_seq(struct kvs_embed *m, const char *name, const uint8_t *fp, size_t fp_len,
		       const struct kvs_geometry *g, bool create, uint64_t *id, char *err,
		       size_t errlen);
/* Attach: the committed length and a malloc'ed copy of the token ids kept (caller frees). */
int kvs_embed_attach(struct kvs_embed *m, uint64_t id, uint64_t *committed, uint32_t **ids,
		     size_t *n_ids, char *err, size_t errlen);
/* CommitTokens, with kvstored's checks. */
int kvs_embed_commit_tokens(struct kvs_embed *m, uint64_t id, uint64_t committed, uint64_t first,
			    const uint32_t *ids, size_t n, char *err, size_t errlen);
/* CloseSequence: detaches (the worker's leases dropped, blocks never committed freed), then
 * drops the blocks and the sequence when drop is true. */
int kvs_embed_close_seq(struct kvs_embed *m, uint64_t id, bool drop, char *err, size_t errlen);
/* Runs e[0..n) (n <= KVS_EMBED_RING_MAX) and overwrites each entry with its completion. */
int kvs_embed_ring(struct kvs_embed *m, struct ring_entry *e, unsigned n, char *err,
		   size_t errlen);

#endif
