/* Integration: bad input never hurts kvstored. Over a raw ZeroMQ DEALER socket: random frames,
 * truncated and oversized protobufs, wrong versions, missing bodies, out-of-range ids, other
 * workers' ids, frames of the wrong shape — thousands of them, each answered with an error
 * reply (negative status and a message). Over a worker's ring: random entries, offsets that are
 * not blocks or belong to another sequence, forged lease ids — each completed with an error.
 * Afterwards the daemon still serves a normal client, and its resident memory has not grown
 * (checked without AddressSanitizer, whose quarantine holds freed memory on purpose). */
#include "test_kvstored_harness.h"

#include <inttypes.h>
#include <zmq.h>

#define ROUNDS 3000

static uint64_t rss_kb(pid_t pid)
{
	char path[64], line[256];
	uint64_t kb = 0;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %" SCNu64, &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static size_t pack_req(Freekv__Request *q, uint8_t *buf, size_t cap)
{
	size_t n = freekv__request__get_packed_size(q);
	assert_true(n <= cap);
	return freekv__request__pack(q, buf);
}

/* Makes q an OPEN_SEQUENCE request with body o: named name, geometry g, and a fingerprint of
 * fp_len bytes at fp. */
static void open_body(Freekv__Request *q, Freekv__OpenSequence *o, Freekv__Geometry *g,
		      const char *name, uint8_t *fp, size_t fp_len)
{
	o->name = (char *)name;
	o->model_fingerprint.len = fp_len;
	o->model_fingerprint.data = fp;
	o->geometry = g;
	q->body_case = FREEKV__REQUEST__BODY_OPEN_SEQUENCE;
	q->open_sequence = o;
}

/* One bad message; returns the reply's status (must be < 0). */
static int send_bad(void *sock, uint64_t *rng, uint32_t other_worker, int *kind_out)
{
	static uint8_t buf[80000];
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__SequenceRef ref = FREEKV__SEQUENCE_REF__INIT;
	Freekv__OpenSequence o = FREEKV__OPEN_SEQUENCE__INIT;
	Freekv__Geometry g = FREEKV__GEOMETRY__INIT;
	Freekv__ShowSequence sh = FREEKV__SHOW_SEQUENCE__INIT;
	static uint32_t many[20000];
	size_t len = 0;
	int kind = (int)(test_rand(rng) % 10), nframes = 1;
	q.version = 1;
	q.id = test_rand(rng) | 1;
	switch (kind) {
	case 0: /* random bytes */
		len = test_rand(rng) % 512;
		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)test_rand(rng);
		break;
	case 1: /* truncated valid request */
		g.n_layers = g.n_kv_heads = g.head_dim = g.page_size = 4;
		g.dtype = FREEKV__DTYPE__DTYPE_F16;
		open_body(&q, &o, &g, "t", buf + 70000, 1);
		len = pack_req(&q, buf, sizeof buf);
		len = test_rand(rng) % len;
		break;
	case 2: /* wrong version */
		q.version = 2 + (uint32_t)(test_rand(rng) % 100);
		q.body_case = FREEKV__REQUEST__BODY_STATS;
		q.stats = &(Freekv__Empty)FREEKV__EMPTY__INIT;
		len = pack_req(&q, buf, sizeof buf);
		break;
	case 3: /* no body */
		len = pack_req(&q, buf, sizeof buf);
		break;
	case 4: /* unknown sequence id */
		ref.seq_id = test_rand(rng) | (1ull << 40);
		q.body_case = FREEKV__REQUEST__BODY_SHOW_SEQUENCE;
		sh.has_seq_id = true;
		sh.seq_id = ref.seq_id;
		q.show_sequence = &sh;
		len = pack_req(&q, buf, sizeof buf);
		break;
	case 5: /* another worker's id from this connection */
		q.has_worker_id = true;
		q.worker_id = test_rand(rng) % 2 ? other_worker : (uint32_t)test_rand(rng);
		ref.seq_id = 1;
		q.body_case = FREEKV__REQUEST__BODY_ATTACH;
		q.attach = &ref;
		len = pack_req(&q, buf, sizeof buf);
		break;
	case 6: /* bad geometry */
		g.n_layers = (uint32_t)(test_rand(rng) % 3) * 100000;
		g.n_kv_heads = 0;
		g.head_dim = 1u << 30;
		g.page_size = 16;
		g.dtype = (Freekv__DType)(test_rand(rng) % 9 + 4);
		open_body(&q, &o, &g, "geo", buf + 70000, 4);
		len = pack_req(&q, buf, sizeof buf);
		break;
	case 7: /* oversize token count (max_tokens=1000) */
		g.n_layers = g.n_kv_heads = g.head_dim = g.page_size = 4;
		g.dtype = FREEKV__DTYPE__DTYPE_F16;
		open_body(&q, &o, &g, "many", buf + 70000, 4);
		o.n_token_ids = 1001 + test_rand(rng) % 10000;
		o.token_ids = many;
		len = pack_req(&q, buf, sizeof buf);
		break;
	case 8: /* oversized frame (max_request_bytes=64K) */
		len = 65537 + test_rand(rng) % 8000;
		memset(buf, 0x0a, len);
		break;
	default: /* wrong frame shape */
		nframes = 2 + (int)(test_rand(rng) % 3);
		len = test_rand(rng) % 64;
		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)test_rand(rng);
		if (nframes == 2 && len == 0)
			len = 1; /* [empty][empty] would be a REQ-style empty request: still an error */
		break;
	}
	*kind_out = kind;
	for (int f = 0; f < nframes; f++)
		assert_true(zmq_send(sock, buf, len, f + 1 < nframes ? ZMQ_SNDMORE : 0) >= 0);
	zmq_msg_t m;
	zmq_msg_init(&m);
	int n = zmq_msg_recv(&m, sock, 0);
	assert_true(n >= 0);
	Freekv__Reply *r = freekv__reply__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
	zmq_msg_close(&m);
	assert_non_null(r);
	int status = r->status;
	if (status >= 0 || !r->error || !r->error[0])
		fprintf(stderr, "kind %d: status %d error '%s'\n", kind, status, r->error ? r->error : "(none)");
	freekv__reply__free_unpacked(r, NULL);
	return status;
}

static void test_control_fuzz(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "max_tokens=1000", "--set", "max_request_bytes=64K", NULL };
	struct harness h;
	uint64_t seq;
	harness_start(&h, extra);
	struct kvs *w = h_worker(&h, "legit", &seq);
	assert_non_null(w);

	void *ctx = zmq_ctx_new();
	void *sock = zmq_socket(ctx, ZMQ_DEALER);
	int tmo = 5000, linger = 0;
	zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
	zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
	assert_int_equal(zmq_connect(sock, h.endpoint), 0);

	uint64_t rng = 0x5eed;
	int seen[10] = { 0 }, kind;
	uint64_t rss0 = 0;
	for (int i = 0; i < ROUNDS; i++) {
		if (i == ROUNDS / 3)
			rss0 = rss_kb(h.pid);
		assert_true(send_bad(sock, &rng, kvs_worker_id(w), &kind) < 0);
		seen[kind]++;
	}
	for (int k = 0; k < 10; k++)
		assert_true(seen[k] > 0);
	uint64_t rss1 = rss_kb(h.pid);
	fprintf(stderr, "kvstored RSS %" PRIu64 " kB after %d bad requests, %" PRIu64 " kB after %d\n", rss0,
		ROUNDS / 3, rss1, ROUNDS);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
	/* Sanitizer runtimes keep growing their own bookkeeping (quarantine, race history). */
	assert_true(rss1 <= rss0 + 1024);
#endif
	/* Still alive and correct for the legitimate worker. */
	assert_true(harness_alive(&h));
	uint64_t off[1];
	assert_int_equal(kvs_alloc(w, seq, 0, 0, 1, off), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_stats(w, &r), 0);
	bool found = false;
	for (size_t i = 0; i < r->stats->n_commands; i++)
		if (!strcmp(r->stats->commands[i]->name, "malformed"))
			found = r->stats->commands[i]->errors > 0;
	assert_true(found);
	kvs_reply_free(r);
	zmq_close(sock);
	zmq_ctx_term(ctx);
	kvs_close(w);
	harness_stop(&h);
}

static void test_ring_fuzz(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq_a, seq_b, off_b[2], off_a[1];
	harness_start(&h, NULL);
	struct kvs *a = h_worker(&h, "ring-a", &seq_a);
	struct kvs *b = h_worker(&h, "ring-b", &seq_b);
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(kvs_alloc(b, seq_b, 0, 0, 2, off_b), 0);
	assert_int_equal(kvs_commit(b, seq_b, 32, off_b, 2), 0);
	assert_int_equal(kvs_alloc(a, seq_a, 0, 0, 1, off_a), 0);

	/* Targeted: another worker's sequence and blocks, interior offsets, forged leases. */
	uint64_t o[2], l[2], m = 1;
	uint32_t pg = 0;
	assert_int_equal(kvs_alloc(a, seq_b, 0, 5, 1, o), -ENOENT);
	assert_int_equal(kvs_commit(a, seq_a, 16, off_b, 1), -EPERM);
	uint64_t interior = off_a[0] + 64;
	assert_int_equal(kvs_commit(a, seq_a, 16, &interior, 1), -EINVAL);
	uint64_t beyond = kvs_pool_bytes(a) + 4096;
	assert_int_equal(kvs_commit(a, seq_a, 16, &beyond, 1), -EINVAL);
	assert_int_equal(kvs_recall(a, seq_b, 0, &pg, &m, 1, o, l), -ENOENT);
	assert_int_equal(kvs_alloc(a, seq_a, 9, 0, 1, o), -EINVAL);	/* layer out of range */
	assert_int_equal(kvs_alloc(a, seq_a, 0, 0, 1, o), -EEXIST);
	/* Pages past max_tokens (1M tokens of 16: page 65535 is the last) are out of range: a far
	 * page would only grow the daemon's block table (n_layers x pages). */
	assert_int_equal(kvs_alloc(a, seq_a, 0, (1u << 24) - 1, 1, o), -ERANGE);
	assert_int_equal(kvs_alloc(a, seq_a, 0, 65535, 2, o), -ERANGE);
	assert_int_equal(kvs_alloc(a, seq_a, 1, 65535, 1, o), 0);
	assert_int_equal(kvs_commit(a, seq_a, 1u << 30, off_a, 1), -ERANGE);
	uint64_t bad_mask = 1u << 5;
	assert_int_equal(kvs_recall(a, seq_a, 0, &pg, &bad_mask, 1, o, l), -EINVAL);
	assert_int_equal(kvs_commit(a, seq_a, 16, off_a, 1), 0);
	assert_int_equal(kvs_recall(b, seq_b, 0, &pg, &m, 1, o, l), 0);
	assert_int_equal(kvs_release(a, l, 1), -EINVAL);	/* b's lease, presented by a */
	uint64_t twice[2] = { l[0], l[0] };
	assert_int_equal(kvs_release(b, twice, 2), -EINVAL);
	assert_int_equal(kvs_release(b, l, 1), 0);
	assert_int_equal(kvs_release(b, l, 1), -EINVAL);	/* stale */

	/* Random entries: every one completes, and none succeeds by accident. */
	uint64_t rng = 99;
	for (int i = 0; i < 2000; i++) {
		struct ring_entry e;
		memset(&e, 0, sizeof e);
		e.op = (uint32_t)(test_rand(&rng) % 7);
		e.seq_id = test_rand(&rng) % 4 ? seq_b : test_rand(&rng);
		e.layer = (uint32_t)(test_rand(&rng) % 4);
		e.first_page = (uint32_t)test_rand(&rng);
		e.count = (uint32_t)(test_rand(&rng) % 80);
		e.n_payload = (uint32_t)(test_rand(&rng) % (RING_PAYLOAD_MAX + 1));
		for (unsigned k = 0; k < RING_PAYLOAD_MAX; k++)
			e.payload[k] = test_rand(&rng) % 3 ? test_rand(&rng) : off_b[k % 2];
		e.user_data = (uint64_t)i + 1;
		assert_int_equal(kvs_ring_submit(a, &e, 1), 1);
		struct ring_entry c;
		assert_int_equal(kvs_ring_complete(a, &c, 1, 5000), 1);
		assert_int_equal(c.user_data, e.user_data);
		assert_true(c.status < 0);
	}
	assert_true(harness_alive(&h));
	/* b's data is untouched. */
	assert_int_equal(kvs_recall(b, seq_b, 0, &pg, &m, 1, o, l), 0);
	assert_int_equal(kvs_release(b, l, 1), 0);
	kvs_close(a);
	kvs_close(b);
	harness_stop(&h);
}

static size_t count_dir(const char *path)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "ls %s | wc -l", path);
	FILE *p = popen(cmd, "r");
	size_t n = 0;
	assert_non_null(p);
	assert_int_equal(fscanf(p, "%zu", &n), 1);
	pclose(p);
	return n;
}

/* count_dir(path) once it holds still: a worker's Goodbye is handled by the daemon after the
 * worker has gone, so its descriptor and watch thread may linger a moment. Waits (up to 5 s)
 * for two reads 100 ms apart to agree and, with at_most >= 0, for the count to fall to it. */
static size_t count_settled(const char *path, long at_most)
{
	size_t n = count_dir(path);
	for (int i = 0; i < 50; i++) {
		usleep(100 * 1000);
		size_t m = count_dir(path);
		if (m == n && (at_most < 0 || (long)m <= at_most))
			return m;
		n = m;
	}
	return n;
}

/* Workers come and go (Hello creates a ring segment and its watch thread; Goodbye or death
 * removes them): descriptors and threads of the daemon stay level, no ring segment is left. */
static void test_worker_churn(void **state)
{
	(void)state;
	struct harness h;
	char fd_dir[64], task_dir[64];
	harness_start(&h, NULL);
	snprintf(fd_dir, sizeof fd_dir, "/proc/%d/fd", (int)h.pid);
	snprintf(task_dir, sizeof task_dir, "/proc/%d/task", (int)h.pid);
	size_t fds0 = 0, tasks0 = 0;
	for (int i = 0; i < 200; i++) {
		char name[32];
		uint64_t seq, off[1];
		snprintf(name, sizeof name, "churn-%d", i % 7);
		struct kvs *k = h_worker(&h, name, &seq);
		assert_non_null(k);
		assert_int_equal(kvs_alloc(k, seq, 0, (uint32_t)i, 1, off), 0);
		/* Odd pages stay (committed, inside the committed length: blocks past it are freed
		 * when the worker goes), even ones are freed at Goodbye. */
		if (i % 2)
			assert_int_equal(kvs_commit(k, seq, (uint64_t)(i + 1) * 16, off, 1), 0);
		kvs_close(k);
		if (i == 9) {
			fds0 = count_settled(fd_dir, -1);
			tasks0 = count_settled(task_dir, -1);
		}
	}
	/* 190 more workers came and went: not one descriptor or thread more */
	assert_true(count_settled(fd_dir, (long)fds0) <= fds0);
	assert_true(count_settled(task_dir, (long)tasks0) <= tasks0);
	struct kvs *c;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &c), 0);
	assert_int_equal(kvs_stats(c, &r), 0);
	assert_int_equal(r->stats->blocks_dram, 100);
	assert_int_equal(r->stats->workers, 0);
	kvs_reply_free(r);
	kvs_close(c);
	char cmd[512];
	snprintf(cmd, sizeof cmd, "ls /dev/shm | grep -c -- '%s-ring' >/dev/null", h.shm + 1);
	assert_int_not_equal(WEXITSTATUS(system(cmd)), 0); /* grep finds no ring segment */
	harness_stop(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_control_fuzz, h_teardown),
		cmocka_unit_test_teardown(test_ring_fuzz, h_teardown),
		cmocka_unit_test_teardown(test_worker_churn, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
