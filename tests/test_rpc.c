/* Tests kvstore/rpc.c in-process: rpc_process() on packed requests with the real modules behind
 * it (a small pool, no tier). Checks the codec and validation paths — undecodable, oversized,
 * wrong version, no body, unknown ids, bad geometry, oversize counts, worker identity — that
 * each gets a Reply with the request's id, a negative status and a message; that good requests
 * get the right body; and that the per-command counters count. */
#include "test_util.h"

#include <errno.h>
#include <zmq.h>

#include "proto/kvstore.pb-c.h"
#include "rpc.h"

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

static int setup(void **state)
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
	assert_int_equal(cfg_set(&e->cfg, "dram_bytes", "8M", false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "lock_memory", "false", false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "nvme_path", "", false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "max_tokens", "100", false, err, sizeof err), 0);
	assert_int_equal(cfg_set(&e->cfg, "max_request_bytes", "4K", false, err, sizeof err), 0);
	assert_int_equal(seq_table_init(&e->seqs, 16), 0);
	assert_int_equal(wk_init(&e->workers, 4), 0);
	int ret = dp_init(&e->dp, &e->cfg, &e->seqs, err, sizeof err);
	if (ret)
		fprintf(stderr, "dp_init: %s\n", err);
	assert_int_equal(ret, 0);
	e->zctx = zmq_ctx_new();
	struct rpc_ctx ctx = { &e->cfg, &e->seqs, &e->workers, e->dp, 0, clock_ms };
	assert_int_equal(rpc_init(&e->s, e->zctx, &ctx, err, sizeof err), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	rpc_shutdown(&e->s);
	zmq_ctx_term(e->zctx);
	dp_shutdown(e->dp);
	wk_shutdown(&e->workers);
	seq_table_shutdown(&e->seqs);
	rmdir(e->dir);
	free(e);
	return 0;
}

/* Process raw bytes from identity `who`; returns the decoded reply (caller frees). */
static Freekv__Reply *raw(struct env *e, const char *who, const void *data, size_t len)
{
	uint8_t *out;
	size_t n;
	assert_int_equal(rpc_process(&e->s, who, strlen(who), data, len, &out, &n), 0);
	Freekv__Reply *r = freekv__reply__unpack(NULL, n, out);
	free(out);
	assert_non_null(r);
	if (r->status)
		assert_true(r->error && r->error[0]);
	return r;
}

static Freekv__Reply *call(struct env *e, const char *who, Freekv__Request *q)
{
	uint8_t buf[8192];
	if (!q->version)
		q->version = 1;
	size_t n = freekv__request__get_packed_size(q);
	assert_true(n <= sizeof buf);
	freekv__request__pack(q, buf);
	return raw(e, who, buf, n);
}

static int status_of(Freekv__Reply *r)
{
	int s = r->status;
	freekv__reply__free_unpacked(r, NULL);
	return s;
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_codec_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sequences_and_validation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_worker_identity, setup, teardown),
		cmocka_unit_test_setup_teardown(test_counters_and_config, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
