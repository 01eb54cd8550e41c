/* rpc — control plane: socket, codec, handler table. See rpc.h. */
#include "rpc.h"
#include "access.h"
#include "freekv_store.h"
#include "pbcheck.h"
#include "persist.h"
#include "prefix.h"
#include "remote_seq.h"
#include "prom.h"

#include <errno.h>
#include <malloc.h>
#include <grp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/kvstore.pb-c.h"
#include "log.h"

#define RPC_MAX_FRAMES 4

/* Per-request scratch: every reply sub-message is carved from here and freed at once. */
struct arena_chunk {
	struct arena_chunk *next;
	max_align_t data[];
};

struct call {
	struct rpc_server *s;
	const Freekv__Request *req;
	Freekv__Reply *rep;
	struct wk_worker *w;	/* the welcomed caller, or NULL */
	const void *ident;
	size_t ident_len;
	const struct rpc_peer *peer;	/* NULL: in-process caller */
	bool refused;			/* failed for want of rights (counted per verb) */
	char err[RPC_ERR_MAX];
	struct arena_chunk *chunks;
};

static void *ca(struct call *c, size_t n)
{
	struct arena_chunk *k = calloc(1, sizeof *k + n);
	if (!k)
		return NULL;
	k->next = c->chunks;
	c->chunks = k;
	return k->data;
}

static void arena_free(struct call *c)
{
	while (c->chunks) {
		struct arena_chunk *k = c->chunks;
		c->chunks = k->next;
		free(k);
	}
}

static int fail(struct call *c, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof c->err, fmt, ap);
	va_end(ap);
	return status;
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

#define NEW(c, T, INIT) ({ T *p_ = ca((c), sizeof(T)); if (p_) *p_ = (T)INIT; p_; })

/* ---------------------------------------------------------------- reply builders */

static Freekv__SequenceInfo *seq_info(struct call *c, const struct seq *s, bool tokens)
{
	Freekv__SequenceInfo *i = NEW(c, Freekv__SequenceInfo, FREEKV__SEQUENCE_INFO__INIT);
	Freekv__Geometry *g = NEW(c, Freekv__Geometry, FREEKV__GEOMETRY__INIT);
	Freekv__TierPages *tp = NEW(c, Freekv__TierPages, FREEKV__TIER_PAGES__INIT);
	if (!i || !g || !tp)
		return NULL;
	struct dp_seq_usage u;
	dp_seq_usage(c->s->ctx.dp, s, &u);
	g->n_layers = s->geo.n_layers;
	g->n_kv_heads = s->geo.n_kv_heads;
	g->head_dim = s->geo.head_dim;
	g->page_size = s->geo.page_size;
	g->dtype = (Freekv__DType)s->geo.dtype;
	tp->dram = u.dram;
	tp->nvme = u.nvme;
	tp->in_flight = u.in_flight;
	tp->has_remote = true;
	tp->remote = u.remote;
	i->seq_id = s->id;
	i->name = (char *)s->name;
	i->state = (Freekv__SequenceState)s->state;
	i->geometry = g;
	i->committed_tokens = s->committed_tokens;
	i->pages = tp;
	i->leases = u.leases;
	if (s->worker_id) {
		i->has_worker_id = true;
		i->worker_id = s->worker_id;
	}
	i->model_fingerprint.data = (uint8_t *)s->fp;
	i->model_fingerprint.len = s->fp_len;
	i->block_bytes = s->block_bytes;
	if (s->damaged_blocks) {
		i->has_damaged_blocks = i->has_damaged_cut_from = true;
		i->damaged_blocks = s->damaged_blocks;
		i->damaged_cut_from = s->damaged_cut_from;
	}
	i->has_token_count = true;
	i->token_count = s->n_tokens;
	i->has_prefix_covered_tokens = i->has_shared_pages = true;
	i->prefix_covered_tokens = s->covered_tokens;
	i->shared_pages = (uint32_t)u.shared;
	if (tokens) {
		i->n_token_ids = s->n_tokens;
		i->token_ids = s->tokens;
	}
	return i;
}

static int reply_seq(struct call *c, const struct seq *s, bool tokens)
{
	c->rep->sequence = seq_info(c, s, tokens);
	if (!c->rep->sequence)
		return -ENOMEM;
	c->rep->body_case = FREEKV__REPLY__BODY_SEQUENCE;
	return 0;
}

static int reply_ack(struct call *c)
{
	c->rep->ack = NEW(c, Freekv__Empty, FREEKV__EMPTY__INIT);
	c->rep->body_case = FREEKV__REPLY__BODY_ACK;
	return c->rep->ack ? 0 : -ENOMEM;
}

static int reply_evicted(struct call *c, uint64_t seqs, uint64_t blocks)
{
	Freekv__EvictReply *e = NEW(c, Freekv__EvictReply, FREEKV__EVICT_REPLY__INIT);
	if (!e)
		return -ENOMEM;
	e->sequences = seqs;
	e->blocks = blocks;
	c->rep->evicted = e;
	c->rep->body_case = FREEKV__REPLY__BODY_EVICTED;
	return 0;
}

/* The sequence named by id (when nonzero) or name. */
static struct seq *lookup(struct call *c, bool has_id, uint64_t id, const char *name)
{
	struct seq *s = NULL;
	if (has_id && id)
		s = seq_find(c->s->ctx.seqs, id);
	else if (name)
		s = seq_find_name(c->s->ctx.seqs, name);
	if (!s) {
		if (has_id && id)
			fail(c, 0, "no sequence with id %" PRIu64, id);
		else
			fail(c, 0, "no sequence '%s'", name ? name : "");
	}
	return s;
}

/* ---------------------------------------------------------------- access */

/* A refusal for want of rights (docs/design.md §4 "Access"): counted per verb, and logged the
 * first time each connection meets one. */
static int refuse(struct call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(struct call *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof c->err, fmt, ap);
	va_end(ap);
	c->refused = true;
	struct rpc_server *s = c->s;
	uint64_t key = 1469598103934665603ull; /* FNV-1a of the routing identity */
	for (size_t i = 0; i < c->ident_len; i++)
		key = (key ^ ((const uint8_t *)c->ident)[i]) * 1099511628211ull;
	for (size_t i = 0; i < s->n_refused_peers; i++)
		if (s->refused_peers[i] == key)
			return -EACCES;
	if (s->n_refused_peers < RPC_REFUSED_PEERS) {
		s->refused_peers[s->n_refused_peers++] = key;
		const char *more = s->n_refused_peers == RPC_REFUSED_PEERS ?
			" (further peers are not logged)" : "";
		if (c->peer && c->peer->has_cred)
			log_warn("refused pid %u uid %u: %s%s", c->peer->pid,
				c->peer->uid, c->err, more);
		else
			log_warn("refused: %s%s", c->err, more);
	}
	return -EACCES;
}

/* Whether the caller may use sequence s: its creator's uid, or an admin. In-process callers and
 * daemons without an access table (tests) are the daemon itself. */
static int may_use(struct call *c, const struct seq *s)
{
	if (!c->peer || !c->s->ctx.access || !c->w || c->w->rights == ACCESS_ADMIN || !s->has_owner ||
	    s->owner_uid == c->w->uid)
		return 0;
	char hint[CFG_STR_MAX + 128];
	return refuse(c, "sequence '%s' belongs to uid %u, not uid %u; %s", s->name, s->owner_uid,
		      c->w->uid, access_admin_hint(c->s->ctx.access, hint, sizeof hint));
}

/* ---------------------------------------------------------------- handlers */

/* A Hello's pid against the connection's credentials; see rpc.h. */
static int check_hello_pid(struct call *c, uint32_t pid)
{
	const struct rpc_peer *p = c->peer;
	int ret = 0;
	if (!p || !p->ipc)
		return 0;
	if (!p->has_cred)
		ret = fail(c, -EPERM, "Hello claims pid %u but the ipc connection carries no peer "
			   "credentials to check it against", pid);
	else if (p->pid != pid)
		ret = fail(c, -EPERM, "Hello claims pid %u but the connection belongs to pid %u (uid %u)",
			   pid, p->pid, p->uid);
	if (ret && ++c->s->hello_refused <= 10)
		log_warn("Hello refused: %s%s", c->err,
			c->s->hello_refused == 10 ? " (further refusals are not logged)" : "");
	return ret;
}

static int h_hello(struct call *c)
{
	const Freekv__Hello *h = c->req->hello;
	struct rpc_ctx *x = &c->s->ctx;
	if (h->role != FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER && h->role != FREEKV__CLIENT_ROLE__CLIENT_ROLE_CONTROL)
		return fail(c, -EINVAL, "unknown client role %d", h->role);
	struct wk_worker *w = wk_find_ident(x->workers, c->ident, c->ident_len);
	if (w)
		return fail(c, -EALREADY, "this connection is already worker %u", w->id);
	int ret = check_hello_pid(c, h->pid);
	if (ret)
		return ret;
	enum access_right rights = ACCESS_ADMIN;
	if (c->peer && x->access) {
		char why[RPC_ERR_MAX - 32];
		rights = access_of(x->access, c->peer->ipc, c->peer->has_cred, c->peer->uid,
				   c->peer->gid, h->auth_token, why, sizeof why);
		if (rights == ACCESS_NONE)
			return refuse(c, "Hello refused: %s", why);
	}
	ret = wk_add(x->workers, h->pid, (enum wk_role)h->role, h->name, c->ident, c->ident_len, x->now_ms(), &w);
	if (ret == -ESRCH)
		return fail(c, ret, "pid %u does not exist", h->pid);
	if (ret == -ENOSPC)
		return fail(c, ret, "max_workers (%zu) clients registered", x->workers->max);
	if (ret)
		return fail(c, ret, "cannot register: %s", strerror(-ret));
	w->rights = (uint8_t)rights;
	w->pid_verified = c->peer && c->peer->ipc && c->peer->has_cred && c->peer->pid == h->pid;
	w->uid = c->peer && c->peer->has_cred ? c->peer->uid : 0;
	Freekv__Welcome *wel = NEW(c, Freekv__Welcome, FREEKV__WELCOME__INIT);
	char *ring = ca(c, CFG_STR_MAX);
	if (!wel || !ring) {
		wk_remove(x->workers, w->id);
		return -ENOMEM;
	}
	if (h->role == FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER) {
		ret = dp_worker_add(x->dp, w->id, ring, CFG_STR_MAX, c->err, sizeof c->err);
		if (ret) {
			wk_remove(x->workers, w->id);
			return ret;
		}
		wel->ring_name = ring;
	}
	wel->worker_id = w->id;
	wel->has_protocol_version = true;
	wel->protocol_version = FREEKV__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
	wel->pool_name = (char *)dp_pool_name(x->dp);
	wel->pool_bytes = dp_pool_bytes(x->dp);
	wel->ring_entries = (uint32_t)x->cfg->ring_entries;
	wel->heartbeat_ms = (uint32_t)(x->cfg->heartbeat_timeout_ms / 3);
	if (x->cfg->hugetlbfs_path[0])
		wel->hugetlbfs_path = x->cfg->hugetlbfs_path;
	c->rep->welcome = wel;
	c->rep->body_case = FREEKV__REPLY__BODY_WELCOME;
	return 0;
}

static int h_heartbeat(struct call *c)
{
	const Freekv__Heartbeat *h = c->req->heartbeat;
	if (h->worker_id != c->w->id)
		return fail(c, -EPERM, "heartbeat for worker %u from worker %u", h->worker_id, c->w->id);
	if (h->stats) {
		struct wk_stats *st = &c->w->stats;
		st->has = true;
		st->decode_tok_s = h->stats->decode_tok_s;
		st->tokens_decoded = h->stats->tokens_decoded;
		st->pages_recalled = h->stats->pages_recalled;
		st->bytes_recalled = h->stats->bytes_recalled;
		st->correction_rate = h->stats->correction_rate;
		st->has_refresh = h->stats->has_full_step_rate;
		st->full_step_rate = h->stats->full_step_rate;
		st->tokens_fetched = h->stats->tokens_fetched;
		st->full_step_ms = h->stats->full_step_ms;
		st->n_layer_rate = h->stats->n_layer_full_step_rate < WK_MAX_LAYER_STATS ?
				   h->stats->n_layer_full_step_rate : WK_MAX_LAYER_STATS;
		if (st->n_layer_rate) /* protobuf-c leaves an empty repeated field NULL */
			memcpy(st->layer_rate, h->stats->layer_full_step_rate,
			       st->n_layer_rate * sizeof *st->layer_rate);
	}
	return reply_ack(c);
}

static int h_open(struct call *c)
{
	const Freekv__OpenSequence *o = c->req->open_sequence;
	struct rpc_ctx *x = &c->s->ctx;
	struct seq_geometry g = {
		o->geometry->n_layers, o->geometry->n_kv_heads, o->geometry->head_dim,
		o->geometry->page_size, (uint32_t)o->geometry->dtype,
	};
	struct seq *s = seq_find_name(x->seqs, o->name), *src = NULL;
	size_t had = s ? s->n_tokens : 0;
	bool created;
	int ret;
	if (o->has_prefix_ubatch && o->prefix_ubatch > PREFIX_MAX_UBATCH)
		return fail(c, -EINVAL, "prefix_ubatch %u above %u", o->prefix_ubatch, PREFIX_MAX_UBATCH);
	if ((o->cache_salt && strlen(o->cache_salt) > PREFIX_MAX_SALT) ||
	    (o->has_prefix_variant && o->prefix_variant.len > PREFIX_MAX_SALT))
		return fail(c, -EINVAL, "cache_salt or prefix_variant longer than %d bytes",
			    PREFIX_MAX_SALT);
	if (!s && !o->create && !(o->fork_from && o->fork_from[0]) && x->remote && x->remote->r) {
		/* Unknown here: perhaps published by another host (docs/design.md §8). */
		ret = remote_seq_adopt(x->remote, o->name, o->model_fingerprint.data,
				       o->model_fingerprint.len, &g, c->w != NULL, c->w ? c->w->uid : 0,
				       &s, c->err, sizeof c->err);
		if (ret)
			return ret;
		had = s->n_tokens;
	}
	if (o->fork_from && o->fork_from[0]) {
		/* Fork (docs/design.md §4): a new sequence that shares every full page of src. */
		if (s)
			return fail(c, -EEXIST, "cannot fork into '%s': it exists", o->name);
		if (!(src = seq_find_name(x->seqs, o->fork_from)))
			return fail(c, -ENOENT, "no sequence '%s' to fork", o->fork_from);
		if ((ret = may_use(c, src)))
			return ret;
		if (o->n_token_ids)
			return fail(c, -EINVAL, "a fork takes its token ids from '%s'", src->name);
	}
	ret = seq_open(x->seqs, o->name, o->model_fingerprint.data, o->model_fingerprint.len, &g,
		       o->token_ids, o->n_token_ids, x->cfg->max_tokens, o->create, &s, &created, c->err,
		       sizeof c->err);
	if (ret)
		return ret;
	if (created) {
		s->has_owner = c->w != NULL;
		s->owner_uid = c->w ? c->w->uid : 0;
		if (src && (src->fp_len != s->fp_len || memcmp(src->fp, s->fp, s->fp_len) ||
			    memcmp(&src->geo, &s->geo, sizeof s->geo))) {
			seq_remove(x->seqs, s);
			return fail(c, -EINVAL, "'%s' has another model fingerprint or geometry than "
				    "the fork asked for", src->name);
		}
		persist_seq_open(x->ps, s);
		ret = src ? dp_fork(x->dp, src, s, c->err, sizeof c->err)
		    : o->has_prefix_ubatch && o->prefix_ubatch && o->n_token_ids
			? dp_prefix_open(x->dp, s, o->prefix_ubatch, o->cache_salt,
					 o->has_prefix_variant ? o->prefix_variant.data : NULL,
					 o->has_prefix_variant ? o->prefix_variant.len : 0,
					 o->n_token_ids, c->err, sizeof c->err)
			: 0;
		if (ret) {
			persist_seq_remove(x->ps, s);
			seq_remove(x->seqs, s);
			return ret;
		}
		if (!src && s->prefix_ubatch && x->remote)
			remote_seq_prefix_extend(x->remote, s, o->n_token_ids);
	} else if (src) {
		return fail(c, -EEXIST, "cannot fork into '%s': it exists", o->name);
	} else if (s->n_tokens > had) {
		persist_seq_tokens(x->ps, s, had, s->tokens + had, s->n_tokens - had);
	}
	if (!created && (ret = may_use(c, s)))
		return ret;
	return reply_seq(c, s, false);
}

static int h_attach(struct call *c)
{
	struct rpc_ctx *x = &c->s->ctx;
	struct seq *s = lookup(c, true, c->req->attach->seq_id, NULL);
	if (!s)
		return -ENOENT;
	if (c->w->role != WK_ROLE_WORKER)
		return fail(c, -EPERM, "only workers attach sequences");
	int ret = may_use(c, s);
	if (ret)
		return ret;
	if (s->state != SEQ_ATTACHED && x->remote &&
	    (ret = remote_seq_claim(x->remote, s, c->err, sizeof c->err)))
		return ret;
	ret = seq_attach(s, c->w->id, c->err, sizeof c->err);
	if (ret)
		return ret;
	return reply_seq(c, s, true);
}

/* remote_publish = true: a sequence its worker detaches goes to Redis (docs/design.md §8). A
 * failure is logged; the detach stands. */
static void auto_publish(struct call *c, struct seq *s)
{
	struct rpc_ctx *x = &c->s->ctx;
	uint64_t blocks, bytes;
	char err[256];
	if (!x->remote || !x->remote->r || !x->cfg->remote_publish)
		return;
	if (remote_seq_publish(x->remote, s, &blocks, &bytes, err, sizeof err))
		log_warn("sequence '%s' not published: %s", s->name, err);
}

static int h_detach(struct call *c)
{
	struct seq *s = lookup(c, true, c->req->detach->seq_id, NULL);
	if (!s)
		return -ENOENT;
	int ret = seq_detach(s, c->w->id, c->err, sizeof c->err);
	if (ret)
		return ret;
	dp_worker_detach(c->s->ctx.dp, c->w->id, s);
	auto_publish(c, s);
	return reply_ack(c);
}

static int h_close(struct call *c)
{
	const Freekv__CloseSequence *cl = c->req->close_sequence;
	struct rpc_ctx *x = &c->s->ctx;
	struct seq *s = lookup(c, true, cl->seq_id, NULL);
	uint64_t blocks;
	if (!s)
		return -ENOENT;
	int ret = may_use(c, s);
	if (ret)
		return ret;
	if (s->state == SEQ_ATTACHED) {
		if (!c->w || s->worker_id != c->w->id)
			return fail(c, -EBUSY, "sequence '%s' is attached to worker %u", s->name, s->worker_id);
		dp_worker_detach(x->dp, c->w->id, s);
		seq_detach(s, c->w->id, NULL, 0);
	}
	if (!cl->drop)
		return reply_ack(c);
	ret = dp_drop_seq(x->dp, s, &blocks, c->err, sizeof c->err);
	if (ret)
		return ret;
	if (x->remote)
		remote_seq_release(x->remote, s);
	persist_seq_remove(x->ps, s);
	seq_remove(x->seqs, s);
	return reply_evicted(c, 1, blocks);
}

static int h_list_sequences(struct call *c)
{
	struct seq_table *t = c->s->ctx.seqs;
	Freekv__SequenceList *l = NEW(c, Freekv__SequenceList, FREEKV__SEQUENCE_LIST__INIT);
	if (!l || !(l->sequences = ca(c, (t->n + 1) * sizeof *l->sequences)))
		return -ENOMEM;
	for (size_t i = 0; i < t->n; i++) {
		/* A worker sees its own sequences; an admin (or the daemon itself) all of them. */
		if (c->peer && c->s->ctx.access && c->w && c->w->rights != ACCESS_ADMIN &&
		    t->v[i]->has_owner && t->v[i]->owner_uid != c->w->uid)
			continue;
		if (!(l->sequences[l->n_sequences++] = seq_info(c, t->v[i], false)))
			return -ENOMEM;
	}
	c->rep->sequences = l;
	c->rep->body_case = FREEKV__REPLY__BODY_SEQUENCES;
	return 0;
}

static int h_show_sequence(struct call *c)
{
	const Freekv__ShowSequence *sh = c->req->show_sequence;
	struct seq *s = lookup(c, sh->has_seq_id, sh->seq_id, sh->name);
	if (!s)
		return -ENOENT;
	int ret = may_use(c, s);
	return ret ? ret : reply_seq(c, s, sh->with_tokens);
}

static int h_list_workers(struct call *c)
{
	struct rpc_ctx *x = &c->s->ctx;
	struct wk_registry *r = x->workers;
	Freekv__WorkerList *l = NEW(c, Freekv__WorkerList, FREEKV__WORKER_LIST__INIT);
	if (!l || !(l->workers = ca(c, (r->max + 1) * sizeof *l->workers)))
		return -ENOMEM;
	uint64_t now = x->now_ms();
	for (size_t i = 0; i < r->max; i++) {
		struct wk_worker *w = &r->v[i];
		if (!w->id)
			continue;
		Freekv__WorkerInfo *wi = NEW(c, Freekv__WorkerInfo, FREEKV__WORKER_INFO__INIT);
		if (!wi)
			return -ENOMEM;
		wi->worker_id = w->id;
		wi->pid = w->pid;
		wi->role = (Freekv__ClientRole)w->role;
		wi->name = w->name;
		wi->leases = dp_worker_leases(x->dp, w->id);
		for (size_t k = 0; k < x->seqs->n; k++)
			wi->sequences += x->seqs->v[k]->state == SEQ_ATTACHED && x->seqs->v[k]->worker_id == w->id;
		wi->last_heartbeat_ms_ago = now - w->last_heartbeat_ms;
		if (w->stats.has) {
			Freekv__WorkerStats *st = NEW(c, Freekv__WorkerStats, FREEKV__WORKER_STATS__INIT);
			if (!st)
				return -ENOMEM;
			st->has_decode_tok_s = st->has_tokens_decoded = st->has_pages_recalled = true;
			st->has_bytes_recalled = st->has_correction_rate = true;
			st->decode_tok_s = w->stats.decode_tok_s;
			st->tokens_decoded = w->stats.tokens_decoded;
			st->pages_recalled = w->stats.pages_recalled;
			st->bytes_recalled = w->stats.bytes_recalled;
			st->correction_rate = w->stats.correction_rate;
			if (w->stats.has_refresh) {
				st->has_full_step_rate = st->has_tokens_fetched = true;
				st->has_full_step_ms = true;
				st->full_step_rate = w->stats.full_step_rate;
				st->tokens_fetched = w->stats.tokens_fetched;
				st->full_step_ms = w->stats.full_step_ms;
				st->n_layer_full_step_rate = w->stats.n_layer_rate;
				st->layer_full_step_rate = w->stats.layer_rate;
			}
			wi->stats = st;
		}
		l->workers[l->n_workers++] = wi;
	}
	c->rep->workers = l;
	c->rep->body_case = FREEKV__REPLY__BODY_WORKERS;
	return 0;
}

/* Drop (or demote) one sequence for Evict; attached sequences can only be demoted. */
static int evict_one(struct call *c, struct seq *s, bool demote, uint64_t *seqs, uint64_t *blocks)
{
	struct rpc_ctx *x = &c->s->ctx;
	uint64_t n = 0;
	int ret;
	if (demote) {
		ret = dp_demote_seq(x->dp, s, &n, c->err, sizeof c->err);
	} else {
		if (s->state == SEQ_ATTACHED)
			return fail(c, -EBUSY, "sequence '%s' is attached to worker %u (demote it instead)",
				    s->name, s->worker_id);
		ret = dp_drop_seq(x->dp, s, &n, c->err, sizeof c->err);
		if (!ret && x->remote)
			remote_seq_release(x->remote, s);
		if (!ret) {
			persist_seq_remove(x->ps, s);
			seq_remove(x->seqs, s);
		}
	}
	if (ret)
		return ret;
	++*seqs;
	*blocks += n;
	return 0;
}

static int h_evict(struct call *c)
{
	const Freekv__Evict *e = c->req->evict;
	struct seq_table *t = c->s->ctx.seqs;
	uint64_t seqs = 0, blocks = 0;
	int ret = 0;
	switch (e->target) {
	case FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE: {
		struct seq *s = lookup(c, e->has_seq_id, e->seq_id, e->name);
		if (!s)
			return -ENOENT;
		ret = evict_one(c, s, e->demote, &seqs, &blocks);
		break;
	}
	case FREEKV__EVICT_TARGET__EVICT_TARGET_WORKER:
		if (!e->has_worker_id || !wk_find(c->s->ctx.workers, e->worker_id))
			return fail(c, -ENOENT, "no worker %u", e->worker_id);
		for (size_t i = 0; i < t->n && !ret; i++)
			if (t->v[i]->state == SEQ_ATTACHED && t->v[i]->worker_id == e->worker_id)
				ret = evict_one(c, t->v[i], true, &seqs, &blocks);
		break;
	case FREEKV__EVICT_TARGET__EVICT_TARGET_DETACHED:
		for (size_t i = t->n; i-- > 0 && !ret;)
			if (t->v[i]->state != SEQ_ATTACHED)
				ret = evict_one(c, t->v[i], e->demote, &seqs, &blocks);
		/* Pages kept only by the prefix index go too (docs/design.md §4). */
		if (!ret && !e->demote)
			blocks += dp_prefix_evict(c->s->ctx.dp, UINT64_MAX);
		break;
	default:
		return fail(c, -EINVAL, "unknown evict target %d", e->target);
	}
	if (ret)
		return ret;
	return reply_evicted(c, seqs, blocks);
}

static int h_publish(struct call *c)
{
	const Freekv__Publish *p = c->req->publish;
	struct rpc_ctx *x = &c->s->ctx;
	struct seq *s = lookup(c, p->has_seq_id, p->seq_id, p->name);
	uint64_t blocks = 0, bytes = 0;
	if (!s)
		return -ENOENT;
	int ret = may_use(c, s);
	if (ret)
		return ret;
	if (s->state == SEQ_ATTACHED)
		return fail(c, -EBUSY, "sequence '%s' is attached to worker %u: detach it first",
			    s->name, s->worker_id);
	if (!x->remote || !x->remote->r)
		return fail(c, -ENODEV, "no remote tier configured (remote_url is empty)");
	ret = remote_seq_publish(x->remote, s, &blocks, &bytes, c->err, sizeof c->err);
	return ret ? ret : reply_evicted(c, 1, blocks);
}

static int h_demote(struct call *c)
{
	const Freekv__Demote *d = c->req->demote;
	struct seq *s = lookup(c, d->has_seq_id, d->seq_id, d->name);
	uint64_t seqs = 0, blocks = 0;
	if (!s)
		return -ENOENT;
	if (d->has_remote && d->remote) {
		int ret = dp_offload_seq(c->s->ctx.dp, s, &blocks, c->err, sizeof c->err);
		return ret ? ret : reply_evicted(c, 1, blocks);
	}
	int ret = evict_one(c, s, true, &seqs, &blocks);
	return ret ? ret : reply_evicted(c, seqs, blocks);
}

static Freekv__CommandStat *cmd_stat(struct call *c, const char *name, uint64_t calls, uint64_t errors,
				     uint64_t us, uint64_t refused)
{
	Freekv__CommandStat *cs = NEW(c, Freekv__CommandStat, FREEKV__COMMAND_STAT__INIT);
	if (cs) {
		cs->name = (char *)name;
		cs->calls = calls;
		cs->errors = errors;
		cs->total_us = us;
		cs->has_refused = true;
		cs->refused = refused;
	}
	return cs;
}

static Freekv__JournalStats *journal_stats_msg(struct call *c, const struct persist *ps)
{
	struct persist_stats p;
	Freekv__JournalStats *j = NEW(c, Freekv__JournalStats, FREEKV__JOURNAL_STATS__INIT);
	if (!j)
		return NULL;
	persist_stats(ps, &p);
	j->path = (char *)persist_journal_path(ps);
	j->bytes = p.journal_bytes;
	j->records = p.records;
	j->syncs = p.syncs;
	j->compactions = p.compactions;
	j->last_compaction_unix = (uint64_t)p.last_compaction;
	j->replayed = p.replayed;
	j->replay_ms = p.replay_ms;
	j->adopted_sequences = p.adopted_seqs;
	j->adopted_blocks = p.adopted_blocks;
	j->damaged_sequences = p.damaged_seqs;
	j->damaged_blocks = p.damaged_blocks;
	j->ignored_bytes = p.ignored_bytes;
	j->failed = p.failed;
	return j;
}

static Freekv__RemoteStats *remote_stats_msg(struct call *c, const struct remote_seq *rs)
{
	struct remote_seq_stats st;
	Freekv__RemoteStats *m = NEW(c, Freekv__RemoteStats, FREEKV__REMOTE_STATS__INIT);
	if (!m)
		return NULL;
	remote_seq_stats(rs, &st);
	m->url = (char *)remote_url(rs->r);
	m->ops = st.io.ops;
	m->errors = st.io.errors;
	m->bytes_put = st.io.bytes_put;
	m->bytes_got = st.io.bytes_got;
	m->total_us = st.io.total_us;
	m->crc_errors = st.io.crc_errors;
	m->published = st.published;
	m->adopted = st.adopted;
	m->owned = st.owned;
	m->has_cluster = true;
	m->cluster = remote_is_cluster(rs->r);
	struct dp_stats d;
	dp_stats(c->s->ctx.dp, &d);
	m->has_tier = m->has_tier_blocks = m->has_offloaded = m->has_fetched = true;
	m->has_tier_errors = m->has_tier_bytes_put = m->has_tier_bytes_got = m->has_tier_us = true;
	m->tier = d.remote_tier;
	m->tier_blocks = d.blocks_remote;
	m->offloaded = d.offloaded;
	m->fetched = d.fetched;
	m->tier_errors = d.remote_errors;
	m->tier_bytes_put = d.remote_io.bytes_put;
	m->tier_bytes_got = d.remote_io.bytes_got;
	m->tier_us = d.remote_io.total_us;
	return m;
}

static Freekv__PrefixStats *prefix_stats_msg(struct call *c, struct dp *dp)
{
	struct dp_prefix_stats p;
	Freekv__PrefixStats *m = NEW(c, Freekv__PrefixStats, FREEKV__PREFIX_STATS__INIT);
	if (!m)
		return NULL;
	dp_prefix_stats(dp, &p);
	m->lookups = p.lookups;
	m->hits = p.hits;
	m->misses = p.misses;
	m->pages_attached = p.pages_attached;
	m->tokens_saved = p.tokens_saved;
	m->indexed_pages = p.indexed_pages;
	m->shared_blocks = p.shared_blocks;
	m->forks = p.forks;
	m->has_remote_published = m->has_remote_pages = true;
	m->remote_published = p.remote_published;
	m->remote_pages = p.remote_pages;
	m->has_cached_blocks = m->has_evicted_pages = true;
	m->cached_blocks = p.cached_blocks;
	m->evicted_pages = p.evicted_pages;
	return m;
}

bool rpc_heap_in_use(uint64_t *bytes)
{
#ifdef __SANITIZE_ADDRESS__
	(void)bytes;
	return false; /* the sanitizer's allocator: mallinfo2 counts nothing */
#else
	struct mallinfo2 m = mallinfo2();
	*bytes = (uint64_t)m.uordblks + (uint64_t)m.hblkhd;
	return true;
#endif
}

static int h_stats(struct call *c)
{
	struct rpc_ctx *x = &c->s->ctx;
	struct dp_stats d;
	Freekv__StatsReply *r = NEW(c, Freekv__StatsReply, FREEKV__STATS_REPLY__INIT);
	size_t nc = rpc_n_commands();
	if (!r || !(r->commands = ca(c, (nc + 1) * sizeof *r->commands)) ||
	    !(r->ring_ops = ca(c, DP_N_OPS * sizeof *r->ring_ops)))
		return -ENOMEM;
	dp_stats(x->dp, &d);
	r->dram_bytes = d.dram_bytes;
	r->dram_used_bytes = d.dram_used_bytes;
	r->nvme_bytes = d.nvme_bytes;
	r->nvme_used_bytes = d.nvme_used_bytes;
	r->blocks_dram = d.blocks_dram;
	r->blocks_nvme = d.blocks_nvme;
	r->demoted_blocks = d.demoted;
	r->promoted_blocks = d.promoted;
	r->crc_errors = d.crc_errors;
	r->workers = (uint32_t)x->workers->n;
	r->sequences = (uint32_t)x->seqs->n;
	r->uptime_ms = x->now_ms() - x->start_ms;
	r->has_leases = r->has_pending_ops = r->has_tier_in_flight = true;
	r->leases = d.leases;
	r->pending_ops = d.pending_ops;
	r->tier_in_flight = d.tier_pending;
	r->has_swaps = r->has_swap_failures = true;
	r->swaps = d.swaps;
	r->swap_failures = d.swap_failures;
	r->has_heap_in_use_bytes = rpc_heap_in_use(&r->heap_in_use_bytes);
	r->has_demoted_unwritten = r->has_kept_blocks = r->has_nvme_kept_bytes = true;
	r->has_kept_reclaimed = r->has_nvme_unwritten_bytes = true;
	r->nvme_unwritten_bytes = d.nvme_unwritten_bytes;
	r->demoted_unwritten = d.demoted_unwritten;
	r->kept_blocks = d.blocks_kept;
	r->nvme_kept_bytes = d.nvme_kept_bytes;
	r->kept_reclaimed = d.kept_reclaimed;
	if (!(r->prefix = prefix_stats_msg(c, x->dp)))
		return -ENOMEM;
	if (x->remote && x->remote->r && !(r->remote = remote_stats_msg(c, x->remote)))
		return -ENOMEM;
	if (x->ps && !(r->journal = journal_stats_msg(c, x->ps)))
		return -ENOMEM;
	for (size_t i = 0; i < nc; i++) {
		struct rpc_stat *st = &c->s->stats[i];
		if (!(r->commands[r->n_commands++] = cmd_stat(c, rpc_command_name(i), st->calls, st->errors, st->total_us,
								     st->refused)))
			return -ENOMEM;
	}
	if (!(r->commands[r->n_commands++] = cmd_stat(c, "malformed", c->s->bad.calls, c->s->bad.errors, 0, 0)))
		return -ENOMEM;
	for (int k = 0; k < DP_N_OPS; k++)
		if (!(r->ring_ops[r->n_ring_ops++] = cmd_stat(c, dp_op_name(k), d.ops[k].calls, d.ops[k].errors,
							     d.ops[k].total_us, 0)))
			return -ENOMEM;
	c->rep->stats = r;
	c->rep->body_case = FREEKV__REPLY__BODY_STATS;
	return 0;
}

static int config_reply(struct call *c, const char *only)
{
	Freekv__ConfigReply *r = NEW(c, Freekv__ConfigReply, FREEKV__CONFIG_REPLY__INIT);
	if (!r || !(r->entries = ca(c, cfg_count() * sizeof *r->entries)))
		return -ENOMEM;
	for (size_t i = 0; i < cfg_count(); i++) {
		if (only && strcmp(only, cfg_key(i)) != 0)
			continue;
		Freekv__ConfigEntry *e = NEW(c, Freekv__ConfigEntry, FREEKV__CONFIG_ENTRY__INIT);
		char *v = ca(c, CFG_STR_MAX);
		if (!e || !v)
			return -ENOMEM;
		cfg_get(c->s->ctx.cfg, cfg_key(i), v, CFG_STR_MAX);
		e->key = (char *)cfg_key(i);
		e->value = v;
		e->runtime = cfg_runtime(i);
		e->help = (char *)cfg_help(i);
		r->entries[r->n_entries++] = e;
	}
	if (only && !r->n_entries)
		return fail(c, -ENOENT, "unknown key '%s'", only);
	c->rep->config = r;
	c->rep->body_case = FREEKV__REPLY__BODY_CONFIG;
	return 0;
}

static int h_config_get(struct call *c)
{
	return config_reply(c, c->req->config_get->key);
}

static int h_config_set(struct call *c)
{
	const Freekv__ConfigSet *cs = c->req->config_set;
	int ret = cfg_set(c->s->ctx.cfg, cs->key, cs->value, true, c->err, sizeof c->err);
	if (ret)
		return ret;
	log_set_level((enum log_level)c->s->ctx.cfg->log_level); /* in case it was log_level */
	log_info("config %s = %s (ConfigSet)", cs->key, cs->value);
	return config_reply(c, cs->key);
}

static int h_commit_tokens(struct call *c)
{
	const Freekv__CommitTokens *ct = c->req->commit_tokens;
	struct seq *s = lookup(c, true, ct->seq_id, NULL);
	if (!s)
		return -ENOENT;
	if (s->state != SEQ_ATTACHED || s->worker_id != c->w->id)
		return fail(c, -EPERM, "sequence '%s' is not attached to worker %u", s->name, c->w->id);
	if (ct->committed_tokens > (uint64_t)s->n_pages * s->geo.page_size)
		return fail(c, -ERANGE, "committed_tokens %" PRIu64 " beyond the %u allocated pages",
			    ct->committed_tokens, s->n_pages);
	uint64_t old = s->committed_tokens;
	int ret = seq_commit(s, ct->committed_tokens, ct->first, ct->token_ids, ct->n_token_ids,
			     c->s->ctx.cfg->max_tokens, c->err, sizeof c->err);
	if (ret)
		return ret;
	/* The tail blocks' new rows, then ids and length; synced before the reply (rpc_process). */
	if (ct->n_token_ids || old != s->committed_tokens) {
		dp_seq_committed(c->s->ctx.dp, s, old);
		persist_seq_tokens(c->s->ctx.ps, s, ct->first, ct->token_ids, ct->n_token_ids);
	}
	dp_prefix_publish(c->s->ctx.dp, s);
	return reply_ack(c);
}

/* A clean exit: attached sequences become detached (not orphaned), then the worker is gone. */
static int h_goodbye(struct call *c)
{
	struct rpc_ctx *x = &c->s->ctx;
	uint32_t wid = c->w->id;
	for (size_t i = 0; i < x->seqs->n; i++) {
		struct seq *s = x->seqs->v[i];
		if (s->state == SEQ_ATTACHED && s->worker_id == wid) {
			dp_worker_detach(x->dp, wid, s);
			seq_detach(s, wid, NULL, 0);
			auto_publish(c, s);
		}
	}
	dp_worker_gone(x->dp, wid);
	wk_remove(x->workers, wid);
	c->w = NULL;
	return reply_ack(c);
}

/* ---------------------------------------------------------------- table */

/* NEED_HELLO: refused before a Welcome (only Hello and the read-only Stats are not);
 * NEED_ADMIN: an admin verb (docs/design.md §4 "Access"). */
enum { NEED_WORKER = 1, NEED_HELLO = 2, NEED_ADMIN = 4 };

static const struct rpc_cmd {
	const char *name;
	Freekv__Request__BodyCase body;
	unsigned flags;
	int (*fn)(struct call *c);
} cmds[] = {
	{ "Hello", FREEKV__REQUEST__BODY_HELLO, 0, h_hello },
	{ "Heartbeat", FREEKV__REQUEST__BODY_HEARTBEAT, NEED_WORKER, h_heartbeat },
	{ "OpenSequence", FREEKV__REQUEST__BODY_OPEN_SEQUENCE, NEED_HELLO, h_open },
	{ "Attach", FREEKV__REQUEST__BODY_ATTACH, NEED_WORKER, h_attach },
	{ "Detach", FREEKV__REQUEST__BODY_DETACH, NEED_WORKER, h_detach },
	{ "CloseSequence", FREEKV__REQUEST__BODY_CLOSE_SEQUENCE, NEED_HELLO, h_close },
	{ "ListSequences", FREEKV__REQUEST__BODY_LIST_SEQUENCES, NEED_HELLO, h_list_sequences },
	{ "ShowSequence", FREEKV__REQUEST__BODY_SHOW_SEQUENCE, NEED_HELLO, h_show_sequence },
	{ "ListWorkers", FREEKV__REQUEST__BODY_LIST_WORKERS, NEED_HELLO, h_list_workers },
	{ "Evict", FREEKV__REQUEST__BODY_EVICT, NEED_HELLO | NEED_ADMIN, h_evict },
	{ "Demote", FREEKV__REQUEST__BODY_DEMOTE, NEED_HELLO | NEED_ADMIN, h_demote },
	{ "Stats", FREEKV__REQUEST__BODY_STATS, 0, h_stats },
	{ "ConfigGet", FREEKV__REQUEST__BODY_CONFIG_GET, NEED_HELLO, h_config_get },
	{ "ConfigSet", FREEKV__REQUEST__BODY_CONFIG_SET, NEED_HELLO | NEED_ADMIN, h_config_set },
	{ "CommitTokens", FREEKV__REQUEST__BODY_COMMIT_TOKENS, NEED_WORKER, h_commit_tokens },
	{ "Goodbye", FREEKV__REQUEST__BODY_GOODBYE, NEED_WORKER, h_goodbye },
	{ "Publish", FREEKV__REQUEST__BODY_PUBLISH, NEED_HELLO, h_publish },
};

#define N_CMDS (sizeof cmds / sizeof cmds[0])

size_t rpc_n_commands(void)
{
	return N_CMDS;
}

const char *rpc_command_name(size_t i)
{
	return i < N_CMDS ? cmds[i].name : NULL;
}

/* Checks that need the decoded request, before dispatch. */
static int dispatch(struct call *c, size_t *row)
{
	const Freekv__Request *q = c->req;
	struct rpc_ctx *x = &c->s->ctx;
	if (q->version != FREEKV__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT)
		return fail(c, -EPROTONOSUPPORT, "protocol version %u not supported (this daemon speaks %d)",
			    q->version, FREEKV__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT);
	if (q->body_case == FREEKV__REQUEST__BODY__NOT_SET)
		return fail(c, -EINVAL, "request has no body");
	for (*row = 0; *row < N_CMDS && cmds[*row].body != q->body_case; ++*row)
		;
	if (*row == N_CMDS)
		return fail(c, -EOPNOTSUPP, "unsupported request %d", q->body_case);
	if (q->has_worker_id && q->worker_id) {
		c->w = wk_check(x->workers, q->worker_id, c->ident, c->ident_len);
		if (!c->w)
			return fail(c, -EPERM, "worker id %u is unknown, dead, or not this connection's", q->worker_id);
		wk_heartbeat(c->w, x->now_ms());
	}
	if ((cmds[*row].flags & NEED_WORKER) && !c->w)
		return fail(c, -EPERM, "%s needs the worker_id of a welcomed client", cmds[*row].name);
	/* Rights (docs/design.md §4 "Access"); in-process callers are the daemon itself. */
	if (c->peer && x->access) {
		if ((cmds[*row].flags & NEED_HELLO) && !c->w)
			return refuse(c, "%s is refused before Hello: say Hello first", cmds[*row].name);
		if ((cmds[*row].flags & NEED_ADMIN) && c->w->rights != ACCESS_ADMIN) {
			char hint[CFG_STR_MAX + 128];
			return refuse(c, "%s needs admin rights and uid %u has worker rights; %s",
				      cmds[*row].name, c->w->uid,
				      access_admin_hint(x->access, hint, sizeof hint));
		}
	}
	int ret = cmds[*row].fn(c);
	if (ret && !c->err[0])
		snprintf(c->err, sizeof c->err, "%s: %s", cmds[*row].name, strerror(-ret));
	return ret;
}

/* rpc_process, with the journal synced before it returns (sync), or left to the caller, which
 * syncs before it sends the reply (rpc_serve's group commit). */
static int process(struct rpc_server *s, const void *ident, size_t ident_len,
		   const struct rpc_peer *peer, const void *data, size_t len, uint8_t **reply,
		   size_t *reply_len, bool sync)
{
	struct call c = { .s = s, .ident = ident, .ident_len = ident_len, .peer = peer };
	Freekv__Reply rep = FREEKV__REPLY__INIT;
	Freekv__Request *req = NULL;
	size_t row = N_CMDS;
	uint64_t t0 = now_us();
	int status;
	c.rep = &rep;
	if (len > s->ctx.cfg->max_request_bytes) {
		status = fail(&c, -EMSGSIZE, "request of %zu bytes exceeds max_request_bytes %" PRIu64, len,
			      s->ctx.cfg->max_request_bytes);
	} else if (!(req = freekv__request__unpack(NULL, len, data))) {
		status = fail(&c, -EBADMSG, "undecodable request (%zu bytes)", len);
	} else if ((status = pbcheck_strings(&freekv__request__descriptor, data, len, c.err,
					     sizeof c.err))) {
		rep.id = req->id;
	} else {
		c.req = req;
		rep.id = req->id;
		status = dispatch(&c, &row);
		/* What a reply reports as done is durable first (docs/design.md §4). */
		if (sync && persist_dirty(s->ctx.ps))
			persist_sync(s->ctx.ps);
	}
	if (status) {
		rep.body_case = FREEKV__REPLY__BODY__NOT_SET;
		rep.error = c.err;
	}
	rep.status = status;
	*reply_len = freekv__reply__get_packed_size(&rep);
	*reply = malloc(*reply_len ? *reply_len : 1);
	int ret = 0;
	if (*reply)
		freekv__reply__pack(&rep, *reply);
	else
		ret = -ENOMEM;
	arena_free(&c);
	if (req)
		freekv__request__free_unpacked(req, NULL);
	struct rpc_stat *st = row < N_CMDS ? &s->stats[row] : &s->bad;
	st->calls++;
	st->errors += status != 0;
	st->refused += c.refused;
	uint64_t us = now_us() - t0;
	st->total_us += us;
	if (s->latency)
		prom_hist_observe(s->latency, (double)us / 1e6);
	return ret;
}

int rpc_process(struct rpc_server *s, const void *ident, size_t ident_len,
		const struct rpc_peer *peer, const void *data, size_t len, uint8_t **reply,
		size_t *reply_len)
{
	return process(s, ident, ident_len, peer, data, len, reply, reply_len, true);
}

/* ---------------------------------------------------------------- socket */

static int bind_ipc_perms(struct rpc_server *s, const char *path, const char *group, char *err, size_t errlen)
{
	snprintf(s->ipc_path, sizeof s->ipc_path, "%s", path);
	if (chmod(path, 0660) < 0) {
		snprintf(err, errlen, "chmod %s: %s", path, strerror(errno));
		return -errno;
	}
	if (group && *group) {
		struct group *g = getgrnam(group);
		if (!g) {
			snprintf(err, errlen, "group '%s' does not exist", group);
			return -ENOENT;
		}
		if (chown(path, (uid_t)-1, g->gr_gid) < 0) {
			snprintf(err, errlen, "chown %s to group %s: %s", path, group, strerror(errno));
			return -errno;
		}
	}
	return 0;
}

int rpc_init(struct rpc_server *s, void *zctx, const struct rpc_ctx *ctx, char *err, size_t errlen)
{
	memset(s, 0, sizeof *s);
	s->ctx = *ctx;
	s->stats = calloc(N_CMDS, sizeof *s->stats);
	if (!s->stats)
		return -ENOMEM;
	s->sock = zmq_socket(zctx, ZMQ_ROUTER);
	if (!s->sock) {
		snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
		return -errno;
	}
	int linger = 500;
	zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger);
	const char *ep = ctx->cfg->endpoint;
	char addr[512];
	int pr = kvs_endpoint_prepare(s->sock, ep, addr, sizeof addr);
	if (pr || zmq_bind(s->sock, addr) != 0) {
		int e = pr ? -pr : errno;
		snprintf(err, errlen, "bind %s: %s", ep, zmq_strerror(e));
		zmq_close(s->sock);
		s->sock = NULL;
		return -e;
	}
	if (strncmp(ep, "ipc://", 6) == 0) {
		int ret = bind_ipc_perms(s, ep + 6, ctx->cfg->group, err, errlen);
		if (ret) {
			rpc_shutdown(s);
			return ret;
		}
	} else {
		log_warn("%s carries no peer credentials: the pid a client announces "
			"in Hello is not verified", ep);
	}
	return 0;
}

void rpc_shutdown(struct rpc_server *s)
{
	if (s->sock)
		zmq_close(s->sock);
	if (s->ipc_path[0])
		unlink(s->ipc_path);
	free(s->stats);
	free(s->held);
	memset(s, 0, sizeof *s);
}

/* The sender of m as libzmq saw the connection (see rpc.h). */
static void peer_of(const struct rpc_server *s, zmq_msg_t *m, struct rpc_peer *p)
{
	memset(p, 0, sizeof *p);
	p->ipc = s->ipc_path[0] != '\0';
	if (p->ipc)
		rpc_peer_parse(zmq_msg_gets(m, "Peer-Address"), p);
}

/* Receive one multipart message: frames[0] is the routing identity. Returns the frame count
 * (frames beyond RPC_MAX_FRAMES are received and dropped, and the count says so), 0 when
 * nothing is waiting, or -errno. */
static int recv_frames(void *sock, zmq_msg_t *frames, int *total)
{
	int n = 0, more = 1;
	*total = 0;
	while (more) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, sock, n == 0 && *total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
			int e = errno;
			zmq_msg_close(&m);
			for (int i = 0; i < n; i++)
				zmq_msg_close(&frames[i]);
			return e == EAGAIN ? 0 : -e;
		}
		more = zmq_msg_more(&m);
		++*total;
		if (n < RPC_MAX_FRAMES)
			frames[n++] = m;
		else
			zmq_msg_close(&m);
	}
	return n;
}

/* A reply rpc_serve holds until the journal records it reports are synced. */
struct held_reply {
	uint8_t *ident;
	size_t ident_len;
	bool delim;
	uint8_t *rep;
	size_t rep_len;
};

static void send_reply(struct rpc_server *s, const void *ident, size_t ident_len, bool delim,
		       const uint8_t *rep, size_t rep_len)
{
	zmq_send(s->sock, ident, ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	if (delim)
		zmq_send(s->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(s->sock, rep, rep_len, ZMQ_DONTWAIT);
}

/* One journal sync for the held replies' records, then the replies, in order. need: the sync
 * generation that covers what they journaled (0: nothing). */
static void flush_held(struct rpc_server *s, struct held_reply *held, int *n_held, uint64_t need)
{
	if (need && s->ctx.dp)
		dp_wait_durable(s->ctx.dp, need); /* ring ops go on meanwhile */
	else if (need)
		persist_sync(s->ctx.ps);
	for (int i = 0; i < *n_held; i++) {
		send_reply(s, held[i].ident, held[i].ident_len, held[i].delim, held[i].rep,
			   held[i].rep_len);
		free(held[i].ident);
		free(held[i].rep);
	}
	*n_held = 0;
}

/* Group commit (docs/design.md §4 "Restart without loss"): the messages waiting are handled
 * first, their replies held; then one journal sync covers every record they wrote, and the
 * replies go out in the order the requests came. A worker that sends a batch's CommitTokens
 * together (kvs_commit_tokens_many) waits for one sync, not one per sequence. Where the hold
 * cannot be allocated, each request syncs and is answered at once, as rpc_process does. */
int rpc_serve(struct rpc_server *s, int budget)
{
	int handled = 0, n_held = 0;
	if (budget > s->held_cap) { /* grown once: the daemon serves with one budget */
		struct held_reply *h = realloc(s->held, (size_t)budget * sizeof *h);
		if (h) {
			s->held = h;
			s->held_cap = budget;
		}
	}
	struct held_reply *held = budget <= s->held_cap ? s->held : NULL;
	uint64_t need = 0; /* the sync generation the held replies wait for */
	while (handled < budget) {
		zmq_msg_t f[RPC_MAX_FRAMES];
		int total, n = recv_frames(s->sock, f, &total);
		if (n <= 0)
			break;
		handled++;
		const void *ident = zmq_msg_data(&f[0]);
		size_t ident_len = zmq_msg_size(&f[0]);
		/* DEALER: [id][payload]; REQ: [id][empty][payload]. */
		bool delim = total == 3 && zmq_msg_size(&f[1]) == 0;
		uint8_t *rep = NULL;
		size_t rep_len = 0;
		if (total == 2 || delim) {
			zmq_msg_t *p = &f[total - 1];
			struct rpc_peer peer;
			peer_of(s, p, &peer);
			uint64_t a0 = persist_appended(s->ctx.ps);
			process(s, ident, ident_len, &peer, zmq_msg_data(p), zmq_msg_size(p), &rep,
				&rep_len, !held);
			if (persist_appended(s->ctx.ps) != a0)
				need = persist_need(s->ctx.ps); /* it journaled: its reply waits */
		} else {
			Freekv__Reply r = FREEKV__REPLY__INIT;
			char msg[96];
			snprintf(msg, sizeof msg, "expected [payload] or [empty][payload], got %d frames", total - 1);
			r.status = -EPROTO;
			r.error = msg;
			rep_len = freekv__reply__get_packed_size(&r);
			rep = malloc(rep_len ? rep_len : 1);
			if (rep)
				freekv__reply__pack(&r, rep);
			s->bad.calls++;
			s->bad.errors++;
		}
		uint8_t *id_copy = held && rep ? malloc(ident_len ? ident_len : 1) : NULL;
		if (id_copy) {
			memcpy(id_copy, ident, ident_len);
			held[n_held++] = (struct held_reply){ id_copy, ident_len, delim, rep, rep_len };
		} else if (rep) {
			/* Not held (no memory for it): the replies held before it go first, all
			 * after the sync that makes what they report durable. */
			flush_held(s, held, &n_held, need);
			need = 0;
			if (persist_dirty(s->ctx.ps))
				persist_sync(s->ctx.ps);
			send_reply(s, ident, ident_len, delim, rep, rep_len);
			free(rep);
		}
		for (int i = 0; i < n; i++)
			zmq_msg_close(&f[i]);
	}
	if (n_held)
		flush_held(s, held, &n_held, need);
	return handled;
}

void rpc_notify_shutdown(struct rpc_server *s)
{
	Freekv__Reply r = FREEKV__REPLY__INIT;
	Freekv__Notice n = FREEKV__NOTICE__INIT;
	uint8_t buf[128];
	n.what = "shutdown";
	r.status = -ESHUTDOWN;
	r.error = "kvstored is shutting down";
	r.body_case = FREEKV__REPLY__BODY_NOTICE;
	r.notice = &n;
	size_t len = freekv__reply__pack(&r, buf);
	struct wk_registry *reg = s->ctx.workers;
	for (size_t i = 0; i < reg->max; i++) {
		struct wk_worker *w = &reg->v[i];
		if (!w->id || w->dead)
			continue;
		zmq_send(s->sock, w->ident, w->ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
		zmq_send(s->sock, buf, len, ZMQ_DONTWAIT);
	}
}
