/* specache_fetch — the row fetch stream of the `specache` policy (docs/design.md §5): a thread
 * per sequence that copies the exact rows a decode step selected for the next one — one KV
 * head's K and V row of one position each — from the host copy into the layer's staging,
 * beside the rest of the step. The next step waits for the layer's job before its attention at
 * that layer and uploads the staging to the device.
 *
 * Staging: per layer, (2, n_kv, k, d) in the KV dtype — row (h, slot) of the K half, then of the
 * V half — a host mirror of the layer's device rows: a job writes only the slots it lists, so
 * the rows kept from the previous step stay in place. Host blocks are read through pins
 * (hostkv_pin_many, up to 32 pages a call), which the host copy allows from this thread while
 * the compute thread appends and commits; the rows fetched are below the committed length, so
 * nothing writes them meanwhile.
 *
 * Ownership: sfetch_new() allocates the stream, its staging and starts the thread;
 * sfetch_free() waits for the job in progress, joins the thread and frees everything. A layer
 * has at most one job: between sfetch_submit() and sfetch_wait() the caller does not touch its
 * rows or staging. Errors are 0 or -errno. */
#ifndef FREEKV_SPECACHE_FETCH_H
#define FREEKV_SPECACHE_FETCH_H

#include <stdint.h>

#include "layout.h"

struct hostkv_seq;
struct sfetch;

/* One row to fetch: position pos of KV head head into staging slot (head, slot). */
struct sfetch_row {
	int head, slot;
	int64_t pos;
};

struct sfetch_opts {
	struct hostkv_seq *host; /* borrowed; outlives the stream */
	struct kv_geom g;	 /* host block geometry (n_kv, p, d, KV dtype) */
	int n_layers;
	int k;			 /* slots per KV head */
};

struct sfetch_done {
	int64_t rows;	   /* rows copied */
	int64_t bytes;	   /* bytes copied (K and V) */
	int64_t ns_waited; /* time sfetch_wait blocked */
	int64_t ns_hidden; /* time the job ran that sfetch_wait did not block for */
};

int sfetch_new(const struct sfetch_opts *o, struct sfetch **out);
void sfetch_free(struct sfetch *f);

/* The row list of a layer, n_kv·k entries, for the caller to fill before sfetch_submit. */
struct sfetch_row *sfetch_rows(struct sfetch *f, int layer);
/* The staging of a layer: (2, n_kv, k, d) in the KV dtype. */
void *sfetch_stage(struct sfetch *f, int layer);
/* Queues the first n rows of the layer's list (n 0: nothing to do, no job). -EBUSY when the
 * layer has a job not yet waited for. */
int sfetch_submit(struct sfetch *f, int layer, int n);
/* Waits for the layer's job (at once when it has none); its result, and its accounting in
 * *done when not NULL. */
int sfetch_wait(struct sfetch *f, int layer, struct sfetch_done *done);

#endif
