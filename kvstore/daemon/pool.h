/* pool — kvstored's DRAM pool: a named shared-memory segment holding every page block, and the
 * daemon-private metadata of those blocks.
 *
 * Creator side (kvstored): pool_create makes the segment (POSIX shm under /dev/shm, or a file in
 * a hugetlbfs directory), mode 0660 with an optional group, reserves its memory (fallocate, so a
 * too-small /dev/shm is an error now and not a SIGBUS later), maps it and optionally mlocks it.
 * The segment is carved by slab.c into one slab class per block size. Each block in use has a
 * descriptor (struct pool_block) kept in daemon heap memory, NEVER in the shared segment: a
 * worker can scribble on block bytes but not on who owns them. A descriptor outlives the DRAM
 * copy of its block: when the block is demoted to the NVMe tier the DRAM slot is released and the
 * descriptor records the NVMe extent instead. pool_destroy unmaps and unlinks the segment.
 *
 * The segment itself is made with pool_map.h's helpers, which the client library shares
 * (ring segments, and the mapper side that workers use).
 *
 * Ownership: pool_create allocates struct pool and everything behind it; pool_destroy frees it.
 * Pointers returned by pool_block_get stay valid until that block is freed (descriptors live in
 * fixed chunks that never move). Not thread-safe: the daemon's event loop owns the pool.
 * Functions that take char *err write a one-line human message there on failure (err may be
 * NULL). */
#ifndef FREEKV_POOL_H
#define FREEKV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pool_map.h"

#define POOL_NO_BLOCK UINT32_MAX
#define POOL_NO_OFFSET UINT64_MAX

/* ---------------------------------------------------------------- the pool (creator side) */

struct pool_config {
	const char *shm_name;
	const char *hugetlbfs_dir;  /* optional */
	uint64_t dram_bytes;        /* segment size; whole slab units of it are used */
	bool lock_memory;           /* mlock the mapping; failure is an error naming LimitMEMLOCK= */
	const char *group;          /* optional */
	mode_t mode;                /* 0 means 0660 */
	uint64_t slab_unit_bytes;   /* 0: SLAB_UNIT_DEFAULT */
	bool unlink_existing;
	bool adopt;                 /* map an existing segment of this name and size as it is */
};

enum pool_tier {
	POOL_TIER_FREE = 0,   /* descriptor unused */
	POOL_TIER_DRAM,       /* bytes at dram_off */
	POOL_TIER_NVME,       /* bytes at nvme_off only */
	POOL_TIER_DEMOTING,   /* write DRAM -> NVMe in flight: both offsets valid, DRAM authoritative */
	POOL_TIER_PROMOTING,  /* read NVMe -> DRAM in flight: NVMe authoritative; dram_off valid
			       * except during a swap (pool_block_swap_begin) */
	POOL_TIER_REMOTE,     /* bytes in the remote tier only (Redis, remote_id) */
	POOL_TIER_OFFLOADING, /* NVMe -> remote in flight: NVMe authoritative, nvme_off valid */
	POOL_TIER_FETCHING,   /* remote -> DRAM in flight: remote authoritative, dram_off valid */
};

/* Block descriptor. The caller (daemon) may write the owner fields (seq_id, layer, page, refs,
 * crc/has_crc, user) directly; tier, locations, leases, committed and lru change only through
 * the pool_block_* functions below so the usage counters stay exact. */
struct pool_block {
	uint64_t seq_id;        /* owning sequence */
	uint32_t layer;
	uint32_t page;
	uint64_t dram_off;      /* POOL_NO_OFFSET when not in DRAM */
	uint64_t nvme_off;      /* POOL_NO_OFFSET when no NVMe extent */
	uint64_t remote_id;     /* its key in the remote tier; 0 when none */
	uint64_t lru;           /* pool clock at the last touch; smaller = colder */
	uint64_t user;          /* free for the daemon (e.g. owning worker id) */
	uint32_t bytes;         /* block size (the class's block_bytes) */
	uint32_t leases;        /* a leased block is never moved */
	uint32_t refs;          /* sequences mapping this block, + 1 while indexed (prefix.h) */
	uint32_t crc;           /* crc32c of the block bytes, valid when has_crc */
	uint32_t rows;          /* token rows of the page committed when rows_crc was taken */
	uint32_t rows_crc;      /* crc32c of those rows (persist.h), checked after a restart */
	uint16_t cls;           /* slab class */
	uint8_t tier;           /* enum pool_tier */
	bool committed;
	bool has_crc;
	bool doomed;            /* its sequence was dropped during its I/O: freed when that ends */
	bool indexed;           /* its page is in the prefix index, which holds one of refs */
	bool remote_published;  /* REMOTE: its bytes are a published sequence's block (the key
				 * follows from its sequence's name and generation), not this
				 * host's tier's: never deleted by this host */
	uint32_t self;          /* its own id */
	uint32_t lru_prev, lru_next; /* pool.c's list of DRAM blocks in lru order (private) */
	uint64_t kept_off;      /* DRAM: an NVMe extent still holding these very bytes (crc), kept
				 * from the promotion that brought them back; POOL_NO_OFFSET when
				 * none (docs/design.md §4 "Kept copies") */
	uint32_t kept_prev, kept_next; /* pool.c's list of blocks with a kept extent (private) */
};

struct pool_usage {
	uint64_t dram_bytes;       /* segment size */
	uint64_t dram_used_bytes;  /* bytes of DRAM slots in use (strides) */
	uint64_t dram_free_bytes;  /* what more blocks could still get, over all units */
	uint64_t blocks;           /* descriptors in use */
	uint64_t blocks_dram;
	uint64_t blocks_nvme;
	uint64_t blocks_inflight;  /* DEMOTING + PROMOTING + OFFLOADING + FETCHING */
	uint64_t blocks_remote;
	uint64_t blocks_leased;
	uint64_t blocks_committed;
	uint64_t blocks_kept;      /* DRAM blocks whose NVMe extent was kept (kept_off) */
	uint64_t kept_bytes;       /* the bytes of those extents */
	uint64_t slabs;
	unsigned classes;
	bool locked;               /* the mapping is mlocked */
};

struct pool;

/* Creates the segment, maps and (when lock_memory) locks it, sets up the slab classes' range.
 * Errors: those of pool_segment_create; -ENOMEM / -EPERM / -EAGAIN from mlock with a message
 * that names LimitMEMLOCK= / ulimit -l and lock_memory=false. */
int pool_create(const struct pool_config *cfg, struct pool **out, char *err, size_t err_len);
/* Unmaps, unlinks the segment, frees all metadata. NULL is fine. */
void pool_destroy(struct pool *p);

/* Whether pool_create mapped a previous daemon's segment (cfg->adopt) instead of a new one. */
bool pool_adopted(const struct pool *p);
/* With keep, pool_destroy unmaps the segment but leaves it for the next daemon to adopt. */
void pool_keep_segment(struct pool *p, bool keep);

void *pool_base(const struct pool *p);
uint64_t pool_bytes(const struct pool *p);
int pool_fd(const struct pool *p);
const char *pool_name(const struct pool *p);

/* Bytes of one page block [n_kv][2][p][d]; 0 when any factor is 0 or it overflows 32 bits. */
uint64_t pool_block_bytes(uint32_t n_kv, uint32_t page, uint32_t head_dim, uint32_t dtype_size);

/* Class for a block size (added on first use); see slab_class_get. */
int pool_class(struct pool *p, uint64_t block_bytes, unsigned *cls);

/* Allocates a DRAM block of class cls and a descriptor for it (tier DRAM, zero owner fields,
 * touched). *id names it until pool_block_free. -ENOSPC when DRAM is full (demote, then retry). */
int pool_block_alloc(struct pool *p, unsigned cls, uint32_t *id);
/* Frees the descriptor and its DRAM slot, if any. The caller frees the NVMe extent (tier.h)
 * first, a kept one too (pool_block_unkeep). -EINVAL for an unknown id, -EBUSY for a leased or
 * in-flight block. */
int pool_block_free(struct pool *p, uint32_t id);

/* Restart (persist.h): a committed block that a previous daemon left in DRAM at off, inside the
 * slab that starts at slab_base (see slab_adopt), or on NVMe at nvme_off with its crc. The
 * descriptor comes back committed, unleased, with zero owner fields. -EEXIST / -EINVAL /
 * -ERANGE from slab_adopt when the offset cannot be taken as it was. */
int pool_block_adopt_dram(struct pool *p, unsigned cls, uint64_t slab_base, uint64_t off,
			  uint32_t *id);
int pool_block_adopt_nvme(struct pool *p, unsigned cls, uint64_t nvme_off, uint32_t crc,
			  uint32_t *id);
/* Start of the slab holding a DRAM-resident block (journaled with it). -EINVAL otherwise. */
int pool_block_slab_base(const struct pool *p, uint32_t id, uint64_t *base);
/* For an ALLOC of class cls that found no block while every slab unit is owned: the range of
 * the other class's slab to empty (see slab_reclaim_pick). -EAGAIN when a unit is free. */
int pool_reclaim_pick(struct pool *p, unsigned cls, uint64_t *base, uint64_t *bytes,
		      uint64_t *stride);
/* The ALLOCs of class cls stopped waiting: units kept for it go back (slab_unreserve). */
void pool_unreserve(struct pool *p, unsigned cls);

/* Descriptor of a live block, or NULL for an unknown / freed id. */
struct pool_block *pool_block_get(struct pool *p, uint32_t id);
/* Pointer to the DRAM bytes of a block, NULL when it has none. */
void *pool_block_data(struct pool *p, uint32_t id);

/* Maps a pool offset (e.g. one a worker sent) to its block. -ERANGE outside the pool, -EINVAL
 * when off is not the start of a block in use. */
int pool_block_at(const struct pool *p, uint64_t off, uint32_t *id);

void pool_block_touch(struct pool *p, uint32_t id);
/* +1 / -1 lease. -EINVAL unknown id or unlease of an unleased block. */
int pool_block_lease(struct pool *p, uint32_t id);
int pool_block_unlease(struct pool *p, uint32_t id);
/* Sets committed (counted in pool_usage). */
int pool_block_set_committed(struct pool *p, uint32_t id, bool committed);

/* Demotion, in two steps around the NVMe write (tier.h):
 *   begin: DRAM -> DEMOTING, records nvme_off (an extent the caller allocated). -EBUSY leased.
 *   end ok: DEMOTING -> NVME, releases the DRAM slot, records crc.
 *   end failed: DEMOTING -> DRAM, forgets nvme_off (the caller frees the extent). */
int pool_block_demote_begin(struct pool *p, uint32_t id, uint64_t nvme_off);
int pool_block_demote_end(struct pool *p, uint32_t id, bool ok, uint32_t crc);
/* Promotion: begin: NVME -> PROMOTING, allocates a DRAM slot (-ENOSPC when none);
 *   end ok: PROMOTING -> DRAM; with keep the extent becomes the block's kept_off (the newest
 *   kept), else nvme_off is forgotten (the caller frees the extent);
 *   end failed: PROMOTING -> NVME, releases the DRAM slot (if it has one: see swaps). */
int pool_block_promote_begin(struct pool *p, uint32_t id);
int pool_block_promote_end(struct pool *p, uint32_t id, bool ok, bool keep);

/* Kept copies (docs/design.md §4): a committed block never changes, so the extent a promotion
 * read it from still holds its bytes, and demoting it again needs no write.
 *   demote_kept: DRAM -> NVME at kept_off, releasing the DRAM slot, with no I/O; crc stays.
 *     The caller has checked that the DRAM bytes still have that crc. -EINVAL when the block
 *     is not in DRAM or has no kept extent, -EBUSY leased.
 *   unkeep: forgets the kept extent and returns its offset (POOL_NO_OFFSET: none) for the
 *     caller to free: the bytes changed (a COMMIT), the block goes, or the tier needs room.
 *   kept_newest: the block whose extent was kept last (POOL_NO_BLOCK: none), the one whose
 *     copy is least likely to be used soon. */
int pool_block_demote_kept(struct pool *p, uint32_t id);
uint64_t pool_block_unkeep(struct pool *p, uint32_t id);
uint32_t pool_kept_newest(const struct pool *p);

/* The remote tier below NVMe (docs/design.md §8), around a Redis write or read the caller runs
 * (remote_io.h):
 *   offload begin: NVME -> OFFLOADING. end ok: -> REMOTE with remote_id, nvme_off forgotten
 *   (the caller frees the extent); end failed: -> NVME.
 *   fetch begin: REMOTE -> FETCHING with a DRAM slot (-ENOSPC when none). end ok: -> DRAM
 *   (touched; remote_id kept for the caller to delete, then clear); end failed: -> REMOTE,
 *   the slot released. */
int pool_block_offload_begin(struct pool *p, uint32_t id);
int pool_block_offload_end(struct pool *p, uint32_t id, bool ok, uint64_t remote_id);
int pool_block_fetch_begin(struct pool *p, uint32_t id);
int pool_block_fetch_end(struct pool *p, uint32_t id, bool ok);
/* Restart: a committed block a previous daemon left in the remote tier under remote_id. */
int pool_block_adopt_remote(struct pool *p, unsigned cls, uint64_t remote_id, uint32_t crc,
			    uint32_t *id);

/* Swap, when DRAM and NVMe are both full: NVMe-resident block a takes DRAM-resident block v's
 * slot and v takes a's extent, around two I/Os the caller runs (read a's extent into a buffer,
 * write v's bytes to that extent, copy the buffer into v's slot).
 *   begin: a NVME -> PROMOTING with no DRAM slot (NVMe authoritative); v DRAM -> DEMOTING to
 *          a's extent (DRAM authoritative). -EINVAL wrong tiers, a == v or different classes;
 *          -EBUSY v leased.
 *   commit: v -> NVME at a's old extent with v_crc, its slot now a's; a -> DRAM in that slot
 *          (touched). The slot must already hold a's bytes.
 * To undo a begin: pool_block_demote_end(v, false, 0) and pool_block_promote_end(a, false),
 * in either order, each when its side is done (a keeps its extent and crc). */
int pool_block_swap_begin(struct pool *p, uint32_t a, uint32_t v);
int pool_block_swap_commit(struct pool *p, uint32_t a, uint32_t v, uint32_t v_crc);

/* Victim scan for demotion. rank(ctx, b) is called for DRAM-resident, unleased blocks and
 * returns -1 to skip it, else a rank (0 = most preferred). Up to max ids are written to ids in
 * (rank, lru) order; *n gets the count. The daemon ranks unleased committed blocks of detached
 * sequences 0, other committed blocks 1, and skips uncommitted ones. The pool keeps its DRAM
 * blocks on a list in lru order, so the scan walks from the coldest and stops once it has max
 * blocks of rank 0: under a full pool of detached sequences a demotion costs what it takes,
 * not a pass over every descriptor. */
typedef int (*pool_rank_fn)(void *ctx, const struct pool_block *b);
int pool_victims(struct pool *p, pool_rank_fn rank, void *ctx, uint32_t *ids, size_t max,
		 size_t *n);

/* The same scan spread over calls, budget blocks at a time, so that a walk of a full pool never
 * holds its caller (the data plane) for long: begin, step until it returns 1, end. The pool may
 * change between steps: a block leaving DRAM under the cursor moves the cursor on, and a block
 * touched after its visit may be visited again at the tail, so the result can name a block
 * twice or one no longer a victim: callers check each before using it. pool_victims is
 * begin + one unbounded step + end. */
struct pool_scan {
	struct pool_scan *next;		/* the pool's live scans (private) */
	uint32_t cursor;
	size_t max, n0, n;
	uint32_t *ids0;			/* rank-0 blocks, in lru order */
	uint64_t *lru0;			/* their lru when visited */
	void *heap;			/* the best max of the others */
};
int pool_scan_begin(struct pool *p, struct pool_scan *s, size_t max);
/* 1: the scan is complete; 0: budget blocks visited, more to go. */
int pool_scan_step(struct pool *p, struct pool_scan *s, pool_rank_fn rank, void *ctx,
		   size_t budget);
/* Writes the result in (rank, lru) order to ids (room for max) and, when lrus is not NULL,
 * each block's lru as it was when visited (a block touched since has another); frees the scan;
 * the count. */
size_t pool_scan_end(struct pool *p, struct pool_scan *s, uint32_t *ids, uint64_t *lrus);

/* Calls fn for every live block (id order); stops early when fn returns non-zero and returns
 * that value. Used by the daemon to drop a dead worker's blocks. */
typedef int (*pool_each_fn)(void *ctx, uint32_t id, struct pool_block *b);
int pool_each(struct pool *p, pool_each_fn fn, void *ctx);

void pool_usage(const struct pool *p, struct pool_usage *u);

#endif
