/* Integration: the pid a Hello announces is checked against the ipc connection's peer
 * credentials by a real kvstored. A client that claims another live process's pid (its parent's,
 * or a registered worker's) is refused with EPERM and a message naming both pids, nothing is
 * registered for it, the daemon stays up and the real worker keeps working; the same connection
 * is then welcomed when it tells the truth. A child process that connects on its own is checked
 * against its own pid, not the parent's. */
#include "test_kvstored_harness.h"

#include "proto/kvstore.pb-c.h"

/* Sends Hello(role worker, pid) over k; returns the status, *err gets the daemon's message. */
static int hello_as(struct kvs *k, uint32_t pid, char *err, size_t errlen)
{
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Hello h = FREEKV__HELLO__INIT;
	h.role = FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER;
	h.pid = pid;
	h.name = "claimant";
	q.body_case = FREEKV__REQUEST__BODY_HELLO;
	q.hello = &h;
	Freekv__Reply *r = NULL;
	int ret = kvs_call(k, &q, &r);
	snprintf(err, errlen, "%s", ret ? kvs_error(k) : "");
	if (r)
		kvs_reply_free(r);
	return ret;
}

static size_t n_workers(struct kvs *k)
{
	Freekv__Reply *r;
	assert_int_equal(kvs_list_workers(k, &r), 0);
	size_t n = r->workers->n_workers;
	kvs_reply_free(r);
	return n;
}

static void test_hello_pid_checked(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq;
	char err[512], want[64];
	harness_start(&h, NULL);
	struct kvs *w = h_worker(&h, "honest", &seq);
	assert_non_null(w);
	uint64_t off[1];
	assert_int_equal(kvs_alloc(w, seq, 0, 0, 1, off), 0);

	struct kvs *liar;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &liar), 0);
	/* The parent (ctest) is alive, so only the credential check can refuse this. */
	assert_int_equal(hello_as(liar, (uint32_t)getppid(), err, sizeof err), -EPERM);
	fprintf(stderr, "refused as expected: %s\n", err);
	snprintf(want, sizeof want, "claims pid %u", (unsigned)getppid());
	assert_non_null(strstr(err, want));
	snprintf(want, sizeof want, "belongs to pid %u", (unsigned)getpid());
	assert_non_null(strstr(err, want));
	/* The daemon's own pid (alive too). */
	assert_int_equal(hello_as(liar, (uint32_t)h.pid, err, sizeof err), -EPERM);
	assert_int_equal(n_workers(w), 1);
	assert_true(harness_alive(&h));

	/* The honest worker is unaffected: heartbeat and ring work. */
	assert_int_equal(kvs_heartbeat(w), 0);
	assert_int_equal(kvs_alloc(w, seq, 0, 1, 1, off), 0);

	/* The same connection, telling the truth, is welcomed. */
	assert_int_equal(hello_as(liar, (uint32_t)getpid(), err, sizeof err), 0);
	assert_int_equal(n_workers(w), 2);
	kvs_close(liar);

	/* A child connects on its own: its Hello must carry its own pid, not the parent's. */
	pid_t c = fork();
	assert_true(c >= 0);
	if (c == 0) {
		struct kvs *k;
		char e2[512];
		int rc = 0;
		if (kvs_connect(h.endpoint, 5000, &k))
			_exit(10);
		if (hello_as(k, (uint32_t)getppid(), e2, sizeof e2) != -EPERM)
			rc = 11;
		else if (kvs_hello(k, KVS_ROLE_CONTROL, "child"))
			rc = 12;
		kvs_close(k);
		_exit(rc);
	}
	int st;
	assert_int_equal(waitpid(c, &st, 0), c);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);

	Freekv__Reply *r;
	assert_int_equal(kvs_stats(w, &r), 0);
	bool found = false;
	for (size_t i = 0; i < r->stats->n_commands; i++)
		if (!strcmp(r->stats->commands[i]->name, "Hello"))
			found = r->stats->commands[i]->errors >= 3;
	assert_true(found);
	kvs_reply_free(r);
	kvs_close(w);
	harness_stop(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_hello_pid_checked, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
