/* hostkv — see hostkv.h. The block logic every store shares:
 *
 * - A sequence's block table maps (layer, page) to a pool offset, the lease that keeps the
 *   block where it is, an LRU stamp and a pin count. Blocks are allocated ahead, HOSTKV_AHEAD
 *   pages at a time for every layer in one ring batch, so the per-token path does no ring
 *   traffic while it stays inside allocated pages. An offset is only used while its block is
 *   leased: kvstored moves unleased committed blocks (demotion to NVMe, swaps).
 * - Leases (docs/design.md §4). Every block at or past the tail page (page committed / p: written by
 *   write-through, or allocated ahead) is leased from allocation until it is full and
 *   committed. Without a budget every other block stays leased too (lease-all: no per-step
 *   ring traffic except COMMIT). With a budget of B, the leased blocks that are full,
 *   committed and unpinned ("evictable") are at most B after every call: a pin of a block
 *   that is not leased RECALLs it (kvstored promotes it from NVMe first when it was demoted;
 *   hostkv_pin_many RECALLs all the missing blocks of its pages in one run of the ring, so a
 *   reader that pins what it is about to read pays one round trip, not one a block), and
 *   when the evictable count passes B the least recently used are RELEASEd in one batch
 *   down to B - B/4. A pinned block is never released, so its pointer stays valid until unpin.
 * - hostkv_commit COMMITs the blocks of pages the committed length reached for the first time
 *   (ring), and sends token ids the store does not keep yet (control request). Ids already
 *   kept cost nothing, so a caller may keep a sampled id ahead and commit it again later; a
 *   length alone rides on the next request (or close), see hostkv_commit.
 * - A heartbeat thread keeps the worker alive when no control request went out for a while.
 *
 * Locks: h->mu serialises every store op (the kvs handle is single-threaded and the heartbeat
 * thread shares it); s->mu guards the block table (offsets, leases, pins, stamps, n_alloc,
 * full, the counters), which the recall thread's pins change while the compute thread appends
 * and commits. s->mu is never held across a store op: a RECALL may wait for NVMe, and the
 * other thread's pins of leased blocks must not wait behind it. Two threads may lease the same
 * block at once; the second lease is released at once. */
#include "clock.h"
#include "hostkv.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "errmsg.h"
#include "hostkv_impl.h"
#include "hostkv_table.h"

#define HOSTKV_AHEAD 16u		/* pages per layer allocated at once */
#define HOSTKV_ALLOC_MAX 64u		/* pages per ALLOC entry (ring.h) */
#define HOSTKV_RECALL_MAX 32u		/* pages per RECALL entry */
#define HOSTKV_RELEASE_MAX 64u		/* leases per RELEASE entry */
#define HOSTKV_MAX_PAGES (1u << 24)	/* per layer, as kvstored allows */

/* Store ops are called with h->mu held; each marks the time for the heartbeat thread. */
void hk_lock_store(struct hostkv *h)
{
	pthread_mutex_lock(&h->mu);
}

void hk_unlock_store(struct hostkv *h, bool control)
{
	if (control)
		h->last_call_ms = clock_ms();
	pthread_mutex_unlock(&h->mu);
}

/* ---------------------------------------------------------------- heartbeat */

static void *hb_main(void *arg)
{
	struct hostkv *h = arg;
	char err[256];
	pthread_mutex_lock(&h->mu);
	while (!h->hb_stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)h->hb_ms * 1000000u / 3;
		ts.tv_sec += (time_t)(ns / 1000000000u);
		ts.tv_nsec = (long)(ns % 1000000000u);
		pthread_cond_timedwait(&h->hb_cond, &h->mu, &ts);
		if (h->hb_stop)
			break;
		if (clock_ms() - h->last_call_ms < h->hb_ms / 3)
			continue;
		h->hb_err = h->ops->heartbeat(h->st, NULL, err, sizeof err);
		h->last_call_ms = clock_ms();
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* ---------------------------------------------------------------- store handle */

int hostkv_open(const struct hostkv_opts *o, struct hostkv **out, char *err, size_t errlen)
{
	struct hostkv *h = calloc(1, sizeof *h);
	if (!h)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	if (o->lease_budget > HOSTKV_MAX_BUDGET) {
		free(h);
		return errmsg(err, errlen, -EINVAL, "lease budget %u above the largest, %u blocks",
			      o->lease_budget, HOSTKV_MAX_BUDGET);
	}
	h->remote = o->endpoint && o->endpoint[0];
	h->lease_budget = o->lease_budget;
	int ret = h->remote
		? hostkv_remote_open(o, &h->ops, &h->st, &h->base, &h->bytes, err, errlen)
		: hostkv_embedded_open(o, &h->ops, &h->st, &h->base, &h->bytes, err, errlen);
	if (ret) {
		free(h);
		return ret;
	}
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->hb_cond, NULL);
	pthread_rwlock_init(&h->life, NULL);
	h->retry_ms = o->retry_s > 0 ? (uint32_t)o->retry_s * 1000u : 0;
	h->came_back = -1;
	h->last_call_ms = clock_ms();
	h->hb_ms = h->ops->heartbeat_ms ? h->ops->heartbeat_ms(h->st) : 0;
	if (h->hb_ms && h->ops->heartbeat) {
		ret = pthread_create(&h->hb, NULL, hb_main, h);
		if (ret) {
			hostkv_close(h);
			return errmsg(err, errlen, -ret, "cannot start the heartbeat thread: %s",
				      strerror(ret));
		}
		h->hb_running = true;
	}
	*out = h;
	return 0;
}

void hostkv_close(struct hostkv *h)
{
	if (!h)
		return;
	while (h->seqs)
		hostkv_seq_close(h->seqs, false);
	if (h->hb_running) {
		pthread_mutex_lock(&h->mu);
		h->hb_stop = true;
		pthread_cond_signal(&h->hb_cond);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->hb, NULL);
	}
	if (h->reg_be)
		h->reg_be->ops->host_unregister(h->reg_be->ctx, h->base);
	h->ops->close(h->st);
	pthread_cond_destroy(&h->hb_cond);
	pthread_mutex_destroy(&h->mu);
	pthread_rwlock_destroy(&h->life);
	free(h);
}

bool hostkv_is_remote(const struct hostkv *h)
{
	return h->remote;
}

static bool gone_locked(const struct hostkv *h)
{
	return h->ops->gone && h->ops->gone(h->st);
}

bool hostkv_store_gone(const struct hostkv *h)
{
	if (!h)
		return false;
	pthread_rwlock_rdlock((pthread_rwlock_t *)&h->life);
	bool gone = gone_locked(h);
	pthread_rwlock_unlock((pthread_rwlock_t *)&h->life);
	return gone;
}

/* Runs a public op: under `life` for reading; when it failed because the store went away and
 * the store comes back (hk_reconnect), runs it again. */
#define WITH_RECONNECT(h, err, errlen, ret, call)					\
	do {										\
		for (;;) {								\
			pthread_rwlock_rdlock(&(h)->life);				\
			uint64_t gen_ = (h)->gen;					\
			(ret) = (call);							\
			bool gone_ = (ret) && gone_locked(h);				\
			pthread_rwlock_unlock(&(h)->life);				\
			if (!gone_ || hk_reconnect((h), gen_, (err), (errlen)))		\
				break;							\
		}									\
	} while (0)

int hostkv_seq_register(struct hostkv_seq *s, struct backend *be, char *err, size_t errlen)
{
	struct hostkv *h = s->h;
	if (!be->ops->host_register)
		return 0;
	pthread_mutex_lock(&h->mu);
	int ret = 0;
	if (h->reg_be && h->reg_be != be)
		ret = errmsg(err, errlen, -EBUSY, "the pool mapping is registered with another "
			     "backend");
	else if (!h->reg_be && !(ret = be->ops->host_register(be->ctx, h->base, h->bytes, err,
								errlen)))
		h->reg_be = be;
	pthread_mutex_unlock(&h->mu);
	return ret;
}

/* ---------------------------------------------------------------- ring batches */

/* Runs n entries in batches; every completion must carry status 0. An entry of a batch that
 * never ran keeps status -ECANCELED. */
static int run_ring(struct hostkv *h, struct ring_entry *e, size_t n, char *err, size_t errlen)
{
	static const char *const op_names[] = { "INVALID", "ALLOC", "COMMIT", "RECALL", "RELEASE" };
	int ret = 0;
	for (size_t i = 0; i < n; i++)
		e[i].status = -ECANCELED;
	hk_lock_store(h);
	for (size_t i = 0; i < n && !ret; i += HOSTKV_RING_BATCH) {
		unsigned m = n - i < HOSTKV_RING_BATCH ? (unsigned)(n - i) : HOSTKV_RING_BATCH;
		ret = h->ops->ring(h->st, e + i, m, err, errlen);
		for (unsigned j = 0; j < m && !ret; j++) {
			const struct ring_entry *x = &e[i + j];
			if (!x->status)
				continue;
			/* A full pool: say what fills it and what would make room (the store knows). */
			char why[512] = "";
			if (x->status == -ENOSPC && h->ops->explain_full)
				h->ops->explain_full(h->st, why, sizeof why);
			else if (x->status == -ENOSPC)
				snprintf(why, sizeof why, " (the store's DRAM pool is full%s)",
					 h->lease_budget ? "" : "; --lease-budget N lets it move blocks "
					 "of open sequences to NVMe");
			ret = errmsg(err, errlen, x->status, "%s %s (layer %u, page %u): %s%s",
				     h->ops->name, op_names[x->op <= RING_OP_MAX ? x->op : 0], x->layer,
				     x->first_page, strerror(-x->status), why);
		}
	}
	hk_unlock_store(h, false);
	return ret;
}

/* RELEASEs leases ids[0..n). */
static int release_leases(struct hostkv *h, const uint64_t *ids, size_t n, char *err,
			  size_t errlen)
{
	if (!n)
		return 0;
	size_t ne = (n + HOSTKV_RELEASE_MAX - 1) / HOSTKV_RELEASE_MAX;
	struct ring_entry *e = calloc(ne, sizeof *e);
	if (!e)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		struct ring_entry *x = &e[i / HOSTKV_RELEASE_MAX];
		x->op = RING_OP_RELEASE;
		x->payload[x->n_payload++] = ids[i];
		x->count = x->n_payload;
	}
	int ret = run_ring(h, e, ne, err, errlen);
	free(e);
	return ret;
}

static bool off_ok(const struct hostkv_seq *s, uint64_t off)
{
	return off < s->h->bytes && s->h->bytes - off >= s->block_bytes;
}

/* ---------------------------------------------------------------- block table */

struct hk_block *hk_blk(struct hostkv_seq *s, int layer, uint32_t page)
{
	return &s->blk[(size_t)layer * s->cap + page];
}

/* Whether the budget counts b (s->mu held): leased, unpinned, full and committed. */
static bool evictable(const struct hostkv_seq *s, uint32_t page, const struct hk_block *b)
{
	return b->lease && !b->pins && page < s->full;
}

static int grow_table(struct hostkv_seq *s, uint32_t pages)
{
	if (pages <= s->cap)
		return 0;
	uint32_t cap = s->cap ? s->cap : 16;
	while (cap < pages)
		cap *= 2;
	struct hk_block *b = calloc((size_t)s->n_layers * cap, sizeof *b);
	if (!b)
		return -ENOMEM;
	pthread_mutex_lock(&s->mu);
	for (int l = 0; l < s->n_layers; l++)
		if (s->cap)
			memcpy(b + (size_t)l * cap, s->blk + (size_t)l * s->cap,
			       s->cap * sizeof *b);
	struct hk_block *old = s->blk;
	s->blk = b;
	s->cap = cap;
	pthread_mutex_unlock(&s->mu);
	free(old);
	return 0;
}

/* RECALLs (all heads) the blocks lp[0..n) — (layer, page) pairs, each layer's pages adjacent —
 * in one run of the ring, up to HOSTKV_RECALL_MAX pages of one layer per entry, and records
 * their offsets and leases; on_demand counts them as recalls. A block another thread leased
 * meanwhile keeps that lease, and the second one is released. */
static int recall_blocks(struct hostkv_seq *s, const uint32_t *lp, size_t n, bool on_demand,
			 char *err, size_t errlen)
{
	if (!n)
		return 0;
	struct ring_entry *e = calloc(n, sizeof *e);
	uint64_t *stray = calloc(n, sizeof *stray);
	uint32_t *cnt = calloc(n, sizeof *cnt); /* pages of each entry, as sent */
	if (!e || !stray || !cnt) {
		free(e);
		free(stray);
		free(cnt);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const uint32_t l = lp[2 * i], p = lp[2 * i + 1];
		struct ring_entry *x = &e[k];
		if (x->count && (x->count == HOSTKV_RECALL_MAX || x->layer != l))
			x = &e[++k];
		if (!x->count)
			*x = (struct ring_entry){ .op = RING_OP_RECALL, .seq_id = s->id, .layer = l,
						  .first_page = p };
		x->payload[x->n_payload++] = p;
		x->payload[x->n_payload++] = s->all_heads;
		cnt[k] = ++x->count;
	}
	const size_t ne = k + 1;
	if (on_demand) {
		pthread_mutex_lock(&s->mu);
		s->n_recall_ops += ne;
		pthread_mutex_unlock(&s->mu);
	}
	int ret = run_ring(s->h, e, ne, err, errlen);
	/* Record what was leased even on a partial failure, so close releases it. */
	size_t n_stray = 0, at = 0;
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < ne; at += cnt[i], i++) {
		if (!e[i].status && e[i].n_payload != 2 * cnt[i] && !ret)
			ret = errmsg(err, errlen, -EPROTO, "store answered a RECALL of %u pages with "
				     "%u values", cnt[i], e[i].n_payload);
		if (e[i].status || e[i].n_payload != 2 * cnt[i])
			continue;
		for (uint32_t j = 0; j < cnt[i]; j++) {
			const uint32_t l = lp[2 * (at + j)], p = lp[2 * (at + j) + 1];
			uint64_t off = e[i].payload[2 * j], lid = e[i].payload[2 * j + 1];
			struct hk_block *b = hk_blk(s, (int)l, p);
			if (!off_ok(s, off)) {
				if (!ret)
					ret = errmsg(err, errlen, -EPROTO, "store gave an offset "
						     "outside the pool");
				stray[n_stray++] = lid;
				continue;
			}
			if (b->lease) {
				stray[n_stray++] = lid;
				continue;
			}
			b->off = off;
			b->lease = lid;
			b->used = ++s->clock;
			s->n_held++;
			s->n_evictable += evictable(s, p, b);
			s->n_recalls += on_demand;
		}
	}
	pthread_mutex_unlock(&s->mu);
	char e2[256];
	int r2 = release_leases(s->h, stray, n_stray, e2, sizeof e2);
	if (r2 && !ret)
		ret = errmsg(err, errlen, r2, "%s", e2);
	free(cnt);
	free(stray);
	free(e);
	return ret;
}

/* Leases the allocated blocks of pages [p0, p1) of layers [l0, l1) that hold no lease. */
int hk_lease_missing(struct hostkv_seq *s, int l0, int l1, uint32_t p0, uint32_t p1,
			 char *err, size_t errlen)
{
	pthread_mutex_lock(&s->mu);
	size_t n = 0;
	for (int l = l0; l < l1; l++)
		for (uint32_t p = p0; p < p1 && p < s->n_alloc[l]; p++)
			n += !hk_blk(s, l, p)->lease;
	uint32_t *lp = n ? malloc(2 * n * sizeof *lp) : NULL;
	if (!lp) {
		pthread_mutex_unlock(&s->mu);
		return n ? errmsg(err, errlen, -ENOMEM, "out of memory") : 0;
	}
	size_t k = 0;
	for (int l = l0; l < l1; l++)
		for (uint32_t p = p0; p < p1 && p < s->n_alloc[l]; p++)
			if (!hk_blk(s, l, p)->lease) {
				lp[k++] = (uint32_t)l;
				lp[k++] = p;
			}
	pthread_mutex_unlock(&s->mu);
	int ret = recall_blocks(s, lp, n, false, err, errlen);
	free(lp);
	return ret;
}

static int cmp_used(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Over the budget: RELEASEs the least recently used evictable blocks, down to B - B/4. */
static int enforce_budget(struct hostkv_seq *s, char *err, size_t errlen)
{
	pthread_mutex_lock(&s->mu);
	if (!s->budget || s->n_evictable <= s->budget) {
		pthread_mutex_unlock(&s->mu);
		return 0;
	}
	size_t want = s->n_evictable - (s->budget - s->budget / 4);
	/* (used, layer, page) of every evictable block */
	uint64_t *c = malloc(s->n_evictable * 3 * sizeof *c);
	if (!c) {
		pthread_mutex_unlock(&s->mu);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	size_t n = 0;
	for (int l = 0; l < s->n_layers; l++)
		for (uint32_t p = 0; p < s->full && p < s->n_alloc[l]; p++) {
			const struct hk_block *b = hk_blk(s, l, p);
			if (evictable(s, p, b) && n < s->n_evictable) {
				c[3 * n] = b->used;
				c[3 * n + 1] = (uint64_t)l;
				c[3 * n + 2] = p;
				n++;
			}
		}
	assert(n == s->n_evictable);
	qsort(c, n, 3 * sizeof *c, cmp_used);
	if (want > n)
		want = n;
	for (size_t i = 0; i < want; i++) {
		struct hk_block *b = hk_blk(s, (int)c[3 * i + 1], (uint32_t)c[3 * i + 2]);
		c[i] = b->lease;	/* c[0..i) is past every entry still read */
		b->lease = 0;
	}
	s->n_evictable -= want;
	s->n_held -= want;
	s->n_releases += want;
	pthread_mutex_unlock(&s->mu);
	/* Forgotten here before the RELEASE runs: if it fails part way, the store still holds
	 * the rest until the sequence is closed (close and Goodbye drop a worker's leases). */
	int ret = release_leases(s->h, c, want, err, errlen);
	free(c);
	return ret;
}

/* Allocates pages [n_alloc[l], upto) of every layer, then leases them. */
int hk_alloc_pages(struct hostkv_seq *s, uint32_t upto, char *err, size_t errlen)
{
	int ret = grow_table(s, upto);
	if (ret)
		return errmsg(err, errlen, ret, "out of memory");
	uint32_t lo = upto;
	size_t n = 0;
	for (int l = 0; l < s->n_layers; l++) {
		if (s->n_alloc[l] < lo)
			lo = s->n_alloc[l];
		if (s->n_alloc[l] < upto)
			n += (upto - s->n_alloc[l] + HOSTKV_ALLOC_MAX - 1) / HOSTKV_ALLOC_MAX;
	}
	if (n) {
		struct ring_entry *e = calloc(n, sizeof *e);
		if (!e)
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		size_t k = 0;
		for (int l = 0; l < s->n_layers; l++)
			for (uint32_t p = s->n_alloc[l]; p < upto; p += HOSTKV_ALLOC_MAX)
				e[k++] = (struct ring_entry){
					.op = RING_OP_ALLOC, .seq_id = s->id, .layer = (uint32_t)l,
					.first_page = p,
					.count = upto - p < HOSTKV_ALLOC_MAX ? upto - p : HOSTKV_ALLOC_MAX,
				};
		ret = run_ring(s->h, e, n, err, errlen);
		/* Entries that succeeded hold blocks: advance over them (in order per layer) so a
		 * retry does not ask for them again. */
		pthread_mutex_lock(&s->mu);
		for (size_t i = 0; i < n; i++) {
			uint32_t l = e[i].layer;
			if (e[i].status || e[i].n_payload != e[i].count ||
			    e[i].first_page != s->n_alloc[l])
				continue;
			for (uint32_t j = 0; j < e[i].count; j++)
				hk_blk(s, (int)l, e[i].first_page + j)->off = e[i].payload[j];
			s->n_alloc[l] += e[i].count;
		}
		pthread_mutex_unlock(&s->mu);
		free(e);
		if (ret)
			return ret;
	}
	return hk_lease_missing(s, 0, s->n_layers, lo, upto, err, errlen);
}

/* ---------------------------------------------------------------- sequences */

static int geom_dtype(enum fkv_dtype t)
{
	switch (t) {
	case FKV_F32: return 1;
	case FKV_F16: return 2;
	case FKV_BF16: return 3;
	}
	return 0;
}

static void seq_free(struct hostkv_seq *s)
{
	pthread_mutex_destroy(&s->mu);
	free(s->blk);
	free(s->n_alloc);
	free(s->ids);
	free(s);
}

int hk_keep_ids(struct hostkv_seq *s, const int32_t *ids, size_t first, size_t n)
{
	if (first + n > s->cap_ids) {
		size_t cap = s->cap_ids ? s->cap_ids : 256;
		while (cap < first + n)
			cap *= 2;
		int32_t *v = realloc(s->ids, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		s->ids = v;
		s->cap_ids = cap;
	}
	memcpy(s->ids + first, ids, n * sizeof *ids);
	if (first + n > s->n_ids)
		s->n_ids = first + n;
	return 0;
}

static int seq_open(struct hostkv *h, const char *name, const uint8_t *fingerprint,
		    int n_layers, const struct kv_geom *g, bool create,
		    const struct hostkv_prefix *px, struct hostkv_seq **out, char *err,
		    size_t errlen);

int hostkv_seq_open(struct hostkv *h, const char *name, const uint8_t *fingerprint,
		    int n_layers, const struct kv_geom *g, bool create, struct hostkv_seq **out,
		    char *err, size_t errlen)
{
	return seq_open(h, name, fingerprint, n_layers, g, create, NULL, out, err, errlen);
}

int hostkv_seq_open_prefix(struct hostkv *h, const char *name, const uint8_t *fingerprint,
			   int n_layers, const struct kv_geom *g, const struct hostkv_prefix *px,
			   struct hostkv_seq **out, char *err, size_t errlen)
{
	return seq_open(h, name, fingerprint, n_layers, g, true, px, out, err, errlen);
}

static int seq_open(struct hostkv *h, const char *name, const uint8_t *fingerprint,
		    int n_layers, const struct kv_geom *g, bool create,
		    const struct hostkv_prefix *px, struct hostkv_seq **out, char *err,
		    size_t errlen)
{
	if (!name || !name[0] || strlen(name) >= sizeof ((struct hostkv_seq *)0)->name)
		return errmsg(err, errlen, -EINVAL, "sequence name must have 1 to %zu bytes",
			      sizeof ((struct hostkv_seq *)0)->name - 1);
	if (n_layers <= 0 || g->n_kv <= 0 || g->n_kv > 64 || g->p <= 0 || g->d <= 0 ||
	    !geom_dtype(g->dtype))
		return errmsg(err, errlen, -EINVAL, "bad KV geometry (%d layers, %d heads, page %d, "
			      "head dim %d)", n_layers, g->n_kv, g->p, g->d);
	struct hostkv_seq *s = calloc(1, sizeof *s);
	if (!s)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	pthread_mutex_init(&s->mu, NULL);
	s->h = h;
	snprintf(s->name, sizeof s->name, "%s", name);
	s->n_layers = n_layers;
	s->g = *g;
	s->block_bytes = layout_block_bytes(g);
	s->all_heads = g->n_kv == 64 ? UINT64_MAX : (1ull << g->n_kv) - 1;
	s->budget = h->lease_budget;
	s->n_alloc = calloc((size_t)n_layers, sizeof *s->n_alloc);
	if (!s->n_alloc) {
		seq_free(s);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	struct kvs_geometry kg = { (uint32_t)n_layers, (uint32_t)g->n_kv, (uint32_t)g->d,
				   (uint32_t)g->p, (uint32_t)geom_dtype(g->dtype) };
	s->kg = kg;
	memcpy(s->fp, fingerprint, sizeof s->fp);
	uint64_t committed = 0;
	uint32_t *ids = NULL;
	size_t n_ids = 0;
	hk_lock_store(h);
	int ret = h->ops->open_seq(h->st, name, fingerprint, FKV_FINGERPRINT_BYTES, &kg, create,
				   px, &s->id, err, errlen);
	if (!ret)
		ret = h->ops->attach(h->st, s->id, &committed, &ids, &n_ids, err, errlen);
	hk_unlock_store(h, true);
	if (ret) {
		seq_free(s);
		return ret;
	}
	s->committed = (int64_t)committed;
	if (n_ids && hk_keep_ids(s, (const int32_t *)ids, 0, n_ids))
		ret = errmsg(err, errlen, -ENOMEM, "out of memory");
	free(ids);
	uint32_t pages = (uint32_t)((committed + (uint64_t)g->p - 1) / (uint64_t)g->p);
	if (!ret && n_ids < committed)
		ret = errmsg(err, errlen, -EPROTO, "sequence '%s' keeps %zu token ids for %" PRIu64
			     " committed tokens", name, n_ids, committed);
	if (!ret)
		ret = grow_table(s, pages) ? errmsg(err, errlen, -ENOMEM, "out of memory") : 0;
	if (!ret) {
		/* The store holds every page of the committed length; with a budget only the tail
		 * page is leased now, the others when they are pinned. */
		for (int l = 0; l < n_layers; l++)
			s->n_alloc[l] = pages;
		s->full = (uint32_t)(committed / (uint64_t)g->p);
		ret = hk_lease_missing(s, 0, n_layers, s->budget ? s->full : 0, pages, err, errlen);
	}
	s->n_commit_pages = pages;
	hk_lock_store(h);
	s->next = h->seqs;
	h->seqs = s;
	hk_unlock_store(h, false);
	if (!ret)
		ret = enforce_budget(s, err, errlen);
	if (ret) {
		hostkv_seq_close(s, false);
		return ret;
	}
	*out = s;
	return 0;
}

int64_t hostkv_seq_committed(const struct hostkv_seq *s)
{
	return s->committed;
}

int64_t hostkv_seq_tokens(const struct hostkv_seq *s, const int32_t **ids)
{
	*ids = s->ids;
	return (int64_t)s->n_ids;
}

static int block_once(struct hostkv_seq *s, int layer, int page, void **block, char *err,
		      size_t errlen)
{
	if (layer < 0 || layer >= s->n_layers || page < 0 || (uint32_t)page >= HOSTKV_MAX_PAGES)
		return errmsg(err, errlen, -EINVAL, "no block (layer %d, page %d) in a %d-layer "
			      "sequence", layer, page, s->n_layers);
	if (s->budget && (uint32_t)page < s->full)
		return errmsg(err, errlen, -EBUSY, "sequence '%s': page %d is full and committed; "
			      "with a lease budget it is read through a pin", s->name, page);
	if ((uint32_t)page >= s->n_alloc[layer]) {
		uint32_t upto = (uint32_t)page + 1;
		if (upto < s->n_alloc[layer] + HOSTKV_AHEAD)
			upto = s->n_alloc[layer] + HOSTKV_AHEAD;
		if (upto > HOSTKV_MAX_PAGES)
			upto = HOSTKV_MAX_PAGES;
		int ret = hk_alloc_pages(s, upto, err, errlen);
		if (ret)
			return ret;
	}
	/* Leased since allocation unless that lease failed: lease it now. */
	int ret = hk_lease_missing(s, layer, layer + 1, (uint32_t)page, (uint32_t)page + 1, err,
				errlen);
	if (ret)
		return ret;
	pthread_mutex_lock(&s->mu);
	struct hk_block *b = hk_blk(s, layer, (uint32_t)page);
	const bool leased = b->lease != 0;
	if (leased) {
		b->used = ++s->clock;
		*block = s->h->base + b->off;
	}
	pthread_mutex_unlock(&s->mu);
	if (!leased)
		return errmsg(err, errlen, -EIO, "sequence '%s': block (layer %d, page %d) is not "
			      "leased", s->name, layer, page);
	return 0;
}

int hostkv_block(struct hostkv_seq *s, int layer, int page, void **block, char *err,
		 size_t errlen)
{
	int ret;
	WITH_RECONNECT(s->h, err, errlen, ret, block_once(s, layer, page, block, err, errlen));
	return ret;
}

/* Adds one pin of (layer, page) (s->mu held): the block leaves the budget's count. */
static void pin_locked(struct hostkv_seq *s, int layer, uint32_t page)
{
	struct hk_block *b = hk_blk(s, layer, page);
	s->n_evictable -= evictable(s, page, b);
	b->pins++;
}

/* Drops one pin of (layer, page) (s->mu held); false when it had none. */
static bool unpin_locked(struct hostkv_seq *s, int layer, uint32_t page)
{
	struct hk_block *b = hk_blk(s, layer, page);
	if (!b->pins)
		return false;
	b->pins--;
	s->n_evictable += evictable(s, page, b);
	return true;
}

static int cmp_u32(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return *x < *y ? -1 : *x > *y;
}

static int pin_many_once(struct hostkv_seq *s, int layer, const int *pages, int n,
			 const void **blocks, char *err, size_t errlen)
{
	if (layer < 0 || layer >= s->n_layers || n < 0 || (n && (!pages || !blocks)))
		return errmsg(err, errlen, -EINVAL, "no blocks (layer %d, %d pages)", layer, n);
	pthread_mutex_lock(&s->mu);
	for (int i = 0; i < n; i++)
		if (pages[i] < 0 || (uint32_t)pages[i] >= s->n_alloc[layer]) {
			pthread_mutex_unlock(&s->mu);
			return errmsg(err, errlen, pages[i] < 0 ? -EINVAL : -ENOENT, "sequence '%s' "
				      "has no block (layer %d, page %d)", s->name, layer, pages[i]);
		}
	/* Pinned first: nothing releases them while the missing ones are RECALLed. */
	size_t n_miss = 0;
	for (int i = 0; i < n; i++) {
		pin_locked(s, layer, (uint32_t)pages[i]);
		struct hk_block *b = hk_blk(s, layer, (uint32_t)pages[i]);
		b->used = ++s->clock;
		n_miss += !b->lease;
	}
	/* (layer, page) of each distinct page missing a lease: the front half sorts the pages. */
	uint32_t *lp = n_miss ? malloc(2 * n_miss * sizeof *lp) : NULL;
	int ret = n_miss && !lp ? errmsg(err, errlen, -ENOMEM, "out of memory") : 0;
	size_t m = 0;
	if (lp) {
		for (int i = 0; i < n; i++)
			if (!hk_blk(s, layer, (uint32_t)pages[i])->lease)
				lp[m++] = (uint32_t)pages[i];
		qsort(lp, m, sizeof *lp, cmp_u32);
		size_t u = 0;
		for (size_t i = 0; i < m; i++)
			if (!u || lp[u - 1] != lp[i])
				lp[u++] = lp[i];
		for (m = u; u--;) {
			lp[2 * u + 1] = lp[u];
			lp[2 * u] = (uint32_t)layer;
		}
	}
	pthread_mutex_unlock(&s->mu);
	if (!ret)
		ret = recall_blocks(s, lp, m, true, err, errlen);
	free(lp);
	pthread_mutex_lock(&s->mu);
	for (int i = 0; i < n && !ret; i++) {
		const struct hk_block *b = hk_blk(s, layer, (uint32_t)pages[i]);
		if (b->lease)
			blocks[i] = s->h->base + b->off;
		else
			ret = errmsg(err, errlen, -EIO, "sequence '%s': block (layer %d, page %d) "
				     "was not leased", s->name, layer, pages[i]);
	}
	for (int i = 0; i < n && ret; i++)
		unpin_locked(s, layer, (uint32_t)pages[i]);
	pthread_mutex_unlock(&s->mu);
	if (!m)
		return ret;
	/* The recalled blocks (or, after a failure, the unpinned ones) may have pushed others
	 * past the budget; the first failure is the one reported. */
	char e2[256];
	int r2 = enforce_budget(s, e2, sizeof e2);
	if (r2 && !ret) {
		ret = errmsg(err, errlen, r2, "%s", e2);
		pthread_mutex_lock(&s->mu);
		for (int i = 0; i < n; i++)
			unpin_locked(s, layer, (uint32_t)pages[i]);
		pthread_mutex_unlock(&s->mu);
	}
	return ret;
}

int hostkv_pin_many(struct hostkv_seq *s, int layer, const int *pages, int n,
		    const void **blocks, char *err, size_t errlen)
{
	int ret;
	WITH_RECONNECT(s->h, err, errlen, ret, pin_many_once(s, layer, pages, n, blocks, err, errlen));
	return ret;
}

int hostkv_block_ro_pin(struct hostkv_seq *s, int layer, int page, const void **block,
			char *err, size_t errlen)
{
	return hostkv_pin_many(s, layer, &page, 1, block, err, errlen);
}

int hostkv_unpin_many(struct hostkv_seq *s, int layer, const int *pages, int n, char *err,
		      size_t errlen)
{
	if (layer < 0 || layer >= s->n_layers || n < 0 || (n && !pages))
		return errmsg(err, errlen, -EINVAL, "no blocks (layer %d, %d pages)", layer, n);
	pthread_mutex_lock(&s->mu);
	int i = 0;
	while (i < n && pages[i] >= 0 && (uint32_t)pages[i] < s->n_alloc[layer] &&
	       unpin_locked(s, layer, (uint32_t)pages[i]))
		i++;
	if (i < n) {
		const int bad = pages[i];
		while (i--)
			pin_locked(s, layer, (uint32_t)pages[i]);
		pthread_mutex_unlock(&s->mu);
		return errmsg(err, errlen, -EINVAL, "sequence '%s': block (layer %d, page %d) is "
			      "not pinned", s->name, layer, bad);
	}
	pthread_mutex_unlock(&s->mu);
	int ret;
	WITH_RECONNECT(s->h, err, errlen, ret, enforce_budget(s, err, errlen));
	return ret;
}

int hostkv_unpin(struct hostkv_seq *s, int layer, int page, char *err, size_t errlen)
{
	return hostkv_unpin_many(s, layer, &page, 1, err, errlen);
}

void hostkv_seq_lease_stats(struct hostkv_seq *s, struct hostkv_lease_stats *st)
{
	*st = (struct hostkv_lease_stats){ .budget = s->budget };
	pthread_mutex_lock(&s->mu);
	for (int l = 0; l < s->n_layers; l++)
		for (uint32_t p = 0; p < s->n_alloc[l]; p++) {
			const struct hk_block *b = hk_blk(s, l, p);
			st->held += b->lease != 0;
			st->pinned += b->pins != 0;
			st->evictable += evictable(s, p, b);
		}
	st->recalls = s->n_recalls;
	st->recall_ops = s->n_recall_ops;
	st->releases = s->n_releases;
	assert(st->held == s->n_held && st->evictable == s->n_evictable);
	pthread_mutex_unlock(&s->mu);
}

/* COMMITs the blocks of pages [n_commit_pages, pages) of every layer, moving the committed
 * length to `committed` with the last entry (the earlier ones carry the old length). Those
 * pages are at or past the tail page, so they are leased. */
int hk_commit_blocks(struct hostkv_seq *s, uint32_t pages, int64_t committed, char *err,
			 size_t errlen)
{
	size_t nb = (size_t)(pages - s->n_commit_pages) * (size_t)s->n_layers;
	size_t n = nb ? (nb + RING_PAYLOAD_MAX - 1) / RING_PAYLOAD_MAX : 1;
	struct ring_entry *e = calloc(n, sizeof *e);
	if (!e)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		e[i] = (struct ring_entry){ .op = RING_OP_COMMIT, .seq_id = s->id,
					    .committed_tokens = (uint64_t)(i + 1 == n ? committed
										       : s->committed) };
	size_t k = 0;
	pthread_mutex_lock(&s->mu);
	for (uint32_t p = s->n_commit_pages; p < pages; p++)
		for (int l = 0; l < s->n_layers; l++, k++) {
			struct ring_entry *x = &e[k / RING_PAYLOAD_MAX];
			x->payload[x->n_payload++] = hk_blk(s, l, p)->off;
			x->count = x->n_payload;
		}
	pthread_mutex_unlock(&s->mu);
	int ret = run_ring(s->h, e, n, err, errlen);
	free(e);
	if (!ret)
		s->n_commit_pages = pages;
	return ret;
}

/* One sequence's commit, in the three parts commit_many_once runs for each (hostkv_commit is a
 * batch of one): the checks and the blocks of pages that filled (commit_prepare), the token
 * ids' request (commit_send_ids, for the batch), then the sequence's state (commit_finish). */
struct commit_job {
	struct hostkv_seq *s;
	int64_t committed, first, n;
	const int32_t *ids;
	int64_t same, fresh; /* ids already kept (checked), ids new to the store */
	uint32_t *u;	     /* the fresh ids, for the request (fresh > 0) */
	bool sent;	     /* something went to the store */
};

static int commit_prepare(struct commit_job *j, char *err, size_t errlen)
{
	struct hostkv_seq *s = j->s;
	const int64_t committed_tokens = j->committed, first = j->first, n = j->n;
	const int32_t *ids = j->ids;
	if (committed_tokens < s->committed)
		return errmsg(err, errlen, -EINVAL, "committed length %" PRId64 " below %" PRId64,
			      committed_tokens, s->committed);
	if (n < 0 || first < 0 || (uint64_t)first > s->n_ids || (n && !ids))
		return errmsg(err, errlen, -EINVAL, "token ids at %" PRId64 " would leave a gap "
			      "after the %zu kept", first, s->n_ids);
	int64_t kept_after = first + n > (int64_t)s->n_ids ? first + n : (int64_t)s->n_ids;
	if (committed_tokens > kept_after)
		return errmsg(err, errlen, -EINVAL, "committing %" PRId64 " tokens without their ids",
			      committed_tokens);
	uint32_t pages = (uint32_t)((committed_tokens + s->g.p - 1) / s->g.p);
	for (int l = 0; l < s->n_layers; l++)
		if (s->n_alloc[l] < pages)
			return errmsg(err, errlen, -EINVAL, "committing %" PRId64 " tokens: layer %d "
				      "has no block for page %u", committed_tokens, l, s->n_alloc[l]);
	/* Ids the store already keeps are not sent again; they must agree. */
	j->fresh = first + n - (int64_t)s->n_ids;
	j->same = n - (j->fresh > 0 ? j->fresh : 0);
	for (int64_t i = 0; i < j->same; i++)
		if (s->ids[first + i] != ids[i])
			return errmsg(err, errlen, -EINVAL, "token id %d at %" PRId64 " disagrees with "
				      "the kept %d", ids[i], first + i, s->ids[first + i]);
	/* A length that moves within committed blocks and brings no new ids waits for the next
	 * request that carries it (or close): the store's length may lag, which a resume
	 * handles (the ids past it are run again), and a decode step costs one round trip (the
	 * sampled id kept), not two. */
	if (pages > s->n_commit_pages) {
		int ret = hk_lease_missing(s, 0, s->n_layers, s->n_commit_pages, pages, err, errlen)
		       ?: hk_commit_blocks(s, pages, committed_tokens, err, errlen);
		if (ret)
			return ret;
		j->sent = true;
	}
	if (j->fresh > 0) {
		if (!(j->u = malloc((size_t)j->fresh * sizeof *j->u)))
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		for (int64_t i = 0; i < j->fresh; i++)
			j->u[i] = (uint32_t)ids[j->same + i];
	}
	return 0;
}

/* After the ids' request, when it succeeded (or there was none). */
static int commit_finish(struct commit_job *j, char *err, size_t errlen)
{
	struct hostkv_seq *s = j->s;
	if (j->fresh > 0) {
		if (hk_keep_ids(s, j->ids + j->same, s->n_ids, (size_t)j->fresh))
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		j->sent = true;
	}
	if (j->sent)
		s->lagging = false;
	else if (j->committed != s->committed)
		s->lagging = true;
	s->committed = j->committed;
	/* Pages that became full are the budget's now. */
	uint32_t full = (uint32_t)(j->committed / s->g.p);
	pthread_mutex_lock(&s->mu);
	for (uint32_t p = s->full; p < full; p++)
		for (int l = 0; l < s->n_layers; l++) {
			const struct hk_block *b = hk_blk(s, l, p);
			s->n_evictable += b->lease && !b->pins;
		}
	if (full > s->full)
		s->full = full;
	pthread_mutex_unlock(&s->mu);
	return enforce_budget(s, err, errlen);
}

/* The ids' requests of jobs[0..n) (those with fresh ids and rets[i] 0) under one store lock:
 * overlapped where the store has commit_tokens_many, else one after another. */
static void commit_send_ids(struct hostkv *h, struct commit_job *jobs, int n, int *rets,
			    char *err, size_t errlen)
{
	struct kvs_commit *c = malloc((size_t)n * sizeof *c);
	int *at = malloc((size_t)n * sizeof *at), *r = malloc((size_t)n * sizeof *r);
	if (!c || !at || !r) {
		for (int i = 0; i < n; i++)
			if (!rets[i] && jobs[i].fresh > 0)
				rets[i] = errmsg(err, errlen, -ENOMEM, "out of memory");
		free(c);
		free(at);
		free(r);
		return;
	}
	int m = 0;
	for (int i = 0; i < n; i++)
		if (!rets[i] && jobs[i].fresh > 0) {
			const struct hostkv_seq *s = jobs[i].s;
			c[m] = (struct kvs_commit){ .seq_id = s->id,
						    .committed_tokens = (uint64_t)jobs[i].committed,
						    .first = s->n_ids, .tokens = jobs[i].u,
						    .n = (size_t)jobs[i].fresh };
			at[m++] = i;
		}
	if (m) {
		hk_lock_store(h);
		if (h->ops->commit_tokens_many) {
			h->ops->commit_tokens_many(h->st, c, m, r, err, errlen);
		} else {
			char e2[256];
			for (int k = 0; k < m; k++)
				r[k] = h->ops->commit_tokens(h->st, c[k].seq_id, c[k].committed_tokens,
							     c[k].first, c[k].tokens, c[k].n,
							     k ? e2 : err, k ? sizeof e2 : errlen);
		}
		hk_unlock_store(h, true);
		for (int k = 0; k < m; k++)
			rets[at[k]] = r[k];
	}
	free(c);
	free(at);
	free(r);
}

/* Commits jobs[0..n) of one store: every job's checks and blocks, then all their ids'
 * requests together, then each one's state. rets[i] is job i's result; returns the first
 * error, whose message is in err. */
static int commit_many_once(struct hostkv *h, struct commit_job *jobs, int n, int *rets,
			    char *err, size_t errlen)
{
	char e2[256];
	int first = 0;
	for (int i = 0; i < n; i++) {
		free(jobs[i].u);
		jobs[i].u = NULL;
		jobs[i].sent = false;
		rets[i] = commit_prepare(&jobs[i], first ? e2 : err, first ? sizeof e2 : errlen);
		first = first ? first : rets[i];
	}
	commit_send_ids(h, jobs, n, rets, first ? e2 : err, first ? sizeof e2 : errlen);
	for (int i = 0; i < n; i++) {
		if (!rets[i])
			rets[i] = commit_finish(&jobs[i], first ? e2 : err, first ? sizeof e2 : errlen);
		first = first ? first : rets[i];
	}
	return first;
}

int hostkv_commit(struct hostkv_seq *s, int64_t committed_tokens, const int32_t *ids,
		  int64_t first, int64_t n, char *err, size_t errlen)
{
	struct commit_job j = { .s = s, .committed = committed_tokens, .first = first, .n = n,
				.ids = ids };
	int ret, r1;
	WITH_RECONNECT(s->h, err, errlen, ret, commit_many_once(s->h, &j, 1, &r1, err, errlen));
	free(j.u);
	return ret;
}

struct hostkv *hostkv_seq_store(const struct hostkv_seq *s)
{
	return s->h;
}

int hostkv_commit_many(struct hostkv_seq *const *ss, const int64_t *committed_tokens,
		       const int32_t *const *ids, const int64_t *first, const int64_t *n,
		       int count, int *rets, char *err, size_t errlen)
{
	if (count <= 0)
		return 0;
	struct hostkv *h = ss[0]->h;
	for (int i = 0; i < count; i++) {
		rets[i] = 0;
		for (int k = 0; k < i; k++)
			if (ss[k] == ss[i])
				return errmsg(err, errlen, -EINVAL, "a sequence twice in one commit");
		if (ss[i]->h != h)
			return errmsg(err, errlen, -EINVAL, "sequences of two stores in one commit");
	}
	struct commit_job *jobs = calloc((size_t)count, sizeof *jobs);
	if (!jobs)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	for (int i = 0; i < count; i++)
		jobs[i] = (struct commit_job){ .s = ss[i], .committed = committed_tokens[i],
					       .first = first[i], .n = n[i], .ids = ids[i] };
	int ret;
	WITH_RECONNECT(h, err, errlen, ret, commit_many_once(h, jobs, count, rets, err, errlen));
	for (int i = 0; i < count; i++)
		free(jobs[i].u);
	free(jobs);
	return ret;
}

int hostkv_seq_close(struct hostkv_seq *s, bool drop)
{
	if (!s)
		return 0;
	struct hostkv *h = s->h;
	char err[256];
	int ret = 0;
	/* A store that went away and comes back gets the final length, as if it had stayed. */
	pthread_rwlock_rdlock(&h->life);
	uint64_t gen = h->gen;
	bool gone = gone_locked(h);
	pthread_rwlock_unlock(&h->life);
	if (gone && h->retry_ms)
		hk_reconnect(h, gen, err, sizeof err);
	pthread_rwlock_rdlock(&h->life);
	if (s->lagging && !drop)
		ret = hk_commit_blocks(s, s->n_commit_pages, s->committed, err, sizeof err);
	size_t n = 0;
	uint64_t *ids = s->n_held ? malloc(s->n_held * sizeof *ids) : NULL;
	if (ids) {
		pthread_mutex_lock(&s->mu);
		for (int l = 0; l < s->n_layers; l++)
			for (uint32_t p = 0; p < s->n_alloc[l]; p++)
				if (hk_blk(s, l, p)->lease && n < s->n_held)
					ids[n++] = hk_blk(s, l, p)->lease;
		pthread_mutex_unlock(&s->mu);
	}
	/* Without the list (no memory) the store still drops the leases with the sequence. */
	int r = release_leases(h, ids, n, err, sizeof err);
	ret = ret ? ret : r;
	free(ids);
	hk_lock_store(h);
	int r2 = h->ops->close_seq(h->st, s->id, drop, err, sizeof err);
	for (struct hostkv_seq **pp = &h->seqs; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	hk_unlock_store(h, true);
	pthread_rwlock_unlock(&h->life);
	seq_free(s);
	return ret ? ret : r2;
}

/* ---------------------------------------------------------------- statistics */

static double jnum(struct json_object *o, const char *key, protobuf_c_boolean *has)
{
	struct json_object *v;
	*has = json_object_object_get_ex(o, key, &v) &&
	       (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int));
	return *has ? json_object_get_double(v) : 0.0;
}

int hostkv_report_stats(struct hostkv *h, const char *json)
{
	if (!h->ops->heartbeat)
		return -EOPNOTSUPP;
	struct json_object *o = json_tokener_parse(json);
	if (!o || !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return -EINVAL;
	}
	Freekv__WorkerStats st = FREEKV__WORKER_STATS__INIT;
	st.decode_tok_s = jnum(o, "decode_tok_s", &st.has_decode_tok_s);
	st.tokens_decoded = (uint64_t)jnum(o, "tokens_decoded", &st.has_tokens_decoded);
	st.pages_recalled = (uint64_t)jnum(o, "pages_recalled", &st.has_pages_recalled);
	st.bytes_recalled = (uint64_t)jnum(o, "bytes_recalled", &st.has_bytes_recalled);
	st.correction_rate = jnum(o, "correction_rate", &st.has_correction_rate);
	st.full_step_rate = jnum(o, "full_step_rate", &st.has_full_step_rate);
	st.tokens_fetched = (uint64_t)jnum(o, "tokens_fetched", &st.has_tokens_fetched);
	st.full_step_ms = jnum(o, "full_step_ms", &st.has_full_step_ms);
	/* Per layer, in layer order: layers without the counter (full attention) report 0. */
	struct json_object *layers;
	size_t n_layers = json_object_object_get_ex(o, "layers", &layers) &&
			  json_object_is_type(layers, json_type_array) && st.has_full_step_rate ?
			  json_object_array_length(layers) : 0;
	double *rates = n_layers ? calloc(n_layers, sizeof *rates) : NULL;
	for (size_t i = 0; rates && i < n_layers; i++) {
		protobuf_c_boolean has;
		rates[i] = jnum(json_object_array_get_idx(layers, i), "full_step_rate", &has);
	}
	st.n_layer_full_step_rate = rates ? n_layers : 0;
	st.layer_full_step_rate = rates;
	st.json = (char *)json;
	char err[256];
	hk_lock_store(h);
	int ret = h->ops->heartbeat(h->st, &st, err, sizeof err);
	hk_unlock_store(h, true);
	json_object_put(o);
	free(rates);
	return ret;
}
