/* hostkv_remote — the hostkv store ops over a running kvstored: control requests through the
 * client library (freekv_store.h), block ops through the worker's shared-memory ring, blocks in
 * the mapped pool. See hostkv_impl.h. */
#include "clock.h"
#include "errmsg.h"
#include "hostkv_impl.h"

#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REMOTE_TIMEOUT_MS 10000
#define RING_WAIT_MS 10000

struct remote {
	struct kvs *k;
	char endpoint[256], name[64];
	int timeout_ms;
	uint64_t next_user;
	_Atomic bool gone;	/* set by any thread's call (the heartbeat thread's too) */
};

/* The client library's verdicts for a daemon that is no more: the connection was lost
 * (-ECONNRESET), nothing answers (-ECONNREFUSED), it announced its shutdown (-ESHUTDOWN). */
static bool is_gone(int ret)
{
	return ret == -ECONNRESET || ret == -ECONNREFUSED || ret == -ESHUTDOWN;
}

static int kerr(struct remote *r, int ret, char *err, size_t errlen, const char *what)
{
	if (is_gone(ret))
		r->gone = true;
	return errmsg(err, errlen, ret, "%s: %s", what,
		      kvs_error(r->k)[0] ? kvs_error(r->k) : strerror(-ret));
}

static bool r_gone(void *st)
{
	struct remote *r = st;
	return r->gone;
}

static int r_open_seq(void *st, const char *name, const uint8_t *fp, size_t fp_len,
		      const struct kvs_geometry *g, bool create, const struct hostkv_prefix *px,
		      uint64_t *id, char *err, size_t errlen)
{
	struct remote *r = st;
	struct kvs_prefix_req q = { 0 };
	if (px) {
		q.ubatch = px->ubatch;
		q.salt = px->salt;
		q.variant = px->variant;
		q.variant_len = px->variant ? strlen(px->variant) : 0;
	}
	/* The prompt's ids go with the open only when sharing is asked for. */
	int ret = kvs_open_sequence_px(r->k, name, fp, fp_len, g,
				       px ? (const uint32_t *)px->ids : NULL, px ? px->n_ids : 0,
				       create, px ? &q : NULL, id, NULL);
	return ret ? kerr(r, ret, err, errlen, "opening the sequence in kvstored") : 0;
}

static int r_attach(void *st, uint64_t id, uint64_t *committed, uint32_t **ids, size_t *n_ids,
		    char *err, size_t errlen)
{
	struct remote *r = st;
	Freekv__Reply *rep = NULL;
	int ret = kvs_attach(r->k, id, &rep);
	if (ret)
		return kerr(r, ret, err, errlen, "attaching the sequence in kvstored");
	if (!rep || rep->body_case != FREEKV__REPLY__BODY_SEQUENCE) {
		kvs_reply_free(rep);
		return errmsg(err, errlen, -EPROTO,
			      "attach: kvstored sent no sequence information");
	}
	const Freekv__SequenceInfo *si = rep->sequence;
	*committed = si->committed_tokens;
	*n_ids = si->n_token_ids;
	*ids = malloc((si->n_token_ids ? si->n_token_ids : 1) * sizeof **ids);
	if (!*ids) {
		kvs_reply_free(rep);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	if (si->n_token_ids)
		memcpy(*ids, si->token_ids, si->n_token_ids * sizeof **ids);
	kvs_reply_free(rep);
	return 0;
}

static int r_commit_tokens(void *st, uint64_t id, uint64_t committed, uint64_t first,
			   const uint32_t *ids, size_t n, char *err, size_t errlen)
{
	struct remote *r = st;
	int ret = kvs_commit_tokens(r->k, id, committed, first, ids, n);
	return ret ? kerr(r, ret, err, errlen, "committing the token ids to kvstored") : 0;
}

static int r_commit_tokens_many(void *st, const struct kvs_commit *c, int n, int *rets,
				char *err, size_t errlen)
{
	struct remote *r = st;
	int ret = kvs_commit_tokens_many(r->k, c, n, rets);
	for (int i = 0; i < n; i++)
		if (is_gone(rets[i]))
			r->gone = true;
	return ret ? kerr(r, ret, err, errlen, "committing the token ids to kvstored") : 0;
}

static int r_close_seq(void *st, uint64_t id, bool drop, char *err, size_t errlen)
{
	struct remote *r = st;
	int ret = kvs_close_sequence(r->k, id, drop);
	return ret ? kerr(r, ret, err, errlen, "closing the sequence in kvstored") : 0;
}

/* Pushes the batch (all of it fits: HOSTKV_RING_BATCH is below the smallest ring) and collects
 * one completion per entry, matched by user_data. */
static int r_ring(void *st, struct ring_entry *e, unsigned n, char *err, size_t errlen)
{
	struct remote *r = st;
	uint64_t base = r->next_user;
	r->next_user += n;
	for (unsigned i = 0; i < n; i++)
		e[i].user_data = base + i;
	unsigned pushed = 0;
	uint64_t deadline = clock_ms() + RING_WAIT_MS;
	while (pushed < n) {
		int ret = kvs_ring_submit(r->k, e + pushed, n - pushed);
		if (ret < 0)
			return kerr(r, ret, err, errlen, "ring submit");
		pushed += (unsigned)ret;
		if (pushed < n && clock_ms() > deadline)
			return errmsg(err, errlen, -ETIMEDOUT,
				      "ring: submission ring stayed full for %d ms", RING_WAIT_MS);
	}
	struct ring_entry c[HOSTKV_RING_BATCH];
	unsigned got = 0;
	while (got < n) {
		uint64_t t = clock_ms();
		if (t >= deadline)
			return errmsg(err, errlen, -ETIMEDOUT,
				      "ring: %u of %u completions within %d ms", got, n,
				      RING_WAIT_MS);
		int m = kvs_ring_complete(r->k, c, n - got, (int)(deadline - t));
		if (m < 0)
			return kerr(r, m, err, errlen, "ring completion");
		for (int i = 0; i < m; i++) {
			uint64_t u = c[i].user_data - base;
			if (c[i].user_data < base || u >= n)
				return errmsg(err, errlen, -EPROTO,
					      "ring: unexpected completion %" PRIu64,
					      c[i].user_data);
			e[u] = c[i];
			got++;
		}
	}
	return 0;
}

static int r_heartbeat(void *st, const Freekv__WorkerStats *stats, char *err, size_t errlen)
{
	struct remote *r = st;
	int ret;
	if (!stats) {
		ret = kvs_heartbeat(r->k);
	} else {
		Freekv__Request q = FREEKV__REQUEST__INIT;
		Freekv__Heartbeat hb = FREEKV__HEARTBEAT__INIT;
		hb.worker_id = kvs_worker_id(r->k);
		hb.stats = (Freekv__WorkerStats *)stats;
		q.body_case = FREEKV__REQUEST__BODY_HEARTBEAT;
		q.heartbeat = &hb;
		ret = kvs_call(r->k, &q, NULL);
	}
	return ret ? kerr(r, ret, err, errlen, "heartbeat") : 0;
}

static uint32_t r_heartbeat_ms(void *st)
{
	struct remote *r = st;
	return kvs_heartbeat_ms(r->k);
}

/* What fills the pool, from the daemon's own counters: detached and orphaned sequences'
 * DRAM blocks (evictable now), leased blocks (pinned by running workers), the NVMe tier's room
 * (where demotion would put blocks). */
static void r_explain_full(void *st, char *buf, size_t len)
{
	struct remote *r = st;
	Freekv__Reply *s = NULL, *l = NULL;
	if (kvs_stats(r->k, &s) || kvs_list_sequences(r->k, &l)) {
		snprintf(buf, len, " (the store's DRAM pool is full)");
		kvs_reply_free(s);
		return;
	}
	uint64_t idle_seqs = 0, idle_blocks = 0;
	for (size_t i = 0; i < l->sequences->n_sequences; i++) {
		const Freekv__SequenceInfo *q = l->sequences->sequences[i];
		if (q->state != FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ATTACHED) {
			idle_seqs++;
			idle_blocks += q->pages->dram;
		}
	}
	/* Short: it ends an error line that callers keep in a few hundred bytes. */
	const Freekv__StatsReply *t = s->stats;
	char tier[64] = "no NVMe tier";
	if (t->nvme_bytes)
		snprintf(tier, sizeof tier, "NVMe %" PRIu64 "/%" PRIu64 " MiB", t->nvme_used_bytes >> 20,
			 t->nvme_bytes >> 20);
	snprintf(buf, len, " (pool full: %" PRIu64 "/%" PRIu64 " MiB; %" PRIu64 " blocks in %" PRIu64
		 " detached seqs, %" PRIu64 " leased by workers; %s. Try `kvctl evict --detached`, "
		 "a larger dram_bytes or --lease-budget N)", t->dram_used_bytes >> 20,
		 t->dram_bytes >> 20, idle_blocks, idle_seqs, t->has_leases ? t->leases : 0, tier);
	kvs_reply_free(s);
	kvs_reply_free(l);
}

static void r_close(void *st)
{
	struct remote *r = st;
	if (!r)
		return;
	kvs_close(r->k);
	free(r);
}

static int r_reopen(void *old_st, void **st, char *err, size_t errlen);

static const struct hostkv_store_ops remote_ops = {
	.name = "kvstored",
	.open_seq = r_open_seq,
	.attach = r_attach,
	.commit_tokens = r_commit_tokens,
	.commit_tokens_many = r_commit_tokens_many,
	.close_seq = r_close_seq,
	.ring = r_ring,
	.heartbeat = r_heartbeat,
	.heartbeat_ms = r_heartbeat_ms,
	.explain_full = r_explain_full,
	.gone = r_gone,
	.reopen = r_reopen,
	.close = r_close,
};

/* Connects and says Hello as a worker: r->k, or -errno with err filled. */
static int r_connect(struct remote *r, char *err, size_t errlen)
{
	int ret = kvs_connect(r->endpoint, r->timeout_ms, &r->k);
	if (ret)
		return errmsg(err, errlen, ret, "cannot connect to %s: %s", r->endpoint,
			      strerror(-ret));
	ret = kvs_hello(r->k, KVS_ROLE_WORKER, r->name);
	if (ret) {
		const char *why = kvs_error(r->k);
		if (strstr(why, r->endpoint)) /* the client library named it already */
			errmsg_set(err, errlen, "%s", why);
		else
			errmsg_set(err, errlen, "kvstored at %s: %s", r->endpoint, why);
		kvs_close(r->k);
		r->k = NULL;
	}
	return ret;
}

/* A new connection to the (restarted) daemon that keeps old's pool mapping; old is freed
 * either way on success, kept on failure. */
static int r_reopen(void *old_st, void **st, char *err, size_t errlen)
{
	struct remote *old = old_st;
	struct remote *r = calloc(1, sizeof *r);
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	memcpy(r->endpoint, old->endpoint, sizeof r->endpoint);
	memcpy(r->name, old->name, sizeof r->name);
	r->timeout_ms = old->timeout_ms;
	r->next_user = 1;
	int ret = r_connect(r, err, errlen);
	if (ret) {
		free(r);
		return ret;
	}
	ret = kvs_pool_take(r->k, old->k);
	if (ret) {
		errmsg_set(err, errlen, "%s", kvs_error(r->k));
		r_close(r);
		return ret;
	}
	kvs_abandon(old->k);
	free(old);
	*st = r;
	return 0;
}

int hostkv_remote_open(const struct hostkv_opts *o, const struct hostkv_store_ops **ops,
		       void **st, uint8_t **base, uint64_t *bytes, char *err, size_t errlen)
{
	struct remote *r = calloc(1, sizeof *r);
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	if (strlen(o->endpoint) >= sizeof r->endpoint) {
		free(r);
		return errmsg(err, errlen, -ENAMETOOLONG, "endpoint longer than %zu bytes",
			      sizeof r->endpoint - 1);
	}
	strcpy(r->endpoint, o->endpoint);
	snprintf(r->name, sizeof r->name, "%s", o->worker_name ? o->worker_name : "kvworker");
	r->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : REMOTE_TIMEOUT_MS;
	r->next_user = 1;
	int ret = r_connect(r, err, errlen);
	if (ret) {
		free(r);
		return ret;
	}
	*ops = &remote_ops;
	*st = r;
	*base = kvs_pool_base(r->k);
	*bytes = kvs_pool_bytes(r->k);
	return 0;
}
