/* remote — kvstored's link to Redis. See remote.h. */
#include "remote.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "clock.h"
#include "crc32c.h"
#include "errmsg.h"
#include "log.h"

#define KEY_MAX 400

struct remote {
	char url[256], host[200], ns[128], id[128];
	int port;
	uint32_t timeout_ms, lease_ms;
	redisContext *c;
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

int remote_open(const struct remote_config *c, struct remote **out, char *err, size_t errlen)
{
	const char *u = c->url;
	if (strncmp(u, "redis://", 8))
		return errmsg(err, errlen, -EINVAL, "remote_url '%s': expected redis://HOST:PORT "
			      "(Redis Cluster is not supported yet)", u);
	const char *h = u + 8, *colon = strrchr(h, ':');
	char *end;
	long port = colon ? strtol(colon + 1, &end, 10) : 6379;
	size_t hl = colon ? (size_t)(colon - h) : strlen(h);
	if (!hl || hl >= sizeof ((struct remote *)0)->host || port < 1 || port > 65535 ||
	    (colon && *end))
		return errmsg(err, errlen, -EINVAL, "remote_url '%s': expected redis://HOST:PORT", u);
	struct remote *r = calloc(1, sizeof *r);
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	snprintf(r->url, sizeof r->url, "%s", u);
	memcpy(r->host, h, hl);
	r->port = (int)port;
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
	if (r->c)
		redisFree(r->c);
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

static int fail_ctx(struct remote *r, char *err, size_t errlen)
{
	int e = ctx_errno(r->c);
	if (e == -EAGAIN || e == -EWOULDBLOCK || e == -ETIMEDOUT) {
		e = -ETIMEDOUT;
		errmsg_set(err, errlen, "Redis at %s: no answer within %u ms (remote_timeout_ms)",
			   r->url, r->timeout_ms);
	} else {
		errmsg_set(err, errlen, "Redis at %s: %s", r->url, r->c->errstr[0] ? r->c->errstr :
			   strerror(-e));
	}
	redisFree(r->c); /* made again at the next call */
	r->c = NULL;
	r->st.errors++;
	return e;
}

static int connect_now(struct remote *r, char *err, size_t errlen)
{
	if (r->c)
		return 0;
	struct timeval tv = { r->timeout_ms / 1000, (long)(r->timeout_ms % 1000) * 1000 };
	errno = 0;
	redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	r->c = c;
	if (c->err || redisSetTimeout(c, tv) != REDIS_OK)
		return fail_ctx(r, err, errlen);
	r->st.reconnects++;
	return 0;
}

/* One command of a pipeline: up to 8 arguments; key and value buffers it owns (freed after). */
struct cmd {
	int argc;
	const char *argv[8];
	size_t len[8];
	char key[KEY_MAX];
	void *own;
};

typedef int (*reply_fn)(void *ctx, size_t i, const redisReply *rep, char *err, size_t errlen);

/* Reads and drops the n replies still due for a window after a failed one. */
static void drain(struct remote *r, size_t n)
{
	for (size_t k = 0; k < n && r->c; k++) {
		void *skip = NULL;
		if (redisGetReply(r->c, &skip) != REDIS_OK) {
			fail_ctx(r, NULL, 0);
			return;
		}
		freeReplyObject(skip);
	}
}

/* Sends cmds[0..n) in windows of REMOTE_WINDOW and hands each reply to fn (NULL: any non-error
 * reply is fine). Stops at the first failure: a transport error drops the connection. */
static int pipeline(struct remote *r, struct cmd *cmds, size_t n, reply_fn fn, void *ctx,
		    char *err, size_t errlen)
{
	uint64_t t0 = clock_ns();
	int ret = connect_now(r, err, errlen);
	for (size_t w = 0; !ret && w < n; w += REMOTE_WINDOW) {
		size_t m = n - w < REMOTE_WINDOW ? n - w : REMOTE_WINDOW;
		for (size_t i = 0; i < m && !ret; i++) {
			struct cmd *c = &cmds[w + i];
			if (redisAppendCommandArgv(r->c, c->argc, c->argv, c->len) != REDIS_OK)
				ret = fail_ctx(r, err, errlen);
		}
		for (size_t i = 0; i < m && !ret; i++) {
			void *v = NULL;
			if (redisGetReply(r->c, &v) != REDIS_OK) {
				ret = fail_ctx(r, err, errlen);
				break;
			}
			const redisReply *rep = v;
			r->st.ops++;
			if (rep->type == REDIS_REPLY_ERROR)
				ret = errmsg(err, errlen, -EIO, "Redis at %s: %s", r->url, rep->str);
			else if (fn)
				ret = fn(ctx, w + i, rep, err, errlen);
			if (ret) {
				r->st.errors++;
				drain(r, m - i - 1); /* the rest of the window's replies */
			}
			freeReplyObject(v);
		}
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
	snprintf(key, KEY_MAX, "%s:blk:%s:%" PRIu64 ":%u:%u", r->ns, name, gen, layer, page);
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
	snprintf(c.key, KEY_MAX, "%s:seq:%s", r->ns, name);
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
	snprintf(c.key, KEY_MAX, "%s:seq:%s", r->ns, name);
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
	snprintf(c->key, KEY_MAX, "%s:owner:%s", r->ns, name);
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
	for (size_t w = 0; w < n; w += REMOTE_WINDOW) {
		size_t m = n - w < REMOTE_WINDOW ? n - w : REMOTE_WINDOW;
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
