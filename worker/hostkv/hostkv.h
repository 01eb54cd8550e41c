/* hostkv — a worker's view of the host copy of its sequences' KV (docs/design.md §2–3): HND page blocks
 * (layout.h) kept by a running kvstored (through the client library: pool mapping, rings,
 * control requests) or, without --store, by an embedded in-process store built from the same
 * kvstore modules with no IPC.
 *
 * Every token's K and V reaches the host copy: policies write a page's tokens into its block as
 * they are appended (the tail page by write-through each step), and the engine commits the
 * sequence's length and token ids after each step. Retrieval policies read committed blocks
 * back for recall. A block's pool offset is only stable while the worker leases it (docs/design.md §4).
 * By default (lease budget 0) the worker leases every block of the sequences it has open, so
 * kvstored never moves them. With a lease budget of B blocks per sequence, the blocks that are
 * full, committed and not pinned stay leased only while they are among the B most recently
 * used; the others are RELEASEd (kvstored may demote them to NVMe) and RECALLed when a reader
 * pins them again, so one sequence's KV may exceed the DRAM pool. Blocks at or past the tail
 * page (being written, or allocated ahead) are always leased. Blocks are allocated ahead,
 * several pages of every layer per ring batch, so appending stays off the ring until a batch
 * is used up. With kvstored a heartbeat thread keeps the worker alive while it computes.
 *
 * The embedded store is kvstored's own sequence table and data plane (seq.c, dataplane.c: pool,
 * slab classes, ring, leases, the same checks) run in-process, with direct calls instead of
 * the control plane; its shared memory is unlinked as soon as it is mapped. Sequences live as
 * long as the handle: a resume needs kvstored.
 *
 * Ownership: hostkv_open() allocates the store handle (connection, mappings, embedded pool);
 * hostkv_close() closes every sequence still open (detaching them) and frees everything.
 * hostkv_seq_open() allocates a sequence handle that hostkv_seq_close() frees. Errors are
 * 0 or -errno with a message in err (the daemon's text when it refused). One thread uses a
 * handle at a time, except the pins and unpins (hostkv_block_ro_pin(), hostkv_pin_many() and
 * their unpins), which the recall thread may call while the compute thread appends and
 * commits. */
#ifndef FREEKV_HOSTKV_H
#define FREEKV_HOSTKV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "model.h"

struct hostkv;
struct hostkv_seq;

struct hostkv_opts {
	const char *endpoint;	  /* kvstored endpoint; NULL: embedded in-process store */
	const char *worker_name;  /* shown by `kvctl workers` */
	size_t embedded_bytes;	  /* pool size of the embedded store (0: a default) */
	int timeout_ms;		  /* control request timeout (0: a default) */
	/* kvstored found gone: for up to this many seconds, reconnect and continue in place
	 * (0: every later call fails; the caller closes the handle). */
	int retry_s;
	/* Leases kept per sequence on full, committed, unpinned blocks (0: every block leased,
	 * the default; at most HOSTKV_MAX_BUDGET). */
	uint32_t lease_budget;
};

#define HOSTKV_MAX_BUDGET (1u << 24)

int hostkv_open(const struct hostkv_opts *o, struct hostkv **out, char *err, size_t errlen);
void hostkv_close(struct hostkv *h);
bool hostkv_is_remote(const struct hostkv *h);
/* True once a call found kvstored gone (the connection lost, nothing answering, or its shutdown
 * notice): every later call fails too. The caller closes the handle (its sequences are kept by
 * the store, docs/design.md §4 "Restart without loss") and opens a new one to go on. */
bool hostkv_store_gone(const struct hostkv *h);
/* After the store was found gone: false when the attempt to continue in place (retry_s) never
 * reached a running store again (it did not come back in time); true when it did, or when
 * there was no attempt. */
bool hostkv_store_came_back(const struct hostkv *h);

struct backend;
/* Registers the pool mapping that s's blocks live in with be (its host_register op: page-locked
 * for DMA recall) once per store handle; 0 at once when be has no host_register. On failure
 * nothing stays registered and err says why (LimitMEMLOCK when the system refused the lock);
 * -EBUSY when another backend holds the registration. hostkv_close() undoes it, so be must
 * outlive the store handle. */
int hostkv_seq_register(struct hostkv_seq *s, struct backend *be, char *err, size_t errlen);

/* Opens sequence name for this model (fingerprint) and KV geometry, creating it when create
 * is set and it does not exist. An existing sequence with another fingerprint or geometry is
 * refused. The sequence is attached to this worker until closed. */
int hostkv_seq_open(struct hostkv *h, const char *name, const uint8_t *fingerprint,
		    int n_layers, const struct kv_geom *g, bool create, struct hostkv_seq **out,
		    char *err, size_t errlen);
/* Prefix sharing (docs/design.md §4): a new sequence opened with its prompt's ids attaches the
 * leading pages of the same prompt that another sequence of the same model, geometry, ubatch,
 * namespace (salt) and variant already has in the store; its committed length (and the ids it
 * keeps: the whole prompt) tell the caller where to start its prefill, which must run in
 * chunks of ubatch from there. The embedded store shares nothing. */
struct hostkv_prefix {
	const int32_t *ids;	/* the prompt */
	size_t n_ids;
	uint32_t ubatch;
	const char *salt;	/* NULL or "": the default namespace */
	const char *variant;	/* backend and policy: what else decides a page's bits */
};
int hostkv_seq_open_prefix(struct hostkv *h, const char *name, const uint8_t *fingerprint,
			   int n_layers, const struct kv_geom *g, const struct hostkv_prefix *px,
			   struct hostkv_seq **out, char *err, size_t errlen);
/* Tokens whose K/V are committed in the host copy. */
int64_t hostkv_seq_committed(const struct hostkv_seq *s);
/* Token ids kept with the sequence (may run past the committed K/V by the tokens sampled but
 * not yet run through the model); *ids is borrowed until the next call on s. */
int64_t hostkv_seq_tokens(const struct hostkv_seq *s, const int32_t **ids);

/* The HND block of (layer, page) for writing, allocated when it does not exist yet. The pointer
 * stays valid while the page is at or past the tail page (committed / p), which is where every
 * write goes. Without a lease budget any allocated page may be asked for and stays valid
 * until close; with one, a full committed page is refused (-EBUSY): read it through a pin. */
int hostkv_block(struct hostkv_seq *s, int layer, int page, void **block, char *err,
		 size_t errlen);
/* Pins an allocated block for reading (-ENOENT when there is none): *block stays valid, and the
 * block leased, until the matching hostkv_unpin(). A block that is not leased is RECALLed first
 * (kvstored promotes it from NVMe when it was demoted), then the least recently used evictable
 * leases past the budget are released. Pins nest (a count per block). */
int hostkv_block_ro_pin(struct hostkv_seq *s, int layer, int page, const void **block,
			char *err, size_t errlen);
/* Pins pages[0..n) of one layer as hostkv_block_ro_pin() would, one pin per entry (a page
 * listed twice is pinned twice), blocks[i] the block of pages[i]; the pages that are not leased
 * are RECALLed together, up to 32 a ring entry, in one run of the ring, and the budget is
 * enforced once after. All or nothing: on an error (-ENOENT for a page with no block, before
 * anything is pinned) no pin of the call is left. pages is borrowed for the call. */
int hostkv_pin_many(struct hostkv_seq *s, int layer, const int *pages, int n,
		    const void **blocks, char *err, size_t errlen);
/* Drops one pin of (layer, page) (-EINVAL when it holds none); may release leases over the
 * budget (a RELEASE failure is returned, the pin is dropped either way). */
int hostkv_unpin(struct hostkv_seq *s, int layer, int page, char *err, size_t errlen);
/* Drops one pin of each of pages[0..n) of one layer: all of them, or none (-EINVAL when one of
 * them holds no pin left), then releases leases over the budget once, as hostkv_unpin(). */
int hostkv_unpin_many(struct hostkv_seq *s, int layer, const int *pages, int n, char *err,
		      size_t errlen);

/* Lease counters of a sequence: held, evictable and pinned are counted from the block table
 * now; recalls (blocks leased again on demand), recall_ops (the RECALL ring entries that carried
 * them, up to 32 blocks each) and releases (leases dropped for the budget) since open. With a
 * budget, evictable <= budget after every call. */
struct hostkv_lease_stats {
	uint64_t budget, held, evictable, pinned, recalls, recall_ops, releases;
};
void hostkv_seq_lease_stats(struct hostkv_seq *s, struct hostkv_lease_stats *st);

/* Commits: the K/V of positions < committed_tokens are written, and the token ids
 * ids[0..n) at positions first.. are kept with the sequence. Ids already kept must agree and
 * are not sent again. A length that only moves inside pages already committed, with no new
 * ids, reaches the store with the next commit that sends something (or at close): after a
 * crash the store's length may lag by those steps, whose ids it keeps, and a resume runs them
 * again. */
int hostkv_commit(struct hostkv_seq *s, int64_t committed_tokens, const int32_t *ids,
		  int64_t first, int64_t n, char *err, size_t errlen);
/* The store a sequence was opened in. */
struct hostkv *hostkv_seq_store(const struct hostkv_seq *s);
/* hostkv_commit for count sequences of one store (each once), as a batch's decode step keeps
 * every sequence's sampled id: each one's checks and filled pages, then all their token ids'
 * requests together, one round trip's wait for them all (kvstored; the embedded store takes
 * them in turn). rets[i] is sequence i's result, what hostkv_commit would have returned;
 * returns 0 or the first error, its message in err. */
int hostkv_commit_many(struct hostkv_seq *const *ss, const int64_t *committed_tokens,
		       const int32_t *const *ids, const int64_t *first, const int64_t *n,
		       int count, int *rets, char *err, size_t errlen);
/* Detaches (drop = false: the store keeps it for a later resume) or drops the sequence. */
int hostkv_seq_close(struct hostkv_seq *s, bool drop);

/* Reports the worker's statistics (a JSON object; its keys decode_tok_s, tokens_decoded,
 * pages_recalled, bytes_recalled, correction_rate, and refreshkv's full_step_rate,
 * tokens_fetched, full_step_ms and layers[i].full_step_rate, when present, are what `kvctl
 * workers` shows) to kvstored now, as a heartbeat. -EINVAL for text that is not a JSON object,
 * -EOPNOTSUPP for the embedded store. */
int hostkv_report_stats(struct hostkv *h, const char *json);

#endif
