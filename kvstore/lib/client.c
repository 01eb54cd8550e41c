/* client — libfreekv_store: the ZeroMQ request path, pool and ring mapping. See freekv_store.h. */
#include "clock.h"
#include "freekv_store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "pool_map.h"

#define KVS_ERR_MAX 512
#define KVS_RING_SLICE_MS 50
#define KVS_RING_TIMEOUT_MS 60000

struct kvs {
	void *zctx, *sock;
	int timeout_ms;
	uint64_t next_id, next_user;
	uint32_t worker_id, heartbeat_ms;
	bool shutdown;
	struct pool_map pool;
	bool pool_mapped;
	struct ring *ring;
	struct kvs_ring_timing last;	/* of the last ring_sync */
	void *mon;		/* PAIR socket receiving the control socket's connection events */
	enum { LINK_PENDING, LINK_UP, LINK_REFUSED, LINK_LOST } link;
	char endpoint[256];
	char token[256];	/* sent in Hello: tcp endpoints with an auth_token_file */
	char err[KVS_ERR_MAX];
	char notice[KVS_ERR_MAX];	/* the daemon's shutdown message, kept for later calls */
};

static int seterr(struct kvs *k, int ret, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(k->err, sizeof k->err, fmt, ap);
	va_end(ap);
	return ret;
}

/* Connection events of the control socket (a ZeroMQ socket monitor), read without blocking:
 * they tell "no daemon at this endpoint" (a connect refused before any succeeded) and "the
 * daemon went away" (a disconnect after a connect) apart from a slow reply, so a request fails
 * at once instead of at its timeout. ZeroMQ keeps reconnecting underneath: a daemon that comes
 * back puts the link up again. */
static void drain_monitor(struct kvs *k)
{
	for (;;) {
		zmq_msg_t ev, addr;
		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, k->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			return;
		}
		uint16_t id = 0;
		if (zmq_msg_size(&ev) >= sizeof id)
			memcpy(&id, zmq_msg_data(&ev), sizeof id);
		zmq_msg_close(&ev);
		zmq_msg_init(&addr); /* the second frame: the endpoint */
		if (zmq_msg_recv(&addr, k->mon, ZMQ_DONTWAIT) >= 0)
			zmq_msg_close(&addr);
		/* A lost link stays lost: ZeroMQ may reconnect to a restarted daemon, which knows
		 * neither this session's worker id nor its ring (docs/design.md §4). */
		if (id == ZMQ_EVENT_CONNECTED && k->link != LINK_LOST)
			k->link = LINK_UP;
		else if (id == ZMQ_EVENT_DISCONNECTED && k->link == LINK_UP)
			k->link = LINK_LOST;
		else if (id == ZMQ_EVENT_CONNECT_RETRIED && k->link != LINK_UP)
			k->link = k->link == LINK_LOST ? LINK_LOST : LINK_REFUSED;
	}
}

/* 0 while the link may still answer; else the error a waiting request should end with. */
static int link_error(struct kvs *k)
{
	if (!k->mon)
		return 0;
	drain_monitor(k);
	if (k->link == LINK_REFUSED)
		return seterr(k, -ECONNREFUSED, "no kvstored answers at %s (connection refused)",
			      k->endpoint);
	if (k->link == LINK_LOST)
		return seterr(k, -ECONNRESET, "kvstored at %s is gone (connection lost)", k->endpoint);
	return 0;
}

static void monitor_start(struct kvs *k)
{
	char name[64];
	snprintf(name, sizeof name, "inproc://kvs-monitor-%p", (void *)k);
	if (zmq_socket_monitor(k->sock, name, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
						      ZMQ_EVENT_DISCONNECTED) != 0)
		return; /* without events, requests still end at their timeout */
	k->mon = zmq_socket(k->zctx, ZMQ_PAIR);
	if (k->mon && zmq_connect(k->mon, name) != 0) {
		zmq_close(k->mon);
		k->mon = NULL;
	}
}

int kvs_endpoint_prepare(void *sock, const char *endpoint, char *out, size_t outlen)
{
	static const char local[] = "tcp://localhost:";
	int n;
	if (strncmp(endpoint, local, sizeof local - 1) == 0)
		n = snprintf(out, outlen, "tcp://127.0.0.1:%s", endpoint + sizeof local - 1);
	else
		n = snprintf(out, outlen, "%s", endpoint);
	if (n < 0 || (size_t)n >= outlen)
		return -ENAMETOOLONG;
	if (strncmp(out, "tcp://[", 7) == 0) {
		int on = 1;
		zmq_setsockopt(sock, ZMQ_IPV6, &on, sizeof on);
	}
	return 0;
}

int kvs_connect(const char *endpoint, int timeout_ms, struct kvs **out)
{
	struct kvs *k = calloc(1, sizeof *k);
	if (!k)
		return -ENOMEM;
	k->timeout_ms = timeout_ms > 0 ? timeout_ms : 5000;
	k->next_id = 1;
	k->next_user = 1;
	k->zctx = zmq_ctx_new();
	if (!k->zctx) {
		free(k);
		return -ENOMEM;
	}
	k->sock = zmq_socket(k->zctx, ZMQ_DEALER);
	int linger = 0;
	if (!k->sock) {
		int e = errno;
		zmq_ctx_term(k->zctx);
		free(k);
		return -e;
	}
	zmq_setsockopt(k->sock, ZMQ_LINGER, &linger, sizeof linger);
	zmq_setsockopt(k->sock, ZMQ_SNDTIMEO, &k->timeout_ms, sizeof k->timeout_ms);
	char ep[512];
	snprintf(k->endpoint, sizeof k->endpoint, "%s", endpoint);
	const char *tf = getenv("FREEKV_TOKEN_FILE");
	if (tf && *tf && kvs_set_token_file(k, tf))
		fprintf(stderr, "libfreekv_store: FREEKV_TOKEN_FILE: %s\n", k->err);
	monitor_start(k);
	int ret = kvs_endpoint_prepare(k->sock, endpoint, ep, sizeof ep);
	if (ret || zmq_connect(k->sock, ep) != 0) {
		int e = ret ? -ret : errno;
		if (k->mon)
			zmq_close(k->mon);
		zmq_close(k->sock);
		zmq_ctx_term(k->zctx);
		free(k);
		return -e;
	}
	*out = k;
	return 0;
}

void kvs_close(struct kvs *k)
{
	if (!k)
		return;
	if (k->worker_id && !k->shutdown) {
		/* Best effort: without it the daemon notices at process exit or heartbeat timeout. */
		Freekv__Request q = FREEKV__REQUEST__INIT;
		Freekv__Empty e = FREEKV__EMPTY__INIT;
		q.body_case = FREEKV__REQUEST__BODY_GOODBYE;
		q.goodbye = &e;
		k->timeout_ms = k->timeout_ms < 1000 ? k->timeout_ms : 1000;
		kvs_call(k, &q, NULL);
	}
	if (k->ring)
		ring_close(k->ring);
	if (k->pool_mapped)
		pool_unmap(&k->pool);
	if (k->mon) {
		zmq_socket_monitor(k->sock, NULL, 0);
		zmq_setsockopt(k->mon, ZMQ_LINGER, &(int){ 0 }, sizeof(int));
		zmq_close(k->mon);
	}
	zmq_close(k->sock);
	zmq_ctx_term(k->zctx);
	free(k);
}

void kvs_abandon(struct kvs *k)
{
	if (!k)
		return;
	k->shutdown = true;
	kvs_close(k);
}

int kvs_pool_take(struct kvs *k, struct kvs *old)
{
	struct stat a, b;
	if (!k->pool_mapped || !old->pool_mapped)
		return seterr(k, -EINVAL, "no pool mapping to take");
	if (fstat(k->pool.fd, &a) < 0 || fstat(old->pool.fd, &b) < 0)
		return seterr(k, -errno, "fstat of the pool segment: %s", strerror(errno));
	if (a.st_dev != b.st_dev || a.st_ino != b.st_ino || k->pool.bytes != old->pool.bytes)
		return seterr(k, -ESTALE, "kvstored maps a new pool segment: what the old one held "
			      "is gone");
	pool_unmap(&k->pool);
	k->pool = old->pool;
	old->pool_mapped = false;
	return 0;
}

const char *kvs_error(const struct kvs *k)
{
	return k->err;
}

uint32_t kvs_worker_id(const struct kvs *k)
{
	return k->worker_id;
}

void *kvs_pool_base(const struct kvs *k)
{
	return k->pool_mapped ? k->pool.base : NULL;
}

uint64_t kvs_pool_bytes(const struct kvs *k)
{
	return k->pool_mapped ? k->pool.bytes : 0;
}

uint32_t kvs_heartbeat_ms(const struct kvs *k)
{
	return k->heartbeat_ms;
}

void kvs_reply_free(Freekv__Reply *r)
{
	if (r)
		freekv__reply__free_unpacked(r, NULL);
}

/* Takes a decoded notice (id 0): the daemon is going away. */
static int on_notice(struct kvs *k, Freekv__Reply *r)
{
	k->shutdown = true;
	seterr(k, 0, "%s", r->error ? r->error : "kvstored sent a notice");
	snprintf(k->notice, sizeof k->notice, "%s", k->err);
	freekv__reply__free_unpacked(r, NULL);
	return -ESHUTDOWN;
}

/* Reads notices without blocking (used while waiting on the ring). */
static void poll_notices(struct kvs *k)
{
	for (;;) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, k->sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&m);
			return;
		}
		Freekv__Reply *r = freekv__reply__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
		zmq_msg_close(&m);
		if (r && r->id == 0)
			on_notice(k, r);
		else if (r)
			freekv__reply__free_unpacked(r, NULL);
	}
}

int kvs_set_token_file(struct kvs *k, const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return seterr(k, -errno, "token file %s: %s", path, strerror(errno));
	char line[sizeof k->token];
	bool ok = fgets(line, sizeof line, f) != NULL;
	fclose(f);
	line[ok ? strcspn(line, "\r\n") : 0] = '\0';
	if (!line[0])
		return seterr(k, -EINVAL, "token file %s: empty", path);
	memcpy(k->token, line, sizeof line);
	return 0;
}

/* kvs_call's checks before a send: a Hello first where one is needed (docs/design.md §4
 * "Access": everything but Hello and Stats needs a Welcome; a client that has not said Hello
 * says it now, as a control session), pending notices (late replies of timed-out requests are
 * dropped here too), the link. */
static int call_ready(struct kvs *k, const Freekv__Request *req)
{
	if (!k->worker_id && !k->shutdown && req->body_case != FREEKV__REQUEST__BODY_HELLO &&
	    req->body_case != FREEKV__REQUEST__BODY_STATS) {
		int ret = kvs_hello(k, KVS_ROLE_CONTROL, "kvs");
		if (ret)
			return ret;
	}
	poll_notices(k);
	if (k->shutdown)
		return seterr(k, -ESHUTDOWN, "%s", k->notice);
	if (k->mon) {
		drain_monitor(k);
		if (k->link == LINK_LOST)
			return link_error(k);
	}
	return 0;
}

/* Sends req under the next request id (set in req->id). */
static int call_send(struct kvs *k, Freekv__Request *req)
{
	req->version = FREEKV__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
	req->id = k->next_id++;
	if (k->worker_id) {
		req->has_worker_id = true;
		req->worker_id = k->worker_id;
	}
	size_t len = freekv__request__get_packed_size(req);
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf)
		return seterr(k, -ENOMEM, "out of memory");
	freekv__request__pack(req, buf);
	int rc = zmq_send(k->sock, buf, len, 0);
	free(buf);
	if (rc < 0) {
		if (errno == EAGAIN)
			return seterr(k, -EHOSTUNREACH, "kvstored is not reachable (nothing accepted the connection)");
		return seterr(k, -errno, "send: %s", zmq_strerror(errno));
	}
	return 0;
}

/* Waits until deadline (clock_ms) for the reply to request id; replies to other ids (late
 * replies of requests that timed out) are dropped. */
static int call_recv(struct kvs *k, uint64_t id, uint64_t deadline, Freekv__Reply **out)
{
	for (;;) {
		uint64_t t = clock_ms();
		if (t >= deadline)
			return seterr(k, -ETIMEDOUT, "no reply from kvstored at %s within %d ms",
				      k->endpoint, k->timeout_ms);
		zmq_pollitem_t it[2] = { { .socket = k->sock, .events = ZMQ_POLLIN },
					 { .socket = k->mon, .events = ZMQ_POLLIN } };
		if (zmq_poll(it, k->mon ? 2 : 1, (long)(deadline - t)) < 0) {
			if (errno == EINTR)
				continue;
			return seterr(k, -errno, "poll: %s", zmq_strerror(errno));
		}
		if (!(it[0].revents & ZMQ_POLLIN)) {
			int le = link_error(k);
			if (le)
				return le;
			continue;
		}
		zmq_msg_t m;
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, k->sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&m);
			continue;
		}
		Freekv__Reply *r = freekv__reply__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
		zmq_msg_close(&m);
		if (!r)
			return seterr(k, -EBADMSG, "undecodable reply from kvstored");
		if (r->id == 0)
			return on_notice(k, r);
		if (r->id != id) { /* a late reply to a request that timed out */
			freekv__reply__free_unpacked(r, NULL);
			continue;
		}
		int status = r->status;
		if (status) {
			seterr(k, status, "%s", r->error ? r->error : strerror(-status));
			freekv__reply__free_unpacked(r, NULL);
			return status > 0 ? -EPROTO : status;
		}
		k->err[0] = '\0';
		if (out)
			*out = r;
		else
			freekv__reply__free_unpacked(r, NULL);
		return 0;
	}
}

int kvs_call(struct kvs *k, Freekv__Request *req, Freekv__Reply **out)
{
	if (out)
		*out = NULL;
	int ret = call_ready(k, req) ?: call_send(k, req);
	if (ret)
		return ret;
	return call_recv(k, req->id, clock_ms() + (uint64_t)k->timeout_ms, out);
}

int kvs_hello(struct kvs *k, enum kvs_role role, const char *name)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Hello h = FREEKV__HELLO__INIT;
	Freekv__Reply *r;
	char err[POOL_ERR_LEN];
	h.role = (Freekv__ClientRole)role;
	h.pid = (uint32_t)getpid();
	h.name = (char *)name;
	if (k->token[0])
		h.auth_token = k->token;
	q.body_case = FREEKV__REQUEST__BODY_HELLO;
	q.hello = &h;
	int ret = kvs_call(k, &q, &r);
	if (ret)
		return ret;
	if (r->body_case != FREEKV__REPLY__BODY_WELCOME) {
		kvs_reply_free(r);
		return seterr(k, -EPROTO, "Hello answered without a Welcome");
	}
	const Freekv__Welcome *w = r->welcome;
	k->heartbeat_ms = w->heartbeat_ms;
	if (role == KVS_ROLE_WORKER) {
		ret = pool_map(w->pool_name, w->hugetlbfs_path, w->pool_bytes, &k->pool, err, sizeof err);
		if (ret) {
			seterr(k, ret, "map pool %s: %s", w->pool_name, err);
			goto out;
		}
		k->pool_mapped = true;
		if (!w->ring_name) {
			ret = seterr(k, -EPROTO, "Welcome names no ring");
			goto out;
		}
		ret = ring_open(w->ring_name, &k->ring, err, sizeof err);
		if (ret) {
			seterr(k, ret, "map ring %s: %s", w->ring_name, err);
			goto out;
		}
	}
	k->worker_id = w->worker_id;
out:
	kvs_reply_free(r);
	return ret;
}

int kvs_heartbeat(struct kvs *k)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Heartbeat h = FREEKV__HEARTBEAT__INIT;
	h.worker_id = k->worker_id;
	q.body_case = FREEKV__REQUEST__BODY_HEARTBEAT;
	q.heartbeat = &h;
	return kvs_call(k, &q, NULL);
}

int kvs_open_sequence(struct kvs *k, const char *name, const void *fp, size_t fp_len,
		      const struct kvs_geometry *g, const uint32_t *tokens, size_t n_tokens, bool create,
		      uint64_t *seq_id)
{
	return kvs_open_sequence_px(k, name, fp, fp_len, g, tokens, n_tokens, create, NULL, seq_id,
				    NULL);
}

int kvs_open_sequence_px(struct kvs *k, const char *name, const void *fp, size_t fp_len,
			 const struct kvs_geometry *g, const uint32_t *tokens, size_t n_tokens,
			 bool create, const struct kvs_prefix_req *px, uint64_t *seq_id,
			 uint64_t *covered)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__OpenSequence o = FREEKV__OPEN_SEQUENCE__INIT;
	Freekv__Geometry geo = FREEKV__GEOMETRY__INIT;
	Freekv__Reply *r;
	geo.n_layers = g->n_layers;
	geo.n_kv_heads = g->n_kv_heads;
	geo.head_dim = g->head_dim;
	geo.page_size = g->page_size;
	geo.dtype = (Freekv__DType)g->dtype;
	o.name = (char *)name;
	o.model_fingerprint.data = (uint8_t *)fp;
	o.model_fingerprint.len = fp_len;
	o.geometry = &geo;
	o.token_ids = (uint32_t *)tokens;
	o.n_token_ids = n_tokens;
	o.has_create = true;
	o.create = create;
	if (px && px->ubatch) {
		o.has_prefix_ubatch = true;
		o.prefix_ubatch = px->ubatch;
		o.cache_salt = px->salt && px->salt[0] ? (char *)px->salt : NULL;
		o.has_prefix_variant = px->variant_len > 0;
		o.prefix_variant.data = (uint8_t *)px->variant;
		o.prefix_variant.len = px->variant_len;
	}
	if (px && px->fork_from)
		o.fork_from = (char *)px->fork_from;
	q.body_case = FREEKV__REQUEST__BODY_OPEN_SEQUENCE;
	q.open_sequence = &o;
	int ret = kvs_call(k, &q, &r);
	if (ret)
		return ret;
	if (r->body_case != FREEKV__REPLY__BODY_SEQUENCE) {
		kvs_reply_free(r);
		return seterr(k, -EPROTO, "OpenSequence answered without a SequenceInfo");
	}
	*seq_id = r->sequence->seq_id;
	if (covered)
		*covered = r->sequence->prefix_covered_tokens;
	kvs_reply_free(r);
	return 0;
}

static int seq_ref_call(struct kvs *k, Freekv__Request__BodyCase body, uint64_t seq_id, Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__SequenceRef ref = FREEKV__SEQUENCE_REF__INIT;
	ref.seq_id = seq_id;
	q.body_case = body;
	if (body == FREEKV__REQUEST__BODY_ATTACH)
		q.attach = &ref;
	else
		q.detach = &ref;
	return kvs_call(k, &q, out);
}

int kvs_attach(struct kvs *k, uint64_t seq_id, Freekv__Reply **out)
{
	return seq_ref_call(k, FREEKV__REQUEST__BODY_ATTACH, seq_id, out);
}

int kvs_detach(struct kvs *k, uint64_t seq_id)
{
	return seq_ref_call(k, FREEKV__REQUEST__BODY_DETACH, seq_id, NULL);
}

int kvs_close_sequence(struct kvs *k, uint64_t seq_id, bool drop)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__CloseSequence c = FREEKV__CLOSE_SEQUENCE__INIT;
	c.seq_id = seq_id;
	c.drop = drop;
	q.body_case = FREEKV__REQUEST__BODY_CLOSE_SEQUENCE;
	q.close_sequence = &c;
	return kvs_call(k, &q, NULL);
}


int kvs_commit_tokens_many(struct kvs *k, const struct kvs_commit *c, int n, int *rets)
{
	for (int i = 0; i < n; i++)
		rets[i] = 0;
	if (n <= 0)
		return 0;
	Freekv__Request q = FREEKV__REQUEST__INIT;
	q.body_case = FREEKV__REQUEST__BODY_COMMIT_TOKENS;
	int ret = call_ready(k, &q);
	uint64_t *ids = ret ? NULL : malloc((size_t)n * sizeof *ids);
	if (!ret && !ids)
		ret = seterr(k, -ENOMEM, "out of memory");
	/* Every request sent before any reply is read: they wait in kvstored's queue together
	 * and the round trips overlap; the replies come back in the order sent. A request that
	 * cannot be sent fails with every one after it. */
	int sent = 0;
	while (!ret && sent < n) {
		Freekv__CommitTokens ct = FREEKV__COMMIT_TOKENS__INIT;
		ct.seq_id = c[sent].seq_id;
		ct.committed_tokens = c[sent].committed_tokens;
		ct.first = c[sent].first;
		ct.token_ids = (uint32_t *)c[sent].tokens;
		ct.n_token_ids = c[sent].n;
		q.commit_tokens = &ct;
		if (!(ret = call_send(k, &q)))
			ids[sent++] = q.id;
	}
	for (int i = sent; ret && i < n; i++)
		rets[i] = ret;
	/* Each reply waited for in turn, under one deadline; the first error's message stays. */
	char first[KVS_ERR_MAX] = "";
	int first_ret = ret;
	if (ret)
		snprintf(first, sizeof first, "%s", k->err);
	const uint64_t deadline = clock_ms() + (uint64_t)k->timeout_ms;
	for (int i = 0; i < sent; i++) {
		rets[i] = call_recv(k, ids[i], deadline, NULL);
		if (rets[i] && !first_ret) {
			first_ret = rets[i];
			snprintf(first, sizeof first, "%s", k->err);
		}
	}
	free(ids);
	if (first_ret)
		snprintf(k->err, sizeof k->err, "%s", first);
	return first_ret;
}

int kvs_commit_tokens(struct kvs *k, uint64_t seq_id, uint64_t committed_tokens, uint64_t first,
		      const uint32_t *tokens, size_t n)
{
	const struct kvs_commit c = { .seq_id = seq_id, .committed_tokens = committed_tokens,
				      .first = first, .tokens = tokens, .n = n };
	int ret;
	return kvs_commit_tokens_many(k, &c, 1, &ret);
}

static int empty_call(struct kvs *k, Freekv__Request__BodyCase body, Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Empty e = FREEKV__EMPTY__INIT;
	q.body_case = body;
	/* list_sequences, list_workers and stats share the Empty type and the oneof storage. */
	q.list_sequences = &e;
	return kvs_call(k, &q, out);
}

int kvs_list_sequences(struct kvs *k, Freekv__Reply **out)
{
	return empty_call(k, FREEKV__REQUEST__BODY_LIST_SEQUENCES, out);
}

int kvs_list_workers(struct kvs *k, Freekv__Reply **out)
{
	return empty_call(k, FREEKV__REQUEST__BODY_LIST_WORKERS, out);
}

int kvs_stats(struct kvs *k, Freekv__Reply **out)
{
	return empty_call(k, FREEKV__REQUEST__BODY_STATS, out);
}

int kvs_show_sequence(struct kvs *k, uint64_t seq_id, const char *name, bool tokens, Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__ShowSequence s = FREEKV__SHOW_SEQUENCE__INIT;
	if (seq_id) {
		s.has_seq_id = true;
		s.seq_id = seq_id;
	} else {
		s.name = (char *)name;
	}
	s.has_with_tokens = true;
	s.with_tokens = tokens;
	q.body_case = FREEKV__REQUEST__BODY_SHOW_SEQUENCE;
	q.show_sequence = &s;
	return kvs_call(k, &q, out);
}

int kvs_evict(struct kvs *k, Freekv__EvictTarget target, uint64_t seq_id, const char *name,
	      uint32_t worker_id, bool demote, Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Evict e = FREEKV__EVICT__INIT;
	e.target = target;
	e.has_seq_id = seq_id != 0;
	e.seq_id = seq_id;
	e.name = (char *)name;
	e.has_worker_id = target == FREEKV__EVICT_TARGET__EVICT_TARGET_WORKER;
	e.worker_id = worker_id;
	e.has_demote = true;
	e.demote = demote;
	q.body_case = FREEKV__REQUEST__BODY_EVICT;
	q.evict = &e;
	return kvs_call(k, &q, out);
}

int kvs_demote(struct kvs *k, uint64_t seq_id, const char *name, Freekv__Reply **out)
{
	return kvs_demote_to(k, seq_id, name, false, out);
}

int kvs_demote_to(struct kvs *k, uint64_t seq_id, const char *name, bool remote,
		  Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Demote d = FREEKV__DEMOTE__INIT;
	d.has_remote = remote;
	d.remote = remote;
	d.has_seq_id = seq_id != 0;
	d.seq_id = seq_id;
	d.name = (char *)name;
	q.body_case = FREEKV__REQUEST__BODY_DEMOTE;
	q.demote = &d;
	return kvs_call(k, &q, out);
}

int kvs_publish(struct kvs *k, uint64_t seq_id, const char *name, Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Publish p = FREEKV__PUBLISH__INIT;
	p.has_seq_id = seq_id != 0;
	p.seq_id = seq_id;
	p.name = (char *)name;
	q.body_case = FREEKV__REQUEST__BODY_PUBLISH;
	q.publish = &p;
	return kvs_call(k, &q, out);
}

int kvs_config_get(struct kvs *k, const char *key, Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__ConfigGet g = FREEKV__CONFIG_GET__INIT;
	g.key = (char *)key;
	q.body_case = FREEKV__REQUEST__BODY_CONFIG_GET;
	q.config_get = &g;
	return kvs_call(k, &q, out);
}

int kvs_config_set(struct kvs *k, const char *key, const char *value, Freekv__Reply **out)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__ConfigSet s = FREEKV__CONFIG_SET__INIT;
	s.key = (char *)key;
	s.value = (char *)value;
	q.body_case = FREEKV__REQUEST__BODY_CONFIG_SET;
	q.config_set = &s;
	return kvs_call(k, &q, out);
}

/* ---------------------------------------------------------------- ring */

int kvs_ring_submit(struct kvs *k, const struct ring_entry *e, unsigned n)
{
	if (!k->ring)
		return seterr(k, -ENOTCONN, "no ring: say Hello as a worker first");
	if (k->shutdown)
		return seterr(k, -ESHUTDOWN, "%s", k->notice);
	int ret = ring_push(k->ring, e, n);
	if (ret < 0)
		seterr(k, ret, "ring push: %s", strerror(-ret));
	return ret;
}

int kvs_ring_complete(struct kvs *k, struct ring_entry *out, unsigned max, int timeout_ms)
{
	if (!k->ring)
		return seterr(k, -ENOTCONN, "no ring: say Hello as a worker first");
	uint64_t deadline = clock_ms() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms);
	/* The control socket is checked for a shutdown notice only when the ring stayed empty for
	 * a whole wait slice: the fast path is the ring alone. */
	bool check = false;
	for (;;) {
		int n = ring_pop(k->ring, out, max);
		if (n)
			return n < 0 ? seterr(k, n, "ring corrupted") : n;
		if (check) {
			poll_notices(k);
			if (k->shutdown)
				return seterr(k, -ESHUTDOWN, "%s", k->notice);
			int le = link_error(k);
			if (le)
				return le;
		}
		uint64_t t = clock_ms();
		if (t >= deadline)
			return 0;
		int slice = deadline - t < KVS_RING_SLICE_MS ? (int)(deadline - t) : KVS_RING_SLICE_MS;
		int ret = ring_wait(k->ring, slice);
		if (ret && ret != -ETIMEDOUT && ret != -EINTR)
			return seterr(k, ret, "ring wait: %s", strerror(-ret));
		check = ret != 0;
	}
}

void kvs_ring_last_timing(const struct kvs *k, struct kvs_ring_timing *t)
{
	*t = k->last;
}

/* Splits a round trip from pushed_ns to seen_ns with the completion's stamps; the daemon's
 * share is clamped to the round trip (it cannot be longer on one clock). */
static void split_round_trip(struct kvs_ring_timing *t, const struct ring_entry *c, uint64_t pushed_ns,
			     uint64_t seen_ns)
{
	uint64_t rt = seen_ns - pushed_ns;
	uint64_t posted = c->posted_ns < pushed_ns ? pushed_ns : c->posted_ns > seen_ns ? seen_ns : c->posted_ns;
	uint64_t daemon = posted - pushed_ns, served = (uint64_t)c->served_us * 1000u;
	if (served > daemon)
		served = daemon;
	*t = (struct kvs_ring_timing){ rt, daemon - served, served, rt - daemon };
}

/* Submit one entry and wait for its completion. */
static int ring_sync(struct kvs *k, struct ring_entry *e)
{
	e->user_data = k->next_user++;
	uint64_t pushed = clock_ns();
	int ret = kvs_ring_submit(k, e, 1);
	if (ret < 0)
		return ret;
	if (ret == 0)
		return seterr(k, -EAGAIN, "submission ring full");
	uint64_t deadline = clock_ms() + KVS_RING_TIMEOUT_MS;
	for (;;) {
		struct ring_entry c;
		uint64_t t = clock_ms();
		if (t >= deadline)
			return seterr(k, -ETIMEDOUT, "no ring completion within %d ms", KVS_RING_TIMEOUT_MS);
		int n = kvs_ring_complete(k, &c, 1, (int)(deadline - t));
		if (n < 0)
			return n;
		if (n == 0)
			continue;
		if (c.user_data != e->user_data)
			return seterr(k, -EPROTO, "completion %" PRIu64 " while waiting for %" PRIu64, c.user_data,
				      e->user_data);
		split_round_trip(&k->last, &c, pushed, clock_ns());
		*e = c;
		if (c.status)
			return seterr(k, c.status, "ring op %u: %s", c.op, strerror(-c.status));
		return 0;
	}
}

int kvs_alloc(struct kvs *k, uint64_t seq_id, uint32_t layer, uint32_t first_page, uint32_t n,
	      uint64_t *offsets)
{
	struct ring_entry e = { .op = RING_OP_ALLOC, .seq_id = seq_id, .layer = layer, .first_page = first_page, .count = n };
	int ret = ring_sync(k, &e);
	if (ret)
		return ret;
	if (e.n_payload != n)
		return seterr(k, -EPROTO, "ALLOC returned %u offsets for %u pages", e.n_payload, n);
	memcpy(offsets, e.payload, n * sizeof *offsets);
	return 0;
}

int kvs_commit(struct kvs *k, uint64_t seq_id, uint64_t committed_tokens, const uint64_t *offsets, uint32_t n)
{
	struct ring_entry e = { .op = RING_OP_COMMIT, .seq_id = seq_id, .committed_tokens = committed_tokens,
				.count = n, .n_payload = n };
	if (n > RING_PAYLOAD_MAX)
		return seterr(k, -EINVAL, "COMMIT of %u blocks exceeds %u", n, RING_PAYLOAD_MAX);
	if (n)
		memcpy(e.payload, offsets, n * sizeof *offsets);
	return ring_sync(k, &e);
}

int kvs_recall(struct kvs *k, uint64_t seq_id, uint32_t layer, const uint32_t *pages, const uint64_t *masks,
	       uint32_t n, uint64_t *offsets, uint64_t *leases)
{
	struct ring_entry e = { .op = RING_OP_RECALL, .seq_id = seq_id, .layer = layer, .count = n, .n_payload = 2 * n };
	if (n > RING_PAYLOAD_MAX / 2)
		return seterr(k, -EINVAL, "RECALL of %u pages exceeds %u", n, RING_PAYLOAD_MAX / 2);
	for (uint32_t i = 0; i < n; i++) {
		e.payload[2 * i] = pages[i];
		e.payload[2 * i + 1] = masks[i];
	}
	int ret = ring_sync(k, &e);
	if (ret)
		return ret;
	if (e.n_payload != 2 * n)
		return seterr(k, -EPROTO, "RECALL returned %u values for %u pages", e.n_payload, n);
	for (uint32_t i = 0; i < n; i++) {
		offsets[i] = e.payload[2 * i];
		leases[i] = e.payload[2 * i + 1];
	}
	return 0;
}

int kvs_release(struct kvs *k, const uint64_t *leases, uint32_t n)
{
	struct ring_entry e = { .op = RING_OP_RELEASE, .count = n, .n_payload = n };
	if (n > RING_PAYLOAD_MAX)
		return seterr(k, -EINVAL, "RELEASE of %u leases exceeds %u", n, RING_PAYLOAD_MAX);
	memcpy(e.payload, leases, n * sizeof *leases);
	return ring_sync(k, &e);
}
