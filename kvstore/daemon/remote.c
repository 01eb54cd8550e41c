/* remote — kvstored's link to Redis. See remote.h. */
#include "remote.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "clock.h"
#include "crc32c.h"
#include "errmsg.h"
#include "log.h"

#define KEY_MAX 400
#define MAX_NODES 16
#define N_SLOTS 16384

/* One Redis server: a seed from remote_url, or a cluster master CLUSTER SLOTS named. */
struct node {
	char host[200];
	int port;
	redisContext *c;
};

struct remote {
	char url[256], ns[128], id[128];
	uint32_t timeout_ms, lease_ms;
	struct node nodes[MAX_NODES];
	unsigned n_nodes, n_seeds;
	bool probed;			/* whether the server is a cluster is known */
	bool cluster;
	uint8_t slot_node[N_SLOTS];	/* cluster: the node serving each hash slot */
	struct remote_stats st;
};

/* The lease scripts: atomic, so that two hosts never both believe they own a name. */
static const char lua_take[] =
	"local v = redis.call('GET', KEYS[1]) "
	"if not v or v == ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) "
	"return redis.status_reply('OK') end return v";
static const char lua_renew[] =
	"if redis.call('GET', KEYS[1]) == ARGV[1] then "
	"return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
static const char lua_give[] =
	"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
	"return 0";

/* A node by address, added when new; -1 when the table is full. */
static int node_index(struct remote *r, const char *host, size_t hl, int port)
{
	for (unsigned i = 0; i < r->n_nodes; i++)
		if (r->nodes[i].port == port && strlen(r->nodes[i].host) == hl &&
		    !memcmp(r->nodes[i].host, host, hl))
			return (int)i;
	if (r->n_nodes == MAX_NODES || hl >= sizeof r->nodes[0].host)
		return -1;
	struct node *n = &r->nodes[r->n_nodes];
	memcpy(n->host, host, hl);
	n->host[hl] = 0;
	n->port = port;
	return (int)r->n_nodes++;
}

void remote_default_host_id(const char *configured, const char *shm_name, char *out, size_t len)
{
	if (configured && configured[0]) {
		snprintf(out, len, "%s", configured);
		return;
	}
	char host[64] = "host";
	gethostname(host, sizeof host - 1);
	snprintf(out, len, "%s:%s", host, shm_name);
}

int remote_open(const struct remote_config *c, struct remote **out, char *err, size_t errlen)
{
	const char *u = c->url;
	if (strncmp(u, "redis://", 8))
		return errmsg(err, errlen, -EINVAL, "remote_url '%s': expected "
			      "redis://HOST:PORT[,HOST:PORT...]", u);
	struct remote *r = calloc(1, sizeof *r);
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	/* HOST:PORT seeds, comma-separated: one server, or nodes of a Redis Cluster. */
	for (const char *h = u + 8; *h;) {
		const char *comma = strchr(h, ','), *stop = comma ? comma : h + strlen(h);
		const char *colon = memrchr(h, ':', (size_t)(stop - h));
		char *end = NULL;
		long port = colon ? strtol(colon + 1, &end, 10) : 6379;
		size_t hl = colon ? (size_t)(colon - h) : (size_t)(stop - h);
		if (!hl || port < 1 || port > 65535 || (colon && end != stop) ||
		    node_index(r, h, hl, (int)port) < 0) {
			free(r);
			return errmsg(err, errlen, -EINVAL, "remote_url '%s': expected "
				      "redis://HOST:PORT[,HOST:PORT...] (at most %d)", u, MAX_NODES);
		}
		h = comma ? comma + 1 : stop;
	}
	r->n_seeds = r->n_nodes;
	if (!r->n_seeds) {
		free(r);
		return errmsg(err, errlen, -EINVAL, "remote_url '%s': no HOST:PORT", u);
	}
	snprintf(r->url, sizeof r->url, "%s", u);
	snprintf(r->ns, sizeof r->ns, "%s", c->ns);
	snprintf(r->id, sizeof r->id, "%s", c->host_id);
	r->timeout_ms = c->timeout_ms ? c->timeout_ms : 2000;
	r->lease_ms = c->lease_ms ? c->lease_ms : 30000;
	*out = r;
	return 0;
}

void remote_close(struct remote *r)
{
	if (!r)
		return;
	for (unsigned i = 0; i < r->n_nodes; i++)
		if (r->nodes[i].c)
			redisFree(r->nodes[i].c);
	free(r);
}

const char *remote_url(const struct remote *r)
{
	return r->url;
}

const char *remote_host_id(const struct remote *r)
{
	return r->id;
}

bool remote_is_cluster(const struct remote *r)
{
	return r->cluster;
}

void remote_stats(const struct remote *r, struct remote_stats *st)
{
	*st = r->st;
}

/* hiredis reports I/O errors as text (and errno): an errno for the caller. */
static int ctx_errno(const redisContext *c)
{
	if (c->err == REDIS_ERR_IO)
		return errno ? -errno : -EIO;
	if (strstr(c->errstr, "refused"))
		return -ECONNREFUSED;
	if (strstr(c->errstr, "timed out") || strstr(c->errstr, "temporarily"))
		return -ETIMEDOUT;
	return c->err == REDIS_ERR_EOF ? -ECONNRESET : -EIO;
}

static int fail_node(struct remote *r, struct node *n, char *err, size_t errlen)
{
	int e = ctx_errno(n->c);
	if (e == -EAGAIN || e == -EWOULDBLOCK || e == -ETIMEDOUT) {
		e = -ETIMEDOUT;
		errmsg_set(err, errlen, "Redis at %s:%d: no answer within %u ms (remote_timeout_ms)",
			   n->host, n->port, r->timeout_ms);
	} else {
		errmsg_set(err, errlen, "Redis at %s:%d: %s", n->host, n->port,
			   n->c->errstr[0] ? n->c->errstr : strerror(-e));
	}
	redisFree(n->c); /* made again at the next call */
	n->c = NULL;
	r->st.errors++;
	return e;
}

static int connect_node(struct remote *r, struct node *n, char *err, size_t errlen)
{
	if (n->c)
		return 0;
	struct timeval tv = { r->timeout_ms / 1000, (long)(r->timeout_ms % 1000) * 1000 };
	errno = 0;
	redisContext *c = redisConnectWithTimeout(n->host, n->port, tv);
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	n->c = c;
	if (c->err || redisSetTimeout(c, tv) != REDIS_OK)
		return fail_node(r, n, err, errlen);
	r->st.reconnects++;
	return 0;
}

/* Reads CLUSTER SLOTS into the slot map. */
static int read_slots(struct remote *r, const redisReply *rep, char *err, size_t errlen)
{
	unsigned covered = 0;
	for (size_t i = 0; i < rep->elements; i++) {
		const redisReply *e = rep->element[i];
		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER ||
		    e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
			return errmsg(err, errlen, -EPROTO, "unexpected CLUSTER SLOTS reply");
		long long lo = e->element[0]->integer, hi = e->element[1]->integer;
		const redisReply *m = e->element[2];
		if (lo < 0 || hi >= N_SLOTS || lo > hi || m->element[0]->type != REDIS_REPLY_STRING ||
		    m->element[1]->type != REDIS_REPLY_INTEGER)
			return errmsg(err, errlen, -EPROTO, "unexpected CLUSTER SLOTS reply");
		int k = node_index(r, m->element[0]->str, m->element[0]->len,
				   (int)m->element[1]->integer);
		if (k < 0)
			return errmsg(err, errlen, -E2BIG, "more than %d Redis nodes", MAX_NODES);
		for (long long sl = lo; sl <= hi; sl++)
			r->slot_node[sl] = (uint8_t)k;
		covered += (unsigned)(hi - lo + 1);
	}
	if (covered != N_SLOTS)
		return errmsg(err, errlen, -EAGAIN, "Redis Cluster at %s serves %u of %d slots (not "
			      "ready?)", r->url, covered, N_SLOTS);
	return 0;
}

/* Whether the server is a cluster, and if so which node serves which slot: asked of the first
 * seed that answers, once, and again after a MOVED or ASK. */
static int probe(struct remote *r, char *err, size_t errlen)
{
	if (r->probed)
		return 0;
	int ret = -ENOENT;
	for (unsigned i = 0; i < r->n_seeds && !r->probed; i++) {
		struct node *n = &r->nodes[i];
		if ((ret = connect_node(r, n, err, errlen)))
			continue;
		redisReply *rep = redisCommand(n->c, "CLUSTER SLOTS");
		if (!rep) {
			ret = fail_node(r, n, err, errlen);
			continue;
		}
		r->st.ops++;
		if (rep->type == REDIS_REPLY_ERROR) { /* cluster support disabled: one server */
			if (i) { /* the node that answered serves everything */
				struct node t = r->nodes[0];
				r->nodes[0] = *n;
				*n = t;
			}
			r->cluster = false;
			r->probed = true;
			ret = 0;
		} else if (rep->type == REDIS_REPLY_ARRAY) {
			ret = read_slots(r, rep, err, errlen);
			r->cluster = r->probed = !ret;
		} else {
			ret = errmsg(err, errlen, -EPROTO, "unexpected CLUSTER SLOTS reply");
		}
		freeReplyObject(rep);
	}
	return ret;
}

/* Redis Cluster's hash slot of a key: CRC16 (XMODEM) of its hash tag ({...}) or of all of it. */
static unsigned key_slot(const char *key)
{
	size_t len = strlen(key);
	const char *open = strchr(key, '{'), *close = open ? strchr(open + 1, '}') : NULL;
	if (open && close && close > open + 1) {
		key = open + 1;
		len = (size_t)(close - open - 1);
	}
	uint16_t crc = 0;
	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)((uint8_t)key[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc & (N_SLOTS - 1);
}

/* One command of a pipeline: up to 8 arguments; key and value buffers it owns (freed after). */
struct cmd {
	int argc;
	const char *argv[8];
	size_t len[8];
	char key[KEY_MAX];
	char num[24];		/* a numeric argument's text (an expiry) */
	void *own;
};

typedef int (*reply_fn)(void *ctx, size_t i, const redisReply *rep, char *err, size_t errlen);

/* Reads and drops the n replies still due for a window after a failed one. */
static void drain(struct remote *r, struct node *nd, size_t n)
{
	for (size_t k = 0; k < n && nd->c; k++) {
		void *skip = NULL;
		if (redisGetReply(nd->c, &skip) != REDIS_OK) {
			fail_node(r, nd, NULL, 0);
			return;
		}
		freeReplyObject(skip);
	}
}

/* The window loop of pipeline() on one node; *moved when the cluster said the slot is served
 * elsewhere (MOVED, ASK). */
static int run(struct remote *r, struct node *nd, struct cmd *cmds, size_t n, reply_fn fn,
	       void *ctx, bool *moved, char *err, size_t errlen)
{
	int ret = 0;
	for (size_t w = 0; !ret && w < n; w += REMOTE_WINDOW) {
		size_t m = n - w < REMOTE_WINDOW ? n - w : REMOTE_WINDOW;
		for (size_t i = 0; i < m && !ret; i++) {
			struct cmd *c = &cmds[w + i];
			if (redisAppendCommandArgv(nd->c, c->argc, c->argv, c->len) != REDIS_OK)
				ret = fail_node(r, nd, err, errlen);
		}
		for (size_t i = 0; i < m && !ret; i++) {
			void *v = NULL;
			if (redisGetReply(nd->c, &v) != REDIS_OK) {
				ret = fail_node(r, nd, err, errlen);
				break;
			}
			const redisReply *rep = v;
			r->st.ops++;
			if (rep->type == REDIS_REPLY_ERROR) {
				*moved = !strncmp(rep->str, "MOVED ", 6) || !strncmp(rep->str, "ASK ", 4);
				ret = errmsg(err, errlen, -EIO, "Redis at %s:%d: %s", nd->host, nd->port,
					     rep->str);
			} else if (fn) {
				ret = fn(ctx, w + i, rep, err, errlen);
			}
			if (ret) {
				r->st.errors++;
				drain(r, nd, m - i - 1); /* the rest of the window's replies */
			}
			freeReplyObject(v);
		}
	}
	return ret;
}

/* Sends cmds[0..n) (keys of one hash slot: every key names one sequence in a hash tag) in
 * windows of REMOTE_WINDOW to the node that serves them and hands each reply to fn (NULL: any
 * non-error reply is fine). Stops at the first failure: a transport error drops that node's
 * connection. When a cluster answers MOVED or ASK, the slots are mapped again and the calls
 * (all idempotent) run once more. Frees the commands' buffers. */
static int pipeline(struct remote *r, struct cmd *cmds, size_t n, reply_fn fn, void *ctx,
		    char *err, size_t errlen)
{
	uint64_t t0 = clock_ns();
	int ret = 0;
	for (int attempt = 0; attempt < 2; attempt++) {
		bool moved = false;
		if ((ret = probe(r, err, errlen)))
			break;
		struct node *nd = &r->nodes[r->cluster && n ? r->slot_node[key_slot(cmds[0].key)] : 0];
		ret = connect_node(r, nd, err, errlen);
		if (!ret)
			ret = run(r, nd, cmds, n, fn, ctx, &moved, err, errlen);
		if (!moved)
			break;
		r->probed = false;
	}
	for (size_t i = 0; i < n; i++)
		free(cmds[i].own);
	r->st.total_us += (clock_ns() - t0) / 1000;
	return ret;
}

static void arg(struct cmd *c, const void *p, size_t len)
{
	c->argv[c->argc] = p;
	c->len[c->argc++] = len;
}

static void sarg(struct cmd *c, const char *s)
{
	arg(c, s, strlen(s));
}

static void block_key(const struct remote *r, char *key, const char *name, uint64_t gen,
		      uint32_t layer, uint32_t page)
{
	snprintf(key, KEY_MAX, "%s:{%s}:blk:%" PRIu64 ":%u:%u", r->ns, name, gen, layer, page);
}

static void le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int remote_put_blocks(struct remote *r, const char *name, uint64_t gen,
		      const struct remote_block *b, size_t n, char *err, size_t errlen)
{
	int ret = 0;
	for (size_t w = 0; !ret && w < n; w += REMOTE_WINDOW) {
		size_t m = n - w < REMOTE_WINDOW ? n - w : REMOTE_WINDOW;
		struct cmd cmds[REMOTE_WINDOW];
		memset(cmds, 0, m * sizeof *cmds);
		for (size_t i = 0; i < m; i++) {
			const struct remote_block *x = &b[w + i];
			struct cmd *c = &cmds[i];
			uint8_t *v = malloc((size_t)x->len + 4);
			if (!v) {
				for (size_t k = 0; k < i; k++)
					free(cmds[k].own);
				return errmsg(err, errlen, -ENOMEM, "out of memory");
			}
			le32(v, crc32c(0, x->data, x->len));
			memcpy(v + 4, x->data, x->len);
			c->own = v;
			block_key(r, c->key, name, gen, x->layer, x->page);
			sarg(c, "SET");
			sarg(c, c->key);
			arg(c, v, (size_t)x->len + 4);
			r->st.bytes_put += x->len;
		}
		ret = pipeline(r, cmds, m, NULL, NULL, err, errlen);
	}
	return ret;
}

struct get_ctx {
	struct remote *r;
	const char *name;
	struct remote_block *b;
};

static int got_block(void *ctx, size_t i, const redisReply *rep, char *err, size_t errlen)
{
	struct get_ctx *g = ctx;
	struct remote_block *x = &g->b[i];
	if (rep->type == REDIS_REPLY_NIL)
		return errmsg(err, errlen, -ENOENT, "Redis at %s: block (layer %u, page %u) of '%s' "
			      "is missing", g->r->url, x->layer, x->page, g->name);
	if (rep->type != REDIS_REPLY_STRING || rep->len != (size_t)x->len + 4) {
		g->r->st.crc_errors++;
		return errmsg(err, errlen, -EBADMSG, "Redis at %s: block (layer %u, page %u) of '%s' "
			      "has %zu bytes, not %u", g->r->url, x->layer, x->page, g->name,
			      rep->type == REDIS_REPLY_STRING ? rep->len : 0, x->len + 4);
	}
	const uint8_t *v = (const uint8_t *)rep->str;
	uint32_t want = rd32(v), got = crc32c(0, v + 4, x->len);
	if (want != got) {
		g->r->st.crc_errors++;
		return errmsg(err, errlen, -EBADMSG, "Redis at %s: block (layer %u, page %u) of '%s' "
			      "fails its checksum (crc32c %08x, stored %08x)", g->r->url, x->layer,
			      x->page, g->name, got, want);
	}
	memcpy(x->data, v + 4, x->len);
	g->r->st.bytes_got += x->len;
	return 0;
}

int remote_get_blocks(struct remote *r, const char *name, uint64_t gen, struct remote_block *b,
		      size_t n, char *err, size_t errlen)
{
	int ret = 0;
	for (size_t w = 0; !ret && w < n; w += REMOTE_WINDOW) {
		size_t m = n - w < REMOTE_WINDOW ? n - w : REMOTE_WINDOW;
		struct cmd cmds[REMOTE_WINDOW];
		memset(cmds, 0, m * sizeof *cmds);
		for (size_t i = 0; i < m; i++) {
			block_key(r, cmds[i].key, name, gen, b[w + i].layer, b[w + i].page);
			sarg(&cmds[i], "GET");
			sarg(&cmds[i], cmds[i].key);
		}
		struct get_ctx g = { r, name, b + w };
		ret = pipeline(r, cmds, m, got_block, &g, err, errlen);
	}
	return ret;
}

void remote_drop_blocks(struct remote *r, const char *name, uint64_t gen, uint32_t n_layers,
			uint32_t pages)
{
	size_t n = (size_t)n_layers * pages;
	for (size_t w = 0; w < n; w += REMOTE_WINDOW) {
		size_t m = n - w < REMOTE_WINDOW ? n - w : REMOTE_WINDOW;
		struct cmd cmds[REMOTE_WINDOW];
		memset(cmds, 0, m * sizeof *cmds);
		for (size_t i = 0; i < m; i++) {
			size_t k = w + i;
			block_key(r, cmds[i].key, name, gen, (uint32_t)(k % n_layers),
				  (uint32_t)(k / n_layers));
			sarg(&cmds[i], "DEL");
			sarg(&cmds[i], cmds[i].key);
		}
		char err[256];
		if (pipeline(r, cmds, m, NULL, NULL, err, sizeof err)) {
			log_warn("%s (blocks of an older copy of '%s' stay)", err, name);
			return;
		}
	}
}

static void op_key(const struct remote *r, const struct remote_tier_op *o, char *key)
{
	if (o->key[0])
		snprintf(key, KEY_MAX, "%s", o->key);
	else
		snprintf(key, KEY_MAX, "%s:{tier:%s}:%" PRIu64, r->ns, r->id, o->id);
}

struct tier_ctx {
	struct remote *r;
	struct remote_tier_op *ops;
};

static int got_tier(void *ctx, size_t i, const redisReply *rep, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	struct tier_ctx *t = ctx;
	struct remote_tier_op *o = &t->ops[i];
	if (o->kind != REMOTE_TIER_GET)
		return 0;
	if (rep->type == REDIS_REPLY_NIL) {
		char k[KEY_MAX];
		op_key(t->r, o, k);
		o->status = errmsg(o->err, sizeof o->err, -ENOENT, "block %s is missing from Redis",
				   k);
		return 0;
	}
	const uint8_t *v = (const uint8_t *)rep->str;
	uint32_t want = o->key[0] ? rd32(v) : o->crc; /* a published value carries its own */
	if (rep->type != REDIS_REPLY_STRING || rep->len != (size_t)o->len + 4 || rd32(v) != want ||
	    crc32c(0, v + 4, o->len) != want) {
		t->r->st.crc_errors++;
		char k[KEY_MAX];
		op_key(t->r, o, k);
		o->status = errmsg(o->err, sizeof o->err, -EBADMSG, "block %s in Redis fails its "
				   "checksum (expected crc32c %08x)", k, want);
		return 0;
	}
	memcpy(o->buf, v + 4, o->len);
	t->r->st.bytes_got += o->len;
	return 0;
}

/* "EX seconds" after a SET or GETEX; nothing for 0. */
static void ttl_arg(struct cmd *c, uint32_t ttl_s)
{
	if (!ttl_s)
		return;
	snprintf(c->num, sizeof c->num, "%" PRIu32, ttl_s);
	sarg(c, "EX");
	sarg(c, c->num);
}

void remote_tier_batch(struct remote *r, struct remote_tier_op *ops, size_t n)
{
	/* One pipeline per run of keys in one hash slot (a cluster node answers for its slots). */
	char k0[KEY_MAX], k1[KEY_MAX];
	for (size_t w = 0; w < n;) {
		size_t m = 1;
		op_key(r, &ops[w], k0);
		for (; w + m < n && m < REMOTE_WINDOW; m++) {
			op_key(r, &ops[w + m], k1);
			if (key_slot(k1) != key_slot(k0))
				break;
		}
		struct cmd cmds[REMOTE_WINDOW];
		memset(cmds, 0, m * sizeof *cmds);
		int ret = 0;
		for (size_t i = 0; i < m; i++) {
			struct remote_tier_op *o = &ops[w + i];
			struct cmd *c = &cmds[i];
			o->status = 0;
			o->err[0] = 0;
			op_key(r, o, c->key);
			if (o->kind == REMOTE_TIER_PUT) {
				uint8_t *v = malloc((size_t)o->len + 4);
				if (!v) {
					ret = -ENOMEM;
					break;
				}
				le32(v, o->crc);
				memcpy(v + 4, o->buf, o->len);
				c->own = v;
				sarg(c, "SET");
				sarg(c, c->key);
				arg(c, v, (size_t)o->len + 4);
				ttl_arg(c, o->ttl_s);
				r->st.bytes_put += o->len;
			} else if (o->kind == REMOTE_TIER_GET && o->ttl_s) {
				sarg(c, "GETEX"); /* Redis >= 6.2: read and renew the expiry */
				sarg(c, c->key);
				ttl_arg(c, o->ttl_s);
			} else {
				sarg(c, o->kind == REMOTE_TIER_GET ? "GET" : "DEL");
				sarg(c, c->key);
			}
		}
		char err[160];
		struct tier_ctx t = { r, ops + w };
		if (!ret)
			ret = pipeline(r, cmds, m, got_tier, &t, err, sizeof err);
		else
			for (size_t i = 0; i < m; i++)
				free(cmds[i].own);
		if (ret) /* the transport (or memory) failed: every op of the window did */
			for (size_t i = 0; i < m; i++) {
				ops[w + i].status = ret;
				snprintf(ops[w + i].err, sizeof ops[w + i].err, "%s",
					 ret == -ENOMEM ? "out of memory" : err);
			}
		w += m;
	}
}

void remote_prefix_key(const struct remote *r, const uint8_t key[32], uint32_t layer, char *out,
		       size_t len)
{
	char hex[65];
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", key[i]);
	snprintf(out, len, "%s:{pfx:%s}:%u", r->ns, hex, layer);
}

void remote_published_key(const struct remote *r, const char *name, uint64_t gen,
			  uint32_t layer, uint32_t page, char *key, size_t len)
{
	char k[KEY_MAX];
	block_key(r, k, name, gen, layer, page);
	snprintf(key, len, "%s", k);
}

int remote_put_meta(struct remote *r, const char *name, const struct remote_meta *m, char *err,
		    size_t errlen)
{
	struct cmd c = { 0 };
	uint8_t geo[20];
	uint32_t g[5] = { m->geo.n_layers, m->geo.n_kv_heads, m->geo.head_dim, m->geo.page_size,
			  m->geo.dtype };
	for (int i = 0; i < 5; i++)
		le32(geo + 4 * i, g[i]);
	uint8_t *tok = malloc(m->n_tokens * 4 + 1);
	if (!tok)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	for (size_t i = 0; i < m->n_tokens; i++)
		le32(tok + 4 * i, m->tokens[i]);
	c.own = tok;
	char committed[24], gen[24];
	snprintf(committed, sizeof committed, "%" PRIu64, m->committed);
	snprintf(gen, sizeof gen, "%" PRIu64, m->gen);
	snprintf(c.key, KEY_MAX, "%s:{%s}:seq", r->ns, name);
	/* HSET key geo .. fp .. committed .. tokens .. gen .. host ..: 14 arguments, in two
	 * commands of the one pipeline (struct cmd holds 8). */
	struct cmd cmds[2] = { 0 };
	cmds[0] = c;
	sarg(&cmds[0], "HSET");
	sarg(&cmds[0], cmds[0].key);
	sarg(&cmds[0], "geo");
	arg(&cmds[0], geo, sizeof geo);
	sarg(&cmds[0], "fp");
	arg(&cmds[0], m->fp, m->fp_len);
	sarg(&cmds[0], "tokens");
	arg(&cmds[0], tok, m->n_tokens * 4);
	snprintf(cmds[1].key, KEY_MAX, "%s", c.key);
	sarg(&cmds[1], "HSET");
	sarg(&cmds[1], cmds[1].key);
	sarg(&cmds[1], "committed");
	sarg(&cmds[1], committed);
	sarg(&cmds[1], "gen");
	sarg(&cmds[1], gen);
	sarg(&cmds[1], "host");
	sarg(&cmds[1], m->host);
	/* MULTI/EXEC would need a third round; the gen field is written last, in the second
	 * command, so a reader sees either the old gen or the new one with the new fields. */
	return pipeline(r, cmds, 2, NULL, NULL, err, errlen);
}

struct meta_ctx {
	struct remote_meta *m;
	bool found;
};

static int got_meta(void *ctx, size_t i, const redisReply *rep, char *err, size_t errlen)
{
	(void)i;
	struct meta_ctx *mc = ctx;
	struct remote_meta *m = mc->m;
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements % 2)
		return errmsg(err, errlen, -EPROTO, "unexpected HGETALL reply");
	if (!rep->elements)
		return 0;
	mc->found = true;
	unsigned seen = 0;
	for (size_t k = 0; k + 1 < rep->elements; k += 2) {
		const redisReply *f = rep->element[k], *v = rep->element[k + 1];
		if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			continue;
		if (!strcmp(f->str, "geo") && v->len == 20) {
			const uint8_t *p = (const uint8_t *)v->str;
			m->geo = (struct seq_geometry){ rd32(p), rd32(p + 4), rd32(p + 8), rd32(p + 12),
							rd32(p + 16) };
			seen |= 1;
		} else if (!strcmp(f->str, "fp") && v->len && v->len <= SEQ_FP_MAX) {
			memcpy(m->fp, v->str, v->len);
			m->fp_len = v->len;
			seen |= 2;
		} else if (!strcmp(f->str, "tokens") && v->len % 4 == 0) {
			free(m->tokens);
			m->n_tokens = v->len / 4;
			m->tokens = malloc(m->n_tokens * 4 + 4);
			if (!m->tokens)
				return errmsg(err, errlen, -ENOMEM, "out of memory");
			for (size_t t = 0; t < m->n_tokens; t++)
				m->tokens[t] = rd32((const uint8_t *)v->str + 4 * t);
			seen |= 4;
		} else if (!strcmp(f->str, "committed")) {
			m->committed = strtoull(v->str, NULL, 10);
			seen |= 8;
		} else if (!strcmp(f->str, "gen")) {
			m->gen = strtoull(v->str, NULL, 10);
			seen |= 16;
		} else if (!strcmp(f->str, "host")) {
			snprintf(m->host, sizeof m->host, "%s", v->str);
		}
	}
	if (seen != 31)
		return errmsg(err, errlen, -EBADMSG, "incomplete sequence metadata in Redis");
	return 0;
}

int remote_get_meta(struct remote *r, const char *name, struct remote_meta *m, char *err,
		    size_t errlen)
{
	struct cmd c = { 0 };
	memset(m, 0, sizeof *m);
	snprintf(c.key, KEY_MAX, "%s:{%s}:seq", r->ns, name);
	sarg(&c, "HGETALL");
	sarg(&c, c.key);
	struct meta_ctx mc = { m, false };
	int ret = pipeline(r, &c, 1, got_meta, &mc, err, errlen);
	if (!ret && !mc.found)
		ret = errmsg(err, errlen, -ENOENT, "no sequence '%s' in Redis at %s", name, r->url);
	if (ret) {
		free(m->tokens);
		m->tokens = NULL;
	}
	return ret;
}

static void lease_cmd(struct remote *r, struct cmd *c, const char *script, const char *name,
		      char *ms)
{
	snprintf(c->key, KEY_MAX, "%s:{%s}:owner", r->ns, name);
	snprintf(ms, 24, "%u", r->lease_ms);
	sarg(c, "EVAL");
	sarg(c, script);
	sarg(c, "1");
	sarg(c, c->key);
	sarg(c, r->id);
	sarg(c, ms);
}

struct lease_ctx {
	const char *name;
	bool ok;
};

static int got_lease(void *ctx, size_t i, const redisReply *rep, char *err, size_t errlen)
{
	(void)i;
	struct lease_ctx *l = ctx;
	if (rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK")) {
		l->ok = true;
		return 0;
	}
	if (rep->type == REDIS_REPLY_STRING)
		return errmsg(err, errlen, -EBUSY, "sequence '%s' is owned by host %s (a Redis "
			      "lease); it must publish it first", l->name, rep->str);
	return errmsg(err, errlen, -EPROTO, "unexpected lease reply");
}

int remote_lease(struct remote *r, const char *name, char *err, size_t errlen)
{
	struct cmd c = { 0 };
	char ms[24];
	lease_cmd(r, &c, lua_take, name, ms);
	struct lease_ctx l = { name, false };
	return pipeline(r, &c, 1, got_lease, &l, err, errlen);
}

struct renew_ctx {
	size_t renewed;
};

static int got_renew(void *ctx, size_t i, const redisReply *rep, char *err, size_t errlen)
{
	(void)i;
	(void)err;
	(void)errlen;
	struct renew_ctx *c = ctx;
	c->renewed += rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
	return 0;
}

size_t remote_renew(struct remote *r, const char *const *names, size_t n)
{
	struct renew_ctx rc = { 0 };
	char e0[256];
	probe(r, e0, sizeof e0);
	/* One server: every lease in one pipeline. A cluster spreads the names over its slots:
	 * one call each. */
	size_t per = r->cluster ? 1 : REMOTE_WINDOW;
	for (size_t w = 0; w < n; w += per) {
		size_t m = n - w < per ? n - w : per;
		struct cmd cmds[REMOTE_WINDOW];
		char ms[REMOTE_WINDOW][24];
		memset(cmds, 0, m * sizeof *cmds);
		for (size_t i = 0; i < m; i++)
			lease_cmd(r, &cmds[i], lua_renew, names[w + i], ms[i]);
		char err[256];
		if (pipeline(r, cmds, m, got_renew, &rc, err, sizeof err)) {
			log_warn("renewing leases: %s", err);
			break;
		}
	}
	return rc.renewed;
}

int remote_unlease(struct remote *r, const char *name, char *err, size_t errlen)
{
	struct cmd c = { 0 };
	char ms[24];
	lease_cmd(r, &c, lua_give, name, ms);
	c.argc = 5; /* no duration */
	return pipeline(r, &c, 1, NULL, NULL, err, errlen);
}
