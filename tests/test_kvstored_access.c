/* Integration: kvstored's access control (docs/design.md §4 "Access"), with a real daemon and real
 * sockets. A client running as another uid (a child process that drops to nobody) is a worker:
 * it uses its own sequences but can neither evict nor read root's, and a uid outside
 * worker_group is refused at Hello, while root's worker keeps working throughout. A tcp endpoint
 * refuses to start without a token; with one, a client lacking it is unauthorised and the daemon
 * stays up. Requests before Hello, and strings holding a NUL byte or bytes that are not UTF-8,
 * are refused naming what was wrong. */
#include "test_kvstored_harness.h"

#include <grp.h>
#include <pwd.h>
#include <zmq.h>

#define CHILD_CHECK(cond)                                                                        \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "child: %s:%d: %s failed\n", __FILE__, __LINE__, #cond); \
			_exit(1);                                                                \
		}                                                                                \
	} while (0)

/* Runs fn in a child that dropped to uid/gid (no supplementary groups); its exit status. */
static int as_user(uid_t uid, gid_t gid, void (*fn)(const struct harness *), const struct harness *h)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid)) {
			perror("child: drop privileges");
			_exit(3);
		}
		fn(h);
		_exit(0);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void nobody_worker(const struct harness *h)
{
	struct kvs *k;
	Freekv__Reply *r;
	uint64_t mine, roots;
	CHILD_CHECK(kvs_connect(h->endpoint, 5000, &k) == 0);
	CHILD_CHECK(kvs_hello(k, KVS_ROLE_WORKER, "nobody") == 0);
	/* Its own sequence: open, attach, blocks through the ring and the pool (group-mapped). */
	CHILD_CHECK(kvs_open_sequence(k, "mine", h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &mine) == 0);
	CHILD_CHECK(kvs_attach(k, mine, NULL) == 0);
	CHILD_CHECK(h_write_pages(k, mine, 9, 0, 2) == 0);
	CHILD_CHECK(h_read_pages(k, mine, 9, 0, 2) == 0);
	/* root's sequence: not to be read, attached, closed or evicted. */
	CHILD_CHECK(kvs_show_sequence(k, 0, "roots", false, &r) == -EACCES);
	CHILD_CHECK(strstr(kvs_error(k), "belongs to uid 0"));
	CHILD_CHECK(kvs_open_sequence(k, "roots", h_fp, sizeof h_fp, &h_geo, NULL, 0, false, &roots) == -EACCES);
	CHILD_CHECK(kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, 0, "roots", 0, false, &r) == -EACCES);
	CHILD_CHECK(strstr(kvs_error(k), "needs admin rights"));
	CHILD_CHECK(strstr(kvs_error(k), "admin_group"));
	CHILD_CHECK(kvs_config_set(k, "log_level", "debug", NULL) == -EACCES);
	/* The list shows its own sequence only. */
	CHILD_CHECK(kvs_list_sequences(k, &r) == 0);
	CHILD_CHECK(r->sequences->n_sequences == 1);
	CHILD_CHECK(strcmp(r->sequences->sequences[0]->name, "mine") == 0);
	kvs_reply_free(r);
	kvs_close(k);
}

static void outsider(const struct harness *h)
{
	struct kvs *k;
	Freekv__Reply *r;
	CHILD_CHECK(kvs_connect(h->endpoint, 5000, &k) == 0);
	CHILD_CHECK(kvs_stats(k, NULL) == 0); /* read-only status needs no rights */
	CHILD_CHECK(kvs_hello(k, KVS_ROLE_WORKER, "outsider") == -EACCES);
	CHILD_CHECK(strstr(kvs_error(k), "neither worker_group"));
	CHILD_CHECK(kvs_list_sequences(k, &r) == -EACCES);
	kvs_close(k);
}

static uint64_t refused_of(struct kvs *k, const char *verb)
{
	Freekv__Reply *r;
	assert_int_equal(kvs_stats(k, &r), 0);
	uint64_t n = UINT64_MAX;
	for (size_t i = 0; i < r->stats->n_commands; i++)
		if (strcmp(r->stats->commands[i]->name, verb) == 0)
			n = r->stats->commands[i]->refused;
	kvs_reply_free(r);
	return n;
}

static void test_other_uid(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		fprintf(stderr, "skip: needs root to run a client as another uid\n");
		skip();
	}
	struct group *g = getgrnam("nogroup");
	struct passwd *pw = getpwnam("nobody");
	if (!g || !pw) {
		fprintf(stderr, "skip: no nobody/nogroup here\n");
		skip();
	}
	char group[80], wgroup[96];
	snprintf(group, sizeof group, "group=%s", g->gr_name);
	snprintf(wgroup, sizeof wgroup, "worker_group=%s", g->gr_name);
	const char *const extra[] = { "--set", group, "--set", wgroup, NULL };
	struct harness h;
	uint64_t seq;
	harness_start(&h, extra);
	/* The socket's directory must let nobody through to the 0660 socket. */
	assert_int_equal(chmod(h.dir, 0711), 0);
	struct kvs *root = h_worker(&h, "roots", &seq);
	assert_non_null(root);
	assert_int_equal(h_write_pages(root, seq, 3, 0, 4), 0);

	assert_int_equal(as_user(pw->pw_uid, g->gr_gid, nobody_worker, &h), 0);

	/* root's worker kept working, its blocks exact; the admin may evict what nobody made. */
	assert_int_equal(h_read_pages(root, seq, 3, 0, 4), 0);
	assert_int_equal(h_write_pages(root, seq, 3, 4, 2), 0);
	struct kvs *admin;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &admin), 0);
	assert_int_equal(kvs_evict(admin, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, 0, "mine", 0, false, &r), 0);
	kvs_reply_free(r);
	assert_true(refused_of(admin, "Evict") >= 1);
	assert_true(refused_of(admin, "ShowSequence") >= 1);
	assert_true(refused_of(admin, "ConfigSet") >= 1);
	assert_int_equal(refused_of(admin, "Hello"), 0);
	kvs_close(admin);
	kvs_close(root);
	harness_stop(&h);

	/* A uid that may open the socket (its group) but is in no worker_group and has no admin
	 * rights is refused at Hello; read-only status still answers. */
	const char *const closed[] = { "--set", group, "--set", "worker_group=", NULL };
	harness_start(&h, closed);
	assert_int_equal(chmod(h.dir, 0711), 0);
	assert_int_equal(as_user(pw->pw_uid, g->gr_gid, outsider, &h), 0);
	assert_int_equal(kvs_connect(h.endpoint, 5000, &admin), 0);
	assert_int_equal(refused_of(admin, "Hello"), 2); /* its Hello, then the one ListSequences implies */
	kvs_close(admin);
	harness_stop(&h);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, mode);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

static int kvstored_exit(const char *args, const char *expect)
{
	char cmd[8192];
	snprintf(cmd, sizeof cmd, "timeout 10 %s --set lock_memory=false --set dram_bytes=4M "
		 "--set nvme_path= --set shm_name=/fkv-acc-%d %s 2>&1 | tee /dev/stderr | grep -q '%s'",
		 h_kvstored_path(), (int)getpid(), args, expect);
	return WEXITSTATUS(system(cmd));
}

static void test_tcp_token(void **state)
{
	(void)state;
	char dir[] = "/tmp/fkv-tok-XXXXXX", tok[96], loose[96], args[512], ep[64];
	assert_non_null(mkdtemp(dir));
	snprintf(tok, sizeof tok, "%s/token", dir);
	snprintf(loose, sizeof loose, "%s/loose", dir);
	write_file(tok, "s3cret-token\n", 0600);
	write_file(loose, "s3cret-token\n", 0644);
	snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", h_port_base());

	/* No token and no tcp_insecure: refused at start; a readable token file too. */
	snprintf(args, sizeof args, "--set endpoint=%s", ep);
	assert_int_equal(kvstored_exit(args, "needs auth_token_file"), 0);
	snprintf(args, sizeof args, "--set endpoint=%s --set auth_token_file=%s", ep, loose);
	assert_int_equal(kvstored_exit(args, "chmod 600"), 0);

	char set_ep[96], set_tok[160];
	snprintf(set_ep, sizeof set_ep, "endpoint=%s", ep);
	snprintf(set_tok, sizeof set_tok, "auth_token_file=%s", tok);
	const char *const extra[] = { "--set", set_ep, "--set", set_tok, NULL };
	struct harness h;
	harness_start(&h, extra); /* answers Stats without a token */
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(ep, 5000, &k), 0);
	assert_int_equal(kvs_list_sequences(k, &r), -EACCES);
	assert_non_null(strstr(kvs_error(k), "unauthorised"));
	kvs_close(k);
	assert_true(harness_alive(&h));
	/* With the token every verb works, admin ones included. */
	assert_int_equal(kvs_connect(ep, 5000, &k), 0);
	assert_int_equal(kvs_set_token_file(k, tok), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "tcp"), 0);
	uint64_t seq;
	assert_int_equal(kvs_open_sequence(k, "t", h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &seq), 0);
	assert_int_equal(kvs_list_sequences(k, &r), 0);
	assert_int_equal(r->sequences->n_sequences, 1);
	kvs_reply_free(r);
	assert_int_equal(kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, seq, NULL, 0, false, &r), 0);
	kvs_reply_free(r);
	assert_int_equal(kvs_config_set(k, "log_level", "info", NULL), 0);
	kvs_close(k);
	harness_stop(&h);
	unlink(tok);
	unlink(loose);
	rmdir(dir);
}

/* One raw request over a DEALER socket (no client library: no automatic Hello); the reply. */
static Freekv__Reply *raw_call(const char *endpoint, const uint8_t *buf, size_t len)
{
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
	int linger = 0, to = 5000;
	zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
	zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
	assert_int_equal(zmq_connect(s, endpoint), 0);
	assert_int_equal(zmq_send(s, buf, len, 0), (int)len);
	static uint8_t in[65536];
	int n = zmq_recv(s, in, sizeof in, 0);
	assert_true(n > 0);
	zmq_close(s);
	zmq_ctx_term(ctx);
	return freekv__reply__unpack(NULL, (size_t)n, in);
}

/* Packs q, replaces the first `mark` in the bytes with `with` (same length), sends it raw. */
static Freekv__Reply *raw_patched(const char *endpoint, Freekv__Request *q, const char *mark,
				  const char *with, size_t wlen)
{
	static uint8_t buf[4096];
	q->version = FREEKV__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
	q->id = 42;
	size_t n = freekv__request__pack(q, buf);
	if (mark) {
		uint8_t *at = memmem(buf, n, mark, strlen(mark));
		assert_non_null(at);
		memcpy(at, with, wlen);
	}
	return raw_call(endpoint, buf, n);
}

static void test_before_hello_and_strings(void **state)
{
	(void)state;
	struct harness h;
	harness_start(&h, NULL);
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Evict ev = FREEKV__EVICT__INIT;
	ev.target = FREEKV__EVICT_TARGET__EVICT_TARGET_DETACHED;
	q.body_case = FREEKV__REQUEST__BODY_EVICT;
	q.evict = &ev;
	Freekv__Reply *r = raw_patched(h.endpoint, &q, NULL, NULL, 0);
	assert_int_equal(r->status, -EACCES);
	assert_non_null(strstr(r->error, "before Hello"));
	freekv__reply__free_unpacked(r, NULL);

	/* A name holding a NUL byte, then one that is not UTF-8. */
	Freekv__OpenSequence o = FREEKV__OPEN_SEQUENCE__INIT;
	Freekv__Geometry g = FREEKV__GEOMETRY__INIT;
	g.n_layers = 2, g.n_kv_heads = 2, g.head_dim = 64, g.page_size = 16;
	g.dtype = FREEKV__DTYPE__DTYPE_F16;
	o.name = "a/bXc";
	o.geometry = &g;
	o.model_fingerprint.data = (uint8_t *)h_fp;
	o.model_fingerprint.len = sizeof h_fp;
	o.create = true;
	Freekv__Request qo = FREEKV__REQUEST__INIT;
	qo.body_case = FREEKV__REQUEST__BODY_OPEN_SEQUENCE;
	qo.open_sequence = &o;
	r = raw_patched(h.endpoint, &qo, "a/bXc", "a/b\0c", 5);
	assert_int_equal(r->status, -EINVAL);
	assert_non_null(strstr(r->error, "open_sequence.name: NUL byte"));
	freekv__reply__free_unpacked(r, NULL);
	r = raw_patched(h.endpoint, &qo, "a/bXc", "a/\xff\xfe" "c", 5);
	assert_int_equal(r->status, -EINVAL);
	assert_non_null(strstr(r->error, "open_sequence.name: not UTF-8"));
	freekv__reply__free_unpacked(r, NULL);

	/* A config key cut at a NUL byte is not taken for the key before it. */
	Freekv__ConfigSet cs = FREEKV__CONFIG_SET__INIT;
	cs.key = "log_levelXx";
	cs.value = "debug";
	Freekv__Request qc = FREEKV__REQUEST__INIT;
	qc.body_case = FREEKV__REQUEST__BODY_CONFIG_SET;
	qc.config_set = &cs;
	r = raw_patched(h.endpoint, &qc, "log_levelXx", "log_level\0x", 11);
	assert_int_equal(r->status, -EINVAL);
	assert_non_null(strstr(r->error, "config_set.key: NUL byte at offset 9"));
	freekv__reply__free_unpacked(r, NULL);

	/* Nothing was created, and the daemon serves on. */
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_list_sequences(k, &r), 0);
	assert_int_equal(r->sequences->n_sequences, 0);
	kvs_reply_free(r);
	kvs_close(k);
	harness_stop(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_other_uid, h_teardown),
		cmocka_unit_test_teardown(test_tcp_token, h_teardown),
		cmocka_unit_test_teardown(test_before_hello_and_strings, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
