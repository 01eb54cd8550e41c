/* hostkv_reconnect — continuing in place after kvstored restarts (docs/design.md §4 "Restart
 * without loss"; hostkv_table.h).
 *
 * A restarted kvstored re-adopts its pool segment and replays its journal: every committed
 * block is where it was, at the same pool offset, with the committed length and token ids of
 * the last acknowledged COMMIT. What it does not keep is this worker's: its leases, the blocks
 * it allocated ahead and had not committed yet, and the rows written past the committed length
 * (the step in flight). Continuing in place keeps everything the worker computed — so a
 * retrieval policy's speculative state, its device pages and every pointer into the pool stay
 * valid, and the tokens equal an uninterrupted run's:
 *
 * 1. The backend's queued writes into the pool are waited for, then the pages the store may
 *    not keep — from the tail page of the committed length on — are copied aside.
 * 2. A new connection says Hello and takes over the old pool mapping (same segment, so the
 *    same addresses; a new segment means the DRAM copy is gone: -ESTALE).
 * 3. Each open sequence is opened and attached again; its committed length and ids must be a
 *    prefix of this worker's. The blocks it held are leased again (a pinned block must come
 *    back at its offset), the pages the store lost are allocated again, the saved pages are
 *    written back, and the store's length and ids are brought up to this worker's.
 *
 * Anything that does not fit (a pinned block moved, the store keeps other ids, a page before
 * the saved ones lost) ends it with an error: the caller then rebuilds from the store. */
#include "clock.h"
#include "errmsg.h"
#include "hostkv_impl.h"
#include "hostkv_table.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "log.h"

/* What one sequence had before the store went away. */
struct saved_seq {
	struct hostkv_seq *s;
	uint32_t first;		/* pages [first, n_alloc[l]) of each layer copied aside */
	uint32_t *n_alloc;	/* (n_layers) */
	uint32_t max_alloc;
	uint8_t *bytes;		/* (n_layers, max_alloc - first, block_bytes) */
	uint64_t *off;		/* (n_layers, cap) offsets before */
};

static void saved_free(struct saved_seq *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].n_alloc);
		free(v[i].bytes);
		free(v[i].off);
	}
	free(v);
}

static uint8_t *saved_page(const struct saved_seq *v, int layer, uint32_t page)
{
	size_t span = v->max_alloc - v->first;
	return v->bytes + ((size_t)layer * span + (page - v->first)) * v->s->block_bytes;
}

/* Step 1 for one sequence (the backend already fenced). */
static int save_seq(struct saved_seq *v, struct hostkv_seq *s)
{
	struct hostkv *h = s->h;
	v->s = s;
	v->first = s->n_commit_pages ? s->n_commit_pages - 1 : 0;
	v->n_alloc = calloc((size_t)s->n_layers, sizeof *v->n_alloc);
	v->off = calloc((size_t)s->n_layers * (s->cap ? s->cap : 1), sizeof *v->off);
	if (!v->n_alloc || !v->off)
		return -ENOMEM;
	pthread_mutex_lock(&s->mu);
	for (int l = 0; l < s->n_layers; l++) {
		v->n_alloc[l] = s->n_alloc[l];
		if (s->n_alloc[l] > v->max_alloc)
			v->max_alloc = s->n_alloc[l];
		for (uint32_t p = 0; p < s->n_alloc[l]; p++)
			v->off[(size_t)l * s->cap + p] = hk_blk(s, l, p)->off;
	}
	if (v->first > v->max_alloc)
		v->first = v->max_alloc;
	size_t span = v->max_alloc - v->first;
	v->bytes = span ? malloc((size_t)s->n_layers * span * s->block_bytes) : NULL;
	int ret = span && !v->bytes ? -ENOMEM : 0;
	for (int l = 0; l < s->n_layers && !ret; l++)
		for (uint32_t p = v->first; p < s->n_alloc[l]; p++) {
			const struct hk_block *b = hk_blk(s, l, p);
			/* Pages at or past the tail page are leased from allocation on. */
			if (b->lease)
				memcpy(saved_page(v, l, p), h->base + b->off, s->block_bytes);
		}
	pthread_mutex_unlock(&s->mu);
	return ret;
}

/* Step 3 for one sequence, on the new connection. */
static int resync_seq(struct hostkv *h, struct saved_seq *v, char *err, size_t errlen)
{
	struct hostkv_seq *s = v->s;
	uint64_t committed = 0, id = 0;
	uint32_t *ids = NULL;
	size_t n_ids = 0;
	hk_lock_store(h);
	int ret = h->ops->open_seq(h->st, s->name, s->fp, sizeof s->fp, &s->kg, false, NULL, &id, err,
				   errlen);
	if (!ret)
		ret = h->ops->attach(h->st, id, &committed, &ids, &n_ids, err, errlen);
	hk_unlock_store(h, true);
	if (ret)
		return ret;
	const uint32_t p = (uint32_t)s->g.p;
	const uint32_t store_pages = (uint32_t)((committed + p - 1) / p);
	/* The store may be a request ahead (the reply to a COMMIT or CommitTokens it made durable
	 * never came back): those ids are kept, and the op that sent them, run again, must agree. */
	size_t common = n_ids < s->n_ids ? n_ids : s->n_ids;
	if (common && memcmp(ids, s->ids, common * sizeof *ids))
		ret = errmsg(err, errlen, -EPROTO, "sequence '%s': the restarted store keeps other "
			     "token ids than this worker", s->name);
	else if (n_ids > s->n_ids && hk_keep_ids(s, (const int32_t *)ids + s->n_ids, s->n_ids,
						   n_ids - s->n_ids))
		ret = errmsg(err, errlen, -ENOMEM, "out of memory");
	else if (store_pages < v->first)
		ret = errmsg(err, errlen, -ESTALE, "sequence '%s': the restarted store keeps %" PRIu64
			     " tokens, pages this worker no longer holds were lost", s->name,
			     committed);
	free(ids);
	if (ret)
		return ret;
	if ((int64_t)committed > s->committed)
		s->committed = (int64_t)committed;

	/* The new daemon holds no lease of ours and none of the pages past store_pages. */
	pthread_mutex_lock(&s->mu);
	s->id = id;
	for (int l = 0; l < s->n_layers; l++) {
		for (uint32_t q = 0; q < s->n_alloc[l]; q++)
			hk_blk(s, l, q)->lease = 0;
		s->n_alloc[l] = store_pages < v->n_alloc[l] ? store_pages : v->n_alloc[l];
	}
	s->n_held = s->n_evictable = 0;
	s->n_commit_pages = store_pages;
	const uint32_t lo = s->budget && s->full < store_pages ? s->full : (s->budget ? store_pages : 0);
	pthread_mutex_unlock(&s->mu);
	ret = hk_lease_missing(s, 0, s->n_layers, lo, store_pages, err, errlen);
	/* With a budget the full pages were leased only while pinned or recently used: the
	 * pinned ones must be leased again before anyone reads them. */
	for (int l = 0; l < s->n_layers && !ret; l++)
		for (uint32_t q = 0; q < lo && !ret; q++)
			if (hk_blk(s, l, q)->pins)
				ret = hk_lease_missing(s, l, l + 1, q, q + 1, err, errlen);
	if (!ret && v->max_alloc > store_pages)
		ret = hk_alloc_pages(s, v->max_alloc, err, errlen);
	if (ret)
		return ret;

	/* Pointers handed out stay valid: a pinned block is where it was. The saved pages go
	 * back (those the store kept hold the same committed rows, plus the step in flight). */
	pthread_mutex_lock(&s->mu);
	for (int l = 0; l < s->n_layers && !ret; l++)
		for (uint32_t q = 0; q < v->n_alloc[l] && !ret; q++) {
			const struct hk_block *b = hk_blk(s, l, q);
			if (b->pins && b->off != v->off[(size_t)l * s->cap + q])
				ret = errmsg(err, errlen, -ESTALE, "sequence '%s': pinned block "
					     "(layer %d, page %u) moved in the restarted store",
					     s->name, l, q);
		}
	for (int l = 0; l < s->n_layers && !ret; l++)
		for (uint32_t q = v->first; q < v->n_alloc[l]; q++)
			memcpy(h->base + hk_blk(s, l, q)->off, saved_page(v, l, q), s->block_bytes);
	pthread_mutex_unlock(&s->mu);
	if (ret)
		return ret;

	/* The store's length and ids up to this worker's. */
	const uint32_t pages = (uint32_t)((s->committed + p - 1) / p);
	ret = hk_commit_blocks(s, pages, s->committed, err, errlen);
	if (!ret && s->n_ids > n_ids) {
		size_t fresh = s->n_ids - n_ids;
		uint32_t *u = malloc(fresh * sizeof *u);
		if (!u)
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		for (size_t i = 0; i < fresh; i++)
			u[i] = (uint32_t)s->ids[n_ids + i];
		hk_lock_store(h);
		ret = h->ops->commit_tokens(h->st, s->id, (uint64_t)s->committed, n_ids, u, fresh,
					    err, errlen);
		hk_unlock_store(h, true);
		free(u);
	}
	if (!ret)
		s->lagging = false;
	return ret;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

static int reconnect_locked(struct hostkv *h, char *err, size_t errlen)
{
	uint64_t t0 = clock_ms(), deadline = t0 + h->retry_ms;
	if (h->reg_be && h->reg_be->ops->sync)
		h->reg_be->ops->sync(h->reg_be->ctx); /* stores queued into the pool land first */
	size_t n = 0;
	for (struct hostkv_seq *s = h->seqs; s; s = s->next)
		n++;
	struct saved_seq *v = calloc(n ? n : 1, sizeof *v);
	int ret = v ? 0 : -ENOMEM;
	size_t i = 0;
	for (struct hostkv_seq *s = h->seqs; s && !ret; s = s->next)
		ret = save_seq(&v[i++], s);
	if (ret) {
		saved_free(v, i);
		return errmsg(err, errlen, ret, "out of memory");
	}
	log_warn("kvstored is gone; reconnecting (up to %.0f s)",
		h->retry_ms / 1e3);
	long backoff = 50;
	h->came_back = 0;
	for (;;) {
		void *st = NULL;
		hk_lock_store(h);
		ret = h->ops->reopen(h->st, &st, err, errlen);
		if (!ret)
			h->st = st;
		hk_unlock_store(h, true);
		const bool opened = !ret;
		h->came_back |= opened;
		for (size_t k = 0; k < n && !ret; k++)
			ret = resync_seq(h, &v[k], err, errlen);
		if (!ret || ret == -ESTALE || ret == -EPROTO || clock_ms() >= deadline)
			break;
		if (opened && !h->ops->gone(h->st))
			break; /* a running store refused: trying again changes nothing */
		sleep_ms(backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	saved_free(v, n);
	if (!ret)
		log_info("reconnected after %.1f s; %zu sequence(s) continue in "
			"place", (clock_ms() - t0) / 1e3, n);
	return ret;
}

bool hostkv_store_came_back(const struct hostkv *h)
{
	return h->came_back != 0;
}

int hk_reconnect(struct hostkv *h, uint64_t op_gen, char *err, size_t errlen)
{
	if (!h->ops->reopen)
		return -EOPNOTSUPP;
	pthread_rwlock_wrlock(&h->life);
	int ret = 0;
	if (h->gen == op_gen) {
		if (!h->retry_ms) {
			ret = -ECONNRESET;
		} else {
			ret = reconnect_locked(h, err, errlen);
			if (ret)
				h->retry_ms = 0; /* gave up: the handle stays dead */
			else
				h->gen++;
		}
	}
	pthread_rwlock_unlock(&h->life);
	return ret;
}
