/* hostkv_table — the block table shared by hostkv.c (the block logic) and hostkv_reconnect.c
 * (continuing in place after kvstored restarts). Private to worker/hostkv/. */
#ifndef FREEKV_HOSTKV_TABLE_H
#define FREEKV_HOSTKV_TABLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "freekv_store.h"
#include "hostkv.h"
#include "layout.h"

struct hostkv {
	const struct hostkv_store_ops *ops;
	void *st;
	uint8_t *base;
	uint64_t bytes;
	bool remote;
	struct backend *reg_be;	/* the backend the pool mapping is registered with, or NULL */
	pthread_mutex_t mu;	/* store ops, last_call_ms, seqs list */
	uint64_t last_call_ms;
	struct hostkv_seq *seqs;
	uint32_t lease_budget;
	/* In-place reconnection (hostkv_reconnect.c): every public op holds `life` for reading,
	 * a reconnection holds it for writing; gen counts reconnections. */
	pthread_rwlock_t life;
	uint64_t gen;
	uint32_t retry_ms;	/* 0: a store found gone stays gone */
	int8_t came_back;	/* -1: no attempt yet; else whether a failed attempt reached a store */

	pthread_t hb;		/* heartbeat thread, when the store needs one */
	bool hb_running, hb_stop;
	pthread_cond_t hb_cond;
	uint32_t hb_ms;
	int hb_err;		/* last heartbeat failure, 0 when fine */
};

/* One (layer, page) of a sequence. */
struct hk_block {
	uint64_t off;	/* pool offset, valid while leased */
	uint64_t lease;	/* lease id, 0 when not leased */
	uint64_t used;	/* LRU stamp (s->clock when last pinned or leased) */
	uint32_t pins;
};

struct hostkv_seq {
	struct hostkv *h;
	struct hostkv_seq *next;
	uint64_t id;
	char name[128];
	uint8_t fp[FKV_FINGERPRINT_BYTES];	/* model fingerprint, for a reopen */
	struct kvs_geometry kg;			/* as the store was told */
	int n_layers;
	struct kv_geom g;
	size_t block_bytes;
	uint64_t all_heads;	/* RECALL head mask */
	uint32_t budget;	/* evictable leases kept; 0: lease-all */

	pthread_mutex_t mu;	/* everything down to n_releases */
	struct hk_block *blk;	/* (n_layers, cap) */
	uint32_t cap;
	uint32_t *n_alloc;	/* (n_layers,) pages [0, n) have a block */
	uint32_t full;		/* pages [0, full) are full and committed: committed / p */
	uint64_t clock;
	uint64_t n_held;	/* blocks leased */
	uint64_t n_evictable;	/* leased, unpinned, page < full */
	uint64_t n_recalls;	/* blocks leased again on demand */
	uint64_t n_recall_ops;	/* RECALL entries sent for them */
	uint64_t n_releases;	/* leases released for the budget */

	uint32_t n_commit_pages; /* pages [0, n) of every layer were COMMITted */
	int64_t committed;	/* ours; the store's lags by a step while lagging is set */
	bool lagging;
	int32_t *ids;		/* ids kept by the store, (n_ids,) */
	size_t n_ids, cap_ids;
};

void hk_lock_store(struct hostkv *h);
/* control: a control request went out (the heartbeat thread waits longer). */
void hk_unlock_store(struct hostkv *h, bool control);
struct hk_block *hk_blk(struct hostkv_seq *s, int layer, uint32_t page);
/* Leases the allocated blocks of pages [p0, p1) of layers [l0, l1) that hold no lease. */
int hk_lease_missing(struct hostkv_seq *s, int l0, int l1, uint32_t p0, uint32_t p1,
		     char *err, size_t errlen);
/* Allocates pages [n_alloc[l], upto) of every layer, then leases them. */
int hk_alloc_pages(struct hostkv_seq *s, uint32_t upto, char *err, size_t errlen);
/* COMMITs pages [n_commit_pages, pages) of every layer, the length moving to committed. */
int hk_commit_blocks(struct hostkv_seq *s, uint32_t pages, int64_t committed, char *err,
		     size_t errlen);
int hk_keep_ids(struct hostkv_seq *s, const int32_t *ids, size_t first, size_t n);

/* A public op found the store gone (op_gen: h->gen when it started; `life` not held): when
 * retrying is allowed, reconnects and re-establishes every open sequence in place — same pool
 * mapping, same block pointers, the store brought up to what this worker had committed — so
 * that the op can run again and the caller never sees the restart. 0 when the op should run
 * again (another thread may have reconnected already), else the op's error stands (err then
 * says why continuing failed). */
int hk_reconnect(struct hostkv *h, uint64_t op_gen, char *err, size_t errlen);

#endif
