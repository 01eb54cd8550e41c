/* Integration: kvstored as a service. sd_notify over an abstract-namespace NOTIFY_SOCKET (READY,
 * STATUS with pool usage, WATCHDOG at half WATCHDOG_USEC, STOPPING); SIGTERM gives a clean exit
 * with the pool, ring and socket unlinked while a connected worker gets a clear -ESHUTDOWN;
 * SIGHUP reloads only run-time keys from the config file; ConfigGet/ConfigSet honour the
 * run-time flag; a second daemon on the same endpoint refuses to start (and takes nothing from
 * the first); a bad config refuses to start with a message. */
#include "clock.h"
#include "test_kvstored_harness.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/un.h>

static int notify_socket(char *env, size_t len)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char name[64];
	int n = snprintf(name, sizeof name, "fkv-notify-%d", (int)getpid());
	memcpy(a.sun_path + 1, name, (size_t)n); /* abstract: leading NUL */
	assert_int_equal(bind(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)), 0);
	snprintf(env, len, "NOTIFY_SOCKET=@%s", name);
	struct timeval tv = { 5, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

/* Receive datagrams until one contains `want`; false after 5 s of silence. */
static bool wait_for(int fd, const char *want, char *got, size_t len)
{
	for (;;) {
		ssize_t n = recv(fd, got, len - 1, 0);
		if (n < 0)
			return false;
		got[n] = '\0';
		if (strstr(got, want))
			return true;
	}
}

static void test_notify_and_sigterm(void **state)
{
	(void)state;
	static char env_sock[128], env_wd[] = "WATCHDOG_USEC=400000";
	char *env[] = { env_sock, env_wd, NULL };
	char msg[1024];
	struct harness h;
	int fd = notify_socket(env_sock, sizeof env_sock);
	harness_start_env(&h, NULL, env);
	assert_true(wait_for(fd, "READY=1", msg, sizeof msg));
	assert_true(wait_for(fd, "STATUS=", msg, sizeof msg));
	assert_non_null(strstr(msg, "DRAM"));
	assert_non_null(strstr(msg, "NVMe"));
	assert_true(wait_for(fd, "WATCHDOG=1", msg, sizeof msg));
	uint64_t t0 = clock_ms();
	assert_true(wait_for(fd, "WATCHDOG=1", msg, sizeof msg));
	uint64_t gap = clock_ms() - t0;
	assert_true(gap >= 100 && gap < 380); /* every 200 ms (half of WATCHDOG_USEC), never late */

	uint64_t seq, off[1];
	struct kvs *k = h_worker(&h, "stopping", &seq);
	assert_non_null(k);
	char ring[128];
	snprintf(ring, sizeof ring, "%s-ring-%u", h.shm, kvs_worker_id(k));
	assert_true(shm_exists(ring));
	assert_int_equal(kvs_alloc(k, seq, 0, 0, 1, off), 0);

	kill(h.pid, SIGTERM);
	assert_true(wait_for(fd, "STOPPING=1", msg, sizeof msg));
	h_sleep_ms(100);
	/* The worker learns why: the shutdown notice, then every call fails the same way. */
	int ret = kvs_heartbeat(k);
	if (ret != -ESHUTDOWN)
		fprintf(stderr, "heartbeat after SIGTERM: %d %s\n", ret, kvs_error(k));
	assert_int_equal(ret, -ESHUTDOWN);
	assert_non_null(strstr(kvs_error(k), "shutting down"));
	assert_int_equal(kvs_alloc(k, seq, 0, 1, 1, off), -ESHUTDOWN);
	kvs_close(k);
	/* harness_stop checks exit status 0 and the pool and socket gone (SIGTERM again is fine). */
	int st;
	assert_int_equal(waitpid(h.pid, &st, 0), h.pid);
	h_active = false; /* reaped here, not by harness_stop */
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_false(shm_exists(h.shm));
	assert_false(shm_exists(ring));
	unlink(h.nvme);
	rmdir(h.dir);
	close(fd);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_sighup_and_config(void **state)
{
	(void)state;
	char conf[] = "/tmp/fkv-h2-conf-XXXXXX";
	int cfd = mkstemp(conf);
	assert_true(cfd >= 0);
	close(cfd);
	write_file(conf, "# test config\nheartbeat_timeout_ms = 1234\nmax_tokens = 500\n");
	const char *const extra[] = { "--config", conf, NULL };
	struct harness h;
	harness_start(&h, extra);
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_config_get(k, "heartbeat_timeout_ms", &r), 0);
	assert_int_equal(r->config->n_entries, 1);
	assert_string_equal(r->config->entries[0]->value, "1234");
	assert_true(r->config->entries[0]->runtime);
	kvs_reply_free(r);
	/* --set wins over the file. */
	assert_int_equal(kvs_config_get(k, "dram_bytes", &r), 0);
	assert_string_equal(r->config->entries[0]->value, "33554432");
	kvs_reply_free(r);

	/* SIGHUP: run-time keys change, the others are ignored. */
	write_file(conf, "heartbeat_timeout_ms = 4321\ndram_bytes = 1G\n");
	kill(h.pid, SIGHUP);
	uint64_t t0 = clock_ms();
	for (;;) {
		assert_int_equal(kvs_config_get(k, "heartbeat_timeout_ms", &r), 0);
		bool ok = !strcmp(r->config->entries[0]->value, "4321");
		kvs_reply_free(r);
		if (ok)
			break;
		assert_true(clock_ms() - t0 < 3000);
		h_sleep_ms(10);
	}
	assert_int_equal(kvs_config_get(k, "dram_bytes", &r), 0);
	assert_string_equal(r->config->entries[0]->value, "33554432");
	kvs_reply_free(r);
	/* A broken file is refused and changes nothing. */
	write_file(conf, "heartbeat_timeout_ms = 999\nnonsense\n");
	kill(h.pid, SIGHUP);
	h_sleep_ms(200);
	assert_int_equal(kvs_config_get(k, "heartbeat_timeout_ms", &r), 0);
	assert_string_equal(r->config->entries[0]->value, "4321");
	kvs_reply_free(r);

	assert_int_equal(kvs_config_set(k, "dram_high_watermark", "95", &r), 0);
	assert_string_equal(r->config->entries[0]->value, "95");
	kvs_reply_free(r);
	assert_int_equal(kvs_config_set(k, "dram_bytes", "2G", NULL), -EPERM);
	assert_non_null(strstr(kvs_error(k), "restart"));
	assert_int_equal(kvs_config_set(k, "dram_low_watermark", "99", NULL), -EINVAL);
	assert_int_equal(kvs_config_set(k, "nope", "1", NULL), -ENOENT);
	assert_int_equal(kvs_config_get(k, NULL, &r), 0);
	assert_true(r->config->n_entries >= 15);
	kvs_reply_free(r);
	kvs_close(k);
	harness_stop(&h);
	unlink(conf);
}

static void test_second_daemon_refused(void **state)
{
	(void)state;
	struct harness h;
	char cmd[8192];
	harness_start(&h, NULL);
	snprintf(cmd, sizeof cmd,
		 "timeout 10 %s --set endpoint=%s --set shm_name=%s --set lock_memory=false --set nvme_path= "
		 "2>&1 | grep -q 'already serves'",
		 h_kvstored_path(), h.endpoint, h.shm);
	int st = system(cmd);
	assert_int_equal(WEXITSTATUS(st), 0);
	/* The first one kept its pool and socket. */
	assert_true(harness_alive(&h));
	assert_true(shm_exists(h.shm));
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_stats(k, NULL), 0);
	kvs_close(k);
	harness_stop(&h);
}

/* A second daemon on the same pool name (another endpoint) or the same NVMe file refuses and names
 * the owner's pid, touching nothing: the first daemon's committed blocks read back exact. */
static void test_same_pool_refused(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq;
	char cmd[8192], expect[128];
	harness_start(&h, NULL);
	struct kvs *k = h_worker(&h, "owned", &seq);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, seq, 77, 0, 8), 0);

	snprintf(expect, sizeof expect, "is owned by kvstored pid %d", (int)h.pid);
	const char *const clash[2][2] = {
		{ "shm_name", h.shm },	  /* same pool, other endpoint, no tier */
		{ "nvme_path", h.nvme },  /* same tier, other pool and endpoint */
	};
	for (int i = 0; i < 2; i++) {
		snprintf(cmd, sizeof cmd,
			 "timeout 10 %s --set endpoint=ipc://%s/other%d.sock --set lock_memory=false "
			 "--set dram_bytes=32M --set shm_name=%s --set nvme_path=%s 2>&1 | tee /dev/stderr | "
			 "grep -q '%s %s %s'",
			 h_kvstored_path(), h.dir, i, i == 0 ? h.shm : "/fkv-other-pool",
			 i == 0 ? "" : h.nvme, clash[i][0], clash[i][1], expect);
		assert_int_equal(WEXITSTATUS(system(cmd)), 0);
	}
	assert_true(harness_alive(&h));
	assert_true(shm_exists(h.shm));
	assert_int_equal(h_read_pages(k, seq, 77, 0, 8), 0);
	kvs_close(k);
	harness_stop(&h);
}

/* What a kill -9 leaves (the pool segment, a ring segment, the lock files) is removed by the next
 * daemon on that name, which says so; a look-alike name is left alone. With persist = false: a
 * persistent daemon adopts the pool segment instead (test_kvstored_restart). */
static void test_stale_segments_cleaned(void **state)
{
	(void)state;
	struct harness h;
	harness_start(&h, NULL);
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "w"), 0);
	kill(h.pid, SIGKILL);
	waitpid(h.pid, NULL, 0);
	h_active = false;
	kvs_close(k);
	char ring[96], other[96], p[160];
	snprintf(ring, sizeof ring, "%s-ring-1", h.shm);
	snprintf(other, sizeof other, "%s-ring-x", h.shm);
	assert_true(shm_exists(h.shm));
	assert_true(shm_exists(ring));
	snprintf(p, sizeof p, "/dev/shm%s", other);
	int fd = open(p, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);

	char cmd[8192];
	snprintf(cmd, sizeof cmd,
		 "timeout 5 %s --set endpoint=%s --set shm_name=%s --set lock_memory=false "
		 "--set dram_bytes=32M --set nvme_path=%s --set nvme_bytes=32M --set persist=false 2>&1 | "
		 "tee /dev/stderr | "
		 "grep -c 'removed the stale' | grep -qx 2",
		 h_kvstored_path(), h.endpoint, h.shm, h.nvme);
	/* timeout stops the daemon (SIGTERM) once it has served for 5 s: its log is complete. */
	assert_int_equal(WEXITSTATUS(system(cmd)), 0);
	assert_false(shm_exists(ring));
	assert_false(shm_exists(h.shm)); /* the second daemon's own pool, unlinked at its stop */
	assert_true(shm_exists(other));
	unlink(p);
	snprintf(p, sizeof p, "/dev/shm%s.lock", h.shm);
	assert_int_equal(access(p, F_OK), -1); /* released and removed at the clean stop */
	unlink(h.nvme);
	assert_int_equal(rmdir(h.dir), 0); /* nothing else left: the NVMe lock file is gone too */
}

/* Loopback tcp endpoints by name and over IPv6 bind and answer (ZeroMQ reads a bind host as an
 * interface name, so "localhost" failed with ENODEV; [::1] needs ZMQ_IPV6); the smallest pool the
 * dram_bytes key accepts really starts. */
static void test_tcp_loopback_names(void **state)
{
	(void)state;
	const char *hosts[] = { "localhost", "[::1]", "127.0.0.1" };
	for (int i = 0; i < 3; i++) {
		if (i == 1 && access("/proc/net/if_inet6", F_OK) != 0) {
			fprintf(stderr, "no IPv6 here: [::1] not checked\n");
			continue;
		}
		char ep[96], set[128];
		snprintf(ep, sizeof ep, "tcp://%s:%d", hosts[i], h_port_base() + i);
		snprintf(set, sizeof set, "endpoint=%s", ep);
		const char *const extra[] = { "--set", set, "--set", "dram_bytes=2M", "--set",
					      "tcp_insecure=true", NULL };
		struct harness h;
		harness_start(&h, extra); /* ready means a Stats round trip over ep succeeded */
		struct kvs *k;
		assert_int_equal(kvs_connect(ep, 5000, &k), 0);
		assert_int_equal(kvs_stats(k, NULL), 0);
		kvs_close(k);
		harness_stop(&h);
	}
}

/* The trust boundary: pool, ring and socket are mode 0660 and owned by the configured group. */
static void test_group_and_modes(void **state)
{
	(void)state;
	struct group *g = getgrnam("nogroup");
	if (!g)
		g = getgrnam("daemon");
	if (!g) {
		fprintf(stderr, "no group nogroup/daemon here: group check skipped\n");
		return;
	}
	char set[80];
	snprintf(set, sizeof set, "group=%s", g->gr_name);
	const char *const extra[] = { "--set", set, NULL };
	struct harness h;
	uint64_t seq;
	harness_start(&h, extra);
	struct kvs *k = h_worker(&h, "perm", &seq);
	assert_non_null(k);
	char paths[3][256];
	snprintf(paths[0], sizeof paths[0], "%s/kvstored.sock", h.dir);
	snprintf(paths[1], sizeof paths[1], "/dev/shm%s", h.shm);
	snprintf(paths[2], sizeof paths[2], "/dev/shm%s-ring-%u", h.shm, kvs_worker_id(k));
	for (int i = 0; i < 3; i++) {
		struct stat st;
		assert_int_equal(stat(paths[i], &st), 0);
		if ((st.st_mode & 0777) != 0660 || st.st_gid != g->gr_gid)
			fprintf(stderr, "%s: mode %o gid %u\n", paths[i], st.st_mode & 0777, st.st_gid);
		assert_int_equal(st.st_mode & 0777, 0660);
		assert_int_equal(st.st_gid, g->gr_gid);
	}
	kvs_close(k);
	harness_stop(&h);
	/* An unknown group is a clear start-up error. */
	char cmd[8192];
	snprintf(cmd, sizeof cmd,
		 "timeout 10 %s --set group=no-such-group-fkv --set shm_name=/fkv-h2-grp --set lock_memory=false "
		 "--set nvme_path= --set endpoint=ipc:///tmp/fkv-h2-grp.sock 2>&1 | grep -q no-such-group-fkv",
		 h_kvstored_path());
	assert_int_equal(WEXITSTATUS(system(cmd)), 0);
	assert_false(shm_exists("/fkv-h2-grp"));
}

static void test_bad_config_refused(void **state)
{
	(void)state;
	char cmd[8192];
	snprintf(cmd, sizeof cmd, "%s --set dram_low_watermark=95 --set dram_high_watermark=90 2>/dev/null",
		 h_kvstored_path());
	int st = system(cmd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 2);
	snprintf(cmd, sizeof cmd, "%s --set endpoint=tcp://0.0.0.0:1 2>/dev/null", h_kvstored_path());
	st = system(cmd);
	assert_int_equal(WEXITSTATUS(st), 2);
	snprintf(cmd, sizeof cmd, "%s --print-config --set dram_bytes=3G | grep -q '^dram_bytes = 3221225472$'",
		 h_kvstored_path());
	st = system(cmd);
	assert_int_equal(WEXITSTATUS(st), 0);
	/* A pool that cannot be locked names the fix (root bypasses RLIMIT_MEMLOCK: not testable). */
	if (geteuid() == 0)
		return;
	snprintf(cmd, sizeof cmd,
		 "ulimit -l 64; timeout 10 %s --set shm_name=/fkv-h2-lock --set dram_bytes=64M --set nvme_path= "
		 "--set endpoint=ipc:///tmp/fkv-h2-lock.sock 2>&1 | grep -q LimitMEMLOCK",
		 h_kvstored_path());
	st = system(cmd);
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_false(shm_exists("/fkv-h2-lock"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_notify_and_sigterm, h_teardown),
		cmocka_unit_test_teardown(test_sighup_and_config, h_teardown),
		cmocka_unit_test_teardown(test_second_daemon_refused, h_teardown),
		cmocka_unit_test_teardown(test_same_pool_refused, h_teardown),
		cmocka_unit_test_teardown(test_stale_segments_cleaned, h_teardown),
		cmocka_unit_test_teardown(test_tcp_loopback_names, h_teardown),
		cmocka_unit_test_teardown(test_group_and_modes, h_teardown),
		cmocka_unit_test_teardown(test_bad_config_refused, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
