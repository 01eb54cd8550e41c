/* dataplane_persist — the data plane's side of restart without loss (docs/design.md §4,
 * persist.h): the group commit that every completion waits for, the journal records of block
 * moves and committed lengths, the restore at start and the periodic compaction. Shares
 * dataplane_priv.h with dataplane.c. */
#include "dataplane.h"
#include "dataplane_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "persist.h"
#include "pool.h"
#include "ring.h"
#include "tier.h"
#include "log.h"

void dp_stamp_posted(struct ring_entry *e, uint64_t t0_us)
{
	uint64_t now = clock_ns(), us = now / 1000u - t0_us;
	e->posted_ns = now;
	e->served_us = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

/* Whether a completion may be posted only once the journal is durable (docs/design.md §4): a
 * COMMIT's records, and an ALLOC's slots, which a move may have freed. A RECALL hands out no slot
 * a worker writes, a RELEASE nothing, a failed op nothing: they go out at once. */
static bool waits_for_sync(const struct ring_entry *e)
{
	return e->status == 0 && (e->op == RING_OP_COMMIT || e->op == RING_OP_ALLOC);
}

static void post(struct dp *dp, struct dp_done *d)
{
	struct dp_worker *w = dp_find_worker(dp, d->wid);
	if (!w)
		return; /* gone meanwhile */
	dp_stamp_posted(&d->e, d->t0_us);
	if (ring_push(w->ring, &d->e, 1) != 1)
		log_warn("worker %u: completion ring full, completion %" PRIu64 " dropped", w->wid,
			 d->e.user_data);
}

void dp_flush_completions(struct dp *dp)
{
	uint64_t synced = persist_synced(dp->ps);
	size_t held = 0;
	for (size_t i = 0; i < dp->n_outbox; i++) {
		struct dp_done *d = &dp->outbox[i];
		if (!waits_for_sync(&d->e) || d->gen <= synced)
			post(dp, d);
		else
			dp->outbox[held++] = *d; /* the held ones keep their order */
	}
	dp->n_outbox = held;
	if (!held)
		return;
	/* dp_synced wakes the thread when the sync is done. A journal that cannot even be written
	 * (logged) holds nothing back: as a failed sync, the completions go out. */
	if (dp->thread_running && persist_sync_start(dp->ps) == 0)
		return;
	/* Group commit (docs/design.md §4 "Restart without loss"): one fdatasync for the batch. */
	if (!dp->thread_running)
		persist_sync(dp->ps);
	for (size_t i = 0; i < held; i++)
		post(dp, &dp->outbox[i]);
	dp->n_outbox = 0;
}

void dp_wait_durable(struct dp *dp, uint64_t gen)
{
	if (!dp->thread_running) {
		if (persist_synced(dp->ps) < gen)
			persist_sync(dp->ps);
		return;
	}
	while (persist_synced(dp->ps) < gen) {
		/* Unless one runs (the data-plane thread starts the next); a journal that cannot be
		 * written (logged) keeps no reply back, as a failed sync does not. */
		if (persist_sync_start(dp->ps) < 0)
			return;
		dp_unlock(dp);
		persist_wait_synced(dp->ps, gen, 2);
		dp_lock(dp);
	}
}

void dp_synced(void *ctx)
{
	struct dp *dp = ctx;
	ring_kick(&dp->kick);
}

void dp_extent_free(struct dp *dp, uint64_t off, uint32_t len)
{
	struct dp_limbo *l = &dp->limbo;
	if (!dp->ps || !dp->thread_running) {
		tier_extent_free(dp->tier, off, len);
		return;
	}
	if (l->n == l->cap) {
		if (l->head) { /* slide the live part down before growing */
			memmove(l->v, l->v + l->head, (l->n - l->head) * sizeof *l->v);
			l->n -= l->head;
			l->tagged -= l->head;
			l->head = 0;
		}
		if (l->n == l->cap) {
			size_t cap = l->cap ? l->cap * 2 : 1024;
			struct dp_limbo_ext *v = realloc(l->v, cap * sizeof *v);
			if (!v) { /* no room to wait: make the move durable now */
				persist_sync(dp->ps);
				tier_extent_free(dp->tier, off, len);
				return;
			}
			l->v = v;
			l->cap = cap;
		}
	}
	l->v[l->n++] = (struct dp_limbo_ext){ off, 0, len };
}

/* Frees the extents a finished sync covers; all of them when everything is synced. Returns
 * how many it freed. */
static size_t limbo_release(struct dp *dp)
{
	struct dp_limbo *l = &dp->limbo;
	uint64_t synced = persist_synced(dp->ps);
	size_t head = l->head;
	while (l->head < l->tagged && l->v[l->head].gen <= synced) {
		tier_extent_free(dp->tier, l->v[l->head].off, l->v[l->head].len);
		l->head++;
	}
	size_t freed = l->head - head;
	if (l->head == l->n)
		l->head = l->tagged = l->n = 0;
	return freed;
}

size_t dp_persist_pass(struct dp *dp)
{
	if (!dp->ps)
		return 0;
	struct dp_limbo *l = &dp->limbo;
	uint64_t need = persist_need(dp->ps);
	for (size_t i = l->tagged; i < l->n; i++)
		l->v[i].gen = need;
	l->tagged = l->n;
	if (!dp->thread_running) {
		/* Before new writes go out: a freed extent is reused only once its move is durable. */
		if (persist_dirty(dp->ps))
			persist_sync(dp->ps);
		return limbo_release(dp); /* what the thread left */
	}
	size_t freed = limbo_release(dp);
	/* The records reach the file before any I/O of this pass is submitted (a crash of the
	 * daemon loses none of them); the sync, which a host crash needs, goes on in the
	 * background, one at a time, each covering what was written before it started. */
	persist_write(dp->ps);
	if (persist_need(dp->ps) > persist_synced(dp->ps))
		persist_sync_start(dp->ps);
	return freed;
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
	bool was = persist_snapshotting(dp->ps);
	/* A finished compaction made everything durable: the held completions may go. A started
	 * one is written by the thread, a step per pass: wake it. */
	if ((persist_maintain(dp->ps, dp->pool) || (!was && persist_snapshotting(dp->ps))) &&
	    dp->thread_running)
		ring_kick(&dp->kick);
}
