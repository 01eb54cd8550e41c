/* Tests kvstore/lib/ring.c on real shared memory: segment checks, FIFO order across many
 * wraparounds against the sequence of pushed entries, a worker process and a daemon process
 * exchanging thousands of operations through fork (daemon side driven by the watch thread and
 * an eventfd), a futex sleep woken by the peer, timeouts, and a peer that writes garbage into
 * indices and slots. */
#include "test_util.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "pool_map.h"
#include "ring.h"

static char name_buf[64];

static const char *ring_test_name(const char *what)
{
	snprintf(name_buf, sizeof name_buf, "/freekv-test-ring-%s-%d", what, (int)getpid());
	return name_buf;
}

static struct ring *make_ring(const char *name, uint32_t entries)
{
	struct ring_config cfg = { .shm_name = name, .entries = entries, .unlink_existing = true };
	struct ring *r = NULL;
	char err[RING_ERR_LEN] = "";
	int ret = ring_create(&cfg, &r, err, sizeof err);
	if (ret)
		fprintf(stderr, "ring_create: %s\n", err);
	assert_int_equal(ret, 0);
	return r;
}

static struct ring *open_ring(const char *name)
{
	struct ring *w = NULL;
	char err[RING_ERR_LEN] = "";
	int ret = ring_open(name, &w, err, sizeof err);
	if (ret)
		fprintf(stderr, "ring_open: %s\n", err);
	assert_int_equal(ret, 0);
	return w;
}

/* A raw view of the segment, as a buggy or hostile peer would have it. */
static _Atomic uint32_t *raw_word(const struct pool_map *m, unsigned off)
{
	return (_Atomic uint32_t *)((char *)m->base + off);
}

static void make_entry(struct ring_entry *e, uint64_t k)
{
	memset(e, 0, sizeof *e);
	e->op = RING_OP_ALLOC + (uint32_t)(k % 4);
	e->user_data = k;
	e->seq_id = k * 3;
	e->layer = (uint32_t)(k % 5);
	e->first_page = (uint32_t)(k % 1000);
	e->n_payload = (uint32_t)(k % (RING_PAYLOAD_MAX + 1));
	e->count = e->n_payload;
	for (uint32_t i = 0; i < e->n_payload; i++)
		e->payload[i] = k * 1000 + i;
}

static void check_entry(const struct ring_entry *e, uint64_t k)
{
	struct ring_entry want;
	make_entry(&want, k);
	assert_int_equal(e->op, want.op);
	assert_int_equal(e->user_data, k);
	assert_int_equal(e->seq_id, want.seq_id);
	assert_int_equal(e->layer, want.layer);
	assert_int_equal(e->first_page, want.first_page);
	assert_int_equal(e->n_payload, want.n_payload);
	assert_memory_equal(e->payload, want.payload, sizeof(uint64_t) * want.n_payload);
}

static void test_create_and_open_checks(void **state)
{
	(void)state;
	struct ring *r = NULL;
	char err[RING_ERR_LEN] = "";
	struct ring_config cfg = { .shm_name = ring_test_name("chk"), .entries = 12 };
	assert_int_equal(ring_create(&cfg, &r, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "power of two"));
	cfg.entries = 1u << 17;
	assert_int_equal(ring_create(&cfg, &r, err, sizeof err), -EINVAL);
	r = make_ring(cfg.shm_name, 64);
	assert_int_equal(ring_role(r), RING_ROLE_DAEMON);
	char path[128];
	snprintf(path, sizeof path, "/dev/shm%s", cfg.shm_name);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0660);
	assert_int_equal((uint64_t)st.st_size, ring_segment_bytes(64));
	struct ring *w = open_ring(cfg.shm_name);
	assert_int_equal(ring_role(w), RING_ROLE_WORKER);
	assert_int_equal(ring_entries(w), 64);
	ring_close(w);
	assert_int_equal(stat(path, &st), 0); /* the worker never unlinks */
	ring_destroy(r);
	assert_int_equal(stat(path, &st), -1);
	assert_int_equal(ring_open(cfg.shm_name, &w, err, sizeof err), -ENOENT);
	/* A segment that is not a ring (a pool, or a ring whose header was scribbled on). */
	struct pool_segment_config sc = { .name = cfg.shm_name, .bytes = 1 << 20,
					  .unlink_existing = true };
	void *base;
	int fd;
	assert_int_equal(pool_segment_create(&sc, &base, &fd, NULL, 0), 0);
	assert_int_equal(ring_open(cfg.shm_name, &w, err, sizeof err), -EPROTO);
	assert_non_null(strstr(err, "not a freekv ring"));
	pool_segment_unmap(base, 1 << 20, fd);
	pool_segment_unlink(cfg.shm_name, NULL);
	r = make_ring(cfg.shm_name, 8);
	struct pool_map m;
	assert_int_equal(pool_map(cfg.shm_name, NULL, 0, &m, NULL, 0), 0);
	*raw_word(&m, 8) = 1u << 20; /* entries in the header: the size no longer matches */
	assert_int_equal(ring_open(cfg.shm_name, &w, err, sizeof err), -EPROTO);
	pool_unmap(&m);
	ring_destroy(r);
}

static void test_fifo_wraparound(void **state)
{
	(void)state;
	const char *name = ring_test_name("fifo");
	struct ring *d = make_ring(name, 8);
	struct ring *w = open_ring(name);
	struct ring_entry in[13], out[13];
	uint64_t next_push = 0, next_pop = 0;
	uint64_t rng = 5;
	while (next_pop < 5000) {
		unsigned n = 1 + (unsigned)(test_rand(&rng) % 13);
		for (unsigned i = 0; i < n; i++)
			make_entry(&in[i], next_push + i);
		unsigned space = ring_space(w);
		int pushed = ring_push(w, in, n);
		assert_int_equal(pushed, n < space ? n : space);
		next_push += (uint64_t)pushed;
		assert_int_equal(ring_ready(d), next_push - next_pop);
		unsigned want = 1 + (unsigned)(test_rand(&rng) % 13);
		int popped = ring_pop(d, out, want);
		assert_true(popped >= 0);
		for (int i = 0; i < popped; i++)
			check_entry(&out[i], next_pop + (uint64_t)i);
		next_pop += (uint64_t)popped;
	}
	/* The other direction, and a full ring. */
	for (int i = 0; i < 8; i++)
		make_entry(&in[i], 100 + (uint64_t)i);
	assert_int_equal(ring_push(d, in, 8), 8);
	assert_int_equal(ring_push(d, in, 1), 0);
	assert_int_equal(ring_space(d), 0);
	assert_int_equal(ring_pop(w, out, 13), 8);
	for (int i = 0; i < 8; i++)
		check_entry(&out[i], 100 + (uint64_t)i);
	in[0].n_payload = RING_PAYLOAD_MAX + 1;
	assert_int_equal(ring_push(w, in, 1), -EINVAL);
	struct ring_stats st;
	ring_stats(d, &st);
	assert_int_equal(st.popped, next_pop);
	ring_close(w);
	ring_destroy(d);
}

static void test_garbage_from_peer(void **state)
{
	(void)state;
	const char *name = ring_test_name("bad");
	struct ring *d = make_ring(name, 16);
	struct ring *w = open_ring(name);
	struct pool_map m;
	assert_int_equal(pool_map(name, NULL, 0, &m, NULL, 0), 0);
	struct ring_entry e[4], out[16];
	for (int i = 0; i < 4; i++)
		make_entry(&e[i], 10 + (uint64_t)i);
	assert_int_equal(ring_push(w, e, 4), 4);
	/* Slot garbage: op out of range in slot 1, n_payload too large in slot 2. */
	struct ring_entry *slots = (struct ring_entry *)((char *)m.base + RING_OFF_SLOTS);
	slots[1].op = 77;
	slots[2].n_payload = 100000;
	assert_int_equal(ring_pop(d, out, 16), 4);
	check_entry(&out[0], 10);
	assert_int_equal(out[1].op, RING_OP_INVALID);
	assert_int_equal(out[1].user_data, 11);
	assert_int_equal(out[2].op, RING_OP_INVALID);
	assert_int_equal(out[2].n_payload, 0);
	assert_int_equal(out[2].user_data, 12);
	check_entry(&out[3], 13);
	/* Index garbage: a tail far ahead of head, in both rings. */
	uint32_t tail = atomic_load(raw_word(&m, RING_OFF_SQ_TAIL));
	atomic_store(raw_word(&m, RING_OFF_SQ_TAIL), tail + 1000);
	assert_int_equal(ring_pop(d, out, 16), -EPROTO);
	assert_int_equal(ring_ready(d), 0);
	assert_int_equal(ring_wait(d, 10), -EPROTO);
	atomic_store(raw_word(&m, RING_OFF_SQ_TAIL), tail - 1); /* behind head */
	assert_int_equal(ring_pop(d, out, 16), -EPROTO);
	atomic_store(raw_word(&m, RING_OFF_SQ_TAIL), tail);
	assert_int_equal(ring_pop(d, out, 16), 0);
	/* The daemon's produced ring: a worker head that claims more was consumed than pushed. */
	uint32_t head = atomic_load(raw_word(&m, RING_OFF_CQ_HEAD));
	atomic_store(raw_word(&m, RING_OFF_CQ_HEAD), head + 5);
	assert_int_equal(ring_push(d, e, 1), -EPROTO);
	assert_int_equal(ring_space(d), 0);
	atomic_store(raw_word(&m, RING_OFF_CQ_HEAD), head);
	assert_int_equal(ring_push(d, e, 1), 1);
	/* Random words all over the index area: every call returns, in bounds. */
	uint64_t rng = 11;
	for (int it = 0; it < 2000; it++) {
		for (unsigned off = 0; off < 512; off += 4)
			if (test_rand(&rng) % 8 == 0)
				atomic_store(raw_word(&m, off), (uint32_t)test_rand(&rng));
		int r1 = ring_pop(d, out, 16);
		assert_true(r1 == -EPROTO || (r1 >= 0 && r1 <= 16));
		int r2 = ring_push(d, e, 4);
		assert_true(r2 == -EPROTO || (r2 >= 0 && r2 <= 4));
		for (int i = 0; i < (r1 > 0 ? r1 : 0); i++)
			assert_true(out[i].n_payload <= RING_PAYLOAD_MAX);
	}
	pool_unmap(&m);
	ring_close(w);
	ring_destroy(d);
}

static void test_wait_timeout(void **state)
{
	(void)state;
	const char *name = ring_test_name("to");
	struct ring *d = make_ring(name, 8);
	struct ring *w = open_ring(name);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	assert_int_equal(ring_wait(w, 50), -ETIMEDOUT);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	assert_true(ms >= 49.0);
	struct ring_entry e;
	make_entry(&e, 1);
	assert_int_equal(ring_push(d, &e, 1), 1);
	assert_int_equal(ring_wait(w, 0), 0);
	ring_close(w);
	ring_destroy(d);
}

/* The worker announces, through the segment's own sleeping flag, that it sleeps; the daemon
 * waits for that flag before pushing, so the wake is a real FUTEX_WAKE of a sleeping process. */
static void test_futex_sleep_and_wake(void **state)
{
	(void)state;
	const char *name = ring_test_name("fx");
	struct ring *d = make_ring(name, 8);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct ring *w = NULL;
		if (ring_open(name, &w, NULL, 0) != 0)
			_exit(2);
		if (ring_wait(w, 10000) != 0)
			_exit(3);
		struct ring_entry e;
		if (ring_pop(w, &e, 1) != 1 || e.user_data != 4242)
			_exit(4);
		struct ring_stats st;
		ring_stats(w, &st);
		_exit(st.sleeps >= 1 ? 0 : 5);
	}
	struct pool_map m;
	assert_int_equal(pool_map(name, NULL, 0, &m, NULL, 0), 0);
	for (int i = 0; i < 10000 && !atomic_load(raw_word(&m, RING_OFF_CQ_SLEEPING)); i++)
		usleep(1000);
	assert_int_equal(atomic_load(raw_word(&m, RING_OFF_CQ_SLEEPING)), 1);
	struct ring_entry e;
	make_entry(&e, 4242);
	assert_int_equal(ring_push(d, &e, 1), 1);
	struct ring_stats st;
	ring_stats(d, &st);
	assert_int_equal(st.wakes, 1);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	pool_unmap(&m);
	ring_destroy(d);
}

static uint64_t ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The daemon's data-plane thread sleeps on every submission doorbell at once: a push into any
 * ring, or a kick of its private word, must end the sleep; a ring that is not empty must not
 * let it sleep at all. */
static void test_sleep_on_many_rings(void **state)
{
	(void)state;
	char n1[64], n2[64];
	snprintf(n1, sizeof n1, "%s", ring_test_name("m1"));
	snprintf(n2, sizeof n2, "%s", ring_test_name("m2"));
	struct ring *d1 = make_ring(n1, 8), *d2 = make_ring(n2, 8);
	struct ring *w2 = open_ring(n2);
	struct ring_bell b[3];
	_Atomic uint32_t kick = 0;
	struct ring_entry e;

	/* Entries already there: no sleep announced. */
	make_entry(&e, 1);
	assert_int_equal(ring_push(w2, &e, 1), 1);
	assert_int_equal(ring_sleep_prepare(d2, &b[2]), 1);
	assert_int_equal(ring_pop(d2, &e, 1), 1);

	/* A push from another process into the second ring wakes the sleeper. */
	b[0] = (struct ring_bell){ &kick, atomic_load(&kick), true };
	assert_int_equal(ring_sleep_prepare(d1, &b[1]), 0);
	assert_int_equal(ring_sleep_prepare(d2, &b[2]), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct ring *w = NULL;
		if (ring_open(n2, &w, NULL, 0) != 0)
			_exit(2);
		usleep(50000);
		struct ring_entry x;
		make_entry(&x, 7);
		if (ring_push(w, &x, 1) != 1)
			_exit(3);
		struct ring_stats st;
		ring_stats(w, &st);
		_exit(st.wakes == 1 ? 0 : 4); /* it saw the announcement and rang */
	}
	uint64_t t0 = ms_now();
	while (!ring_ready(d2) && ms_now() - t0 < 10000)
		assert_int_equal(ring_bells_wait(b, 3, 10000), 0);
	assert_true(ms_now() - t0 < 5000); /* woken, not timed out */
	assert_int_equal(ring_ready(d2), 1);
	assert_int_equal(ring_ready(d1), 0);
	ring_sleep_end(d1);
	ring_sleep_end(d2);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(ring_pop(d2, &e, 1), 1);
	assert_int_equal(e.user_data, 7);

	/* The kick word: a bump after the snapshot ends the wait at once (no 10 s timeout). */
	b[0].seen = atomic_load(&kick);
	assert_int_equal(ring_sleep_prepare(d1, &b[1]), 0);
	assert_int_equal(ring_sleep_prepare(d2, &b[2]), 0);
	ring_kick(&kick);
	t0 = ms_now();
	assert_int_equal(ring_bells_wait(b, 3, 10000), 0);
	assert_true(ms_now() - t0 < 5000);
	ring_sleep_end(d1);
	ring_sleep_end(d2);

	/* Nothing moves: the timeout ends it. */
	b[0].seen = atomic_load(&kick);
	assert_int_equal(ring_sleep_prepare(d1, &b[1]), 0);
	assert_int_equal(ring_bells_wait(b, 2, 20), 0);
	ring_sleep_end(d1);
	assert_int_equal(ring_bells_wait(b, RING_BELLS_MAX + 1, 0), -EINVAL);

	ring_close(w2);
	ring_destroy(d1);
	ring_destroy(d2);
}

#define OPS 20000u

/* Worker process: keeps up to `entries` operations outstanding, checks every completion. */
static int worker_main(const char *name)
{
	struct ring *w = NULL;
	if (ring_open(name, &w, NULL, 0) != 0)
		return 2;
	uint32_t cap = ring_entries(w);
	uint64_t sent = 0, done = 0;
	struct ring_entry batch[16], out[16];
	while (done < OPS) {
		unsigned n = 0;
		while (n < 16 && sent + n < OPS && sent + n - done < cap) {
			make_entry(&batch[n], sent + n);
			n++;
		}
		if (n) {
			int p = ring_push(w, batch, n);
			if (p < 0)
				return 3;
			sent += (uint64_t)p;
		}
		int ret = ring_wait(w, 10000);
		if (ret != 0)
			return 4;
		int k = ring_pop(w, out, 16);
		if (k < 0)
			return 5;
		for (int i = 0; i < k; i++, done++) {
			struct ring_entry want;
			make_entry(&want, done);
			if (out[i].user_data != done || out[i].status != -(int32_t)(done % 7) ||
			    out[i].n_payload != want.n_payload)
				return 6;
			for (uint32_t j = 0; j < want.n_payload; j++)
				if (out[i].payload[j] != want.payload[j] * 3)
					return 7;
		}
	}
	ring_close(w);
	return 0;
}

static void test_two_processes(void **state)
{
	(void)state;
	const char *name = ring_test_name("2p");
	struct ring *d = make_ring(name, 16);
	int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	assert_true(efd >= 0);
	assert_int_equal(ring_watch_start(d, efd), 0);
	assert_int_equal(ring_watch_start(d, efd), -EBUSY);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(worker_main(name));
	uint64_t served = 0;
	struct ring_entry in[16];
	while (served < OPS) {
		struct pollfd pfd = { .fd = efd, .events = POLLIN };
		int pr = poll(&pfd, 1, 10000);
		assert_int_equal(pr, 1);
		uint64_t v;
		assert_int_equal(read(efd, &v, sizeof v), (ssize_t)sizeof v);
		int k;
		while ((k = ring_pop(d, in, 16)) > 0) {
			for (int i = 0; i < k; i++) {
				assert_int_equal(in[i].user_data, served + (uint64_t)i);
				in[i].status = -(int32_t)(in[i].user_data % 7);
				for (uint32_t j = 0; j < in[i].n_payload; j++)
					in[i].payload[j] *= 3;
			}
			assert_int_equal(ring_push(d, in, (unsigned)k), k);
			served += (uint64_t)k;
		}
		assert_true(k == 0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	ring_watch_stop(d);
	close(efd);
	ring_destroy(d);
}

static void test_watch_announces_pending(void **state)
{
	(void)state;
	const char *name = ring_test_name("wa");
	struct ring *d = make_ring(name, 8);
	struct ring *w = open_ring(name);
	struct ring_entry e;
	make_entry(&e, 9);
	assert_int_equal(ring_push(w, &e, 1), 1);
	int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	assert_int_equal(ring_watch_start(w, efd), -EINVAL);
	assert_int_equal(ring_watch_start(d, efd), 0);
	struct pollfd pfd = { .fd = efd, .events = POLLIN };
	assert_int_equal(poll(&pfd, 1, 5000), 1);
	uint64_t v;
	assert_int_equal(read(efd, &v, sizeof v), (ssize_t)sizeof v);
	/* Nothing new: the eventfd stays quiet; a new submission signals it again. */
	assert_int_equal(poll(&pfd, 1, 200), 0);
	assert_int_equal(ring_push(w, &e, 1), 1);
	assert_int_equal(poll(&pfd, 1, 5000), 1);
	ring_destroy(d); /* stops the watch thread too */
	ring_close(w);
	close(efd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_and_open_checks),
		cmocka_unit_test(test_fifo_wraparound),
		cmocka_unit_test(test_garbage_from_peer),
		cmocka_unit_test(test_wait_timeout),
		cmocka_unit_test(test_futex_sleep_and_wake),
		cmocka_unit_test(test_sleep_on_many_rings),
		cmocka_unit_test(test_two_processes),
		cmocka_unit_test(test_watch_announces_pending),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
