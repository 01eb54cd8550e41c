/* hostkv — see hostkv.h. The block logic every store shares:
 *
 * - A sequence's block table maps (layer, page) to a pool offset. Blocks are allocated ahead,
 *   HOSTKV_AHEAD pages at a time for every layer in one ring batch, so the per-token path does
 *   no ring traffic while it stays inside allocated pages.
 * - Lease-all (DESIGN §4): every block of an open sequence is leased right after it is
 *   allocated (or, on attach, every block the store already holds), so kvstored never moves it
 *   and a block pointer stays valid until the sequence is closed.
 * - hostkv_commit COMMITs the blocks of pages the committed length reached for the first time
 *   (ring), and sends token ids the store does not keep yet (control request). Ids already
 *   kept cost nothing, so a caller may keep a sampled id ahead and commit it again later; a
 *   length alone rides on the next request (or close), see hostkv_commit.
 * - A heartbeat thread keeps the worker alive when no control request went out for a while.
 *
 * Locks: h->mu serialises every store op (the kvs handle is single-threaded and the heartbeat
 * thread shares it); s->mu guards the block table, which hostkv_block_ro reads from the recall
 * thread while hostkv_block grows it. */
#include "hostkv.h"

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

#define HOSTKV_AHEAD 16u		/* pages per layer allocated at once */
#define HOSTKV_ALLOC_MAX 64u		/* pages per ALLOC entry (ring.h) */
#define HOSTKV_RECALL_MAX 32u		/* pages per RECALL entry */
#define HOSTKV_RELEASE_MAX 64u		/* leases per RELEASE entry */
#define HOSTKV_MAX_PAGES (1u << 24)	/* per layer, as kvstored allows */
#define HOSTKV_NO_OFF UINT64_MAX

struct hostkv {
	const struct hostkv_store_ops *ops;
	void *st;
	uint8_t *base;
	uint64_t bytes;
	bool remote;
	struct backend *reg_be;	/* the backend the pool mapping is registered with, or NULL */
	pthread_mutex_t mu;	/* store ops, last_call_ms, seqs list */
	uint64_t last_call_ms;
	struct hostkv_seq *seqs;

	pthread_t hb;		/* heartbeat thread, when the store needs one */
	bool hb_running, hb_stop;
	pthread_cond_t hb_cond;
	uint32_t hb_ms;
	int hb_err;		/* last heartbeat failure, 0 when fine */
};

struct hostkv_seq {
	struct hostkv *h;
	struct hostkv_seq *next;
	uint64_t id;
	char name[128];
	int n_layers;
	struct kv_geom g;
	size_t block_bytes;
	uint64_t all_heads;	/* RECALL head mask */

	pthread_mutex_t mu;	/* off, cap, n_alloc */
	uint64_t *off;		/* (n_layers, cap) pool offsets, HOSTKV_NO_OFF when none */
	uint32_t cap;
	uint32_t *n_alloc;	/* (n_layers,) pages [0, n) have a block */
	uint32_t *n_leased;	/* (n_layers,) pages [0, n) are leased */
	uint32_t n_commit_pages; /* pages [0, n) of every layer were COMMITted */

	uint64_t *leases;
	size_t n_leases, cap_leases;

	int64_t committed;	/* ours; the store's lags by a step while lagging is set */
	bool lagging;
	int32_t *ids;		/* ids kept by the store, (n_ids,) */
	size_t n_ids, cap_ids;
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Store ops are called with h->mu held; each marks the time for the heartbeat thread. */
static void lock_store(struct hostkv *h)
{
	pthread_mutex_lock(&h->mu);
}

static void unlock_store(struct hostkv *h, bool control)
{
	if (control)
		h->last_call_ms = now_ms();
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
		if (now_ms() - h->last_call_ms < h->hb_ms / 3)
			continue;
		h->hb_err = h->ops->heartbeat(h->st, NULL, err, sizeof err);
		h->last_call_ms = now_ms();
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
	h->remote = o->endpoint && o->endpoint[0];
	int ret = h->remote
		? hostkv_remote_open(o, &h->ops, &h->st, &h->base, &h->bytes, err, errlen)
		: hostkv_embedded_open(o, &h->ops, &h->st, &h->base, &h->bytes, err, errlen);
	if (ret) {
		free(h);
		return ret;
	}
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->hb_cond, NULL);
	h->last_call_ms = now_ms();
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
	free(h);
}

bool hostkv_is_remote(const struct hostkv *h)
{
	return h->remote;
}

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

/* Runs n entries in batches; every completion must carry status 0. */
static int run_ring(struct hostkv *h, struct ring_entry *e, size_t n, char *err, size_t errlen)
{
	static const char *const op_names[] = { "INVALID", "ALLOC", "COMMIT", "RECALL", "RELEASE" };
	int ret = 0;
	lock_store(h);
	for (size_t i = 0; i < n && !ret; i += HOSTKV_RING_BATCH) {
		unsigned m = n - i < HOSTKV_RING_BATCH ? (unsigned)(n - i) : HOSTKV_RING_BATCH;
		ret = h->ops->ring(h->st, e + i, m, err, errlen);
		for (unsigned j = 0; j < m && !ret; j++)
			if (e[i + j].status)
				ret = errmsg(err, errlen, e[i + j].status,
					     "%s %s (layer %u, page %u): %s", h->ops->name,
					     op_names[e[i + j].op <= RING_OP_MAX ? e[i + j].op : 0],
					     e[i + j].layer, e[i + j].first_page,
					     strerror(-e[i + j].status));
	}
	unlock_store(h, false);
	return ret;
}

static bool off_ok(const struct hostkv_seq *s, uint64_t off)
{
	return off < s->h->bytes && s->h->bytes - off >= s->block_bytes;
}

/* ---------------------------------------------------------------- block table */

static int grow_table(struct hostkv_seq *s, uint32_t pages)
{
	if (pages <= s->cap)
		return 0;
	uint32_t cap = s->cap ? s->cap : 16;
	while (cap < pages)
		cap *= 2;
	uint64_t *off = malloc((size_t)s->n_layers * cap * sizeof *off);
	if (!off)
		return -ENOMEM;
	for (int l = 0; l < s->n_layers; l++) {
		for (uint32_t p = 0; p < cap; p++)
			off[(size_t)l * cap + p] = p < s->cap ? s->off[(size_t)l * s->cap + p]
							      : HOSTKV_NO_OFF;
	}
	pthread_mutex_lock(&s->mu);
	uint64_t *old = s->off;
	s->off = off;
	s->cap = cap;
	pthread_mutex_unlock(&s->mu);
	free(old);
	return 0;
}

static int add_leases(struct hostkv_seq *s, const uint64_t *ids, size_t n)
{
	if (s->n_leases + n > s->cap_leases) {
		size_t cap = s->cap_leases ? s->cap_leases : 64;
		while (cap < s->n_leases + n)
			cap *= 2;
		uint64_t *v = realloc(s->leases, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		s->leases = v;
		s->cap_leases = cap;
	}
	memcpy(s->leases + s->n_leases, ids, n * sizeof *ids);
	s->n_leases += n;
	return 0;
}

/* Leases pages [n_leased[l], upto) of every layer (RECALL, all heads) and records their
 * offsets: the blocks the store holds for an attached sequence, and fresh allocations. */
static int lease_pages(struct hostkv_seq *s, uint32_t upto, char *err, size_t errlen)
{
	size_t n = 0;
	for (int l = 0; l < s->n_layers; l++)
		if (s->n_leased[l] < upto)
			n += (upto - s->n_leased[l] + HOSTKV_RECALL_MAX - 1) / HOSTKV_RECALL_MAX;
	if (!n)
		return 0;
	struct ring_entry *e = calloc(n, sizeof *e);
	if (!e)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	size_t k = 0;
	for (int l = 0; l < s->n_layers; l++)
		for (uint32_t p = s->n_leased[l]; p < upto; p += HOSTKV_RECALL_MAX) {
			uint32_t c = upto - p < HOSTKV_RECALL_MAX ? upto - p : HOSTKV_RECALL_MAX;
			e[k] = (struct ring_entry){ .op = RING_OP_RECALL, .seq_id = s->id,
						    .layer = (uint32_t)l, .first_page = p,
						    .count = c, .n_payload = 2 * c };
			for (uint32_t i = 0; i < c; i++) {
				e[k].payload[2 * i] = p + i;
				e[k].payload[2 * i + 1] = s->all_heads;
			}
			k++;
		}
	int ret = run_ring(s->h, e, n, err, errlen);
	/* Record what was leased even on a partial failure, so close releases it. */
	for (size_t i = 0; i < n; i++) {
		if (e[i].status || e[i].n_payload != 2 * e[i].count)
			continue;
		uint64_t lids[HOSTKV_RECALL_MAX];
		for (uint32_t j = 0; j < e[i].count; j++) {
			lids[j] = e[i].payload[2 * j + 1];
			if (!off_ok(s, e[i].payload[2 * j]) && !ret)
				ret = errmsg(err, errlen, -EPROTO, "store gave an offset outside the pool");
		}
		if (add_leases(s, lids, e[i].count) && !ret)
			ret = errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	if (!ret) {
		pthread_mutex_lock(&s->mu);
		for (size_t i = 0; i < n; i++)
			for (uint32_t j = 0; j < e[i].count; j++)
				s->off[(size_t)e[i].layer * s->cap + e[i].first_page + j] =
					e[i].payload[2 * j];
		for (int l = 0; l < s->n_layers; l++) {
			if (s->n_leased[l] < upto)
				s->n_leased[l] = upto;
			if (s->n_alloc[l] < upto)
				s->n_alloc[l] = upto;
		}
		pthread_mutex_unlock(&s->mu);
	}
	free(e);
	return ret;
}

/* Allocates pages [n_alloc[l], upto) of every layer, then leases them. */
static int alloc_pages(struct hostkv_seq *s, uint32_t upto, char *err, size_t errlen)
{
	int ret = grow_table(s, upto);
	if (ret)
		return errmsg(err, errlen, ret, "out of memory");
	size_t n = 0;
	for (int l = 0; l < s->n_layers; l++)
		if (s->n_alloc[l] < upto)
			n += (upto - s->n_alloc[l] + HOSTKV_ALLOC_MAX - 1) / HOSTKV_ALLOC_MAX;
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
				s->off[(size_t)l * s->cap + e[i].first_page + j] = e[i].payload[j];
			s->n_alloc[l] += e[i].count;
		}
		pthread_mutex_unlock(&s->mu);
		free(e);
		if (ret)
			return ret;
	}
	/* Lease only what every layer has. */
	uint32_t have = upto;
	for (int l = 0; l < s->n_layers; l++)
		if (s->n_alloc[l] < have)
			have = s->n_alloc[l];
	return lease_pages(s, have, err, errlen);
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
	free(s->off);
	free(s->n_alloc);
	free(s->n_leased);
	free(s->leases);
	free(s->ids);
	free(s);
}

static int keep_ids(struct hostkv_seq *s, const int32_t *ids, size_t first, size_t n)
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

int hostkv_seq_open(struct hostkv *h, const char *name, const uint8_t *fingerprint,
		    int n_layers, const struct kv_geom *g, bool create, struct hostkv_seq **out,
		    char *err, size_t errlen)
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
	s->n_alloc = calloc((size_t)n_layers, sizeof *s->n_alloc);
	s->n_leased = calloc((size_t)n_layers, sizeof *s->n_leased);
	if (!s->n_alloc || !s->n_leased) {
		seq_free(s);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	struct kvs_geometry kg = { (uint32_t)n_layers, (uint32_t)g->n_kv, (uint32_t)g->d,
				   (uint32_t)g->p, (uint32_t)geom_dtype(g->dtype) };
	uint64_t committed = 0;
	uint32_t *ids = NULL;
	size_t n_ids = 0;
	lock_store(h);
	int ret = h->ops->open_seq(h->st, name, fingerprint, FKV_FINGERPRINT_BYTES, &kg, create,
				   &s->id, err, errlen);
	if (!ret)
		ret = h->ops->attach(h->st, s->id, &committed, &ids, &n_ids, err, errlen);
	unlock_store(h, true);
	if (ret) {
		seq_free(s);
		return ret;
	}
	s->committed = (int64_t)committed;
	if (n_ids && keep_ids(s, (const int32_t *)ids, 0, n_ids))
		ret = errmsg(err, errlen, -ENOMEM, "out of memory");
	free(ids);
	uint32_t pages = (uint32_t)((committed + (uint64_t)g->p - 1) / (uint64_t)g->p);
	if (!ret && n_ids < committed)
		ret = errmsg(err, errlen, -EPROTO, "sequence '%s' keeps %zu token ids for %" PRIu64
			     " committed tokens", name, n_ids, committed);
	if (!ret)
		ret = grow_table(s, pages) ? errmsg(err, errlen, -ENOMEM, "out of memory") : 0;
	if (!ret)
		ret = lease_pages(s, pages, err, errlen);
	s->n_commit_pages = pages;
	lock_store(h);
	s->next = h->seqs;
	h->seqs = s;
	unlock_store(h, false);
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

int hostkv_block(struct hostkv_seq *s, int layer, int page, void **block, char *err,
		 size_t errlen)
{
	if (layer < 0 || layer >= s->n_layers || page < 0 || (uint32_t)page >= HOSTKV_MAX_PAGES)
		return errmsg(err, errlen, -EINVAL, "no block (layer %d, page %d) in a %d-layer "
			      "sequence", layer, page, s->n_layers);
	if ((uint32_t)page >= s->n_leased[layer]) {
		uint32_t upto = (uint32_t)page + 1;
		if (upto < s->n_leased[layer] + HOSTKV_AHEAD)
			upto = s->n_leased[layer] + HOSTKV_AHEAD;
		if (upto > HOSTKV_MAX_PAGES)
			upto = HOSTKV_MAX_PAGES;
		int ret = alloc_pages(s, upto, err, errlen);
		if (ret)
			return ret;
	}
	*block = s->h->base + s->off[(size_t)layer * s->cap + (size_t)page];
	return 0;
}

int hostkv_block_ro(struct hostkv_seq *s, int layer, int page, const void **block, char *err,
		    size_t errlen)
{
	if (layer < 0 || layer >= s->n_layers || page < 0)
		return errmsg(err, errlen, -EINVAL, "no block (layer %d, page %d)", layer, page);
	pthread_mutex_lock(&s->mu);
	uint64_t off = (uint32_t)page < s->n_leased[layer] ? s->off[(size_t)layer * s->cap + page]
							   : HOSTKV_NO_OFF;
	pthread_mutex_unlock(&s->mu);
	if (off == HOSTKV_NO_OFF)
		return errmsg(err, errlen, -ENOENT, "sequence '%s' has no block (layer %d, page %d)",
			      s->name, layer, page);
	*block = s->h->base + off;
	return 0;
}

/* COMMITs the blocks of pages [n_commit_pages, pages) of every layer, moving the committed
 * length to `committed` with the last entry (the earlier ones carry the old length). */
static int commit_blocks(struct hostkv_seq *s, uint32_t pages, int64_t committed, char *err,
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
	for (uint32_t p = s->n_commit_pages; p < pages; p++)
		for (int l = 0; l < s->n_layers; l++, k++) {
			struct ring_entry *x = &e[k / RING_PAYLOAD_MAX];
			x->payload[x->n_payload++] = s->off[(size_t)l * s->cap + p];
			x->count = x->n_payload;
		}
	int ret = run_ring(s->h, e, n, err, errlen);
	free(e);
	if (!ret)
		s->n_commit_pages = pages;
	return ret;
}

int hostkv_commit(struct hostkv_seq *s, int64_t committed_tokens, const int32_t *ids,
		  int64_t first, int64_t n, char *err, size_t errlen)
{
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
		if (s->n_leased[l] < pages)
			return errmsg(err, errlen, -EINVAL, "committing %" PRId64 " tokens: layer %d "
				      "has no block for page %u", committed_tokens, l, s->n_leased[l]);
	/* Ids the store already keeps are not sent again; they must agree. */
	int64_t fresh = first + n - (int64_t)s->n_ids;
	int64_t same = n - (fresh > 0 ? fresh : 0);
	for (int64_t i = 0; i < same; i++)
		if (s->ids[first + i] != ids[i])
			return errmsg(err, errlen, -EINVAL, "token id %d at %" PRId64 " disagrees with "
				      "the kept %d", ids[i], first + i, s->ids[first + i]);
	/* A length that moves within committed blocks and brings no new ids waits for the next
	 * request that carries it (or close): the store's length may lag, which a resume
	 * handles (the ids past it are run again), and a decode step costs one round trip (the
	 * sampled id kept), not two. */
	bool sent = false;
	int ret = 0;
	if (pages > s->n_commit_pages) {
		ret = commit_blocks(s, pages, committed_tokens, err, errlen);
		sent = true;
	}
	if (!ret && fresh > 0) {
		uint32_t *u = malloc((size_t)fresh * sizeof *u);
		if (!u)
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		for (int64_t i = 0; i < fresh; i++)
			u[i] = (uint32_t)ids[same + i];
		struct hostkv *h = s->h;
		lock_store(h);
		ret = h->ops->commit_tokens(h->st, s->id, (uint64_t)committed_tokens, s->n_ids, u,
					    (size_t)fresh, err, errlen);
		unlock_store(h, true);
		free(u);
		if (!ret && keep_ids(s, ids + same, s->n_ids, (size_t)fresh))
			ret = errmsg(err, errlen, -ENOMEM, "out of memory");
		sent = true;
	}
	if (ret)
		return ret;
	if (sent)
		s->lagging = false;
	else if (committed_tokens != s->committed)
		s->lagging = true;
	s->committed = committed_tokens;
	return 0;
}

int hostkv_seq_close(struct hostkv_seq *s, bool drop)
{
	if (!s)
		return 0;
	struct hostkv *h = s->h;
	char err[256];
	int ret = 0;
	if (s->lagging && !drop)
		ret = commit_blocks(s, s->n_commit_pages, s->committed, err, sizeof err);
	if (s->n_leases) {
		size_t n = (s->n_leases + HOSTKV_RELEASE_MAX - 1) / HOSTKV_RELEASE_MAX;
		struct ring_entry *e = calloc(n, sizeof *e);
		if (e) {
			for (size_t i = 0; i < s->n_leases; i++) {
				struct ring_entry *x = &e[i / HOSTKV_RELEASE_MAX];
				x->op = RING_OP_RELEASE;
				x->payload[x->n_payload++] = s->leases[i];
				x->count = x->n_payload;
			}
			int r = run_ring(h, e, n, err, sizeof err);
			ret = ret ? ret : r;
			free(e);
		}
	}
	lock_store(h);
	int r2 = h->ops->close_seq(h->st, s->id, drop, err, sizeof err);
	for (struct hostkv_seq **pp = &h->seqs; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	unlock_store(h, true);
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
	st.json = (char *)json;
	char err[256];
	lock_store(h);
	int ret = h->ops->heartbeat(h->st, &st, err, sizeof err);
	unlock_store(h, true);
	json_object_put(o);
	return ret;
}
