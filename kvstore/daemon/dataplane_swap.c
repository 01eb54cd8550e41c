/* dataplane_swap — promotion when DRAM and the NVMe tier are both full: the NVMe page trades
 * places with a cold DRAM block of its class. See struct dp_swap (dataplane_priv.h).
 *
 * Why this order keeps every page: the page's extent is read into a bounce buffer and its crc32c
 * checked before anything is overwritten, so a failed read changes nothing (both blocks stay
 * where they were, the RECALL gets the error). The victim is only read by the write, so it stays
 * intact in DRAM whatever the write does; if the write fails, the page's verified bytes are still
 * in the bounce and are written back to the extent (retried until they are) before the page is
 * NVMe-resident again. Only after the write succeeded are the bounce bytes copied into the
 * victim's slot and both descriptors switched. Meanwhile the page is PROMOTING and the victim
 * DEMOTING: neither can be leased, committed, freed or chosen by another move. */
#include "dataplane_priv.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "seq.h"
#include "slab.h"
#include "tier.h"
#include "log.h"

/* Pool blocks are read and written by the tier in place: their stride must hold whole O_DIRECT
 * units (tier.h). */
_Static_assert(SLAB_ALIGN % TIER_ALIGN == 0, "slab stride must hold whole tier units");


struct swap_rank {
	struct dp *dp;
	uint16_t cls;
};

/* As demotion ranks its victims (detached sequences first), among blocks of the page's class. */
static int rank_swap_victim(void *ctx, const struct pool_block *b)
{
	const struct swap_rank *r = ctx;
	return b->cls != r->cls ? -1 : dp_rank_victim(r->dp, b);
}

static uint64_t swap_cookie(const struct dp *dp, const struct dp_swap *sw)
{
	return (uint64_t)DP_COOKIE_SWAP << 32 | (uint32_t)(sw - dp->swaps);
}

/* Both blocks back where they were before pool_block_swap_begin. */
static void swap_undo(struct dp *dp, struct dp_swap *sw)
{
	pool_block_demote_end(dp->pool, sw->victim, false, 0);
	pool_block_promote_end(dp->pool, sw->block, false, false);
	sw->phase = DP_SWAP_FREE;
}

int dp_swap_start(struct dp *dp, uint32_t block)
{
	struct pool_block *b = pool_block_get(dp->pool, block);
	struct dp_swap *sw = NULL;
	for (unsigned i = 0; i < DP_SWAP_MAX && !sw; i++)
		if (dp->swaps[i].phase == DP_SWAP_FREE)
			sw = &dp->swaps[i];
	if (!sw)
		return -EBUSY;
	struct swap_rank rk = { dp, b->cls };
	uint32_t victim;
	size_t n;
	int ret = pool_victims(dp->pool, rank_swap_victim, &rk, &victim, 1, &n);
	if (ret)
		return ret;
	if (!n)
		return -ENOSPC;
	/* The tier moves whole TIER_ALIGN units (tier.h): room for the padding too. */
	const size_t io_bytes = ((size_t)b->bytes + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
	if (sw->bounce_bytes < io_bytes) {
		void *buf;
		if (posix_memalign(&buf, TIER_ALIGN, io_bytes))
			return -ENOMEM;
		free(sw->bounce);
		sw->bounce = buf;
		sw->bounce_bytes = io_bytes;
	}
	dp_unkeep(dp, victim); /* it takes the other block's extent */
	ret = pool_block_swap_begin(dp->pool, block, victim);
	if (ret)
		return ret;
	*sw = (struct dp_swap){
		.phase = DP_SWAP_READ, .block = block, .victim = victim, .nvme_off = b->nvme_off,
		.bytes = b->bytes, .bounce = sw->bounce, .bounce_bytes = sw->bounce_bytes,
	};
	ret = tier_read(dp->tier, sw->bounce, sw->nvme_off, sw->bytes, b->crc, swap_cookie(dp, sw));
	if (ret)
		swap_undo(dp, sw);
	return ret;
}

static void restore_submit(struct dp *dp, struct dp_swap *sw)
{
	int ret = tier_write(dp->tier, sw->bounce, sw->nvme_off, sw->bytes, swap_cookie(dp, sw));
	sw->restore_waiting = ret != 0;
	if (ret)
		sw->restore_at_us = dp_now_us() + DP_SWAP_RETRY_US;
}

static void read_done(struct dp *dp, struct dp_swap *sw, int status)
{
	if (status) {
		if (status == -EBADMSG)
			dp->crc_errors++;
		dp->swap_failures++;
		log_error("swap of NVMe block %u (offset %" PRIu64 ") with DRAM block %u: "
			"reading it failed (%s); both stay where they were", sw->block, sw->nvme_off,
			sw->victim, strerror(-status));
		uint32_t block = sw->block;
		swap_undo(dp, sw);
		dp_fail_recalls_of(dp, block, status);
		return;
	}
	if (tier_write(dp->tier, pool_block_data(dp->pool, sw->victim), sw->nvme_off, sw->bytes,
		       swap_cookie(dp, sw)))
		swap_undo(dp, sw); /* nothing written: the waiting RECALL starts over on its next pass */
	else
		sw->phase = DP_SWAP_WRITE;
}

static void write_done(struct dp *dp, struct dp_swap *sw, const struct tier_result *r)
{
	if (r->status) {
		pool_block_demote_end(dp->pool, sw->victim, false, 0);
		dp->swap_failures++;
		log_error("swap of NVMe block %u (offset %" PRIu64 ") with DRAM block %u: "
			"writing the DRAM block failed (%s); it stays in DRAM, block %u is written back from "
			"memory", sw->block, sw->nvme_off, sw->victim, strerror(-r->status), sw->block);
		dp_fail_recalls_of(dp, sw->block, r->status);
		sw->phase = DP_SWAP_RESTORE;
		sw->restore_tries = 0;
		restore_submit(dp, sw);
		return;
	}
	memcpy(pool_block_data(dp->pool, sw->victim), sw->bounce, sw->bytes);
	int ret = pool_block_swap_commit(dp->pool, sw->block, sw->victim, r->crc);
	assert(ret == 0);
	(void)ret;
	dp->swapped++;
	sw->phase = DP_SWAP_FREE;
	/* Both moves journaled; the promoted block's rows are checksummed afresh. */
	pool_block_get(dp->pool, sw->block)->rows = 0;
	pool_block_get(dp->pool, sw->block)->rows_crc = 0;
	dp_log_block(dp, sw->victim);
	dp_log_block(dp, sw->block);
	dp_retry_recalls_of(dp, sw->block);
}

static void restore_done(struct dp *dp, struct dp_swap *sw, const struct tier_result *r)
{
	if (r->status == 0) {
		/* The bounce was verified against this crc when read and has not changed since. */
		assert(r->crc == pool_block_get(dp->pool, sw->block)->crc);
		pool_block_promote_end(dp->pool, sw->block, false, false);
		log_info("block %u written back to NVMe offset %" PRIu64 " (%u failed "
			"attempt(s) before); it is NVMe-resident again", sw->block, sw->nvme_off,
			sw->restore_tries);
		sw->phase = DP_SWAP_FREE;
		return;
	}
	if (sw->restore_tries++ == 0)
		log_error("writing block %u back to NVMe offset %" PRIu64 " failed (%s); "
			"retrying every %u ms, its bytes are held in memory meanwhile", sw->block,
			sw->nvme_off, strerror(-r->status), DP_SWAP_RETRY_US / 1000);
	sw->restore_waiting = true;
	sw->restore_at_us = dp_now_us() + DP_SWAP_RETRY_US;
}

void dp_swap_done(struct dp *dp, const struct tier_result *r)
{
	uint32_t i = (uint32_t)r->cookie;
	if (i >= DP_SWAP_MAX)
		return;
	struct dp_swap *sw = &dp->swaps[i];
	switch (sw->phase) {
	case DP_SWAP_READ:
		read_done(dp, sw, r->status);
		break;
	case DP_SWAP_WRITE:
		write_done(dp, sw, r);
		break;
	case DP_SWAP_RESTORE:
		restore_done(dp, sw, r);
		break;
	default:
		break;
	}
}

void dp_swap_retry(struct dp *dp)
{
	uint64_t now = 0;
	for (unsigned i = 0; i < DP_SWAP_MAX; i++) {
		struct dp_swap *sw = &dp->swaps[i];
		if (sw->phase != DP_SWAP_RESTORE || !sw->restore_waiting)
			continue;
		if (!now)
			now = dp_now_us();
		if (now >= sw->restore_at_us)
			restore_submit(dp, sw);
	}
}

bool dp_swap_restoring(const struct dp *dp, uint32_t block)
{
	for (unsigned i = 0; i < DP_SWAP_MAX; i++)
		if (dp->swaps[i].phase == DP_SWAP_RESTORE && dp->swaps[i].block == block)
			return true;
	return false;
}

void dp_swap_shutdown(struct dp *dp)
{
	for (unsigned i = 0; i < DP_SWAP_MAX; i++) {
		free(dp->swaps[i].bounce);
		dp->swaps[i].bounce = NULL;
		dp->swaps[i].bounce_bytes = 0;
	}
}
