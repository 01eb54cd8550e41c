/* hostkv_impl — the seam inside hostkv between the block logic every store shares (hostkv.c:
 * the per-sequence block table, allocation ahead, leases, commits) and the two stores behind it:
 * a running kvstored reached through the client library (hostkv_remote.c) and the embedded
 * in-process store made of kvstored's own sequence table and data plane (hostkv_embedded.c).
 *
 * Both stores speak the ring protocol of ring.h for blocks, so ALLOC / COMMIT / RECALL / RELEASE
 * entries are built once in hostkv.c; the control requests (open, attach, token ids, close) are
 * one op each. A store state is created by its open function and freed by its close op. The
 * caller (hostkv.c) serialises every op with one mutex; ops are never called concurrently. */
#ifndef FREEKV_HOSTKV_IMPL_H
#define FREEKV_HOSTKV_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "freekv_store.h"
#include "hostkv.h"

/* Ring entries one ring op call may carry (well below every ring's capacity). */
#define HOSTKV_RING_BATCH 32u

struct hostkv_store_ops {
	const char *name;
	/* OpenSequence; *id is the store's sequence id. px (NULL: none) asks for prefix sharing
	 * (a store without it ignores it: nothing is covered). */
	int (*open_seq)(void *st, const char *name, const uint8_t *fp, size_t fp_len,
			const struct kvs_geometry *g, bool create, const struct hostkv_prefix *px,
			uint64_t *id, char *err, size_t errlen);
	/* Attach: the committed length and a malloc'ed copy of the token ids kept (caller frees). */
	int (*attach)(void *st, uint64_t id, uint64_t *committed, uint32_t **ids, size_t *n_ids,
		      char *err, size_t errlen);
	int (*commit_tokens)(void *st, uint64_t id, uint64_t committed, uint64_t first,
			     const uint32_t *ids, size_t n, char *err, size_t errlen);
	/* (optional) commit_tokens for n sequences, their round trips overlapped: rets[i] is
	 * c[i]'s result; returns 0 or the first error (its message in err). Without it, hostkv
	 * calls commit_tokens for each. */
	int (*commit_tokens_many)(void *st, const struct kvs_commit *c, int n, int *rets,
				  char *err, size_t errlen);
	/* Detaches (drop false) or drops; the store releases what the worker still holds of it. */
	int (*close_seq)(void *st, uint64_t id, bool drop, char *err, size_t errlen);
	/* Runs e[0..n) (n <= HOSTKV_RING_BATCH) and overwrites each entry with its completion;
	 * returns 0 when every completion arrived (their statuses are left to the caller). */
	int (*ring)(void *st, struct ring_entry *e, unsigned n, char *err, size_t errlen);
	/* (optional) A heartbeat, carrying stats when not NULL. */
	int (*heartbeat)(void *st, const Freekv__WorkerStats *stats, char *err, size_t errlen);
	/* (optional) Milliseconds between the control requests liveness needs; 0 = none needed. */
	uint32_t (*heartbeat_ms)(void *st);
	/* (optional) Why the store's DRAM pool is full and what would make room, one line for an
	 * ALLOC that failed with -ENOSPC (what holds it: detached sequences, leases, the NVMe
	 * tier). */
	void (*explain_full)(void *st, char *buf, size_t len);
	/* (optional) True once a call found the store gone (its daemon died, stopped or cannot
	 * be reached any more): the handle is dead, a new one must be opened. */
	bool (*gone)(void *st);
	/* (optional) Connects again to a store found gone (restarted): *st is a new state whose
	 * pool mapping is the old one (same base), and old_st is freed; on failure old_st is
	 * kept. -ESTALE when the store's pool is a new segment (what it held is gone). */
	int (*reopen)(void *old_st, void **st, char *err, size_t errlen);
	void (*close)(void *st);
};

/* Each opens its store and returns the pool mapping the blocks live in. */
int hostkv_remote_open(const struct hostkv_opts *o, const struct hostkv_store_ops **ops,
		       void **st, uint8_t **base, uint64_t *bytes, char *err, size_t errlen);
int hostkv_embedded_open(const struct hostkv_opts *o, const struct hostkv_store_ops **ops,
			 void **st, uint8_t **base, uint64_t *bytes, char *err, size_t errlen);

#endif
