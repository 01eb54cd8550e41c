/* slab — carves the DRAM pool's byte range into slabs, one slab class per block size.
 *
 * The pool (pool.c) is the only user. The range [0, bytes) is cut into fixed units
 * (default 2 MiB, the huge-page size); a slab is a run of consecutive units owned by one class
 * and holds blocks of that class's stride (the block size rounded up to 4096, so every block
 * offset is O_DIRECT-aligned). Blocks are named by their byte offset in the range. Each
 * allocated block carries one caller-defined 32-bit tag (the pool stores its descriptor id
 * there) so an offset can be mapped back to its owner in O(1). A slab whose blocks are all free
 * gives its units back, so classes can share the range.
 *
 * Ownership: slab_init allocates the allocator and its metadata (private heap memory, never in
 * the shared segment); slab_shutdown frees it. Nothing here touches the bytes of the range.
 * Not thread-safe: the daemon's event loop owns it. */
#ifndef FREEKV_SLAB_H
#define FREEKV_SLAB_H

#include <stdint.h>

#define SLAB_ALIGN 4096u                    /* block alignment (O_DIRECT) */
#define SLAB_UNIT_DEFAULT (2u << 20)        /* 2 MiB */
#define SLAB_MAX_CLASSES 16u

struct slab_alloc;

struct slab_class_info {
	uint64_t block_bytes;     /* as requested */
	uint64_t stride;          /* block_bytes rounded up to SLAB_ALIGN */
	uint64_t slab_bytes;      /* bytes of one slab of this class (a multiple of the unit) */
	uint32_t blocks_per_slab;
	uint64_t slabs;           /* slabs this class holds now */
	uint64_t used;            /* allocated blocks */
	uint64_t free;            /* free blocks inside this class's slabs */
};

/* bytes: size of the range (whole units only are used); unit_bytes: 0 for SLAB_UNIT_DEFAULT,
 * else a multiple of SLAB_ALIGN. -EINVAL on bad sizes, -ENOMEM. */
int slab_init(struct slab_alloc **out, uint64_t bytes, uint64_t unit_bytes);
void slab_shutdown(struct slab_alloc *sa);

/* Finds the class for block_bytes, adding it when absent. -EINVAL for 0 or a block larger than
 * the range, -ENOSPC when SLAB_MAX_CLASSES classes exist already. */
int slab_class_get(struct slab_alloc *sa, uint64_t block_bytes, unsigned *cls);
int slab_class_info(const struct slab_alloc *sa, unsigned cls, struct slab_class_info *info);
unsigned slab_class_count(const struct slab_alloc *sa);

/* Allocates one block: *off is its byte offset, aligned to SLAB_ALIGN; its tag is 0.
 * -ENOSPC when no slab has a free block and no run of free units is left; -EINVAL bad class. */
int slab_alloc(struct slab_alloc *sa, unsigned cls, uint64_t *off);

/* Restart (persist.h): marks the block at off allocated inside the slab of class cls that starts
 * at byte base, making that slab when its units are free. Blocks are named by offsets that a
 * previous daemon handed out, so the slab must sit exactly where it sat then. -EEXIST when the
 * units or the block are taken otherwise, -EINVAL / -ERANGE for offsets that fit no slab. */
int slab_adopt(struct slab_alloc *sa, unsigned cls, uint64_t base, uint64_t off);
/* Start of the slab holding off (what slab_adopt needs again after a restart). */
int slab_base_of(const struct slab_alloc *sa, uint64_t off, uint64_t *base);

/* Frees the block that starts at off. -EINVAL when off is not the start of an allocated block
 * (double free, interior offset), -ERANGE when off is outside the range. */
int slab_free(struct slab_alloc *sa, uint64_t off);

/* 0 and *cls (may be NULL) when off is the start of an allocated block; -EINVAL / -ERANGE as
 * slab_free. This is how offsets received from a worker are validated. */
int slab_lookup(const struct slab_alloc *sa, uint64_t off, unsigned *cls);

/* Per-block tag of an allocated block; same errors as slab_lookup. */
int slab_set_tag(struct slab_alloc *sa, uint64_t off, uint32_t tag);
int slab_get_tag(const struct slab_alloc *sa, uint64_t off, uint32_t *tag);

/* When class cls needs a slab and no unit is free: the slab of another class with the fewest
 * blocks in use (its range and block stride), whose blocks, once moved out, give its units back.
 * The slab is marked draining (its class stops allocating in it) until it empties; a slab
 * already draining is picked again. When it empties, its units are kept for the class it was
 * first drained for: no other class can make a slab on them (under load the other classes'
 * allocations would otherwise take every unit the moment it came free, and the waiting class
 * would starve). They are given back when that class makes a slab, or by slab_unreserve.
 * -ENOENT when every slab is cls's. */
int slab_reclaim_pick(struct slab_alloc *sa, unsigned cls, uint64_t *base, uint64_t *bytes,
		      uint64_t *stride);
/* Gives back the free units kept for class cls (its wait for room ended without them). */
void slab_unreserve(struct slab_alloc *sa, unsigned cls);

/* Units not owned by any slab (kept for a class or not), those class cls can make a slab on,
 * and the unit size. */
uint64_t slab_free_units(const struct slab_alloc *sa);
uint64_t slab_free_units_for(const struct slab_alloc *sa, unsigned cls);
uint64_t slab_unit_bytes(const struct slab_alloc *sa);

#endif
