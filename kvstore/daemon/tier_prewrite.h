/* tier_prewrite — zeros written once over the NVMe tier file's never-written space, in the
 * background (docs/design.md §4 "NVMe tier").
 *
 * A file preallocated with fallocate holds *unwritten* extents: the first write of a block there
 * also converts its extent, a change of the filesystem's metadata that the next fdatasync of
 * any file on that filesystem (the journal's) has to commit with it. Zeros written once over
 * the whole file make every later write a data write only. Which ranges are still unwritten is
 * asked of the filesystem (FIEMAP) when it starts, so a restarted daemon goes on where the last
 * one stopped; a block device, or a filesystem that cannot say, needs nothing.
 *
 * One write of at most TPW_PIECE bytes is in flight at a time, over free space taken from the
 * tier's allocator for its duration (tier_extent_adopt), so no block is written there
 * meanwhile; space that holds blocks is passed over (their own writes converted it). The
 * caller drives it from the thread that drives the tier: tpw_step each pass queues the next
 * piece when none is in flight (tier_flush submits it), tpw_done takes its completion.
 *
 * Ownership: tpw_open allocates; tpw_close frees (call it after tier_close, or with no piece in
 * flight). Not thread-safe. */
#ifndef FREEKV_TIER_PREWRITE_H
#define FREEKV_TIER_PREWRITE_H

#include <stdbool.h>
#include <stdint.h>

#include "tier.h"

#define TPW_PIECE (1u << 20)

struct tpw;

/* Finds the tier file's unwritten ranges. 0 with *out NULL when there is nothing to write (a
 * block device, no FIEMAP, every byte written); -ENOMEM. */
int tpw_open(struct tier *t, struct tpw **out);
void tpw_close(struct tpw *p);
/* Queues the next piece (tier_write with cookie) when none is in flight; true when it did. */
bool tpw_step(struct tpw *p, uint64_t cookie);
/* The completion of the piece tpw_step queued. A failed write stops the prewrite (logged). */
void tpw_done(struct tpw *p, const struct tier_result *r);
/* Bytes of the file still to be written over (0 when done; NULL is done). */
uint64_t tpw_left(const struct tpw *p);
/* Bytes of free space it holds now for the piece in flight (taken from the allocator, so
 * counted in the tier's used bytes, though no block is there). */
uint64_t tpw_held(const struct tpw *p);
/* Asks the filesystem how many bytes of fd's [0, size) are unwritten (extents so flagged, and
 * holes); -errno when it cannot say (no FIEMAP). For tests and tools. */
int64_t tpw_unwritten_bytes(int fd, uint64_t size);

#endif
