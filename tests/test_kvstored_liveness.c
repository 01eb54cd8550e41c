/* Integration: worker liveness. A worker process holding leases (and an uncommitted block) is
 * killed with SIGKILL: within 1 s its leases are gone, its uncommitted block freed and its
 * sequence orphaned (noticed through the pidfd); another worker keeps working throughout; a new
 * worker attaches the orphan, gets its token ids back and reads every committed byte. A silent
 * worker (alive, no heartbeat) is dropped after heartbeat_timeout_ms. A worker that says Goodbye
 * leaves its sequences detached, not orphaned. */
#include "clock.h"
#include "test_kvstored_harness.h"

#include <stdatomic.h>
#include <sys/mman.h>

#define N_PAGES 6

static int victim(const struct harness *h, int ready_fd)
{
	uint64_t seq, off[N_PAGES + 1];
	uint32_t tokens[N_PAGES * 16];
	struct kvs *k = h_worker(h, "orphan", &seq);
	if (!k)
		return 1;
	uint8_t *base = kvs_pool_base(k);
	for (uint32_t i = 0; i < N_PAGES * 16; i++)
		tokens[i] = 1000 + i;
	for (uint32_t l = 0; l < h_geo.n_layers; l++) {
		if (kvs_alloc(k, seq, l, 0, N_PAGES, off))
			return 2;
		for (uint32_t p = 0; p < N_PAGES; p++)
			h_fill(base + off[p], H_BLOCK, 42, l, p);
		if (kvs_commit(k, seq, N_PAGES * 16, off, N_PAGES))
			return 3;
	}
	if (kvs_commit_tokens(k, seq, N_PAGES * 16, 0, tokens, N_PAGES * 16))
		return 4;
	/* Hold leases on layer 0 and leave one block of layer 1 uncommitted. */
	uint32_t pages[N_PAGES];
	uint64_t masks[N_PAGES], leases[N_PAGES];
	for (uint32_t p = 0; p < N_PAGES; p++) {
		pages[p] = p;
		masks[p] = 1;
	}
	if (kvs_recall(k, seq, 0, pages, masks, N_PAGES, off, leases))
		return 5;
	if (kvs_alloc(k, seq, 1, N_PAGES, 1, off))
		return 6;
	if (write(ready_fd, "r", 1) != 1)
		return 7;
	for (;;)
		pause();
}

/* The client tells "nothing there" and "the daemon died" from a slow reply (a socket monitor),
 * so neither waits for a request timeout: a request to an endpoint with no daemon fails with
 * ECONNREFUSED, and after a kill -9 of the daemon a worker waiting on its ring and its next
 * request fail with ECONNRESET, each naming the endpoint. Timeouts here are 10 s; every answer
 * must come well before. */
static void test_daemon_gone_detected(void **state)
{
	(void)state;
	struct kvs *k;
	char none[128];
	snprintf(none, sizeof none, "ipc:///tmp/fkv-none-%d.sock", (int)getpid());
	assert_int_equal(kvs_connect(none, 10000, &k), 0);
	uint64_t t0 = clock_ms();
	assert_int_equal(kvs_stats(k, NULL), -ECONNREFUSED);
	assert_true(clock_ms() - t0 < 3000);
	assert_non_null(strstr(kvs_error(k), "no kvstored answers at"));
	assert_non_null(strstr(kvs_error(k), none));
	kvs_close(k);

	struct harness h;
	uint64_t seq;
	harness_start(&h, NULL);
	k = h_worker(&h, "gone", &seq);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, seq, 5, 0, 4), 0);
	kill(h.pid, SIGKILL);
	waitpid(h.pid, NULL, 0);
	t0 = clock_ms();
	struct ring_entry c;
	assert_int_equal(kvs_ring_complete(k, &c, 1, 10000), -ECONNRESET);
	assert_true(clock_ms() - t0 < 3000);
	assert_non_null(strstr(kvs_error(k), "is gone"));
	t0 = clock_ms();
	assert_int_equal(kvs_stats(k, NULL), -ECONNRESET);
	assert_true(clock_ms() - t0 < 3000);
	kvs_close(k);
	h_teardown(NULL);
}

/* Loops alloc/commit/recall/release on its own sequence until SIGTERM, counting finished rounds
 * in *rounds (shared with the parent); exits with 0 when every operation succeeded. */
static volatile sig_atomic_t stop_flag;
static void on_term(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static int bystander(const struct harness *h, _Atomic uint32_t *rounds)
{
	uint64_t seq, off[1], lease;
	uint64_t mask = 3;
	signal(SIGTERM, on_term);
	struct kvs *k = h_worker(h, "bystander", &seq);
	if (!k)
		return 1;
	uint8_t *base = kvs_pool_base(k);
	uint32_t page = 0;
	while (!stop_flag && page < 4000) {
		if (kvs_alloc(k, seq, 0, page, 1, off))
			return 2;
		h_fill(base + off[0], H_BLOCK, 7, 0, page);
		if (kvs_commit(k, seq, (page + 1) * 16ull, off, 1))
			return 3;
		if (kvs_recall(k, seq, 0, &page, &mask, 1, off, &lease))
			return 4;
		if (!h_check(base + off[0], H_BLOCK, 7, 0, page))
			return 5;
		if (kvs_release(k, &lease, 1))
			return 6;
		page++;
		atomic_store(rounds, page);
		h_sleep_ms(2);
	}
	kvs_close(k);
	return 0;
}

static void test_kill9_orphans_within_1s(void **state)
{
	(void)state;
	struct harness h;
	int pfd[2];
	harness_start(&h, NULL);
	assert_int_equal(pipe(pfd), 0);
	_Atomic uint32_t *rounds = mmap(NULL, sizeof *rounds, PROT_READ | PROT_WRITE,
					MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(rounds != MAP_FAILED);
	atomic_store(rounds, 0);
	pid_t by = fork();
	assert_true(by >= 0);
	if (by == 0)
		_exit(bystander(&h, rounds));
	pid_t v = fork();
	assert_true(v >= 0);
	if (v == 0)
		_exit(victim(&h, pfd[1]));
	char c;
	assert_int_equal(read(pfd[0], &c, 1), 1);

	struct kvs *ctl;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &ctl), 0);
	assert_int_equal(kvs_show_sequence(ctl, 0, "orphan", false, &r), 0);
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ATTACHED);
	assert_int_equal(r->sequence->leases, N_PAGES);
	assert_int_equal(r->sequence->pages->dram, 2 * N_PAGES + 1);
	kvs_reply_free(r);

	uint32_t rounds_at_kill = atomic_load(rounds);
	uint64_t t0 = clock_ms();
	assert_int_equal(kill(v, SIGKILL), 0);
	int st;
	waitpid(v, &st, 0);
	for (;;) {
		assert_int_equal(kvs_show_sequence(ctl, 0, "orphan", false, &r), 0);
		bool done = r->sequence->state == FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ORPHANED;
		if (done) {
			assert_int_equal(r->sequence->leases, 0);
			assert_int_equal(r->sequence->pages->dram, 2 * N_PAGES); /* uncommitted block freed */
		}
		kvs_reply_free(r);
		if (done)
			break;
		assert_true(clock_ms() - t0 < 1000);
		h_sleep_ms(5);
	}
	fprintf(stderr, "orphaned %llu ms after SIGKILL\n", (unsigned long long)(clock_ms() - t0));
	assert_true(clock_ms() - t0 < 1000);

	/* A new worker resumes the orphan: token ids and every committed byte. */
	struct kvs *k;
	uint64_t seq;
	Freekv__Reply *info;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "resumer"), 0);
	assert_int_equal(kvs_open_sequence(k, "orphan", h_fp, sizeof h_fp, &h_geo, NULL, 0, false, &seq), 0);
	assert_int_equal(kvs_attach(k, seq, &info), 0);
	assert_int_equal(info->sequence->committed_tokens, N_PAGES * 16);
	assert_int_equal(info->sequence->n_token_ids, N_PAGES * 16);
	for (uint32_t i = 0; i < N_PAGES * 16; i++)
		assert_int_equal(info->sequence->token_ids[i], 1000 + i);
	kvs_reply_free(info);
	uint8_t *base = kvs_pool_base(k);
	for (uint32_t l = 0; l < h_geo.n_layers; l++) {
		uint32_t pages[N_PAGES];
		uint64_t masks[N_PAGES], off[N_PAGES], leases[N_PAGES];
		for (uint32_t p = 0; p < N_PAGES; p++) {
			pages[p] = p;
			masks[p] = 3;
		}
		assert_int_equal(kvs_recall(k, seq, l, pages, masks, N_PAGES, off, leases), 0);
		for (uint32_t p = 0; p < N_PAGES; p++)
			assert_true(h_check(base + off[p], H_BLOCK, 42, l, p));
		assert_int_equal(kvs_release(k, leases, N_PAGES), 0);
	}
	/* The freed uncommitted page is gone, not readable. */
	uint32_t gone = N_PAGES;
	uint64_t m1 = 1, o1, l1;
	assert_int_equal(kvs_recall(k, seq, 1, &gone, &m1, 1, &o1, &l1), -ENOENT);
	kvs_close(k);

	/* The other worker kept working through the death and the resume: wait (bounded) until it
	 * has finished 10 more rounds, each checking its own bytes. */
	uint64_t t1 = clock_ms();
	while (atomic_load(rounds) < rounds_at_kill + 10) {
		assert_true(clock_ms() - t1 < 10000);
		h_sleep_ms(5);
	}
	kill(by, SIGTERM);
	assert_int_equal(waitpid(by, &st, 0), by);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	kvs_close(ctl);
	close(pfd[0]);
	close(pfd[1]);
	munmap(rounds, sizeof *rounds);
	harness_stop(&h);
}

static void test_silent_worker_times_out(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "heartbeat_timeout_ms=300", NULL };
	struct harness h;
	harness_start(&h, extra);
	/* The silent worker is a child: its process still runs when it is declared dead, so the
	 * daemon kills it before its blocks may go to anyone else (a late write of a live process
	 * into a reassigned block would corrupt another sequence). */
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		uint64_t seq = 0;
		struct kvs *k = h_worker(&h, "silent", &seq);
		if (!k || kvs_heartbeat_ms(k) != 100 || kvs_heartbeat(k))
			_exit(1);
		if (write(pfd[1], &seq, sizeof seq) != sizeof seq)
			_exit(1);
		sleep(30); /* silent, and alive */
		_exit(2);
	}
	close(pfd[1]);
	uint64_t seq = 0;
	assert_int_equal(read(pfd[0], &seq, sizeof seq), (ssize_t)sizeof seq);
	close(pfd[0]);
	int st = 0;
	uint64_t t0 = clock_ms();
	while (waitpid(pid, &st, WNOHANG) == 0 && clock_ms() - t0 < 10000)
		h_sleep_ms(20);
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	/* Declared dead and gone: the sequence is orphaned, free for another worker. */
	struct kvs *ctl;
	Freekv__Reply *r = NULL;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &ctl), 0);
	for (int i = 0; i < 100; i++) {
		kvs_reply_free(r);
		assert_int_equal(kvs_show_sequence(ctl, seq, NULL, false, &r), 0);
		if (r->sequence->state == FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ORPHANED)
			break;
		h_sleep_ms(20);
	}
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ORPHANED);
	kvs_reply_free(r);
	kvs_close(ctl);
	harness_stop(&h);
}

static void test_goodbye_detaches(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq, off[2], lease;
	uint64_t mask = 1;
	uint32_t page = 0;
	harness_start(&h, NULL);
	struct kvs *k = h_worker(&h, "polite", &seq);
	assert_non_null(k);
	assert_int_equal(kvs_alloc(k, seq, 0, 0, 2, off), 0);
	assert_int_equal(kvs_commit(k, seq, 16, off, 1), 0);
	assert_int_equal(kvs_recall(k, seq, 0, &page, &mask, 1, off, &lease), 0);
	kvs_close(k);
	struct kvs *ctl;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &ctl), 0);
	assert_int_equal(kvs_show_sequence(ctl, seq, NULL, false, &r), 0);
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
	assert_int_equal(r->sequence->leases, 0);
	assert_int_equal(r->sequence->pages->dram, 1); /* the uncommitted page is gone */
	kvs_reply_free(r);
	assert_int_equal(kvs_list_workers(ctl, &r), 0);
	/* Only the asking control session is left: the worker said Goodbye. */
	assert_int_equal(r->workers->n_workers, 1);
	assert_int_equal(r->workers->workers[0]->worker_id, kvs_worker_id(ctl));
	kvs_reply_free(r);
	kvs_close(ctl);
	harness_stop(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_kill9_orphans_within_1s, h_teardown),
		cmocka_unit_test_teardown(test_silent_worker_times_out, h_teardown),
		cmocka_unit_test_teardown(test_goodbye_detaches, h_teardown),
		cmocka_unit_test_teardown(test_daemon_gone_detected, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
