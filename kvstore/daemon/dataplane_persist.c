/* dataplane_persist — the data plane's side of restart without loss (docs/design.md §4,
 * persist.h): the group commit that every completion waits for, the journal records of block
 * moves and committed lengths, the restore at start and the periodic compaction. Shares
 * dataplane_priv.h with dataplane.c. */
#include "dataplane.h"
#include "dataplane_priv.h"

#include <inttypes.h>
#include <stdio.h>

#include "clock.h"
#include "persist.h"
#include "pool.h"
#include "ring.h"
#include "log.h"

void dp_stamp_posted(struct ring_entry *e, uint64_t t0_us)
{
	uint64_t now = clock_ns(), us = now / 1000u - t0_us;
	e->posted_ns = now;
	e->served_us = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

void dp_flush_completions(struct dp *dp)
{
	if (!dp->n_outbox)
		return;
	/* Group commit (docs/design.md §4 "Restart without loss"): one fdatasync for the batch. */
	if (persist_dirty(dp->ps))
		persist_sync(dp->ps);
	for (size_t i = 0; i < dp->n_outbox; i++) {
		struct dp_done *d = &dp->outbox[i];
		struct dp_worker *w = NULL;
		for (size_t k = 0; k < dp->max_w && !w; k++)
			if (dp->w[k].ring && dp->w[k].wid == d->wid)
				w = &dp->w[k];
		if (w)
			dp_stamp_posted(&d->e, d->t0_us);
		if (w && ring_push(w->ring, &d->e, 1) != 1)
			log_warn("worker %u: completion ring full, completion %" PRIu64
				" dropped", w->wid, d->e.user_data);
	}
	dp->n_outbox = 0;
}

static void log_for(struct dp *dp, struct seq *s, uint32_t id)
{
	persist_block(dp->ps, dp->pool, s, id);
}

/* A moved block is journaled for every sequence that maps it (a shared one has several). */
void dp_log_block(struct dp *dp, uint32_t id)
{
	if (dp->ps)
		dp_each_holder(dp, id, log_for);
}

/* The committed length of s moved from old: journal the blocks whose committed rows changed
 * (every layer's pages from the old tail page to the new one), then the length. */
void dp_log_committed(struct dp *dp, struct seq *s, uint64_t old)
{
	if (!dp->ps)
		return;
	uint32_t p = s->geo.page_size;
	uint64_t lo = old / p, hi = (s->committed_tokens + p - 1) / p;
	for (uint64_t pg = lo; pg < hi && pg < s->n_pages; pg++)
		for (uint32_t l = 0; l < s->geo.n_layers; l++) {
			uint32_t id = seq_block(s, l, (uint32_t)pg);
			if (id != SEQ_NO_BLOCK)
				persist_block(dp->ps, dp->pool, s, id);
		}
}

void dp_seq_committed(struct dp *dp, struct seq *s, uint64_t old_committed)
{
	dp_log_committed(dp, s, old_committed < s->committed_tokens ? old_committed : s->committed_tokens);
}

static int max_remote_id(void *ctx, uint32_t id, struct pool_block *b)
{
	(void)id;
	uint64_t *m = ctx;
	if (b->remote_id > *m)
		*m = b->remote_id;
	return 0;
}

int dp_restore(struct dp *dp, struct persist *ps, char *err, size_t errlen)
{
	if (!ps)
		return 0;
	int ret = persist_restore(ps, dp->seqs, dp->pool, dp->tier, err, errlen);
	if (ret)
		return ret;
	dp->ps = ps;
	/* Remote tier ids are never given twice: the next one follows the highest adopted. */
	pool_each(dp->pool, max_remote_id, &dp->next_remote_id);
	/* Keys are not journaled: the index is rebuilt from each sequence's ids (design.md §4). */
	for (size_t i = 0; i < dp->seqs->n; i++) {
		dp->seqs->v[i]->n_keys = 0;
		dp_prefix_publish(dp, dp->seqs->v[i]);
	}
	pool_keep_segment(dp->pool, true); /* the next daemon adopts it (docs/design.md §4) */
	return 0;
}

void dp_maintain(struct dp *dp)
{
	persist_maintain(dp->ps, dp->seqs, dp->pool);
}
