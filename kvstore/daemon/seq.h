/* seq — kvstored's sequences: identity, state, committed length, token ids, block map.
 *
 * A sequence is opened by name together with the model fingerprint and KV geometry of whoever
 * created it; a reopen that disagrees on either is refused, so two models never share KV. Its
 * state is attached (one worker decodes it), detached (kept, nobody attached) or orphaned (its
 * worker died while attached). The token ids travel with it so that a later worker can resume.
 * Its block map gives, per (layer, page), the pool block that holds that page (SEQ_NO_BLOCK when
 * none): the map only names blocks, the pool owns them and the dataplane frees them before a
 * sequence is removed. The table owns every struct seq and its arrays (heap); pointers returned
 * by lookups stay valid until seq_remove() or seq_table_shutdown(). Single-threaded. */
#ifndef FREEKV_SEQ_H
#define FREEKV_SEQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uthash.h>

#define SEQ_NAME_MAX 128	/* bytes including the NUL */
#define SEQ_FP_MAX 64
#define SEQ_NO_BLOCK UINT32_MAX
#define SEQ_MAX_LAYERS 512
#define SEQ_MAX_BLOCK_BYTES (64u << 20)

/* Values match freekv.DType and freekv.SequenceState in proto/kvstore.proto. */
enum seq_dtype { SEQ_DTYPE_F32 = 1, SEQ_DTYPE_F16 = 2, SEQ_DTYPE_BF16 = 3 };
enum seq_state { SEQ_ATTACHED = 1, SEQ_DETACHED = 2, SEQ_ORPHANED = 3 };
enum seq_remote { SEQ_REMOTE_NONE = 0, SEQ_REMOTE_OWNED, SEQ_REMOTE_PUBLISHED };

struct seq_geometry {
	uint32_t n_layers, n_kv_heads, head_dim, page_size;
	uint32_t dtype;	/* enum seq_dtype */
};

struct seq {
	uint64_t id;
	char name[SEQ_NAME_MAX];
	uint8_t fp[SEQ_FP_MAX];
	size_t fp_len;
	struct seq_geometry geo;
	uint64_t block_bytes;		/* one page of one layer: [n_kv][2][p][d] */
	enum seq_state state;
	uint32_t worker_id;		/* attached (or last attached, when orphaned) worker; 0 none */
	bool has_owner;			/* created by a welcomed client ... */
	uint32_t owner_uid;		/* ... of this uid: only it and admins may use it */
	uint64_t committed_tokens;
	uint32_t *tokens;		/* (n_tokens,) */
	size_t n_tokens, cap_tokens;
	uint32_t *blocks;		/* (n_layers, pages_cap) pool block ids */
	uint32_t pages_cap;
	uint32_t n_pages;		/* 1 + highest page with a block in any layer, 0 when none */
	/* Blocks that failed their checksum when a restarted daemon adopted them (persist.h):
	 * never served; the committed length was cut to the first of them. */
	uint32_t damaged_blocks;
	uint64_t damaged_cut_from;	/* committed length before the cut */
	/* Prefix sharing (docs/design.md §4, prefix.h): prefix_ubatch 0 takes no part. keys[p]
	 * is the content key of page p for p < n_keys (the pages published or attached); pages
	 * below publish_limit tokens were written by its own prefill in whole ubatches. */
	uint32_t prefix_ubatch;
	uint64_t publish_limit;
	uint64_t covered_tokens;	/* found in the pool at open (or taken by a fork) */
	uint8_t key0[32];
	uint8_t (*keys)[32];
	uint32_t n_keys, keys_cap;
	/* Beyond one host (remote.h): whether this host holds the name's Redis lease (OWNED) or
	 * handed it over by publishing (PUBLISHED: attaching takes it back), and the generation
	 * of the copy published or adopted (journaled: a restarted daemon renews its leases). */
	uint8_t remote;			/* enum seq_remote */
	uint64_t remote_gen;
	uint64_t snap_epoch;		/* persist.c: the journal compaction that has written it */
	size_t slot;			/* index in seq_table.v */
	UT_hash_handle hh_id, hh_name;	/* the table's indexes by id and by name */
};

/* Sequences in a dense array (for listing and scans) plus hash indexes by id and by name, so a
 * lookup stays O(1) at max_sequences (a million by the key's bounds). */
struct seq_table {
	struct seq **v;	/* (n,) owned */
	size_t n, cap, max;
	uint64_t next_id;
	struct seq *by_id, *by_name;	/* uthash heads */
};

int seq_table_init(struct seq_table *t, size_t max_sequences);
void seq_table_shutdown(struct seq_table *t);

/* Check a geometry: nonzero fields within bounds, a known dtype, a block of at most
 * SEQ_MAX_BLOCK_BYTES. -EINVAL with a message naming the field. */
int seq_check_geometry(const struct seq_geometry *g, char *err, size_t errlen);
uint64_t seq_block_bytes(const struct seq_geometry *g);

/* Open `name`, creating it (detached, no blocks) when absent and `create` is set. An existing
 * sequence must match fp and geometry (-EEXIST otherwise); tokens given for an existing sequence
 * must agree with the ids it keeps (-EINVAL). *created tells which case happened. */
int seq_open(struct seq_table *t, const char *name, const uint8_t *fp, size_t fp_len,
	     const struct seq_geometry *g, const uint32_t *tokens, size_t n_tokens, size_t max_tokens,
	     bool create, struct seq **out, bool *created, char *err, size_t errlen);

/* Restart (persist.h): re-creates sequence `id` as a previous daemon journaled it, detached,
 * with no tokens or blocks yet. -EEXIST for a known id or name, -ENOSPC past max_sequences,
 * -EINVAL for a bad name, fingerprint or geometry. Later opens get ids above every restored one. */
int seq_restore(struct seq_table *t, uint64_t id, const char *name, const uint8_t *fp,
		size_t fp_len, const struct seq_geometry *g, struct seq **out, char *err,
		size_t errlen);

struct seq *seq_find(const struct seq_table *t, uint64_t id);
struct seq *seq_find_name(const struct seq_table *t, const char *name);

/* Attach to worker `wid`: -EBUSY when another worker holds it. Orphans and detached sequences
 * can be attached by anyone. */
int seq_attach(struct seq *s, uint32_t wid, char *err, size_t errlen);
/* Detach: -EPERM unless attached by `wid`. */
int seq_detach(struct seq *s, uint32_t wid, char *err, size_t errlen);
/* Mark every sequence attached to `wid` orphaned; returns how many. */
size_t seq_orphan_worker(struct seq_table *t, uint32_t wid);

/* Set the committed length and append token ids (`first` is the index of tokens[0]; ids
 * already kept must agree, gaps are refused). */
int seq_commit(struct seq *s, uint64_t committed_tokens, uint64_t first, const uint32_t *tokens,
	       size_t n, size_t max_tokens, char *err, size_t errlen);

/* Block map. get returns SEQ_NO_BLOCK outside the map. set grows the map (-ENOMEM). */
uint32_t seq_block(const struct seq *s, uint32_t layer, uint32_t page);
int seq_set_block(struct seq *s, uint32_t layer, uint32_t page, uint32_t block);

/* Remove and free a sequence (its blocks must already be released by the caller). */
void seq_remove(struct seq_table *t, struct seq *s);

const char *seq_state_name(enum seq_state st);

#endif
