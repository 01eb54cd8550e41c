/* persist — journaled metadata, replay and adoption at start. See persist.h. */
#include "persist.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "crc32c.h"
#include "errmsg.h"
#include "journal.h"
#include "pool.h"
#include "tier.h"
#include "log.h"

/* Record types and payloads (native byte order: a journal never leaves its host). */
enum { REC_META = 1, REC_SEQ, REC_TOKENS, REC_COMMITTED, REC_BLOCK, REC_REMOVE, REC_PREFIX,
       REC_REMOTE };
enum { BLK_DRAM = 1, BLK_NVME = 2, BLK_REMOTE = 3, BLK_PUBLISHED = 4 };
#define SEQF_OWNER 1u

struct rec_meta {
	uint64_t dram_bytes;
	char shm_name[CFG_STR_MAX];
};

struct rec_seq {
	uint64_t id, committed, damaged_cut_from;
	uint32_t geo[5];	/* n_layers, n_kv_heads, head_dim, page_size, dtype */
	uint32_t flags, owner_uid, fp_len, damaged_blocks, pad;
	uint8_t fp[SEQ_FP_MAX];
	char name[SEQ_NAME_MAX];
};

struct rec_tokens {
	uint64_t id, committed, first;
	uint32_t n, pad;
	/* uint32_t ids[n] follow */
};

struct rec_committed {
	uint64_t id, committed;
};

struct rec_block {
	uint64_t seq, off, slab_base;	/* off: pool offset (DRAM) or NVMe extent */
	uint32_t layer, page, where, crc, rows, block_bytes;
};

struct rec_remove {
	uint64_t id;
};

/* Beyond one host (docs/design.md §8): whether this host holds the name's Redis lease or
 * published it, and the generation. */
struct rec_remote {
	uint64_t id, gen;
	uint32_t state, pad;
};

/* Prefix sharing (docs/design.md §4): what a restart needs to key the sequence's pages again. */
struct rec_prefix {
	uint64_t id, publish_limit, covered;
	uint32_t ubatch, pad;
	uint8_t key0[32];
};

/* One journaled block location, while replaying. */
struct rblock {
	uint64_t off, slab_base;
	uint32_t crc, rows;
	uint8_t where;	/* 0: none, BLK_DRAM, BLK_NVME, BLK_REMOTE (off: its remote_id) */
};

struct rseq {
	uint64_t id;
	struct rblock *b;	/* (n_layers, cap) */
	uint32_t n_layers, cap;
};

struct persist {
	const struct cfg *cfg;
	char path[PATH_MAX];
	struct journal *j;
	bool failed, sync_logged;
	/* replay state (persist_restore only) */
	struct seq_table *seqs;
	struct rseq *rv;
	size_t n_rv, cap_rv;
	bool meta_ok;		/* the journal's pool is this pool (same name and size) */
	uint64_t snap_bytes;	/* journal size right after the last compaction */
	/* The compaction under way (snap: the new journal; NULL none). A sequence is written to it
	 * once (snap_epoch == epoch), by passes over the table from cursor: a pass that writes
	 * none ends it. snap_err: an append to it failed. */
	struct journal *snap;
	uint64_t epoch;
	size_t cursor, pass_written;
	int snap_err;
	uint64_t compact_t0_ms, compact_from, compact_steps, compact_step_max_ns;
	uint64_t compact_left;	/* records left to the old journal: their sequence not written yet */
	uint64_t compact_retry_ms;	/* after a failed compaction: none starts before this */
	bool have_meta;
	struct persist_stats st;
};

/* ---------------------------------------------------------------- open / close */

int persist_open(const struct cfg *cfg, struct persist **out, char *why, size_t whylen)
{
	*out = NULL;
	if (!cfg->persist) {
		errmsg_set(why, whylen, "persist = false: starting empty; sequences are not kept "
			   "across a restart");
		return 0;
	}
	if (!cfg->journal_path[0] && !cfg->nvme_path[0]) {
		errmsg_set(why, whylen, "persistence is off: no nvme_path and no journal_path to keep "
			   "the journal in; starting empty");
		return 0;
	}
	struct persist *ps = calloc(1, sizeof *ps);
	if (!ps)
		return -ENOMEM;
	ps->cfg = cfg;
	if (cfg->journal_path[0])
		snprintf(ps->path, sizeof ps->path, "%s", cfg->journal_path);
	else
		snprintf(ps->path, sizeof ps->path, "%s.journal", cfg->nvme_path);
	ps->st.enabled = true;
	*out = ps;
	return 0;
}

void persist_close(struct persist *ps)
{
	if (!ps)
		return;
	journal_close(ps->j);
	for (size_t i = 0; i < ps->n_rv; i++)
		free(ps->rv[i].b);
	free(ps->rv);
	free(ps);
}

const char *persist_journal_path(const struct persist *ps)
{
	return ps ? ps->path : "";
}

/* ---------------------------------------------------------------- checksums */

static uint32_t dtype_size(uint32_t dtype)
{
	return dtype == SEQ_DTYPE_F32 ? 4 : 2;
}

uint32_t persist_rows_crc(const void *block, const struct seq_geometry *g, uint32_t from,
			  uint32_t to, uint32_t crc)
{
	/* Block [n_kv][2][p][d]: row r of head h, K (k = 0) or V (k = 1). */
	size_t row = (size_t)g->head_dim * dtype_size(g->dtype);
	const uint8_t *b = block;
	for (uint32_t r = from; r < to; r++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++)
			for (uint32_t k = 0; k < 2; k++)
				crc = crc32c(crc, b + (((size_t)h * 2 + k) * g->page_size + r) * row, row);
	return crc;
}

static uint32_t rows_of(const struct seq *s, uint32_t page)
{
	uint64_t start = (uint64_t)page * s->geo.page_size;
	if (s->committed_tokens <= start)
		return 0;
	uint64_t n = s->committed_tokens - start;
	return n > s->geo.page_size ? s->geo.page_size : (uint32_t)n;
}

/* ---------------------------------------------------------------- hooks */

static void note_failure(struct persist *ps, int ret)
{
	if (ret && !ps->failed) {
		log_error("journal %s: cannot append a record (%s): metadata changes "
			"from now on may be lost at a restart", ps->path, strerror(-ret));
		ps->failed = true;
	}
}

static void append(struct persist *ps, uint32_t type, const void *p, uint32_t len)
{
	note_failure(ps, journal_append(ps->j, type, p, len));
}

/* Whether s's records go to the compaction's new journal too: the snapshot has written it. */
static bool to_snap(const struct persist *ps, const struct seq *s)
{
	return ps->snap && s->snap_epoch == ps->epoch;
}

static void snap_failure(struct persist *ps, int ret)
{
	if (ret && !ps->snap_err)
		ps->snap_err = ret;
}

/* A record of sequence s: to the journal, and to the new one when s is in it already. */
static void append_seq(struct persist *ps, const struct seq *s, uint32_t type, const void *p,
		       uint32_t len)
{
	append(ps, type, p, len);
	if (to_snap(ps, s))
		snap_failure(ps, journal_append(ps->snap, type, p, len));
	else if (ps->snap)
		ps->compact_left++;
}

static void fill_seq(struct rec_seq *r, const struct seq *s)
{
	memset(r, 0, sizeof *r);
	r->id = s->id;
	r->committed = s->committed_tokens;
	r->damaged_cut_from = s->damaged_cut_from;
	r->geo[0] = s->geo.n_layers;
	r->geo[1] = s->geo.n_kv_heads;
	r->geo[2] = s->geo.head_dim;
	r->geo[3] = s->geo.page_size;
	r->geo[4] = s->geo.dtype;
	r->flags = s->has_owner ? SEQF_OWNER : 0;
	r->owner_uid = s->owner_uid;
	r->fp_len = (uint32_t)s->fp_len;
	r->damaged_blocks = s->damaged_blocks;
	memcpy(r->fp, s->fp, s->fp_len);
	snprintf(r->name, sizeof r->name, "%s", s->name);
}

static int tokens_to(struct journal *j, const struct seq *s, uint64_t first, const uint32_t *ids,
		     size_t n)
{
	/* Long id lists go in pieces, each well below the journal's record limit. */
	const size_t piece = 1u << 20;
	size_t done = 0;
	do {
		size_t k = n - done < piece ? n - done : piece;
		size_t bytes = sizeof(struct rec_tokens) + k * sizeof *ids;
		struct rec_tokens *r = malloc(bytes);
		if (!r)
			return -ENOMEM;
		*r = (struct rec_tokens){ .id = s->id, .committed = s->committed_tokens,
					  .first = first + done, .n = (uint32_t)k };
		if (k)
			memcpy(r + 1, ids + done, k * sizeof *ids);
		int ret = journal_append(j, REC_TOKENS, r, (uint32_t)bytes);
		free(r);
		if (ret)
			return ret;
		done += k;
	} while (done < n);
	return 0;
}

void persist_seq_open(struct persist *ps, struct seq *s)
{
	if (!ps || !ps->j)
		return;
	if (ps->snap) /* opened during a compaction: the new journal has it from its start */
		s->snap_epoch = ps->epoch;
	struct rec_seq r;
	fill_seq(&r, s);
	append_seq(ps, s, REC_SEQ, &r, sizeof r);
	if (s->n_tokens) {
		note_failure(ps, tokens_to(ps->j, s, 0, s->tokens, s->n_tokens));
		if (to_snap(ps, s))
			snap_failure(ps, tokens_to(ps->snap, s, 0, s->tokens, s->n_tokens));
	}
}

void persist_seq_tokens(struct persist *ps, const struct seq *s, uint64_t first,
			const uint32_t *ids, size_t n)
{
	if (!ps || !ps->j)
		return;
	note_failure(ps, tokens_to(ps->j, s, first, ids, n));
	if (to_snap(ps, s))
		snap_failure(ps, tokens_to(ps->snap, s, first, ids, n));
}

void persist_seq_committed(struct persist *ps, const struct seq *s)
{
	if (!ps || !ps->j)
		return;
	struct rec_committed r = { s->id, s->committed_tokens };
	append_seq(ps, s, REC_COMMITTED, &r, sizeof r);
}

static void fill_prefix(struct rec_prefix *r, const struct seq *s)
{
	*r = (struct rec_prefix){ .id = s->id, .publish_limit = s->publish_limit,
				  .covered = s->covered_tokens, .ubatch = s->prefix_ubatch };
	memcpy(r->key0, s->key0, sizeof r->key0);
}

void persist_seq_prefix(struct persist *ps, const struct seq *s)
{
	if (!ps || !ps->j)
		return;
	struct rec_prefix r;
	fill_prefix(&r, s);
	append_seq(ps, s, REC_PREFIX, &r, sizeof r);
}

void persist_seq_remote(struct persist *ps, const struct seq *s)
{
	if (!ps || !ps->j)
		return;
	struct rec_remote r = { .id = s->id, .gen = s->remote_gen, .state = s->remote };
	append_seq(ps, s, REC_REMOTE, &r, sizeof r);
}

void persist_seq_remove(struct persist *ps, const struct seq *s)
{
	if (!ps || !ps->j)
		return;
	struct rec_remove r = { s->id };
	append_seq(ps, s, REC_REMOVE, &r, sizeof r);
}

/* The record of block b as it is now (the descriptor's rows_crc brought up to date first). */
static bool block_record(struct pool *pool, const struct seq *s, uint32_t id,
			 struct pool_block *b, struct rec_block *r)
{
	memset(r, 0, sizeof *r);
	r->seq = s->id;
	r->layer = b->layer;
	r->page = b->page;
	r->block_bytes = b->bytes;
	bool dram = b->tier == POOL_TIER_DRAM || b->tier == POOL_TIER_DEMOTING;
	if (dram) {
		const void *data = pool_block_data(pool, id);
		if (!data || pool_block_slab_base(pool, id, &r->slab_base))
			return false;
		uint32_t rows = rows_of(s, b->page);
		if (rows < b->rows) /* never shrinks in practice; recount from zero if it does */
			b->rows = b->rows_crc = 0;
		b->rows_crc = persist_rows_crc(data, &s->geo, b->rows, rows, b->rows_crc);
		b->rows = rows;
		r->where = BLK_DRAM;
		r->off = b->dram_off;
		r->crc = b->rows_crc;
		r->rows = b->rows;
	} else if (b->tier == POOL_TIER_REMOTE && b->remote_published) {
		r->where = BLK_PUBLISHED; /* the publisher's key: name and generation (REC_REMOTE) */
	} else if (b->tier == POOL_TIER_REMOTE) {
		if (!b->has_crc || !b->remote_id)
			return false;
		r->where = BLK_REMOTE;
		r->off = b->remote_id;
		r->crc = b->crc;
	} else {
		if (!b->has_crc || b->nvme_off == POOL_NO_OFFSET)
			return false;
		r->where = BLK_NVME;
		r->off = b->nvme_off;
		r->crc = b->crc;
	}
	return true;
}

void persist_block(struct persist *ps, struct pool *pool, const struct seq *s, uint32_t id)
{
	struct pool_block *b = pool_block_get(pool, id);
	if (!b || !b->committed)
		return;
	if (!ps || !ps->j) {
		return;
	}
	struct rec_block r;
	if (block_record(pool, s, id, b, &r))
		append_seq(ps, s, REC_BLOCK, &r, sizeof r);
}

static int log_sync_error(struct persist *ps, int ret);

int persist_sync(struct persist *ps)
{
	if (!ps || !ps->j)
		return 0;
	return log_sync_error(ps, journal_sync(ps->j));
}

bool persist_dirty(const struct persist *ps)
{
	return ps && ps->j && journal_dirty(ps->j);
}

static int log_sync_error(struct persist *ps, int ret)
{
	if (ret && !ps->sync_logged) {
		log_error("journal %s: sync failed (%s): commits are not durable "
			"until it succeeds", ps->path, strerror(-ret));
		ps->sync_logged = true;
	}
	return ret;
}

int persist_sync_start(struct persist *ps)
{
	return ps && ps->j ? log_sync_error(ps, journal_sync_start(ps->j)) : 0;
}

int persist_write(struct persist *ps)
{
	return ps && ps->j ? log_sync_error(ps, journal_write(ps->j)) : 0;
}

uint64_t persist_need(const struct persist *ps)
{
	return ps && ps->j ? journal_need(ps->j) : 0;
}

uint64_t persist_appended(const struct persist *ps)
{
	return ps && ps->j ? journal_appended(ps->j) : 0;
}

void persist_wait_synced(struct persist *ps, uint64_t gen, int timeout_ms)
{
	if (ps && ps->j)
		journal_wait_synced(ps->j, gen, timeout_ms);
}

uint64_t persist_synced(const struct persist *ps)
{
	return ps && ps->j ? journal_synced(ps->j) : 0;
}

void persist_on_synced(struct persist *ps, void (*fn)(void *ctx), void *ctx)
{
	if (ps && ps->j)
		journal_on_synced(ps->j, fn, ctx);
}

/* ---------------------------------------------------------------- snapshot */

struct snap_ctx {
	struct persist *ps;
	const struct seq_table *seqs;
	struct pool *pool;
};

static int snap_meta(struct persist *ps, struct pool *pool, struct journal *j)
{
	struct rec_meta m = { .dram_bytes = pool_bytes(pool) };
	snprintf(m.shm_name, sizeof m.shm_name, "%s", ps->cfg->shm_name);
	return journal_append(j, REC_META, &m, sizeof m);
}

/* Sequence s as it is now: what a replay of its records so far would build. */
static int snap_seq(struct pool *pool, const struct seq *s, struct journal *j)
{
	struct rec_seq r;
	fill_seq(&r, s);
	int ret = journal_append(j, REC_SEQ, &r, sizeof r);
	if (!ret && s->n_tokens)
		ret = tokens_to(j, s, 0, s->tokens, s->n_tokens);
	if (!ret && (s->prefix_ubatch || s->covered_tokens)) {
		struct rec_prefix rp;
		fill_prefix(&rp, s);
		ret = journal_append(j, REC_PREFIX, &rp, sizeof rp);
	}
	if (!ret && s->remote) {
		struct rec_remote rr = { .id = s->id, .gen = s->remote_gen, .state = s->remote };
		ret = journal_append(j, REC_REMOTE, &rr, sizeof rr);
	}
	for (uint32_t l = 0; l < s->geo.n_layers && !ret; l++) {
		for (uint32_t p = 0; p < s->n_pages && !ret; p++) {
			uint32_t id = seq_block(s, l, p);
			struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(pool, id);
			struct rec_block rb;
			if (b && b->committed && block_record(pool, s, id, b, &rb))
				ret = journal_append(j, REC_BLOCK, &rb, sizeof rb);
		}
	}
	return ret;
}

/* The whole snapshot at once (the compaction at a start). */
static int snap_fill(void *ctx, struct journal *j)
{
	struct snap_ctx *c = ctx;
	int ret = snap_meta(c->ps, c->pool, j);
	for (size_t i = 0; i < c->seqs->n && !ret; i++)
		ret = snap_seq(c->pool, c->seqs->v[i], j);
	return ret;
}

static int compact(struct persist *ps, const struct seq_table *seqs, struct pool *pool)
{
	char err[512];
	struct snap_ctx c = { ps, seqs, pool };
	int ret = journal_compact(ps->j, snap_fill, &c, err, sizeof err);
	if (ret) {
		log_error("%s", err);
		return ret;
	}
	struct journal_stats js;
	journal_stats(ps->j, &js);
	ps->snap_bytes = js.bytes;
	return 0;
}

/* A compaction in steps (docs/design.md §4 "Restart without loss"). The new journal gets each
 * sequence as it is when the step reaches it, and from then on every record of it; records of a
 * sequence not reached yet go to the old journal only, since its snapshot, later, will hold
 * their effect. Replaying the new journal therefore builds each sequence from its snapshot and
 * the changes after it: the state now, as the old journal does. A sequence opened meanwhile is
 * in the new journal from its first record; one removed before it was reached is in neither. A
 * removal moves the table's last sequence into the hole, perhaps behind the cursor: passes go
 * on until one finds nothing left to write. */
static bool snap_step(struct persist *ps, const struct seq_table *seqs, struct pool *pool)
{
	uint64_t before = journal_appended(ps->snap);
	for (uint32_t checked = 0; !ps->snap_err; checked++) {
		if (journal_appended(ps->snap) - before + checked / 16 >= ps->cfg->journal_compact_step)
			return false;
		if (ps->cursor >= seqs->n) {
			if (!ps->pass_written)
				return true;
			ps->cursor = 0;
			ps->pass_written = 0;
			continue;
		}
		struct seq *s = seqs->v[ps->cursor++];
		if (s->snap_epoch == ps->epoch)
			continue;
		s->snap_epoch = ps->epoch;
		ps->pass_written++;
		snap_failure(ps, snap_seq(pool, s, ps->snap));
	}
	return false;
}

bool persist_compacting(const struct persist *ps)
{
	return ps && ps->snap;
}

/* A compaction that failed (a full disk, say) is not tried again at once: the journal goes on
 * growing meanwhile, as it would without compaction. */
#define COMPACT_RETRY_MS 10000

bool persist_snapshotting(const struct persist *ps)
{
	return ps && ps->snap && !journal_compact_sealed(ps->j);
}

void persist_compact_step(struct persist *ps, const struct seq_table *seqs, struct pool *pool)
{
	if (!persist_snapshotting(ps) || ps->snap_err)
		return;
	uint64_t t0 = clock_ns();
	if (snap_step(ps, seqs, pool) && !ps->snap_err)
		ps->snap_err = journal_compact_seal(ps->j);
	ps->compact_steps++;
	uint64_t ns = clock_ns() - t0;
	if (ns > ps->compact_step_max_ns)
		ps->compact_step_max_ns = ns;
}

bool persist_maintain(struct persist *ps, struct pool *pool)
{
	if (!ps || !ps->j)
		return false;
	char err[512];
	struct journal_stats js;
	if (ps->snap) {
		if (ps->snap_err) {
			log_error("compacting the journal %s: writing the snapshot: %s; the journal "
				  "goes on uncompacted, and a compaction is tried again in %d s",
				  ps->path, strerror(-ps->snap_err), COMPACT_RETRY_MS / 1000);
			journal_compact_abort(ps->j);
			ps->snap = NULL;
			ps->compact_retry_ms = clock_ms() + COMPACT_RETRY_MS;
			return false;
		}
		if (!journal_compact_sealed(ps->j))
			return false; /* the data plane writes it, a step per pass */
		uint64_t t0 = clock_ns();
		int ret = journal_compact_finish(ps->j, err, sizeof err);
		if (ret < 0) {
			ps->snap = NULL; /* finish dropped it */
			log_error("%s; the journal goes on uncompacted, and a compaction is tried "
				  "again in %d s", err, COMPACT_RETRY_MS / 1000);
			ps->compact_retry_ms = clock_ms() + COMPACT_RETRY_MS;
			return false;
		}
		if (ret != JOURNAL_COMPACT_DONE)
			return false;
		ps->snap = NULL;
		journal_stats(ps->j, &js);
		ps->snap_bytes = js.bytes;
		log_info("journal compacted from %" PRIu64 " to %" PRIu64 " bytes in %" PRIu64
			 " ms: %" PRIu64 " steps of at most %.2f ms (%" PRIu64 " changes meanwhile "
			 "to sequences the snapshot had not reached), put in place in %.2f ms",
			 ps->compact_from, js.bytes, clock_ms() - ps->compact_t0_ms,
			 ps->compact_steps, ps->compact_step_max_ns / 1e6, ps->compact_left,
			 (clock_ns() - t0) / 1e6);
		return true;
	}
	journal_stats(ps->j, &js);
	/* Twice the last snapshot at least, or a journal whose live state alone passes the limit
	 * would be compacted on every tick. */
	uint64_t limit = ps->cfg->journal_compact_bytes;
	if (limit < 2 * ps->snap_bytes)
		limit = 2 * ps->snap_bytes;
	if (js.bytes < limit || clock_ms() < ps->compact_retry_ms)
		return false;
	uint64_t t0 = clock_ns();
	if (journal_compact_begin(ps->j, &ps->snap, err, sizeof err)) {
		log_error("%s; a compaction is tried again in %d s", err, COMPACT_RETRY_MS / 1000);
		ps->compact_retry_ms = clock_ms() + COMPACT_RETRY_MS;
		return false;
	}
	ps->epoch++;
	ps->cursor = ps->pass_written = 0;
	ps->snap_err = snap_meta(ps, pool, ps->snap);
	ps->compact_t0_ms = clock_ms();
	ps->compact_from = js.bytes;
	ps->compact_steps = 0;
	ps->compact_step_max_ns = 0;
	ps->compact_left = 0;
	log_debug("journal compaction started in %.2f ms", (clock_ns() - t0) / 1e6);
	return false;
}

void persist_stats(const struct persist *ps, struct persist_stats *st)
{
	memset(st, 0, sizeof *st);
	if (!ps)
		return;
	*st = ps->st;
	st->failed = ps->failed;
	if (ps->j) {
		struct journal_stats js;
		journal_stats(ps->j, &js);
		st->journal_bytes = js.bytes;
		st->records = js.records;
		st->syncs = js.syncs;
		st->compactions = js.compactions;
		st->last_compaction = js.last_compaction;
	}
}

/* ---------------------------------------------------------------- replay */

static struct rseq *rseq_find(struct persist *ps, uint64_t id)
{
	for (size_t i = ps->n_rv; i-- > 0;) /* the newest sequences are the busiest */
		if (ps->rv[i].id == id)
			return &ps->rv[i];
	return NULL;
}

static int rseq_block_set(struct rseq *r, uint32_t layer, uint32_t page, const struct rblock *v)
{
	if (page >= r->cap) {
		uint32_t cap = r->cap ? r->cap : 16;
		while (cap <= page)
			cap *= 2;
		struct rblock *b = calloc((size_t)r->n_layers * cap, sizeof *b);
		if (!b)
			return -ENOMEM;
		for (uint32_t l = 0; l < r->n_layers && r->cap; l++)
			memcpy(b + (size_t)l * cap, r->b + (size_t)l * r->cap, r->cap * sizeof *b);
		free(r->b);
		r->b = b;
		r->cap = cap;
	}
	r->b[(size_t)layer * r->cap + page] = *v;
	return 0;
}

static int on_record(void *ctx, uint32_t type, const void *p, uint32_t len, char *msg,
		     size_t msglen)
{
	struct persist *ps = ctx;
	char err[256] = "";
	switch (type) {
	case REC_META: {
		const struct rec_meta *m = p;
		if (len != sizeof *m)
			break;
		ps->have_meta = true;
		ps->meta_ok = m->dram_bytes == ps->cfg->dram_bytes &&
			      strncmp(m->shm_name, ps->cfg->shm_name, sizeof m->shm_name) == 0;
		if (!ps->meta_ok)
			log_warn("the journal describes pool %.*s of %" PRIu64 " bytes, "
				"not %s of %" PRIu64 ": its DRAM blocks cannot be adopted",
				(int)sizeof m->shm_name, m->shm_name, m->dram_bytes,
				ps->cfg->shm_name, ps->cfg->dram_bytes);
		return 0;
	}
	case REC_SEQ: {
		const struct rec_seq *r = p;
		if (len != sizeof *r)
			break;
		struct seq_geometry g = { r->geo[0], r->geo[1], r->geo[2], r->geo[3], r->geo[4] };
		char name[SEQ_NAME_MAX];
		snprintf(name, sizeof name, "%.*s", (int)sizeof r->name, r->name);
		struct seq *s;
		int ret = seq_restore(ps->seqs, r->id, name, r->fp, r->fp_len, &g, &s, err, sizeof err);
		if (ret) {
			errmsg_set(msg, msglen, "%s", err);
			return ret;
		}
		s->committed_tokens = r->committed;
		s->has_owner = r->flags & SEQF_OWNER;
		s->owner_uid = r->owner_uid;
		s->damaged_blocks = r->damaged_blocks;
		s->damaged_cut_from = r->damaged_cut_from;
		if (ps->n_rv == ps->cap_rv) {
			size_t cap = ps->cap_rv ? ps->cap_rv * 2 : 16;
			struct rseq *v = realloc(ps->rv, cap * sizeof *v);
			if (!v)
				return -ENOMEM;
			ps->rv = v;
			ps->cap_rv = cap;
		}
		ps->rv[ps->n_rv++] = (struct rseq){ .id = r->id, .n_layers = g.n_layers };
		return 0;
	}
	case REC_TOKENS: {
		const struct rec_tokens *r = p;
		if (len < sizeof *r || (len - sizeof *r) / sizeof(uint32_t) != r->n ||
		    (len - sizeof *r) % sizeof(uint32_t))
			break;
		struct seq *s = seq_find(ps->seqs, r->id);
		if (!s) {
			errmsg_set(msg, msglen, "token ids of unknown sequence %" PRIu64, r->id);
			return -EINVAL;
		}
		int ret = seq_commit(s, r->committed, r->first, (const uint32_t *)(r + 1), r->n,
				     SIZE_MAX, err, sizeof err);
		if (ret) {
			errmsg_set(msg, msglen, "sequence '%s': %s", s->name, err);
			return ret;
		}
		return 0;
	}
	case REC_COMMITTED: {
		const struct rec_committed *r = p;
		struct seq *s = len == sizeof *r ? seq_find(ps->seqs, r->id) : NULL;
		if (!s)
			break;
		s->committed_tokens = r->committed;
		return 0;
	}
	case REC_BLOCK: {
		const struct rec_block *r = p;
		struct rseq *rs = len == sizeof *r ? rseq_find(ps, r->seq) : NULL;
		struct seq *s = rs ? seq_find(ps->seqs, r->seq) : NULL;
		if (!s || r->layer >= s->geo.n_layers || r->page >= (1u << 24) ||
		    (r->where < BLK_DRAM || r->where > BLK_PUBLISHED) ||
		    r->block_bytes != s->block_bytes ||
		    r->rows > s->geo.page_size)
			break;
		struct rblock b = { r->off, r->slab_base, r->crc, r->rows, (uint8_t)r->where };
		return rseq_block_set(rs, r->layer, r->page, &b);
	}
	case REC_REMOVE: {
		const struct rec_remove *r = p;
		struct seq *s = len == sizeof *r ? seq_find(ps->seqs, r->id) : NULL;
		struct rseq *rs = s ? rseq_find(ps, r->id) : NULL;
		if (!rs)
			break;
		seq_remove(ps->seqs, s);
		free(rs->b);
		*rs = ps->rv[--ps->n_rv];
		return 0;
	}
	case REC_PREFIX: {
		const struct rec_prefix *r = p;
		struct seq *s = len == sizeof *r ? seq_find(ps->seqs, r->id) : NULL;
		if (!s)
			break;
		s->prefix_ubatch = r->ubatch;
		s->publish_limit = r->publish_limit;
		s->covered_tokens = r->covered;
		memcpy(s->key0, r->key0, sizeof s->key0);
		return 0;
	}
	case REC_REMOTE: {
		const struct rec_remote *r = p;
		struct seq *s = len == sizeof *r ? seq_find(ps->seqs, r->id) : NULL;
		if (!s || r->state > SEQ_REMOTE_PUBLISHED)
			break;
		s->remote = (uint8_t)r->state;
		s->remote_gen = r->gen;
		return 0;
	}
	default:
		errmsg_set(msg, msglen, "unknown record type");
		return -EINVAL;
	}
	errmsg_set(msg, msglen, "malformed payload of %u bytes", len);
	return -EINVAL;
}

/* ---------------------------------------------------------------- adoption */

struct adopt_ctx {
	struct persist *ps;
	struct pool *pool;
	struct tier *tier;
	bool dram_ok;
	void *bounce;		/* (bounce_bytes,) TIER_ALIGN-aligned, for NVMe verification */
	uint64_t bounce_bytes;
};

struct find_nvme {
	uint64_t off;
	uint32_t id;
	bool found;
};

static int match_nvme(void *ctx, uint32_t id, struct pool_block *b)
{
	struct find_nvme *f = ctx;
	if (b->tier != POOL_TIER_NVME || b->nvme_off != f->off)
		return 0;
	f->id = id;
	f->found = true;
	return 1;
}

static int match_remote(void *ctx, uint32_t id, struct pool_block *b)
{
	struct find_nvme *f = ctx;
	if (b->tier != POOL_TIER_REMOTE || b->remote_id != f->off)
		return 0;
	f->id = id;
	f->found = true;
	return 1;
}

/* Whether the block rb names was adopted already (for another sequence, at the same layer and
 * page): *id names it then. An NVMe extent is looked for only once the tier says it is taken. */
static bool adopted_before(struct adopt_ctx *a, const struct seq *s, uint32_t layer,
			   uint32_t page, const struct rblock *rb, uint32_t *id)
{
	const struct pool_block *b = NULL;
	if (rb->where == BLK_DRAM) {
		if (a->dram_ok && !pool_block_at(a->pool, rb->off, id))
			b = pool_block_get(a->pool, *id);
	} else if (rb->where == BLK_REMOTE) {
		struct find_nvme f = { .off = rb->off };
		pool_each(a->pool, match_remote, &f);
		*id = f.id;
		b = f.found ? pool_block_get(a->pool, f.id) : NULL;
	} else if (a->tier && tier_extent_taken(a->tier, rb->off, s->block_bytes)) {
		struct find_nvme f = { .off = rb->off };
		pool_each(a->pool, match_nvme, &f);
		*id = f.id;
		b = f.found ? pool_block_get(a->pool, f.id) : NULL;
	}
	return b && b->committed && b->layer == layer && b->page == page &&
	       b->bytes >= s->block_bytes && b->seq_id != s->id;
}

/* Verifies one journaled block and adopts it into the pool (and tier). 0, or a negative errno
 * with why filled: the block is not adopted. */
static int adopt_block(struct adopt_ctx *a, struct seq *s, uint32_t layer, uint32_t page,
		       const struct rblock *rb, char *why, size_t whylen)
{
	unsigned cls;
	uint32_t id;
	int ret = pool_class(a->pool, s->block_bytes, &cls);
	if (ret)
		return errmsg(why, whylen, ret, "no slab class for %" PRIu64 "-byte blocks",
			      s->block_bytes);
	/* A block shared by several sequences is journaled for each: the first adopts it, the
	 * others take a reference (docs/design.md §4 "Prefix sharing"). */
	if (adopted_before(a, s, layer, page, rb, &id)) {
		struct pool_block *b = pool_block_get(a->pool, id);
		ret = seq_set_block(s, layer, page, id);
		if (ret)
			return errmsg(why, whylen, ret, "out of memory");
		b->refs++;
		return 0;
	}
	if (rb->where == BLK_DRAM) {
		if (!a->dram_ok)
			return errmsg(why, whylen, -ENOENT, "its DRAM copy did not survive (the pool "
				      "segment is new)");
		if (rb->off > pool_bytes(a->pool) || s->block_bytes > pool_bytes(a->pool) - rb->off)
			return errmsg(why, whylen, -ERANGE, "pool offset %" PRIu64 " outside the pool",
				      rb->off);
		uint32_t rows = rb->rows;
		uint32_t crc = persist_rows_crc((const uint8_t *)pool_base(a->pool) + rb->off, &s->geo,
						0, rows, 0);
		if (crc != rb->crc)
			return errmsg(why, whylen, -EBADMSG, "checksum mismatch at pool offset %" PRIu64
				      " (crc32c %08x, journaled %08x over %u rows)", rb->off, crc,
				      rb->crc, rows);
		ret = pool_block_adopt_dram(a->pool, cls, rb->slab_base, rb->off, &id);
		if (ret)
			return errmsg(why, whylen, ret, "pool offset %" PRIu64 " cannot be taken again "
				      "(%s)", rb->off, strerror(-ret));
		struct pool_block *b = pool_block_get(a->pool, id);
		b->rows = rows;
		b->rows_crc = crc;
	} else if (rb->where == BLK_REMOTE || rb->where == BLK_PUBLISHED) {
		/* Checked when a RECALL brings it back (docs/design.md §8). */
		if (!a->ps->cfg->remote_tier || !a->ps->cfg->remote_url[0])
			return errmsg(why, whylen, -ENODEV, "it was on the remote tier, which is not "
				      "configured now (remote_url, remote_tier)");
		ret = pool_block_adopt_remote(a->pool, cls, rb->off, rb->crc, &id);
		if (ret)
			return errmsg(why, whylen, ret, "out of block descriptors");
		if (rb->where == BLK_PUBLISHED) {
			struct pool_block *pb = pool_block_get(a->pool, id);
			pb->remote_published = true;
			pb->has_crc = false;
		}
	} else {
		if (!a->tier)
			return errmsg(why, whylen, -ENODEV, "it was on an NVMe tier that is not "
				      "configured now");
		uint64_t need = (s->block_bytes + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
		if (need > a->bounce_bytes) {
			free(a->bounce);
			a->bounce = aligned_alloc(TIER_ALIGN, need);
			a->bounce_bytes = a->bounce ? need : 0;
			if (!a->bounce)
				return errmsg(why, whylen, -ENOMEM, "out of memory");
		}
		ret = tier_read_sync(a->tier, a->bounce, rb->off, (uint32_t)s->block_bytes, rb->crc);
		if (ret)
			return errmsg(why, whylen, ret, "NVMe extent %" PRIu64 ": %s", rb->off,
				      ret == -EBADMSG ? "checksum mismatch" : strerror(-ret));
		ret = tier_extent_adopt(a->tier, rb->off, s->block_bytes);
		if (ret)
			return errmsg(why, whylen, ret, "NVMe extent %" PRIu64 " cannot be taken again "
				      "(%s)", rb->off, strerror(-ret));
		ret = pool_block_adopt_nvme(a->pool, cls, rb->off, rb->crc, &id);
		if (ret) {
			tier_extent_free(a->tier, rb->off, s->block_bytes);
			return errmsg(why, whylen, ret, "out of block descriptors");
		}
	}
	struct pool_block *b = pool_block_get(a->pool, id);
	b->seq_id = s->id;
	b->layer = layer;
	b->page = page;
	b->refs = 1;
	ret = seq_set_block(s, layer, page, id);
	if (ret) {
		if (b->tier == POOL_TIER_NVME)
			tier_extent_free(a->tier, b->nvme_off, b->bytes);
		pool_block_free(a->pool, id);
		return errmsg(why, whylen, ret, "out of memory");
	}
	return 0;
}

static void unadopt_page(struct adopt_ctx *a, struct seq *s, uint32_t page)
{
	for (uint32_t l = 0; l < s->geo.n_layers; l++) {
		uint32_t id = seq_block(s, l, page);
		struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(a->pool, id);
		if (!b)
			continue;
		seq_set_block(s, l, page, SEQ_NO_BLOCK);
		if (b->refs > 1) { /* another sequence adopted it too: it keeps it */
			b->refs--;
			for (size_t i = 0; b->seq_id == s->id && i < a->ps->seqs->n; i++)
				if (a->ps->seqs->v[i] != s && seq_block(a->ps->seqs->v[i], l, page) == id)
					b->seq_id = a->ps->seqs->v[i]->id;
			continue;
		}
		if (b->tier == POOL_TIER_NVME)
			tier_extent_free(a->tier, b->nvme_off, b->bytes);
		pool_block_free(a->pool, id);
	}
}

/* Adopts the blocks of s's committed pages, page by page; the first page with a block that
 * fails ends it and cuts the committed length there. */
static void adopt_seq(struct adopt_ctx *a, struct seq *s, struct rseq *rs)
{
	struct persist *ps = a->ps;
	uint32_t p = s->geo.page_size;
	uint32_t pages = (uint32_t)((s->committed_tokens + p - 1) / p);
	for (uint32_t pg = 0; pg < pages; pg++) {
		for (uint32_t l = 0; l < s->geo.n_layers; l++) {
			const struct rblock *rb = pg < rs->cap ? &rs->b[(size_t)l * rs->cap + pg] : NULL;
			char why[256];
			int ret = rb && rb->where ? adopt_block(a, s, l, pg, rb, why, sizeof why)
						  : errmsg(why, sizeof why, -ENOENT, "no block was "
							   "journaled for it");
			if (!ret) {
				ps->st.adopted_blocks++;
				continue;
			}
			unadopt_page(a, s, pg);
			uint64_t cut = (uint64_t)pg * p;
			uint64_t lost = 0;
			for (uint32_t q = pg; q < pages; q++)
				for (uint32_t m = 0; m < s->geo.n_layers; m++)
					lost += q < rs->cap && rs->b[(size_t)m * rs->cap + q].where;
			log_error("sequence '%s' is damaged: block (layer %u, page %u) "
				"%s; it is never served: committed length cut from %" PRIu64 " to %"
				PRIu64 " tokens (%" PRIu64 " journaled blocks dropped; the token ids are "
				"kept, a resume runs them again)", s->name, l, pg, why,
				s->committed_tokens, cut, lost);
			ps->st.adopted_blocks -= l; /* the page's earlier layers went with it */
			if (!s->damaged_blocks)
				ps->st.damaged_seqs++;
			s->damaged_blocks += (uint32_t)(lost ? lost : 1);
			s->damaged_cut_from = s->committed_tokens;
			s->committed_tokens = cut;
			ps->st.damaged_blocks += lost ? lost : 1;
			return;
		}
	}
}

int persist_restore(struct persist *ps, struct seq_table *seqs, struct pool *pool,
		    struct tier *tier, char *err, size_t errlen)
{
	uint64_t t0 = clock_ms();
	struct journal_replay r;
	ps->seqs = seqs;
	int ret = journal_replay(ps->path, on_record, ps, &r, err, errlen);
	if (ret == -ENOENT) {
		log_info("journal %s: none yet, starting empty", ps->path);
		memset(&r, 0, sizeof r);
	} else if (ret == -EINVAL) {
		/* Not a journal: keep it aside rather than overwrite what may be someone's file. */
		char aside[PATH_MAX + 16];
		snprintf(aside, sizeof aside, "%s.damaged", ps->path);
		log_warn("%s; kept as %s, starting empty", err, aside);
		if (rename(ps->path, aside) < 0)
			return errmsg(err, errlen, -errno, "cannot move %s aside: %s", ps->path,
				      strerror(errno));
		memset(&r, 0, sizeof r);
	} else if (ret) {
		return ret;
	}
	ps->st.replayed = r.records;
	if (r.damaged) {
		char aside[PATH_MAX + 16];
		snprintf(aside, sizeof aside, "%s.damaged", ps->path);
		ps->st.ignored_bytes = r.file_bytes - r.zero_bytes - r.valid_bytes;
		unlink(aside);
		bool kept = link(ps->path, aside) == 0;
		log_error("journal %s is damaged: %s; the valid prefix (%" PRIu64
			" records, %" PRIu64 " bytes) is used, the last %" PRIu64 " bytes are ignored%s%s",
			ps->path, r.why, r.records, r.valid_bytes, ps->st.ignored_bytes,
			kept ? "; the damaged file is kept as " : "", kept ? aside : "");
	}
	struct adopt_ctx a = { .ps = ps, .pool = pool, .tier = tier,
			       .dram_ok = pool_adopted(pool) && (!ps->have_meta || ps->meta_ok) };
	if (pool_adopted(pool))
		log_info("adopted the pool segment %s left by a previous kvstored",
			ps->cfg->shm_name);
	else if (r.records)
		log_warn("the pool segment %s did not survive: blocks that were only "
			"in DRAM are lost", ps->cfg->shm_name);
	for (size_t i = 0; i < ps->n_rv; i++) {
		struct seq *s = seq_find(seqs, ps->rv[i].id);
		if (s)
			adopt_seq(&a, s, &ps->rv[i]);
		free(ps->rv[i].b);
	}
	free(a.bounce);
	free(ps->rv);
	ps->rv = NULL;
	ps->n_rv = ps->cap_rv = 0;
	ps->st.adopted_seqs = seqs->n;
	/* Every sequence comes back detached (seq_restore); pages past the committed length were
	 * never adopted, so a resume allocates them afresh. */
	ret = journal_open(ps->path, r.valid_bytes, &ps->j, err, errlen);
	if (ret)
		return ret;
	journal_preallocate(ps->j, ps->cfg->journal_preallocate);
	ret = compact(ps, seqs, pool);
	if (ret)
		return errmsg(err, errlen, ret, "cannot write the journal %s", ps->path);
	ps->st.replay_ms = clock_ms() - t0;
	if (r.records)
		log_msg(ps->st.damaged_seqs ? LOG_WARN : LOG_INFO, "journal %s: %" PRIu64
			" records replayed; %" PRIu64
			" sequences and %" PRIu64 " blocks adopted (checksums verified), %" PRIu64
			" damaged, in %" PRIu64 " ms; every sequence is detached", ps->path,
			r.records, ps->st.adopted_seqs, ps->st.adopted_blocks, ps->st.damaged_seqs,
			ps->st.replay_ms);
	return 0;
}
