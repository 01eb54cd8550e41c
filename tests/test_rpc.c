/* Tests kvstore/daemon/rpc.c in-process: rpc_process() on packed requests with the real modules behind
 * it (a small pool, no tier). Checks the codec and validation paths — undecodable, oversized,
 * wrong version, no body, unknown ids, bad geometry, oversize counts, worker identity — that
 * each gets a Reply with the request's id, a negative status and a message; that good requests
 * get the right body; and that the per-command counters count. */
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <zmq.h>

#include "proto/kvstore.pb-c.h"
#include "dataplane_priv.h"
#include "pool.h"
#include "ring.h"
#include "rpc.h"
#include "tier.h"

struct env {
	struct cfg cfg;
	struct seq_table seqs;
	struct wk_registry workers;
	struct dp *dp;
	struct rpc_server s;
	void *zctx;
	char dir[64];
};

static uint64_t fake_ms;
static uint64_t clock_ms(void)
{
	return fake_ms;
}

/* An env whose data plane has an NVMe tier (a file in the env's directory) when tier is set,
 * of the given sizes. */
static int env_setup_sized(void **state, bool tier, const char *dram, const char *nvme,
			   const char *max_tokens)
{
	struct env *e = calloc(1, sizeof *e);
	char err[512], v[CFG_STR_MAX];
	cfg_defaults(&e->cfg);
	strcpy(e->dir, "/tmp/fkv-rpc-XXXXXX");
	assert_non_null(mkdtemp(e->dir));
	snprintf(v, sizeof v, "ipc://%s/s.sock", e->dir);
	assert_int_equal(cfg_set(&e->cfg, "endpoint", v, false, err, sizeof err), 0);
	snprintf(v, sizeof v, "/fkv-rpc-%d", (int)getpid());
	assert_int_equal(cfg_set(&e->cfg, "shm_name", v, false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "dram_bytes", dram, false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "lock_memory", "false", false, err, sizeof err), 0);
	snprintf(v, sizeof v, "%s/tier.bin", e->dir);
	assert_int_equal(cfg_set(&e->cfg, "nvme_path", tier ? v : "", false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "nvme_bytes", nvme, false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "max_tokens", max_tokens, false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "max_request_bytes", "4K", false, err, sizeof err), 0);
	assert_int_equal(seq_table_init(&e->seqs, 16), 0);
	assert_int_equal(wk_init(&e->workers, 4), 0);
	int ret = dp_init(&e->dp, &e->cfg, &e->seqs, err, sizeof err);
	if (ret)
		fprintf(stderr, "dp_init: %s\n", err);
	assert_int_equal(ret, 0);
	e->zctx = zmq_ctx_new();
	struct rpc_ctx ctx = { .cfg = &e->cfg, .seqs = &e->seqs, .workers = &e->workers, .dp = e->dp,
				.now_ms = clock_ms };
	assert_int_equal(rpc_init(&e->s, e->zctx, &ctx, err, sizeof err), 0);
	*state = e;
	return 0;
}

static int env_setup(void **state, bool tier)
{
	return env_setup_sized(state, tier, "8M", "8M", "100");
}

/* 256 DRAM blocks, 4 NVMe blocks, room for 300 pages per layer: both tiers fill quickly. */
static int setup_tiny_tiers(void **state)
{
	return env_setup_sized(state, true, "2M", "32K", "4800");
}

static int setup(void **state)
{
	return env_setup(state, false);
}

static int setup_tier(void **state)
{
	return env_setup(state, true);
}

static int teardown(void **state)
{
	struct env *e = *state;
	char path[128];
	rpc_shutdown(&e->s);
	zmq_ctx_term(e->zctx);
	dp_shutdown(e->dp);
	wk_shutdown(&e->workers);
	seq_table_shutdown(&e->seqs);
	snprintf(path, sizeof path, "%s/tier.bin", e->dir);
	unlink(path);
	rmdir(e->dir);
	free(e);
	return 0;
}

/* Process raw bytes from identity `who` sent by `peer` (NULL: in-process); returns the decoded
 * reply (caller frees). */
static Freekv__Reply *raw_peer(struct env *e, const char *who, const struct rpc_peer *peer,
			       const void *data, size_t len)
{
	uint8_t *out;
	size_t n;
	assert_int_equal(rpc_process(&e->s, who, strlen(who), peer, data, len, &out, &n), 0);
	Freekv__Reply *r = freekv__reply__unpack(NULL, n, out);
	free(out);
	assert_non_null(r);
	if (r->status)
		assert_true(r->error && r->error[0]);
	return r;
}

static Freekv__Reply *raw(struct env *e, const char *who, const void *data, size_t len)
{
	return raw_peer(e, who, NULL, data, len);
}

static Freekv__Reply *call_peer(struct env *e, const char *who, const struct rpc_peer *peer,
				Freekv__Request *q)
{
	uint8_t buf[8192];
	if (!q->version)
		q->version = 1;
	size_t n = freekv__request__get_packed_size(q);
	assert_true(n <= sizeof buf);
	freekv__request__pack(q, buf);
	return raw_peer(e, who, peer, buf, n);
}

static Freekv__Reply *call(struct env *e, const char *who, Freekv__Request *q)
{
	return call_peer(e, who, NULL, q);
}

static int status_of(Freekv__Reply *r)
{
	int s = r->status;
	freekv__reply__free_unpacked(r, NULL);
	return s;
}

/* A worker Hello from this process, sent by peer who. */
static Freekv__Reply *hello_worker(struct env *e, const char *who)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Hello h = FREEKV__HELLO__INIT;
	h.role = FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER;
	h.pid = (uint32_t)getpid();
	q.body_case = FREEKV__REQUEST__BODY_HELLO;
	q.hello = &h;
	return call(e, who, &q);
}

static Freekv__Reply *open_seq(struct env *e, const char *name, uint32_t layers, uint8_t fp0, size_t n_tok)
{
	static uint32_t toks[1000];
	uint8_t fp[8] = { fp0 };
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__OpenSequence o = FREEKV__OPEN_SEQUENCE__INIT;
	Freekv__Geometry g = FREEKV__GEOMETRY__INIT;
	g.n_layers = layers;
	g.n_kv_heads = 2;
	g.head_dim = 64;
	g.page_size = 16;
	g.dtype = FREEKV__DTYPE__DTYPE_BF16;
	o.name = (char *)name;
	o.model_fingerprint.data = fp;
	o.model_fingerprint.len = sizeof fp;
	o.geometry = &g;
	o.token_ids = toks;
	o.n_token_ids = n_tok;
	q.id = 77;
	q.body_case = FREEKV__REQUEST__BODY_OPEN_SEQUENCE;
	q.open_sequence = &o;
	return call(e, "ctl", &q);
}

static void test_codec_errors(void **state)
{
	struct env *e = *state;
	uint8_t junk[64];
	uint64_t rng = 3;
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (uint8_t)test_rand(&rng);
	assert_int_equal(status_of(raw(e, "x", junk, sizeof junk)), -EBADMSG);
	assert_int_equal(status_of(raw(e, "x", junk, 0)), -EBADMSG);
	static uint8_t big[5000];
	assert_int_equal(status_of(raw(e, "x", big, sizeof big)), -EMSGSIZE);

	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Empty empty = FREEKV__EMPTY__INIT;
	q.version = 9;
	q.id = 1234;
	q.body_case = FREEKV__REQUEST__BODY_STATS;
	q.stats = &empty;
	Freekv__Reply *r = call(e, "x", &q);
	assert_int_equal(r->id, 1234); /* echoed even on error */
	assert_int_equal(r->status, -EPROTONOSUPPORT);
	assert_non_null(strstr(r->error, "version"));
	freekv__reply__free_unpacked(r, NULL);

	q.version = 1;
	q.body_case = FREEKV__REQUEST__BODY__NOT_SET;
	assert_int_equal(status_of(call(e, "x", &q)), -EINVAL);

	/* A truncated valid request never decodes into something else. */
	uint8_t buf[512];
	r = open_seq(e, "trunc", 2, 1, 0);
	freekv__reply__free_unpacked(r, NULL);
	Freekv__Request q2 = FREEKV__REQUEST__INIT;
	Freekv__ShowSequence sh = FREEKV__SHOW_SEQUENCE__INIT;
	sh.name = "trunc";
	q2.version = 1;
	q2.id = 5;
	q2.body_case = FREEKV__REQUEST__BODY_SHOW_SEQUENCE;
	q2.show_sequence = &sh;
	size_t n = freekv__request__pack(&q2, buf);
	for (size_t cut = 0; cut < n; cut++) {
		r = raw(e, "x", buf, cut);
		assert_true(r->status < 0);
		freekv__reply__free_unpacked(r, NULL);
	}
	r = raw(e, "x", buf, n);
	assert_int_equal(r->status, 0);
	assert_string_equal(r->sequence->name, "trunc");
	freekv__reply__free_unpacked(r, NULL);
}

static void test_sequences_and_validation(void **state)
{
	struct env *e = *state;
	Freekv__Reply *r = open_seq(e, "a", 4, 1, 10);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->id, 77);
	assert_int_equal(r->body_case, FREEKV__REPLY__BODY_SEQUENCE);
	assert_int_equal(r->sequence->block_bytes, 2 * 2 * 16 * 64 * 2);
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
	uint64_t id = r->sequence->seq_id;
	freekv__reply__free_unpacked(r, NULL);
	assert_int_equal(status_of(open_seq(e, "a", 4, 2, 0)), -EEXIST);	/* other fingerprint */
	assert_int_equal(status_of(open_seq(e, "a", 5, 1, 0)), -EEXIST);	/* other geometry */
	assert_int_equal(status_of(open_seq(e, "g", 0, 1, 0)), -EINVAL);	/* bad geometry */
	assert_int_equal(status_of(open_seq(e, "t", 2, 1, 101)), -E2BIG);	/* > max_tokens */

	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__SequenceRef ref = FREEKV__SEQUENCE_REF__INIT;
	Freekv__CloseSequence cl = FREEKV__CLOSE_SEQUENCE__INIT;
	q.body_case = FREEKV__REQUEST__BODY_CLOSE_SEQUENCE;
	cl.seq_id = 999999;
	q.close_sequence = &cl;
	assert_int_equal(status_of(call(e, "ctl", &q)), -ENOENT);
	/* Attach needs a welcomed worker. */
	q.body_case = FREEKV__REQUEST__BODY_ATTACH;
	ref.seq_id = id;
	q.attach = &ref;
	assert_int_equal(status_of(call(e, "ctl", &q)), -EPERM);
	cl.seq_id = id;
	cl.drop = true;
	q.body_case = FREEKV__REQUEST__BODY_CLOSE_SEQUENCE;
	q.close_sequence = &cl;
	r = call(e, "ctl", &q);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->evicted->sequences, 1);
	freekv__reply__free_unpacked(r, NULL);
	assert_null(seq_find(&e->seqs, id));
}

/* libzmq's ipc Peer-Address ("host:uid:gid:pid") and what is not one. */
static void test_peer_parse(void **state)
{
	(void)state;
	struct rpc_peer p = { 0 };
	assert_int_equal(rpc_peer_parse("localhost:1000:27:4242", &p), 0);
	assert_true(p.has_cred);
	assert_int_equal(p.uid, 1000);
	assert_int_equal(p.gid, 27);
	assert_int_equal(p.pid, 4242);
	assert_int_equal(rpc_peer_parse(":0:0:1", &p), 0);
	assert_int_equal(p.pid, 1);
	static const char *const bad[] = {
		"127.0.0.1", "::1", "localhost", "localhost:1:2", "0:0:1", "h:1:2:x", "h:1:2:",
		"h:1::3", "h:1:2:99999999999", "h:1:2:4294967296", "",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct rpc_peer q = { 0 };
		assert_int_equal(rpc_peer_parse(bad[i], &q), -EINVAL);
		assert_false(q.has_cred);
	}
	assert_int_equal(rpc_peer_parse(NULL, &p), -EINVAL);
}

/* A Hello's pid is checked against the connection's credentials over ipc; refused Hellos
 * register nothing; tcp-like peers (no credentials) are accepted unverified. */
static void test_hello_peer_pid(void **state)
{
	struct env *e = *state;
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Hello h = FREEKV__HELLO__INIT;
	h.role = FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER;
	h.pid = (uint32_t)getppid();	/* a live process that is not the sender */
	q.body_case = FREEKV__REQUEST__BODY_HELLO;
	q.hello = &h;
	struct rpc_peer me = { .ipc = true, .has_cred = true, .pid = (uint32_t)getpid() };
	Freekv__Reply *r = call_peer(e, "liar", &me, &q);
	assert_int_equal(r->status, -EPERM);
	char want[64];
	snprintf(want, sizeof want, "claims pid %u", (unsigned)getppid());
	assert_non_null(strstr(r->error, want));
	snprintf(want, sizeof want, "belongs to pid %u", (unsigned)getpid());
	assert_non_null(strstr(r->error, want));
	freekv__reply__free_unpacked(r, NULL);
	assert_int_equal(e->workers.n, 0);
	assert_int_equal(e->s.hello_refused, 1);

	struct rpc_peer nocred = { .ipc = true };
	h.pid = (uint32_t)getpid();
	assert_int_equal(status_of(call_peer(e, "anon", &nocred, &q)), -EPERM);
	assert_int_equal(e->workers.n, 0);

	assert_int_equal(status_of(call_peer(e, "liar", &me, &q)), 0);	/* the same connection, truthful */
	assert_int_equal(e->workers.n, 1);
	struct rpc_peer tcp = { .ipc = false };
	h.pid = (uint32_t)getppid();
	assert_int_equal(status_of(call_peer(e, "remote", &tcp, &q)), 0);
	assert_int_equal(e->workers.n, 2);
	assert_int_equal(e->s.hello_refused, 2);
}

static void test_worker_identity(void **state)
{
	struct env *e = *state;
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Hello h = FREEKV__HELLO__INIT;
	h.role = FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER;
	h.pid = (uint32_t)getpid();
	q.body_case = FREEKV__REQUEST__BODY_HELLO;
	q.hello = &h;
	Freekv__Reply *r = call(e, "w1", &q);
	assert_int_equal(r->status, 0);
	uint32_t wid = r->welcome->worker_id;
	assert_non_null(r->welcome->ring_name);
	assert_int_equal(r->welcome->pool_bytes, 8u << 20);
	freekv__reply__free_unpacked(r, NULL);
	assert_int_equal(status_of(call(e, "w1", &q)), -EALREADY);
	h.pid = 0x7ffffff0; /* no such process */
	assert_int_equal(status_of(call(e, "w2", &q)), -ESRCH);
	h.role = 7;
	assert_int_equal(status_of(call(e, "w3", &q)), -EINVAL);

	r = open_seq(e, "mine", 2, 1, 0);
	uint64_t id = r->sequence->seq_id;
	freekv__reply__free_unpacked(r, NULL);
	Freekv__Request a = FREEKV__REQUEST__INIT;
	Freekv__SequenceRef ref = FREEKV__SEQUENCE_REF__INIT;
	ref.seq_id = id;
	a.body_case = FREEKV__REQUEST__BODY_ATTACH;
	a.attach = &ref;
	a.has_worker_id = true;
	a.worker_id = wid;
	assert_int_equal(status_of(call(e, "intruder", &a)), -EPERM);	/* someone else's id */
	a.worker_id = wid + 100;
	assert_int_equal(status_of(call(e, "w1", &a)), -EPERM);		/* unknown id */
	a.worker_id = wid;
	r = call(e, "w1", &a);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ATTACHED);
	assert_int_equal(r->sequence->worker_id, wid);
	freekv__reply__free_unpacked(r, NULL);

	/* Heartbeat for another id, then a silent worker is reaped by the registry's clock. */
	Freekv__Request hb = FREEKV__REQUEST__INIT;
	Freekv__Heartbeat hbb = FREEKV__HEARTBEAT__INIT;
	hb.body_case = FREEKV__REQUEST__BODY_HEARTBEAT;
	hb.heartbeat = &hbb;
	hb.has_worker_id = true;
	hb.worker_id = wid;
	hbb.worker_id = wid + 1;
	assert_int_equal(status_of(call(e, "w1", &hb)), -EPERM);
	hbb.worker_id = wid;
	assert_int_equal(status_of(call(e, "w1", &hb)), 0);
	uint32_t dead[4];
	fake_ms += e->cfg.heartbeat_timeout_ms + 1;
	assert_int_equal(wk_reap(&e->workers, fake_ms, e->cfg.heartbeat_timeout_ms, dead, 4), 1);
	assert_int_equal(dead[0], wid);
	assert_int_equal(status_of(call(e, "w1", &hb)), -EPERM);
}

static void test_counters_and_config(void **state)
{
	struct env *e = *state;
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__ConfigSet cs = FREEKV__CONFIG_SET__INIT;
	cs.key = "dram_high_watermark";
	cs.value = "80";
	q.body_case = FREEKV__REQUEST__BODY_CONFIG_SET;
	q.config_set = &cs;
	Freekv__Reply *r = call(e, "c", &q);
	assert_int_equal(r->status, 0);
	assert_string_equal(r->config->entries[0]->value, "80");
	freekv__reply__free_unpacked(r, NULL);
	assert_int_equal(e->cfg.dram_high_watermark, 80);
	cs.key = "shm_name";
	cs.value = "/x";
	assert_int_equal(status_of(call(e, "c", &q)), -EPERM);

	Freekv__Empty empty = FREEKV__EMPTY__INIT;
	Freekv__Request s = FREEKV__REQUEST__INIT;
	s.body_case = FREEKV__REQUEST__BODY_STATS;
	s.stats = &empty;
	r = call(e, "c", &s);
	assert_int_equal(r->status, 0);
	bool seen = false;
	for (size_t i = 0; i < r->stats->n_commands; i++) {
		if (!strcmp(r->stats->commands[i]->name, "ConfigSet")) {
			assert_int_equal(r->stats->commands[i]->calls, 2);
			assert_int_equal(r->stats->commands[i]->errors, 1);
			seen = true;
		}
	}
	assert_true(seen);
	assert_int_equal(r->stats->dram_bytes, 8u << 20);
	freekv__reply__free_unpacked(r, NULL);
}

/* ---------------------------------------------------------------- ring ops against the control plane */

/* A worker of the env: welcomed as "w1", its ring mapped, sequence "r" attached, with pages 0
 * and 1 of layer 0 allocated and committed. */
struct wenv {
	uint32_t wid;
	struct ring *r;
	uint64_t seq;
	uint64_t user;
};

/* Submits x and runs the data plane once; 1 when x now holds its completion, 0 when it waits. */
static int submit(struct env *e, struct wenv *w, struct ring_entry *x)
{
	x->user_data = ++w->user;
	assert_int_equal(ring_push(w->r, x, 1), 1);
	dp_run(e->dp);
	return ring_pop(w->r, x, 1);
}

/* The next completion, waiting for tier I/O as long as it takes (bounded). */
static void next_completion(struct env *e, struct wenv *w, struct ring_entry *out)
{
	for (int i = 0; i < 400; i++) {
		dp_run(e->dp);
		if (ring_pop(w->r, out, 1) == 1)
			return;
		dp_drain(e->dp, 20);
	}
	fail_msg("no completion");
}

static void entry(struct ring_entry *x, uint32_t op, uint64_t seq, uint32_t count)
{
	memset(x, 0, sizeof *x);
	x->op = op;
	x->seq_id = seq;
	x->count = count;
}

static int release(struct env *e, struct wenv *w, const uint64_t *leases, uint32_t n)
{
	struct ring_entry x;
	entry(&x, RING_OP_RELEASE, 0, n);
	x.n_payload = n;
	memcpy(x.payload, leases, n * sizeof *leases);
	if (!submit(e, w, &x))
		next_completion(e, w, &x);
	return x.status;
}

static void recall_entry(struct ring_entry *x, uint64_t seq, uint32_t first, uint32_t n)
{
	entry(x, RING_OP_RECALL, seq, n);
	x->n_payload = 2 * n;
	for (uint32_t i = 0; i < n; i++) {
		x->payload[2 * i] = first + i;
		x->payload[2 * i + 1] = 1;
	}
}

static void worker_up(struct env *e, struct wenv *w)
{
	char err[256];
	memset(w, 0, sizeof *w);
	Freekv__Reply *r = hello_worker(e, "w1");
	assert_int_equal(r->status, 0);
	w->wid = r->welcome->worker_id;
	assert_int_equal(ring_open(r->welcome->ring_name, &w->r, err, sizeof err), 0);
	freekv__reply__free_unpacked(r, NULL);
	r = open_seq(e, "r", 2, 1, 0);
	w->seq = r->sequence->seq_id;
	freekv__reply__free_unpacked(r, NULL);
	Freekv__Request a = FREEKV__REQUEST__INIT;
	Freekv__SequenceRef ref = FREEKV__SEQUENCE_REF__INIT;
	ref.seq_id = w->seq;
	a.body_case = FREEKV__REQUEST__BODY_ATTACH;
	a.attach = &ref;
	a.has_worker_id = true;
	a.worker_id = w->wid;
	assert_int_equal(status_of(call(e, "w1", &a)), 0);
	struct ring_entry x;
	entry(&x, RING_OP_ALLOC, w->seq, 2);
	assert_int_equal(submit(e, w, &x), 1);
	assert_int_equal(x.status, 0);
	uint64_t off[2] = { x.payload[0], x.payload[1] };
	entry(&x, RING_OP_COMMIT, w->seq, 2);
	x.committed_tokens = 32;
	x.n_payload = 2;
	memcpy(x.payload, off, sizeof off);
	assert_int_equal(submit(e, w, &x), 1);
	assert_int_equal(x.status, 0);
}

/* Demotes every unleased block of the worker's sequence and waits for the writes. */
static void demote_all(struct env *e, struct wenv *w)
{
	char err[256];
	uint64_t n;
	assert_int_equal(dp_demote_seq(e->dp, seq_find(&e->seqs, w->seq), &n, err, sizeof err), 0);
	dp_drain(e->dp, 2000);
}

/* A RECALL still waiting for its promotion when the worker detaches the sequence must fail:
 * it may not hand out offsets (or leases) of a sequence the worker no longer holds. Whether the
 * promotion is still in flight after dp_run is up to the disk, so the test tries until it is. */
static void test_recall_pending_across_detach(void **state)
{
	struct env *e = *state;
	struct wenv w;
	struct ring_entry x;
	bool hit = false;
	worker_up(e, &w);
	for (int attempt = 0; attempt < 200 && !hit; attempt++) {
		demote_all(e, &w);
		recall_entry(&x, w.seq, 0, 1);
		if (submit(e, &w, &x)) {
			assert_int_equal(x.status, 0);
			assert_int_equal(release(e, &w, &x.payload[1], 1), 0);
			continue;
		}
		hit = true;
		Freekv__Request d = FREEKV__REQUEST__INIT;
		Freekv__SequenceRef ref = FREEKV__SEQUENCE_REF__INIT;
		ref.seq_id = w.seq;
		d.body_case = FREEKV__REQUEST__BODY_DETACH;
		d.detach = &ref;
		d.has_worker_id = true;
		d.worker_id = w.wid;
		assert_int_equal(status_of(call(e, "w1", &d)), 0);
		next_completion(e, &w, &x);
		assert_int_equal(x.status, -ENOENT);
		assert_int_equal(dp_worker_leases(e->dp, w.wid), 0);
	}
	ring_close(w.r);
	if (!hit)
		skip();
}

/* A worker that releases a lease its waiting RECALL took (by guessing the id) still gets, when
 * the RECALL completes, leases that are valid: never the offset of a block it no longer leases. */
static void test_recall_pending_release_guessed(void **state)
{
	struct env *e = *state;
	struct wenv w;
	struct ring_entry x, y;
	bool hit = false;
	worker_up(e, &w);
	for (int attempt = 0; attempt < 200 && !hit; attempt++) {
		recall_entry(&x, w.seq, 0, 1);
		if (!submit(e, &w, &x))
			next_completion(e, &w, &x);
		assert_int_equal(x.status, 0);
		uint64_t held = x.payload[1];
		demote_all(e, &w);	/* page 1 only: page 0 is leased */
		assert_int_equal(release(e, &w, &held, 1), 0);
		uint64_t guess = held + (1ull << 32);	/* the same slot, one generation on */
		recall_entry(&x, w.seq, 0, 2);
		if (submit(e, &w, &x)) {
			assert_int_equal(x.status, 0);
			uint64_t l[2] = { x.payload[1], x.payload[3] };
			assert_int_equal(release(e, &w, l, 2), 0);
			continue;
		}
		uint64_t recall_ud = x.user_data;
		entry(&y, RING_OP_RELEASE, 0, 1);
		y.n_payload = 1;
		y.payload[0] = guess;
		if (!submit(e, &w, &y))
			next_completion(e, &w, &y);
		if (y.user_data == recall_ud) {	/* the RECALL finished first: not the case sought */
			uint64_t l[2] = { y.payload[3], y.payload[1] };
			next_completion(e, &w, &x);	/* the guessed RELEASE: it may have dropped l[1] */
			assert_int_equal(release(e, &w, l, x.status == 0 ? 1 : 2), 0);
			continue;
		}
		hit = true;
		assert_int_equal(y.status, 0);	/* the guess was right */
		next_completion(e, &w, &x);
		assert_int_equal(x.user_data, recall_ud);
		assert_int_equal(x.status, 0);
		assert_int_equal(dp_worker_leases(e->dp, w.wid), 2);
		uint64_t l[2] = { x.payload[1], x.payload[3] };
		assert_int_equal(release(e, &w, l, 2), 0);
	}
	ring_close(w.r);
	if (!hit)
		skip();
}

/* ---------------------------------------------------------------- swaps: failure paths */

#define SW_PAGES 260u	/* layer-0 pages of setup_tiny_tiers: 256 fill DRAM, 4 the tier */
#define SW_BLOCK 8192u

static uint8_t sw_byte(uint32_t page, size_t i)
{
	return (uint8_t)(page * 131u + i * 7u + (i >> 9));
}

static bool sw_page_ok(const uint8_t *p, uint32_t page)
{
	for (size_t i = 0; i < SW_BLOCK; i++)
		if (p[i] != sw_byte(page, i))
			return false;
	return true;
}

static struct pool_block *sw_block(struct env *e, struct wenv *w, uint32_t page)
{
	uint32_t id = seq_block(seq_find(&e->seqs, w->seq), 0, page);
	return id == SEQ_NO_BLOCK ? NULL : pool_block_get(e->dp->pool, id);
}

/* Pages [0, SW_PAGES) of layer 0 written and committed, one ring op each, so that the last
 * ALLOCs need exactly the room demotion can make. Ends with DRAM and the tier full. */
static void sw_fill(struct env *e, struct wenv *w)
{
	uint8_t *base = pool_base(e->dp->pool);
	for (uint32_t p = 0; p < SW_PAGES; p++) {
		struct ring_entry x;
		uint64_t off;
		if (p < 2) {	/* allocated and committed by worker_up */
			off = sw_block(e, w, p)->dram_off;
		} else {
			entry(&x, RING_OP_ALLOC, w->seq, 1);
			x.first_page = p;
			if (!submit(e, w, &x))
				next_completion(e, w, &x);
			assert_int_equal(x.status, 0);
			off = x.payload[0];
		}
		for (size_t i = 0; i < SW_BLOCK; i++)
			base[off + i] = sw_byte(p, i);
		entry(&x, RING_OP_COMMIT, w->seq, 1);
		x.committed_tokens = (uint64_t)(p + 1) * 16;
		x.n_payload = 1;
		x.payload[0] = off;
		if (!submit(e, w, &x))
			next_completion(e, w, &x);
		assert_int_equal(x.status, 0);
	}
	dp_drain(e->dp, 2000);
	struct dp_stats st;
	dp_stats(e->dp, &st);
	assert_int_equal(st.blocks_dram, 256);
	assert_int_equal(st.blocks_nvme, 4);
	assert_int_equal(st.nvme_used_bytes, st.nvme_bytes);
}

/* RECALL one page; 0 when it came back with the right bytes (lease released), -EILSEQ when
 * the bytes differ, else the completion's error. */
static int sw_recall(struct env *e, struct wenv *w, uint32_t page)
{
	struct ring_entry x;
	recall_entry(&x, w->seq, page, 1);
	if (!submit(e, w, &x))
		next_completion(e, w, &x);
	if (x.status)
		return x.status;
	bool ok = sw_page_ok((uint8_t *)pool_base(e->dp->pool) + x.payload[0], page);
	assert_int_equal(release(e, w, &x.payload[1], 1), 0);
	return ok ? 0 : -EILSEQ;
}

static uint32_t sw_nvme_page(struct env *e, struct wenv *w)
{
	for (uint32_t p = 0; p < SW_PAGES; p++)
		if (sw_block(e, w, p)->tier == POOL_TIER_NVME)
			return p;
	fail_msg("no NVMe-resident page");
	return 0;
}

/* Every page back with its own bytes, through swaps; nothing lost. */
static void sw_all_intact(struct env *e, struct wenv *w)
{
	for (uint32_t p = 0; p < SW_PAGES; p++)
		assert_int_equal(sw_recall(e, w, p), 0);
	struct dp_stats st;
	dp_stats(e->dp, &st);
	assert_int_equal(st.blocks_dram, 256);
	assert_int_equal(st.blocks_nvme, 4);
	assert_int_equal(st.blocks_inflight, 0);
}

/* With DRAM and the tier full, a promotion swaps; an injected read error, write error, and write
 * error followed by a failed write-back each fail that RECALL with the error, and leave both
 * pages where they were with their bytes (the page on NVMe once written back). */
static void test_swap_failures_keep_pages(void **state)
{
	struct env *e = *state;
	struct wenv w;
	struct dp_stats st;
	worker_up(e, &w);
	sw_fill(e, &w);

	uint32_t p = sw_nvme_page(e, &w);
	uint64_t p_off = sw_block(e, &w, p)->nvme_off;
	tier_inject_error(e->dp->tier, TIER_OP_READ, 1, -EIO);
	assert_int_equal(sw_recall(e, &w, p), -EIO);
	assert_int_equal(sw_block(e, &w, p)->tier, POOL_TIER_NVME);
	dp_stats(e->dp, &st);
	assert_int_equal(st.swaps, 0);
	assert_int_equal(st.swap_failures, 1);

	/* The write failed after the transfer: the extent holds the victim's bytes until the page is
	 * written back from the bounce buffer. */
	tier_inject_error(e->dp->tier, TIER_OP_WRITE, 1, -EIO);
	assert_int_equal(sw_recall(e, &w, p), -EIO);
	dp_drain(e->dp, 2000);
	assert_int_equal(sw_block(e, &w, p)->tier, POOL_TIER_NVME);
	assert_int_equal(sw_block(e, &w, p)->nvme_off, p_off);
	dp_stats(e->dp, &st);
	assert_int_equal(st.swap_failures, 2);
	assert_int_equal(st.blocks_dram, 256);
	assert_int_equal(sw_recall(e, &w, p), 0);	/* now it swaps */
	dp_stats(e->dp, &st);
	assert_int_equal(st.swaps, 1);

	/* The write-back fails once too: meanwhile a RECALL of the page fails at once (EIO); the
	 * retry, DP_SWAP_RETRY_US later, puts it back. */
	uint32_t q = sw_nvme_page(e, &w);
	tier_inject_error(e->dp->tier, TIER_OP_WRITE, 2, -EIO);
	assert_int_equal(sw_recall(e, &w, q), -EIO);
	assert_int_equal(sw_recall(e, &w, q), -EIO);
	for (int i = 0; i < 400 && sw_block(e, &w, q)->tier != POOL_TIER_NVME; i++) {
		struct timespec ts = { 0, 5000000 };
		nanosleep(&ts, NULL);
		dp_run(e->dp);
		dp_drain(e->dp, 10);
	}
	assert_int_equal(sw_block(e, &w, q)->tier, POOL_TIER_NVME);
	dp_stats(e->dp, &st);
	assert_int_equal(st.swap_failures, 3);
	assert_int_equal(st.crc_errors, 0);
	sw_all_intact(e, &w);
	ring_close(w.r);
}

/* A worker that corrupts its ring's indices gets its ring ignored, and the daemon says so once,
 * not on every pass of the data plane (which runs whenever any other worker submits). */
static void test_corrupt_ring_logged_once(void **state)
{
	struct env *e = *state;
	struct wenv w;
	char err[256], path[128], line[256];
	worker_up(e, &w);
	int fd = shm_open(ring_name(w.r), O_RDWR, 0);
	assert_true(fd >= 0);
	char *hdr = mmap(NULL, RING_OFF_SLOTS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(hdr != MAP_FAILED);
	close(fd);
	*(volatile uint32_t *)(hdr + RING_OFF_SQ_TAIL) += 1u << 31;	/* far past the daemon's head */
	munmap(hdr, RING_OFF_SLOTS);

	Freekv__Reply *r = hello_worker(e, "w2");
	assert_int_equal(r->status, 0);
	struct wenv w2 = { .wid = r->welcome->worker_id };
	assert_int_equal(ring_open(r->welcome->ring_name, &w2.r, err, sizeof err), 0);
	freekv__reply__free_unpacked(r, NULL);

	snprintf(path, sizeof path, "%s/stderr", e->dir);
	int log = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600), saved = dup(2);
	assert_true(log >= 0 && saved >= 0);
	fflush(stderr);
	dup2(log, 2);
	for (int i = 0; i < 50; i++) {
		struct ring_entry x;
		uint64_t forged = 12345;
		entry(&x, RING_OP_RELEASE, 0, 1);
		x.n_payload = 1;
		x.payload[0] = forged;
		assert_int_equal(submit(e, &w2, &x), 1);
		assert_int_equal(x.status, -EINVAL);
	}
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	FILE *f = fdopen(log, "r");
	rewind(f);
	int n = 0;
	while (fgets(line, sizeof line, f))
		n += strstr(line, "ring corrupted") != NULL;
	fclose(f);
	unlink(path);
	assert_int_equal(n, 1);
	ring_close(w2.r);
	ring_close(w.r);
}

/* Ops that wait (here RECALLs of a page being promoted) queue in the daemon, outside the ring: a
 * worker that keeps submitting must not grow that queue without bound. At most a ring's worth
 * (ring_entries = 8) wait; the rest are refused with -EBUSY. */
static void test_pending_bounded(void **state)
{
	struct env *e = *state;
	char err[256];
	struct wenv w;
	struct ring_entry x[8];
	bool hit = false;
	assert_int_equal(cfg_set(&e->cfg, "ring_entries", "8", false, err, sizeof err), 0);
	worker_up(e, &w);
	for (int attempt = 0; attempt < 200 && !hit; attempt++) {
		int busy = 0;
		struct dp_stats st;
		demote_all(e, &w);
		for (int round = 0; round < 2; round++) {
			for (int i = 0; i < 8; i++) {
				recall_entry(&x[i], w.seq, 0, 1);
				x[i].user_data = ++w.user;
			}
			assert_int_equal(ring_push(w.r, x, 8), 8);
			dp_run(e->dp);
			dp_stats(e->dp, &st);
			if (round == 0 && st.pending_ops != 8)
				break;	/* the promotion was done already: not the case sought */
			hit = round == 1 && st.pending_ops > 0;
			if (hit)
				assert_true(st.pending_ops <= 8);
		}
		/* Until quiet: when the promotion ends within the second pass, the 8 waiting RECALLs
		 * find the completion ring full of refusals and are dropped (16 outstanding is the
		 * worker's own error), with their leases: Detach and Attach drop those. */
		uint64_t leases[16];
		int nl = 0;
		for (int i = 0; i < 2000; i++) {
			dp_run(e->dp);
			if (ring_pop(w.r, &x[0], 1) == 1) {
				busy += x[0].status == -EBUSY;
				if (x[0].status == 0)
					leases[nl++] = x[0].payload[1];
				else
					assert_int_equal(x[0].status, -EBUSY);
				continue;
			}
			dp_stats(e->dp, &st);
			if (!st.pending_ops && !st.tier_pending)
				break;
			dp_drain(e->dp, 20);
		}
		if (nl)
			assert_int_equal(release(e, &w, leases, (uint32_t)nl), 0);
		if (hit)
			assert_int_equal(busy, 8);
		if (dp_worker_leases(e->dp, w.wid)) {
			Freekv__Request q = FREEKV__REQUEST__INIT;
			Freekv__SequenceRef ref = FREEKV__SEQUENCE_REF__INIT;
			ref.seq_id = w.seq;
			q.has_worker_id = true;
			q.worker_id = w.wid;
			q.body_case = FREEKV__REQUEST__BODY_DETACH;
			q.detach = &ref;
			assert_int_equal(status_of(call(e, "w1", &q)), 0);
			q.body_case = FREEKV__REQUEST__BODY_ATTACH;
			q.attach = &ref;
			assert_int_equal(status_of(call(e, "w1", &q)), 0);
		}
	}
	ring_close(w.r);
	if (!hit)
		skip();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_codec_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sequences_and_validation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_worker_identity, setup, teardown),
		cmocka_unit_test(test_peer_parse),
		cmocka_unit_test_setup_teardown(test_hello_peer_pid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_counters_and_config, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recall_pending_across_detach, setup_tier, teardown),
		cmocka_unit_test_setup_teardown(test_recall_pending_release_guessed, setup_tier, teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_ring_logged_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pending_bounded, setup_tier, teardown),
		cmocka_unit_test_setup_teardown(test_swap_failures_keep_pages, setup_tiny_tiers, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
