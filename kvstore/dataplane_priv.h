/* dataplane_priv — the data plane's state, shared by its two source files: dataplane.c (ring
 * ops, leases, demotion, promotion) and dataplane_thread.c (the data-plane thread and its lock).
 * Private to those two files; everyone else uses dataplane.h. */
#ifndef FREEKV_DATAPLANE_PRIV_H
#define FREEKV_DATAPLANE_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dataplane.h"
#include "ring.h"

#define DP_RECALL_MAX 32u
#define DP_DEMOTE_QUEUE 64u		/* sequences whose explicit demotion is still going */

struct dp_lease {
	uint32_t block;	/* POOL_NO_BLOCK when the slot is free */
	uint32_t gen;
};

/* A ring op that waits: an ALLOC for room, a RECALL for promotions. */
struct dp_pending {
	struct ring_entry e;
	uint32_t blocks[DP_RECALL_MAX];
	uint64_t lease_ids[DP_RECALL_MAX];	/* 0: not leased yet */
	uint64_t t0_us;
	struct dp_pending *next;
};

struct dp_worker {
	uint32_t wid;
	struct ring *ring;
	struct dp_lease *leases;	/* (cap,) */
	uint32_t *free_slots;		/* (cap,) stack of free lease slots */
	uint32_t cap, n_free, n_leases;
	struct dp_pending *pending;
	bool corrupt_logged;		/* "ring corrupted" was logged for this worker */
};

struct dp {
	const struct cfg *cfg;
	struct seq_table *seqs;
	struct pool *pool;
	struct tier *tier;
	pthread_mutex_t lock;		/* see dp_lock */
	pthread_t thread;
	bool thread_running;		/* written by the control-plane thread only */
	_Atomic bool thread_stop;
	_Atomic uint32_t kick;		/* private futex word: wakes the sleeping data-plane thread */
	_Atomic uint32_t ctl_waiting;	/* control-plane threads waiting in dp_lock */
	struct dp_worker *w;		/* (max_workers,) slots with ring NULL are free */
	size_t max_w;
	uint64_t demoted, promoted, crc_errors, demoting;
	struct dp_opstat ops[DP_N_OPS];
	char ring_prefix[CFG_STR_MAX];
	uint64_t demote_q[DP_DEMOTE_QUEUE];	/* sequence ids, see demote_queue_run */
	size_t n_demote_q;
};

#endif
