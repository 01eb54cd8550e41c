/* kvload — a host's load on one kvstored: N worker processes opening, committing, recalling,
 * detaching, resuming and closing thousands of sequences through the real client library, with
 * optional faults (kill -9, stalls past the liveness timeout, a hostile ring client, pool
 * pressure). Every committed byte is checked against content the generator can recompute, so
 * nothing lost and nothing wrong is a verdict, not a hope. See bench/load/README.md.
 *
 * This header holds what the parent (kvload.c) and the worker processes (load_worker.c) share:
 * the configuration, the page content function, and the latency histograms and counters a
 * worker sends back through a pipe when it ends, and keeps in a shared slot while it runs (so
 * that a worker killed by a fault still counts). */
#ifndef FREEKV_LOAD_H
#define FREEKV_LOAD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "freekv_store.h"

/* Log-linear histogram of nanoseconds: 2^LH_BITS sub-buckets per power of two, so a value
 * is known to within 1/LH_SUB of itself (3.1 %; exact below 2 * LH_SUB ns). Eight per power of
 * two (12.5 %) made a loaded-to-alone ratio of two bucket edges uncertain by as much. */
#define LH_BITS 5
#define LH_SUB (1u << LH_BITS)
#define LH_N (64 * LH_SUB)

struct hist {
	uint64_t n;
	uint64_t b[LH_N];
};

enum load_op { OP_ALLOC, OP_COMMIT, OP_RECALL, OP_RELEASE, OP_RPC, OP_N };

/* The parts of a ring round trip (kvs_ring_last_timing): waiting for kvstored to pop the
 * submission, kvstored's service, and the worker's wake-up after the post. */
enum load_part { PART_QUEUED, PART_SERVED, PART_WOKEN, PART_N };
#define LOAD_SLOW_NS 1000000u		/* a ring op this slow counts in load_stats.slow_* */

struct load_stats {
	struct hist h[OP_N];
	uint64_t ops[OP_N];
	struct hist part[PART_N];	/* every ring op's round trip, split */
	uint64_t slow_n, slow_ns[PART_N];	/* ring ops slower than LOAD_SLOW_NS: parts summed */
	uint64_t bytes_written, bytes_read;
	uint64_t pages_verified;	/* (page, layer) blocks checked byte for byte */
	uint64_t mismatches;		/* blocks whose bytes were wrong: must stay 0 */
	uint64_t lost;			/* committed blocks that could not be read back: must stay 0 */
	uint64_t errors;		/* failed requests (expected under faults, then recovered) */
	uint64_t recoveries;		/* reconnect + re-attach + verify after an error */
	uint64_t forged, forged_accepted; /* hostile client: forged ring entries, and successes */
	uint64_t sequences_churned;
	int32_t first_error;		/* -errno of the first error, for the report */
	char first_error_msg[160];
};

/* What a worker process has counted so far, where kvload reads it when the worker was killed
 * (kill -9 sends nothing down the pipe): its fill once the fill ends, and its steady phase copied
 * every LOAD_SLOT_PERIOD_S into one of two buffers, seq (odd: none yet) naming the whole one. */
#define LOAD_SLOT_PERIOD_S 0.25
struct load_slot {
	struct load_stats fill;
	_Atomic bool fill_done;
	_Atomic unsigned seq;			/* copies made; steady[(seq - 1) & 1] is the last */
	struct load_stats steady[2];
};

struct load_cfg {
	const char *endpoint;
	unsigned workers;
	unsigned sequences;		/* over all workers */
	unsigned pages;			/* full pages per sequence (blocks = pages * layers) */
	unsigned layers;
	double duration_s;		/* steady phase */
	double steady_s;		/* > 0: a worker's steady phase lasts this long after its
					 * own fill (else it ends at the deadline) */
	double rate;			/* ops/s over all workers, 0 unlimited */
	unsigned slice_us;		/* > 0: every worker process asks the scheduler for slices of
					 * this length (common/sched_slice.h), as kvworker --slice-us */
	uint64_t seed;
	struct kvs_geometry geo;
	volatile uint8_t *filled;	/* shared with the parent: [wi] set once worker wi has
					 * filled its sequences (NULL: not told) */
	struct load_slot *slots;	/* shared with the parent: [wi] (NULL: none kept) */
};

/* Bytes of one block of cfg's geometry. */
size_t load_block_bytes(const struct load_cfg *c);

/* Content of block (seq name, layer, page): what was written and what must come back. */
void load_fill(uint8_t *p, size_t n, const char *seq, uint32_t layer, uint32_t page);
bool load_check(const uint8_t *p, size_t n, const char *seq, uint32_t layer, uint32_t page);

void hist_add(struct hist *h, uint64_t ns);
void hist_merge(struct hist *into, const struct hist *h);
/* The value below which a fraction q of the samples fall (a bucket's upper edge), in ns. */
uint64_t hist_pct(const struct hist *h, double q);
/* The bucket of value v, and the largest value it holds (exposed for the histogram's test). */
unsigned hist_bucket(uint64_t v);
uint64_t hist_bucket_top(unsigned b);
void stats_merge(struct load_stats *into, const struct load_stats *s);
/* Adds the split of k's last ring round trip to s. */
void stats_add_ring_parts(struct load_stats *s, const struct kvs *k);
const char *load_op_name(enum load_op op);

/* Runs worker `wi` of cfg until its deadline; writes two struct load_stats to out_fd: the fill,
 * then the steady phase. The sequences it owns are "w<wi>-s<j>"; it attaches them (creating the
 * missing ones), verifies what they hold, fills them (as fast as it can), then loops over
 * recall/verify, detach/resume, churn and status calls at cfg->rate. Returns the process exit
 * status (0 unless it could not recover). */
int load_worker_run(const struct load_cfg *cfg, unsigned wi, double deadline_s, int out_fd);

/* A hostile client until deadline_s: forged COMMITs and RELEASEs of offsets and leases it was
 * never given, RECALLs of sequences it has not attached. Every one must be refused. Writes an
 * empty fill and its struct load_stats to out_fd. */
int load_hostile_run(const struct load_cfg *cfg, double deadline_s, int out_fd);

/* Attaches every sequence of cfg in turn and checks every committed block; adds to s. Returns 0
 * or the first error. */
int load_verify_all(const struct load_cfg *cfg, struct load_stats *s);

double load_now_s(void);
/* Whether every worker of cfg has filled its sequences (cfg->filled set). */
bool load_all_filled(const struct load_cfg *cfg);

#endif
