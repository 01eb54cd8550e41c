/* dataplane — ring ops, leases, demotion and promotion. See dataplane.h. */
#include "dataplane.h"
#include "dataplane_priv.h"

#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "crc32c.h"
#include "persist.h"
#include "pool.h"
#include "remote_io.h"
#include "ring.h"
#include "tier.h"
#include "errmsg.h"
#include "log.h"

#define DP_MAX_LEASES (1u << 22)	/* per worker */
#define DP_MAX_PAGES (1u << 24)		/* pages per layer of one sequence */
#define DP_ALLOC_MAX 64u
#define DP_POP_BATCH 64u

uint64_t dp_now_us(void)
{
	return clock_ns() / 1000u;
}

int dp_init(struct dp **out, const struct cfg *cfg, struct seq_table *seqs, char *err, size_t errlen)
{
	struct dp *dp = calloc(1, sizeof *dp);
	if (!dp)
		return -ENOMEM;
	dp->cfg = cfg;
	dp->seqs = seqs;
	pthread_mutex_init(&dp->lock, NULL);
	dp->max_w = cfg->max_workers;
	dp->w = calloc(dp->max_w, sizeof *dp->w);
	int ret = -ENOMEM;
	if (!dp->w)
		goto fail;
	struct pool_config pc = {
		.shm_name = cfg->shm_name,
		.hugetlbfs_dir = cfg->hugetlbfs_path,
		.dram_bytes = cfg->dram_bytes,
		.lock_memory = cfg->lock_memory,
		.group = cfg->group,
		.unlink_existing = true,
		.adopt = cfg->persist, /* dp_restore decides what of it to keep */
	};
	ret = pool_create(&pc, &dp->pool, err, errlen);
	if (ret)
		goto fail;
	if (cfg->nvme_path[0]) {
		struct tier_config tc = {
			.path = cfg->nvme_path,
			.bytes = cfg->nvme_bytes,
			.queue_depth = (unsigned)cfg->io_queue_depth,
			.reg_base = pool_base(dp->pool),
			.reg_bytes = pool_bytes(dp->pool),
		};
		ret = tier_open(&tc, &dp->tier, err, errlen);
		if (ret)
			goto fail;
	}
	if ((ret = dp_remote_start(dp, err, errlen)))
		goto fail;
	snprintf(dp->ring_prefix, sizeof dp->ring_prefix, "%s", cfg->shm_name);
	*out = dp;
	return 0;
fail:
	dp_shutdown(dp);
	return ret;
}

const char *dp_pool_name(const struct dp *dp)
{
	return pool_name(dp->pool);
}

uint64_t dp_pool_bytes(const struct dp *dp)
{
	return pool_bytes(dp->pool);
}

struct dp_worker *dp_find_worker(const struct dp *dp, uint32_t wid)
{
	for (size_t i = 0; i < dp->max_w; i++)
		if (dp->w[i].ring && dp->w[i].wid == wid)
			return &dp->w[i];
	return NULL;
}

/* ---------------------------------------------------------------- completions */

/* Queues the completion: dp_flush_completions posts it (a COMMIT's or an ALLOC's once the journal
 * sync that covers it is done). */
static void complete(struct dp *dp, struct dp_worker *w, struct ring_entry *e, int status, uint64_t t0)
{
	unsigned k = e->op >= RING_OP_ALLOC && e->op <= RING_OP_RELEASE ? e->op - 1 : DP_OP_INVALID;
	uint64_t now = dp_now_us();
	dp->ops[k].calls++;
	w->last_op_ms = now / 1000; /* it waited on kvstored until now */
	e->status = status;
	if (status) {
		dp->ops[k].errors++;
		e->n_payload = 0;
	}
	if (dp->n_outbox == dp->cap_outbox) {
		size_t cap = dp->cap_outbox ? dp->cap_outbox * 2 : 64;
		struct dp_done *o = realloc(dp->outbox, cap * sizeof *o);
		if (!o) { /* no room to wait: post it now, durability first */
			persist_sync(dp->ps);
			dp->ops[k].total_us += dp_now_us() - t0;
			dp_stamp_posted(e, t0);
			if (ring_push(w->ring, e, 1) != 1)
				log_warn("worker %u: completion ring full, completion %"
					PRIu64 " dropped", w->wid, e->user_data);
			return;
		}
		dp->outbox = o;
		dp->cap_outbox = cap;
	}
	dp->outbox[dp->n_outbox++] = (struct dp_done){ w->wid, t0, persist_need(dp->ps), *e };
	dp->ops[k].total_us += now - t0;
}

/* ---------------------------------------------------------------- leases */

static int lease_add(struct dp *dp, struct dp_worker *w, uint32_t block, uint64_t seq_id,
		     uint64_t *lease_id)
{
	if (!w->n_free) {
		if (w->cap >= DP_MAX_LEASES)
			return -ENOSPC;
		uint32_t cap = w->cap ? w->cap * 2 : 256;
		struct dp_lease *l = realloc(w->leases, cap * sizeof *l);
		if (!l)
			return -ENOMEM;
		w->leases = l;
		uint32_t *f = realloc(w->free_slots, cap * sizeof *f);
		if (!f)
			return -ENOMEM;
		w->free_slots = f;
		for (uint32_t i = cap; i > w->cap; i--) {
			l[i - 1].block = POOL_NO_BLOCK;
			l[i - 1].gen = 1;
			f[w->n_free++] = i - 1;
		}
		w->cap = cap;
	}
	int ret = pool_block_lease(dp->pool, block);
	if (ret)
		return ret;
	uint32_t slot = w->free_slots[--w->n_free];
	w->leases[slot].block = block;
	w->leases[slot].seq_id = seq_id;
	w->n_leases++;
	*lease_id = (uint64_t)w->leases[slot].gen << 32 | slot;
	return 0;
}

static struct dp_lease *lease_get(struct dp_worker *w, uint64_t lease_id)
{
	uint32_t slot = (uint32_t)lease_id, gen = (uint32_t)(lease_id >> 32);
	if (slot >= w->cap || w->leases[slot].block == POOL_NO_BLOCK || w->leases[slot].gen != gen)
		return NULL;
	return &w->leases[slot];
}

static void lease_drop(struct dp *dp, struct dp_worker *w, struct dp_lease *l)
{
	pool_block_unlease(dp->pool, l->block);
	l->block = POOL_NO_BLOCK;
	l->gen++;
	w->free_slots[w->n_free++] = (uint32_t)(l - w->leases);
	w->n_leases--;
}

/* ---------------------------------------------------------------- demotion */

int dp_rank_victim(void *ctx, const struct pool_block *b)
{
	struct dp *dp = ctx;
	if (!b->committed)
		return -1;
	uint32_t holders = b->refs - (b->indexed ? 1 : 0);
	if (!holders)
		return 0; /* a cached page that no sequence uses (prefix index) */
	if (holders > 1)
		return 1; /* shared: hot while any of its sequences may be attached */
	struct seq *s = seq_find(dp->seqs, b->seq_id);
	return s && s->state == SEQ_ATTACHED ? 1 : 0;
}

void dp_unkeep(struct dp *dp, uint32_t id)
{
	struct pool_block *b = pool_block_get(dp->pool, id);
	uint64_t off = pool_block_unkeep(dp->pool, id);
	if (off != POOL_NO_OFFSET)
		dp_extent_free(dp, off, b->bytes); /* reused once the promotion's record is synced */
}

/* The tier is full: up to n kept extents go, the newest first (docs/design.md §4 "Kept
 * copies"). They are free for new writes once the journal's next sync ends. */
static size_t kept_reclaim(struct dp *dp, size_t n)
{
	size_t done = 0;
	uint32_t id;
	while (done < n && (id = pool_kept_newest(dp->pool)) != POOL_NO_BLOCK) {
		dp_unkeep(dp, id);
		done++;
	}
	dp->kept_reclaimed += done;
	return done;
}

/* A block that a promotion brought back, unchanged since: its kept extent takes it again with
 * no write. Its bytes are checksummed first, since a worker may write the next rows of a
 * committed tail page before it commits them; a copy that no longer matches goes. */
static bool demote_unwritten(struct dp *dp, uint32_t id, struct pool_block *b)
{
	if (b->kept_off == POOL_NO_OFFSET)
		return false;
	if (crc32c(0, pool_block_data(dp->pool, id), b->bytes) == b->crc &&
	    pool_block_demote_kept(dp->pool, id) == 0) {
		dp->demoted++;
		dp->demoted_unwritten++;
		dp_log_block(dp, id); /* its DRAM slot is reused only after this is synced */
		return true;
	}
	dp_unkeep(dp, id);
	return false;
}

static int demote_block(struct dp *dp, uint32_t id)
{
	struct pool_block *b = pool_block_get(dp->pool, id);
	if (b->leases)
		return -EBUSY;
	if (demote_unwritten(dp, id, b))
		return 0;
	uint64_t off;
	int ret = tier_extent_alloc(dp->tier, b->bytes, &off);
	/* Room once the journal's next sync ends (extents freed by moves, or kept copies let go
	 * now): a later pass goes on. */
	if (ret == -ENOSPC && (dp->limbo.head < dp->limbo.n || kept_reclaim(dp, DP_DEMOTE_INFLIGHT)))
		return -EBUSY;
	if (ret)
		return ret;
	ret = pool_block_demote_begin(dp->pool, id, off);
	if (!ret)
		ret = tier_write(dp->tier, pool_block_data(dp->pool, id), off, b->bytes,
				 (uint64_t)DP_COOKIE_WRITE << 32 | id);
	if (ret) {
		if (b->tier == POOL_TIER_DEMOTING)
			pool_block_demote_end(dp->pool, id, false, 0);
		tier_extent_free(dp->tier, off, b->bytes);
		return ret;
	}
	dp->demoting++;
	return 0;
}

/* One step of the scan for the next victim queue; the queue is replaced when it completes.
 * dp_run calls it every pass while a scan is under way, so that a scan started above the
 * watermark also ends below it (the thread keeps running passes until it does). */
void dp_vq_step(struct dp *dp)
{
	struct dp_vq *q = &dp->vq;
	if (!q->scanning || !pool_scan_step(dp->pool, &q->scan, dp_rank_victim, dp, DP_VQ_STEP))
		return;
	/* Each block's lru as the walk saw it: one touched since is not taken. */
	q->n = pool_scan_end(dp->pool, &q->scan, q->id, q->lru);
	q->scanning = false;
	q->at = 0;
	q->t_ms = clock_ms();
}

/* Up to max victims from the queue, each still one: in DRAM, unleased, untouched since it was
 * found, and ranked. A scan for the next queue starts when this one is a quarter full or a
 * second old, and goes a step further first. */
static size_t victims_take(struct dp *dp, uint32_t *ids, size_t max)
{
	struct dp_vq *q = &dp->vq;
	uint64_t now = clock_ms();
	if (!q->id) {
		q->id = malloc(DP_VQ_MAX * sizeof *q->id);
		q->lru = malloc(DP_VQ_MAX * sizeof *q->lru);
		if (!q->id || !q->lru) {
			free(q->id);
			free(q->lru);
			q->id = NULL;
			q->lru = NULL;
			return 0;
		}
	}
	if (!q->scanning && (q->n - q->at < DP_VQ_MAX / 4 || now - q->t_ms > DP_VQ_MAX_AGE_MS))
		q->scanning = pool_scan_begin(dp->pool, &q->scan, DP_VQ_MAX) == 0;
	dp_vq_step(dp);
	size_t n = 0;
	while (n < max && q->at < q->n) {
		size_t i = q->at++;
		const struct pool_block *b = pool_block_get(dp->pool, q->id[i]);
		if (b && b->tier == POOL_TIER_DRAM && !b->leases && b->lru == q->lru[i] &&
		    dp_rank_victim(dp, b) >= 0) {
			ids[n++] = q->id[i];
		}
	}
	return n;
}

bool dp_scanning(const struct dp *dp)
{
	return dp->vq.scanning;
}

/* Demote until DRAM use is at most target bytes (counting writes already in flight). At most
 * DP_DEMOTE_INFLIGHT blocks move in one call, writes in flight and kept copies taken back
 * together: a kept copy costs no write but its checksum and record, and thousands of them in
 * one pass would hold up every ring for milliseconds. Returns those taken back. */
static uint64_t demote_to(struct dp *dp, uint64_t target)
{
	struct pool_usage u;
	uint32_t ids[256];
	size_t n;
	if (!dp->tier)
		return 0;
	pool_usage(dp->pool, &u);
	uint64_t resident = u.blocks_dram + u.blocks_inflight;
	uint64_t stride = resident ? u.dram_used_bytes / resident : 0;
	if (!stride || u.dram_used_bytes <= target + dp->demoting * stride)
		return 0;
	/* A full tier takes no block: skip the pool scan that would find victims for nothing. */
	struct tier_usage tu;
	tier_usage(dp->tier, &tu);
	if (tu.bytes - tu.used_bytes < stride && !u.blocks_kept)
		return 0;
	uint64_t want = (u.dram_used_bytes - target - dp->demoting * stride + stride - 1) / stride;
	const uint64_t unwritten0 = dp->demoted_unwritten;
	while (want) {
		/* No more victims than writes the tier can take now: a victim found for a write
		 * refused as busy is a scan for nothing (and its demotion undone). */
		size_t max = want < 256 ? want : 256, room = tier_room(dp->tier);
		if (room < max)
			max = room;
		/* Few writes in flight: a promotion's read queues behind those the device has. */
		uint64_t moving = dp->demoting + (dp->demoted_unwritten - unwritten0);
		if (moving >= DP_DEMOTE_INFLIGHT)
			break;
		if (max > DP_DEMOTE_INFLIGHT - moving)
			max = DP_DEMOTE_INFLIGHT - moving;
		if (!max || !(n = victims_take(dp, ids, max)))
			break;
		size_t i = 0;
		while (i < n && !demote_block(dp, ids[i]))
			i++;
		if (i < n)
			break; /* tier full or busy: try again on the next pass */
		want -= n;
	}
	return dp->demoted_unwritten - unwritten0;
}

/* Slab classes share the pool by whole units, and a class keeps its units while any block in
 * them is in use: under load one model's class can hold every unit, and another model's ALLOC
 * would fail however little DRAM is in use. This demotes the committed, unleased blocks of the
 * other class's emptiest slab so that its units come back; the ALLOC waits for that. */
static struct seq *attached_seq(struct dp *dp, struct dp_worker *w, uint64_t seq_id);

struct class_rank {
	struct dp *dp;
	unsigned cls;
};

static int rank_in_class(void *ctx, const struct pool_block *b)
{
	const struct class_rank *r = ctx;
	return b->cls != r->cls || b->doomed ? -1 : dp_rank_victim(r->dp, b);
}

static void reclaim_unit_for(struct dp *dp, struct dp_worker *w, const struct ring_entry *e)
{
	struct seq *s = attached_seq(dp, w, e->seq_id);
	unsigned cls;
	uint64_t base, bytes, stride;
	if (!s || !dp->tier || pool_class(dp->pool, s->block_bytes, &cls))
		return;
	/* First the class's own coldest blocks: room in its slabs needs no unit at all. */
	struct class_rank rk = { dp, cls };
	uint32_t ids[DP_ALLOC_MAX];
	size_t n = 0;
	size_t want = e->count < DP_ALLOC_MAX ? e->count : DP_ALLOC_MAX;
	if (!pool_victims(dp->pool, rank_in_class, &rk, ids, want, &n)) {
		for (size_t i = 0; i < n; i++)
			if (demote_block(dp, ids[i]))
				break;
	}
	if (dp->demoting || pool_reclaim_pick(dp->pool, cls, &base, &bytes, &stride))
		return;
	for (uint64_t off = base; off + stride <= base + bytes; off += stride) {
		uint32_t id;
		if (pool_block_at(dp->pool, off, &id))
			continue;
		const struct pool_block *b = pool_block_get(dp->pool, id);
		if (!b || b->tier != POOL_TIER_DRAM || b->leases || !b->committed || b->doomed)
			continue;
		if (demote_block(dp, id))
			return; /* tier full or busy: the next pass tries again */
		dp->reclaims++;
	}
}

/* Returns the blocks demoted onto their kept copies (done at once: more may follow in the
 * next pass). */
static uint64_t demote_watermark(struct dp *dp)
{
	struct pool_usage u;
	pool_usage(dp->pool, &u);
	uint64_t high = u.dram_bytes / 100 * dp->cfg->dram_high_watermark;
	uint64_t low = u.dram_bytes / 100 * dp->cfg->dram_low_watermark;
	/* Past the high watermark demotion goes on down to the low one, over as many passes as
	 * DP_DEMOTE_INFLIGHT takes. */
	if (u.dram_used_bytes > high)
		dp->wm_demoting = true;
	if (dp->wm_demoting && u.dram_used_bytes <= low)
		dp->wm_demoting = false;
	return dp->wm_demoting ? demote_to(dp, low) : 0;
}

/* ---------------------------------------------------------------- ring ops */

static struct seq *attached_seq(struct dp *dp, struct dp_worker *w, uint64_t seq_id)
{
	struct seq *s = seq_find(dp->seqs, seq_id);
	return s && s->state == SEQ_ATTACHED && s->worker_id == w->wid ? s : NULL;
}

/* ALLOC: all pages or none. -EAGAIN means "wait for demotion". */
static int op_alloc(struct dp *dp, struct dp_worker *w, struct ring_entry *e)
{
	struct seq *s = attached_seq(dp, w, e->seq_id);
	if (!s)
		return -ENOENT;
	if (e->layer >= s->geo.n_layers || e->count == 0 || e->count > DP_ALLOC_MAX ||
	    e->first_page >= DP_MAX_PAGES || e->count > DP_MAX_PAGES - e->first_page)
		return -EINVAL;
	/* A page past max_tokens would only grow the sequence's block table (n_layers x pages). */
	if ((uint64_t)(e->first_page + e->count - 1) * s->geo.page_size >= dp->cfg->max_tokens)
		return -ERANGE;
	for (uint32_t i = 0; i < e->count; i++)
		if (seq_block(s, e->layer, e->first_page + i) != SEQ_NO_BLOCK)
			return -EEXIST;
	unsigned cls;
	int ret = pool_class(dp->pool, s->block_bytes, &cls);
	if (ret)
		return ret;
	uint32_t ids[DP_ALLOC_MAX];
	uint32_t i;
	for (i = 0; i < e->count; i++) {
		ret = pool_block_alloc(dp->pool, cls, &ids[i]);
		if (ret)
			break;
		struct pool_block *b = pool_block_get(dp->pool, ids[i]);
		b->seq_id = s->id;
		b->layer = e->layer;
		b->page = e->first_page + i;
		b->user = w->wid;
		b->committed = false;
		b->refs = 1;
		ret = seq_set_block(s, e->layer, e->first_page + i, ids[i]);
		if (ret) {
			pool_block_free(dp->pool, ids[i]);
			break;
		}
		e->payload[i] = b->dram_off;
	}
	if (ret) {
		while (i--) {
			seq_set_block(s, e->layer, e->first_page + i, SEQ_NO_BLOCK);
			pool_block_free(dp->pool, ids[i]);
		}
		/* Without a tier to demote to, cached prefix pages make the room. */
		if (ret == -ENOSPC && !dp->tier && dp_prefix_evict(dp, e->count))
			return op_alloc(dp, w, e);
		return ret == -ENOSPC && dp->tier ? -EAGAIN : ret;
	}
	e->n_payload = e->count;
	return 0;
}

static int op_commit(struct dp *dp, struct dp_worker *w, struct ring_entry *e)
{
	struct seq *s = attached_seq(dp, w, e->seq_id);
	uint32_t ids[RING_PAYLOAD_MAX];
	if (!s)
		return -ENOENT;
	if (e->count != e->n_payload || e->count > RING_PAYLOAD_MAX)
		return -EINVAL;
	for (uint32_t i = 0; i < e->count; i++) {
		if (pool_block_at(dp->pool, e->payload[i], &ids[i]))
			return -EINVAL;
		struct pool_block *b = pool_block_get(dp->pool, ids[i]);
		if (!dp_seq_holds(s, b, ids[i]) || (!b->committed && b->user != w->wid))
			return -EPERM;
		if (b->committed && dp_block_readonly(dp, ids[i]))
			return -EROFS; /* shared pages are never written again (docs/design.md §4) */
		if (b->tier != POOL_TIER_DRAM)
			return -EBUSY;
	}
	if (e->committed_tokens > (uint64_t)s->n_pages * s->geo.page_size)
		return -ERANGE;
	uint64_t old = s->committed_tokens;
	for (uint32_t i = 0; i < e->count; i++) {
		dp_unkeep(dp, ids[i]); /* committed again: its rows changed */
		pool_block_set_committed(dp->pool, ids[i], true);
		pool_block_touch(dp->pool, ids[i]);
	}
	s->committed_tokens = e->committed_tokens;
	/* Blocks first, then the length: a torn tail never leaves a length without its blocks.
	 * A COMMIT that changes nothing journals nothing (and costs no sync). */
	for (uint32_t i = 0; i < e->count; i++)
		persist_block(dp->ps, dp->pool, s, ids[i]);
	if (old != s->committed_tokens) {
		dp_log_committed(dp, s, old < s->committed_tokens ? old : s->committed_tokens);
		persist_seq_committed(dp->ps, s);
	}
	dp_prefix_publish(dp, s);
	e->n_payload = 0;
	return 0;
}

/* An op found no DRAM room for its class and nothing to demote: take a unit back from another
 * class (reclaim_unit_for), else let cached prefix pages go, else wait up to alloc_wait_ms for a
 * release or a commit. -EAGAIN: keep it pending; -ENOSPC: give up. An ALLOC comes here after
 * starting demotion; a RECALL whose promotion had no slot and no block to trade places with. */
static int room_wait(struct dp *dp, struct dp_worker *w, struct dp_pending *p)
{
	if (!p->room) { /* its class, kept so that its units go back whatever becomes of the seq */
		struct seq *s = attached_seq(dp, w, p->e.seq_id);
		unsigned cls;
		if (!s || pool_class(dp->pool, s->block_bytes, &cls))
			return -ENOENT;
		p->room = true;
		p->room_cls = cls;
	}
	if (!dp->demoting)
		reclaim_unit_for(dp, w, &p->e);
	if (dp->demoting)
		return -EAGAIN;
	if (dp_prefix_evict(dp, p->e.op == RING_OP_ALLOC ? p->e.count : 1))
		return -EAGAIN;
	uint64_t now = dp_now_us();
	if (!p->deadline_us)
		p->deadline_us = now + dp->cfg->alloc_wait_ms * 1000;
	return now < p->deadline_us ? -EAGAIN : -ENOSPC;
}

/* An op that waited for room stopped waiting (it got its blocks, gave up, or its worker went):
 * the units kept for its class by reclaim_unit_for go back to every class (slab_reclaim_pick). */
static void room_unreserve(struct dp *dp, const struct dp_pending *p)
{
	if (p->room)
		pool_unreserve(dp->pool, p->room_cls);
}

static void unlease_pending(struct dp *dp, struct dp_worker *w, struct dp_pending *p)
{
	for (uint32_t i = 0; i < p->e.count; i++) {
		struct dp_lease *l = p->lease_ids[i] ? lease_get(w, p->lease_ids[i]) : NULL;
		if (l)
			lease_drop(dp, w, l);
		p->lease_ids[i] = 0;
	}
}

/* Advance a RECALL: lease what is in DRAM, start promotions for what is on NVMe. 0 when all
 * are leased, -EAGAIN while waiting, else an error (leases taken so far are dropped). */
static int recall_step(struct dp *dp, struct dp_worker *w, struct dp_pending *p)
{
	int waiting = 0, ret;
	struct seq *s = attached_seq(dp, w, p->e.seq_id);
	if (!s) {
		ret = -ENOENT; /* detached or closed while waiting */
		goto fail;
	}
	/* Lease what is in DRAM first, so that no move below picks this RECALL's own blocks. */
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < p->e.count; i++) {
			if (p->lease_ids[i] && lease_get(w, p->lease_ids[i]))
				continue;
			p->lease_ids[i] = 0; /* dropped meanwhile (RELEASE of a guessed id): lease again */
			struct pool_block *b = pool_block_get(dp->pool, p->blocks[i]);
			if (!dp_seq_holds(s, b, p->blocks[i]) || b->layer != p->e.layer) {
				ret = -ENOENT; /* dropped meanwhile */
				goto fail;
			}
			if (pass == 0 && b->tier != POOL_TIER_DRAM)
				continue;
			switch (b->tier) {
			case POOL_TIER_DRAM:
				ret = lease_add(dp, w, p->blocks[i], s->id, &p->lease_ids[i]);
				if (ret)
					goto fail;
				pool_block_touch(dp->pool, p->blocks[i]);
				break;
			case POOL_TIER_REMOTE:
				ret = dp_fetch_start(dp, p->blocks[i]);
				if (ret == -ENOSPC) {
					demote_to(dp, pool_bytes(dp->pool) / 100 * dp->cfg->dram_low_watermark);
					ret = dp->demoting ? 0 : room_wait(dp, w, p);
				}
				if (ret && ret != -EBUSY && ret != -EAGAIN)
					goto fail;
				waiting = 1;
				break;
			case POOL_TIER_NVME: {
				uint64_t off = b->nvme_off;
				ret = pool_block_promote_begin(dp->pool, p->blocks[i]);
				if (ret == -ENOSPC) {
					demote_to(dp, pool_bytes(dp->pool) / 100 * dp->cfg->dram_low_watermark);
					/* Nothing could be demoted (the tier is full too): trade places. */
					ret = dp->demoting ? 0 : dp_swap_start(dp, p->blocks[i]);
					/* No block of its class to trade with: wait for room as an ALLOC does. */
					if (ret == -ENOSPC)
						ret = room_wait(dp, w, p);
					if (ret && ret != -EBUSY && ret != -EAGAIN)
						goto fail;
					waiting = 1;
					break;
				}
				if (ret)
					goto fail;
				ret = tier_read(dp->tier, pool_block_data(dp->pool, p->blocks[i]), off, b->bytes,
						b->crc, (uint64_t)DP_COOKIE_READ << 32 | p->blocks[i]);
				if (ret) {
					pool_block_promote_end(dp->pool, p->blocks[i], false, false);
					if (ret == -EBUSY) {
						waiting = 1;
						break;
					}
					goto fail;
				}
				waiting = 1;
				break;
			}
			default:	/* I/O in flight: wait for it */
				if (dp_swap_restoring(dp, p->blocks[i])) {
					ret = -EIO; /* a failed swap is writing it back; see dataplane_swap.c */
					goto fail;
				}
				waiting = 1;
				break;
			}
		}
	}
	if (waiting)
		return -EAGAIN;
	for (uint32_t i = 0; i < p->e.count; i++) {
		struct pool_block *b = pool_block_get(dp->pool, p->blocks[i]);
		p->e.payload[2 * i] = b->dram_off;
		p->e.payload[2 * i + 1] = p->lease_ids[i];
	}
	p->e.n_payload = 2 * p->e.count;
	return 0;
fail:
	unlease_pending(dp, w, p);
	return ret;
}

static int op_recall(struct dp *dp, struct dp_worker *w, struct dp_pending *p)
{
	struct ring_entry *e = &p->e;
	struct seq *s = attached_seq(dp, w, e->seq_id);
	if (!s)
		return -ENOENT;
	if (e->layer >= s->geo.n_layers || e->count == 0 || e->count > DP_RECALL_MAX ||
	    e->n_payload != 2 * e->count)
		return -EINVAL;
	uint64_t all_heads = s->geo.n_kv_heads >= 64 ? UINT64_MAX : (1ull << s->geo.n_kv_heads) - 1;
	for (uint32_t i = 0; i < e->count; i++) {
		uint64_t page = e->payload[2 * i], mask = e->payload[2 * i + 1];
		if (page >= DP_MAX_PAGES || mask == 0 || (mask & ~all_heads))
			return -EINVAL;
		p->blocks[i] = seq_block(s, e->layer, (uint32_t)page);
		if (p->blocks[i] == SEQ_NO_BLOCK)
			return -ENOENT;
		p->lease_ids[i] = 0;
	}
	if (!dp->tier) {
		for (uint32_t i = 0; i < e->count; i++)
			if (pool_block_get(dp->pool, p->blocks[i])->tier != POOL_TIER_DRAM)
				return -EIO;
	}
	return recall_step(dp, w, p);
}

static int op_release(struct dp *dp, struct dp_worker *w, struct ring_entry *e)
{
	if (e->count != e->n_payload || e->count == 0 || e->count > RING_PAYLOAD_MAX)
		return -EINVAL;
	for (uint32_t i = 0; i < e->count; i++) {
		if (!lease_get(w, e->payload[i]))
			return -EINVAL;
		for (uint32_t j = 0; j < i; j++)
			if (e->payload[j] == e->payload[i])
				return -EINVAL;
	}
	for (uint32_t i = 0; i < e->count; i++)
		lease_drop(dp, w, lease_get(w, e->payload[i]));
	e->n_payload = 0;
	return 0;
}

/* An ALLOC that found DRAM full: start demotion, then wait for room (room_wait). */
static int alloc_wait(struct dp *dp, struct dp_worker *w, struct dp_pending *p)
{
	demote_to(dp, pool_bytes(dp->pool) / 100 * dp->cfg->dram_low_watermark);
	return room_wait(dp, w, p);
}

/* Queues p; -EBUSY when the worker already has a ring's worth of ops waiting (more could not
 * all complete into its completion ring, and the queue must not grow without bound). */
static int defer(struct dp_worker *w, struct dp_pending *p)
{
	struct dp_pending **pp = &w->pending;
	uint32_t n = 0;
	for (; *pp; n++)
		pp = &(*pp)->next;
	if (n >= ring_entries(w->ring))
		return -EBUSY;
	p->next = NULL;
	*pp = p;
	return 0;
}

static void serve_entry(struct dp *dp, struct dp_worker *w, const struct ring_entry *in)
{
	struct dp_pending *p = calloc(1, sizeof *p);
	struct ring_entry tmp;
	int ret;
	if (!p) {
		tmp = *in;
		complete(dp, w, &tmp, -ENOMEM, dp_now_us());
		return;
	}
	p->e = *in;
	p->t0_us = dp_now_us();
	switch (in->op) {
	case RING_OP_ALLOC:
		ret = op_alloc(dp, w, &p->e);
		if (ret == -EAGAIN) {
			ret = alloc_wait(dp, w, p);
			if (ret == -EAGAIN && !(ret = defer(w, p)))
				return; /* waits (retry_pending) */
		}
		break;
	case RING_OP_COMMIT:
		ret = op_commit(dp, w, &p->e);
		break;
	case RING_OP_RECALL:
		ret = op_recall(dp, w, p);
		if (ret == -EAGAIN) {
			ret = defer(w, p);
			if (!ret)
				return;
			unlease_pending(dp, w, p);
		}
		break;
	case RING_OP_RELEASE:
		ret = op_release(dp, w, &p->e);
		break;
	default:
		ret = -EINVAL;
		break;
	}
	room_unreserve(dp, p);
	complete(dp, w, &p->e, ret, p->t0_us);
	free(p);
}

static void retry_pending(struct dp *dp, struct dp_worker *w)
{
	struct dp_pending **pp = &w->pending;
	while (*pp) {
		struct dp_pending *p = *pp;
		int ret;
		if (p->e.op == RING_OP_ALLOC) {
			ret = op_alloc(dp, w, &p->e);
			if (ret == -EAGAIN && !dp->demoting)
				ret = alloc_wait(dp, w, p);
		} else {
			ret = recall_step(dp, w, p);
		}
		if (ret == -EAGAIN) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		/* Done waiting, with its blocks (perhaps in its own class's slabs, room made by
		 * demotion) or without: units still kept for its class go back. */
		room_unreserve(dp, p);
		complete(dp, w, &p->e, ret, p->t0_us);
		free(p);
	}
}

/* Whether pending op p is a RECALL that names block. */
static bool recall_waits_for(const struct dp_pending *p, uint32_t block)
{
	for (uint32_t k = 0; p->e.op == RING_OP_RECALL && k < p->e.count; k++)
		if (p->blocks[k] == block)
			return true;
	return false;
}

/* The RECALLs waiting for block, of every worker: with fail, each completes with status (its
 * leases dropped); else each advances (recall_step) and completes unless it still waits. */
static void settle_recalls_of(struct dp *dp, uint32_t block, bool fail, int status)
{
	for (size_t i = 0; i < dp->max_w; i++) {
		struct dp_worker *w = &dp->w[i];
		struct dp_pending **pp = &w->pending;
		if (!w->ring)
			continue;
		while (*pp) {
			struct dp_pending *p = *pp;
			bool hit = recall_waits_for(p, block);
			int ret = !hit ? -EAGAIN : fail ? status : recall_step(dp, w, p);
			if (!hit || (!fail && ret == -EAGAIN)) {
				pp = &p->next;
				continue;
			}
			*pp = p->next;
			if (fail)
				unlease_pending(dp, w, p);
			room_unreserve(dp, p);
			complete(dp, w, &p->e, ret, p->t0_us);
			free(p);
		}
	}
}

/* A promotion failed (checksum or I/O): every RECALL waiting for that block fails with it. */
void dp_fail_recalls_of(struct dp *dp, uint32_t block, int status)
{
	settle_recalls_of(dp, block, true, status);
}

/* A block just became DRAM-resident through a swap: advance the RECALLs waiting for it now, so
 * that they lease it before another swap can pick it as its victim (two RECALLs competing for
 * the last unleased DRAM block would otherwise trade it back and forth without end). */
void dp_retry_recalls_of(struct dp *dp, uint32_t block)
{
	settle_recalls_of(dp, block, false, 0);
}

/* A block whose sequence was dropped while its I/O ran (dp_drop_seq) is freed once the I/O has
 * settled it in one tier. */
void dp_free_if_doomed(struct dp *dp, uint32_t id)
{
	struct pool_block *b = pool_block_get(dp->pool, id);
	if (!b || !b->doomed || b->leases || (b->tier != POOL_TIER_DRAM && b->tier != POOL_TIER_NVME &&
					      b->tier != POOL_TIER_REMOTE))
		return;
	dp_block_drop_storage(dp, id, b);
}

static void tier_done(void *ctx, const struct tier_result *r)
{
	struct dp *dp = ctx;
	uint32_t id = (uint32_t)r->cookie;
	if (r->cookie >> 32 == DP_COOKIE_SWAP) {
		dp_swap_done(dp, r);
		return;
	}
	if (r->cookie >> 32 == DP_COOKIE_OFFREAD) {
		dp_offload_read_done(dp, r);
		return;
	}
	if (r->cookie >> 32 == DP_COOKIE_ZERO) {
		tpw_done(dp->tpw, r);
		return;
	}
	struct pool_block *b = pool_block_get(dp->pool, id);
	if (!b)
		return;
	if (r->cookie >> 32 == DP_COOKIE_WRITE) {
		dp->demoting--;
		uint64_t off = b->nvme_off;
		pool_block_demote_end(dp->pool, id, r->status == 0, r->crc);
		if (r->status) {
			tier_extent_free(dp->tier, off, b->bytes);
			log_error("demotion of block %u failed: %s", id, strerror(-r->status));
		} else {
			dp->demoted++;
			dp_log_block(dp, id); /* its DRAM slot is reused only after this is synced */
		}
		dp_free_if_doomed(dp, id);
		return;
	}
	uint64_t off = b->nvme_off;
	bool keep = dp->cfg->nvme_keep_copies;
	pool_block_promote_end(dp->pool, id, r->status == 0, keep);
	if (r->status == 0) {
		/* Its rows are checksummed afresh from the bytes just read (and verified). */
		b->rows = b->rows_crc = 0;
		dp_log_block(dp, id);
		if (b->kept_off == POOL_NO_OFFSET)
			dp_extent_free(dp, off, b->bytes);
		dp->promoted++;
		dp_free_if_doomed(dp, id);
		return;
	}
	if (r->status == -EBADMSG)
		dp->crc_errors++;
	dp_fail_recalls_of(dp, id, r->status);
	if (r->status == -EBADMSG)
		dp_unindex(dp, id); /* never attached again; its sharers all fail */
	dp_free_if_doomed(dp, id);
}

static uint64_t demote_queue_run(struct dp *dp);

/* ---------------------------------------------------------------- loop */

size_t dp_pollfds(const struct dp *dp, int *fds, size_t max)
{
	size_t n = 0;
	if (n < max && dp->tier && tier_eventfd(dp->tier) >= 0)
		fds[n++] = tier_eventfd(dp->tier);
	if (n < max && dp_remote_fd(dp) >= 0)
		fds[n++] = dp_remote_fd(dp);
	return n;
}

int dp_poll_timeout(const struct dp *dp, int dflt)
{
	/* A compaction: without the thread the snapshot is written a step per dp_run of this loop;
	 * with it, the thread writes it and this loop only waits to put it in place (dp_maintain). */
	if (persist_compacting(dp->ps) && (!dp->thread_running || !persist_snapshotting(dp->ps)))
		return dflt < 1 ? dflt : 1;
	for (size_t i = 0; !dp->thread_running && i < dp->max_w; i++)
		if (dp->w[i].ring && ring_ready(dp->w[i].ring))
			return 0; /* left over by the bounded pass: no new doorbell will come */
	if (dp->tier && tier_pending(dp->tier) && tier_eventfd(dp->tier) < 0)
		return 1;
	for (size_t i = 0; i < dp->max_w; i++)
		for (const struct dp_pending *p = dp->w[i].pending; p; p = p->next)
			if (p->deadline_us) /* an op waiting for room: retry, and fail it in time */
				return dflt < DP_ALLOC_RETRY_MS ? dflt : DP_ALLOC_RETRY_MS;
	for (unsigned i = 0; i < DP_SWAP_MAX; i++)
		if (dp->swaps[i].phase == DP_SWAP_RESTORE && dp->swaps[i].restore_waiting)
			return dflt < (int)(DP_SWAP_RETRY_US / 1000) ? dflt
			     : (int)(DP_SWAP_RETRY_US / 1000); /* dp_swap_retry's next attempt */
	return dflt;
}

/* Zeros over the tier file's never-written space, one piece at a time (tier_prewrite.h). */
static void prewrite_step(struct dp *dp)
{
	if (!dp->tpw)
		return;
	tpw_step(dp->tpw, (uint64_t)DP_COOKIE_ZERO << 32);
	if (!tpw_left(dp->tpw)) { /* done, or stopped by a failed write (each logged there) */
		tpw_close(dp->tpw);
		dp->tpw = NULL;
	}
}

void dp_run(struct dp *dp)
{
	struct ring_entry batch[DP_POP_BATCH];
	/* Completions reaped at the end of a pass can unblock waiting ops: go round again. */
	for (int pass = 0; pass < 8; pass++) {
		/* Bounded with the thread (it polls the rest next pass, after the rings): a long
		 * batch of completions, each checksummed and journaled, would hold up every ring.
		 * What they queue (a promotion's read into a slot a demotion just freed) goes out
		 * with the pass's I/O, after dp_persist_pass wrote their records. */
		int progress = dp->tier ? tier_reap_some(dp->tier, dp->thread_running ? DP_REAP_MAX : UINT_MAX,
							 false, tier_done, dp) : 0;
		progress += dp_remote_reap(dp);
		for (size_t i = 0; i < dp->max_w; i++) {
			struct dp_worker *w = &dp->w[i];
			if (!w->ring)
				continue;
			if (w->pending)
				retry_pending(dp, w);
			/* Bounded per pass so one busy worker cannot starve the control plane. */
			int n = 0;
			for (int b = 0; b < 4 && (n = ring_pop(w->ring, batch, DP_POP_BATCH)) > 0; b++) {
				if (!b)
					w->last_op_ms = dp_now_us() / 1000;
				progress += n;
				for (int k = 0; k < n; k++)
					serve_entry(dp, w, &batch[k]);
				dp_flush_completions(dp);
			}
			if (n < 0 && !w->corrupt_logged) /* once: every other worker's traffic passes here */
				log_error("worker %u: ring corrupted (%s)", w->wid, strerror(-n));
			w->corrupt_logged |= n < 0;
		}
		if (demote_watermark(dp))
			progress++; /* the next pass goes on with it, after the rings */
		dp_vq_step(dp); /* a scan started above the watermark ends below it too */
		dp_offload_watermark(dp);
		if (dp->n_offload_q)
			dp_offload_queue_run(dp);
		dp_swap_retry(dp);
		if (dp->n_demote_q && demote_queue_run(dp))
			progress++;
		prewrite_step(dp);
		dp_flush_completions(dp);
		/* Before new I/O goes out. Extents it frees let a queued demotion go on. */
		if (dp_persist_pass(dp) && dp->n_demote_q)
			progress++;
		if (dp->tier && tier_flush(dp->tier) > 0)
			progress++;
		if (progress <= 0)
			break;
	}
	/* A part of the journal's snapshot, while one is written (persist.h). */
	persist_compact_step(dp->ps, dp->seqs, dp->pool);
}

void dp_drain(struct dp *dp, int timeout_ms)
{
	uint64_t end = dp_now_us() + (uint64_t)timeout_ms * 1000;
	while (dp->tier && tier_pending(dp->tier) && dp_now_us() < end) {
		tier_flush(dp->tier);
		tier_wait(dp->tier, 50, tier_done, dp);
	}
	dp_flush_completions(dp);
	dp_persist_pass(dp);
}

/* ---------------------------------------------------------------- workers */

int dp_worker_add(struct dp *dp, uint32_t wid, char *ring_name, size_t len, char *err, size_t errlen)
{
	struct dp_worker *w = NULL;
	if (dp_find_worker(dp, wid)) {
		errmsg_set(err, errlen, "worker %u already has a ring", wid);
		return -EEXIST;
	}
	for (size_t i = 0; i < dp->max_w && !w; i++)
		if (!dp->w[i].ring)
			w = &dp->w[i];
	if (!w) {
		errmsg_set(err, errlen, "max_workers rings in use");
		return -ENOSPC;
	}
	snprintf(ring_name, len, "%s-ring-%u", dp->ring_prefix, wid);
	struct ring_config rc = {
		.shm_name = ring_name,
		.entries = (uint32_t)dp->cfg->ring_entries,
		.group = dp->cfg->group,
		.unlink_existing = true,
	};
	memset(w, 0, sizeof *w);
	int ret = ring_create(&rc, &w->ring, err, errlen);
	if (ret)
		return ret;
	w->wid = wid;
	ring_kick(&dp->kick); /* the data-plane thread sleeps on the old set of doorbells */
	return 0;
}

/* The blocks worker wid ALLOCed for s and never COMMITted, freed. op_alloc names every block
 * it hands out in the sequence's block map, so the map finds them all: the cost is the
 * sequence's pages, not the pool's blocks. */
static void free_uncommitted(struct dp *dp, uint32_t wid, struct seq *s)
{
	for (uint32_t l = 0; l < s->geo.n_layers; l++) {
		for (uint32_t p = 0; p < s->n_pages; p++) {
			uint32_t id = seq_block(s, l, p);
			struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (!b || b->committed || b->user != wid || b->seq_id != s->id || b->leases)
				continue;
			seq_set_block(s, l, p, SEQ_NO_BLOCK);
			pool_block_free(dp->pool, id);
		}
	}
}

/* Committed blocks at pages the committed length does not reach hold no committed token: a
 * worker that dies (or leaves) between the COMMITs of one page's layers leaves some. They are
 * freed when it goes, so whoever resumes the sequence ALLOCs those pages afresh instead of
 * meeting -EEXIST; a restart drops them the same way (persist.c). Not journaled: a restart
 * never adopts them. */
static void trim_past_committed(struct dp *dp, struct seq *s)
{
	uint32_t from = (uint32_t)((s->committed_tokens + s->geo.page_size - 1) / s->geo.page_size);
	for (uint32_t l = 0; l < s->geo.n_layers; l++) {
		for (uint32_t p = from; p < s->n_pages; p++) {
			uint32_t id = seq_block(s, l, p);
			struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (!b || !b->committed || b->leases ||
			    (b->tier != POOL_TIER_DRAM && b->tier != POOL_TIER_NVME &&
			     b->tier != POOL_TIER_REMOTE))
				continue;
			dp_block_unref(dp, s, l, p);
		}
	}
}

void dp_worker_detach(struct dp *dp, uint32_t wid, struct seq *s)
{
	struct dp_worker *w = dp_find_worker(dp, wid);
	if (w) {
		for (uint32_t i = 0; i < w->cap; i++) {
			struct dp_lease *l = &w->leases[i];
			if (l->block != POOL_NO_BLOCK && l->seq_id == s->id)
				lease_drop(dp, w, l);
		}
	}
	free_uncommitted(dp, wid, s);
	trim_past_committed(dp, s);
}

void dp_worker_gone(struct dp *dp, uint32_t wid)
{
	struct dp_worker *w = dp_find_worker(dp, wid);
	if (!w)
		return;
	while (w->pending) {
		struct dp_pending *p = w->pending;
		w->pending = p->next;
		if (p->e.op == RING_OP_RECALL)
			unlease_pending(dp, w, p);
		room_unreserve(dp, p);
		free(p);
	}
	for (uint32_t i = 0; i < w->cap; i++)
		if (w->leases[i].block != POOL_NO_BLOCK)
			lease_drop(dp, w, &w->leases[i]);
	for (size_t k = 0; k < dp->seqs->n; k++) {
		struct seq *s = dp->seqs->v[k];
		if (s->worker_id != wid)
			continue;
		free_uncommitted(dp, wid, s); /* a detach freed those of the others */
		if (s->state == SEQ_ATTACHED) /* still attached to wid: orphaned after this */
			trim_past_committed(dp, s);
	}
	ring_destroy(w->ring);
	ring_kick(&dp->kick);
	free(w->leases);
	free(w->free_slots);
	memset(w, 0, sizeof *w);
}

uint64_t dp_worker_leases(const struct dp *dp, uint32_t wid)
{
	struct dp_worker *w = dp_find_worker(dp, wid);
	return w ? w->n_leases : 0;
}

uint64_t dp_worker_last_op_ms(const struct dp *dp, uint32_t wid)
{
	struct dp_worker *w = dp_find_worker(dp, wid);
	if (!w)
		return 0;
	/* An op kvstored still holds (waiting for room or a promotion) is a worker waiting on
	 * kvstored, not a silent one; its silence counts from the completion (complete). */
	return w->pending ? dp_now_us() / 1000 : w->last_op_ms;
}

/* ---------------------------------------------------------------- sequences */

/* Start demotion of seq's eligible blocks; *started counts them. Returns 0 when none is left,
 * -EBUSY when the tier's request table filled up first, -ENOSPC when the tier is full. */
static int demote_seq_some(struct dp *dp, struct seq *s, uint64_t *started)
{
	int ret = 0;
	const uint64_t unwritten0 = dp->demoted_unwritten;
	for (uint32_t l = 0; l < s->geo.n_layers && !ret; l++) {
		for (uint32_t p = 0; p < s->n_pages && !ret; p++) {
			uint32_t id = seq_block(s, l, p);
			struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (!b || !dp_demote_moves(b))
				continue;
			/* Kept copies are taken back at once, so a pass bounds them as the tier's
			 * request table bounds writes: the rest follow in later passes. */
			if (dp->demoted_unwritten - unwritten0 >= DP_DEMOTE_UNWRITTEN_CALL) {
				ret = -EBUSY;
				break;
			}
			ret = demote_block(dp, id);
			if (!ret)
				++*started;
		}
	}
	tier_flush(dp->tier);
	return ret;
}

/* Sequences whose demotion continues as the tier's request table drains. */
/* Returns the blocks it demoted or started demoting. */
static uint64_t demote_queue_run(struct dp *dp)
{
	size_t keep = 0;
	uint64_t moved = 0;
	for (size_t i = 0; i < dp->n_demote_q; i++) {
		struct seq *s = seq_find(dp->seqs, dp->demote_q[i]);
		uint64_t n = 0;
		if (s && demote_seq_some(dp, s, &n) == -EBUSY)
			dp->demote_q[keep++] = dp->demote_q[i];
		moved += n;
	}
	dp->n_demote_q = keep;
	return moved;
}

int dp_demote_seq(struct dp *dp, struct seq *s, uint64_t *blocks, char *err, size_t errlen)
{
	*blocks = 0;
	if (!dp->tier) {
		errmsg_set(err, errlen, "no NVMe tier configured (nvme_path is empty)");
		return -ENODEV;
	}
	int ret = demote_seq_some(dp, s, blocks);
	if (ret == -ENOSPC && *blocks == 0) {
		errmsg_set(err, errlen, "NVMe tier full");
		return ret;
	}
	if (ret == -EBUSY) {
		dp_queue_add(dp->demote_q, &dp->n_demote_q, s->id);
		/* The reply counts what this demotion will move, not only what the tier's request
		 * table took at once: the rest follow as it drains (demote_queue_run). */
		for (uint32_t l = 0; l < s->geo.n_layers; l++)
			for (uint32_t pg = 0; pg < s->n_pages; pg++) {
				uint32_t id = seq_block(s, l, pg);
				const struct pool_block *b =
					id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
				*blocks += b && dp_demote_moves(b);
			}
	}
	return 0;
}

int dp_drop_seq(struct dp *dp, struct seq *s, uint64_t *blocks, char *err, size_t errlen)
{
	*blocks = 0;
	/* Leases are someone's reads (the dropping worker's own were dropped at detach), and a swap
	 * moves two blocks at once: those refuse the drop. A block only demoting or promoting is
	 * let go now and freed when its I/O ends (free_if_doomed), so a worker can drop its own
	 * sequence while the daemon is moving it. */
	for (uint32_t l = 0; l < s->geo.n_layers; l++) {
		for (uint32_t p = 0; p < s->n_pages; p++) {
			uint32_t id = seq_block(s, l, p);
			struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			bool swapping = false;
			if (b && b->refs > 1)
				continue; /* shared: only the reference goes */
			for (unsigned i = 0; b && i < DP_SWAP_MAX; i++)
				swapping |= dp->swaps[i].phase != DP_SWAP_FREE &&
					    (dp->swaps[i].block == id || dp->swaps[i].victim == id);
			if (b && (b->leases || swapping)) {
				errmsg_set(err, errlen, "sequence '%s' has leased blocks or a swap in flight",
					   s->name);
				return -EBUSY;
			}
		}
	}
	for (uint32_t l = 0; l < s->geo.n_layers; l++) {
		for (uint32_t p = 0; p < s->n_pages; p++) {
			uint32_t id = seq_block(s, l, p);
			struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (!b)
				continue;
			*blocks += b->refs == 1; /* freed now (or when its I/O ends) */
			dp_block_unref(dp, s, l, p);
		}
	}
	return 0;
}

bool dp_queue_has(const uint64_t *q, size_t n, uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (q[i] == id)
			return true;
	return false;
}

void dp_queue_add(uint64_t *q, size_t *n, uint64_t id)
{
	if (*n < DP_DEMOTE_QUEUE && !dp_queue_has(q, *n, id))
		q[(*n)++] = id;
}

/* A block waiting in the demotion (or remote offload) queue counts as in flight: its move was
 * asked for and goes on as the tier drains, so a caller waiting for in_flight == 0 sees it land. */
void dp_seq_usage(struct dp *dp, const struct seq *s, struct dp_seq_usage *u)
{
	memset(u, 0, sizeof *u);
	bool demoting = dp_queue_has(dp->demote_q, dp->n_demote_q, s->id);
	bool offloading = dp_queue_has(dp->offload_q, dp->n_offload_q, s->id);
	for (uint32_t l = 0; l < s->geo.n_layers; l++) {
		for (uint32_t p = 0; p < s->n_pages; p++) {
			uint32_t id = seq_block(s, l, p);
			struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (!b)
				continue;
			bool queued = (demoting && dp_demote_moves(b)) ||
				      (offloading && dp_offload_moves(b));
			if (queued)
				u->in_flight++;
			else if (b->tier == POOL_TIER_DRAM)
				u->dram++;
			else if (b->tier == POOL_TIER_NVME)
				u->nvme++;
			else if (b->tier == POOL_TIER_REMOTE)
				u->remote++;
			else
				u->in_flight++;
			u->leases += b->leases;
			u->shared += l == 0 && b->refs - (b->indexed ? 1u : 0u) > 1;
		}
	}
}

void dp_stats(struct dp *dp, struct dp_stats *st)
{
	struct pool_usage pu;
	memset(st, 0, sizeof *st);
	pool_usage(dp->pool, &pu);
	st->dram_bytes = pu.dram_bytes;
	st->dram_used_bytes = pu.dram_used_bytes;
	st->blocks_dram = pu.blocks_dram;
	st->blocks_nvme = pu.blocks_nvme;
	st->blocks_inflight = pu.blocks_inflight;
	if (dp->tier) {
		struct tier_usage tu;
		tier_usage(dp->tier, &tu);
		st->nvme_bytes = tu.bytes;
		st->nvme_used_bytes = tu.used_bytes - tpw_held(dp->tpw); /* blocks' extents only */
		st->tier_pending = tier_pending(dp->tier);
	}
	st->demoted = dp->demoted;
	st->demoted_unwritten = dp->demoted_unwritten;
	st->nvme_unwritten_bytes = tpw_left(dp->tpw);
	st->kept_reclaimed = dp->kept_reclaimed;
	st->blocks_kept = pu.blocks_kept;
	st->nvme_kept_bytes = pu.kept_bytes;
	st->promoted = dp->promoted;
	st->crc_errors = dp->crc_errors;
	st->swaps = dp->swapped;
	st->swap_failures = dp->swap_failures;
	st->blocks_remote = pu.blocks_remote;
	st->remote_tier = dp->rio != NULL;
	st->offloaded = dp->offloaded;
	st->fetched = dp->fetched;
	st->remote_errors = dp->remote_errors;
	if (dp->rio)
		rio_stats(dp->rio, &st->remote_io);
	for (size_t i = 0; i < dp->max_w; i++) {
		if (!dp->w[i].ring)
			continue;
		st->leases += dp->w[i].n_leases;
		for (struct dp_pending *p = dp->w[i].pending; p; p = p->next)
			st->pending_ops++;
	}
	memcpy(st->ops, dp->ops, sizeof st->ops);
}

const char *dp_op_name(enum dp_opstat_kind k)
{
	static const char *const names[DP_N_OPS] = { "ALLOC", "COMMIT", "RECALL", "RELEASE", "INVALID" };
	return k < DP_N_OPS ? names[k] : "?";
}

void dp_shutdown(struct dp *dp)
{
	if (!dp)
		return;
	dp_stop(dp);
	/* Ops still waiting get a clear error before the rings go away. */
	for (size_t i = 0; dp->w && i < dp->max_w; i++) {
		struct dp_worker *w = &dp->w[i];
		if (!w->ring)
			continue;
		while (w->pending) {
			struct dp_pending *p = w->pending;
			w->pending = p->next;
			complete(dp, w, &p->e, -ESHUTDOWN, p->t0_us);
			free(p);
		}
	}
	dp_flush_completions(dp);
	dp_drain(dp, 2000);
	dp_remote_stop(dp);
	for (size_t i = 0; dp->w && i < dp->max_w; i++) {
		if (dp->w[i].ring) {
			ring_destroy(dp->w[i].ring);
			free(dp->w[i].leases);
			free(dp->w[i].free_slots);
		}
	}
	if (dp->tier)
		tier_close(dp->tier);
	tpw_close(dp->tpw); /* after tier_close: a piece in flight writes from its zeros */
	dp_swap_shutdown(dp); /* after tier_close: in-flight swap I/O still uses the bounces */
	prefix_index_clear(&dp->px);
	if (dp->vq.scanning)
		pool_scan_end(dp->pool, &dp->vq.scan, dp->vq.id, NULL);
	pool_destroy(dp->pool);
	pthread_mutex_destroy(&dp->lock);
	free(dp->vq.id);
	free(dp->vq.lru);
	free(dp->outbox);
	free(dp->limbo.v);
	free(dp->w);
	free(dp);
}
