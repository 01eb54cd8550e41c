/* Helpers for the kvstored integration tests: start a real kvstored process on a temporary shm
 * name, ipc endpoint and NVMe file; wait until it answers; stop it with SIGTERM and check that it
 * exited cleanly and unlinked its shared memory. Also: deterministic block contents and a
 * geometry small enough for quick tests. Header-only, included by test_kvstored_*.c. */
#ifndef FREEKV_TEST_KVSTORED_HARNESS_H
#define FREEKV_TEST_KVSTORED_HARNESS_H

#include "clock.h"
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "freekv_store.h"

#define H_MAX_ARGS 32

struct harness {
	char dir[64];
	char endpoint[128];
	char shm[64];
	char nvme[128];
	pid_t pid;
};

/* A copy of the running test's daemon (the test's own struct is gone once an assertion has
 * jumped out of it), cleaned up by h_teardown. */
static struct harness h_cur;
static bool h_active;

/* 2 layers, 2 KV heads, d 64, p 16, f16: 8 KiB blocks. */
static const struct kvs_geometry h_geo = { 2, 2, 64, 16, 2 };
static const uint8_t h_fp[32] = { 0xf1, 0xee, 0x4b, 0x01 };
#define H_BLOCK 8192u

static inline void h_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

static inline const char *h_kvstored_path(void)
{
	static char p[4096];
	snprintf(p, sizeof p, "%s/kvstore/kvstored", FREEKV_BUILD_DIR);
	return p;
}

/* Start (again) the kvstored that h names — same dir, endpoint, shm name and NVMe file — with
 * the test defaults plus `extra` --set arguments (NULL-terminated); wait until it answers. The
 * defaults turn persistence off (each test starts empty and a stop unlinks the pool); the
 * restart tests turn it on in `extra`. */
static inline void harness_spawn(struct harness *h, const char *const *extra, char *const *env_add)
{
	char sets[8][300];
	snprintf(sets[0], 300, "endpoint=%s", h->endpoint);
	snprintf(sets[1], 300, "shm_name=%s", h->shm);
	snprintf(sets[2], 300, "nvme_path=%s", h->nvme);
	snprintf(sets[3], 300, "lock_memory=false");
	snprintf(sets[4], 300, "dram_bytes=32M");
	snprintf(sets[5], 300, "nvme_bytes=32M");
	snprintf(sets[6], 300, "log_level=warn");
	snprintf(sets[7], 300, "persist=false");
	const char *argv[H_MAX_ARGS];
	int n = 0;
	argv[n++] = h_kvstored_path();
	for (int i = 0; i < 8; i++) {
		argv[n++] = "--set";
		argv[n++] = sets[i];
	}
	for (int i = 0; extra && extra[i] && n < H_MAX_ARGS - 1; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	h->pid = fork();
	assert_true(h->pid >= 0);
	if (h->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test must not leave a daemon behind */
		for (int i = 0; env_add && env_add[i]; i++)
			putenv(env_add[i]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	h_cur = *h;
	h_active = true;
	/* Ready when it answers Stats. */
	uint64_t t0 = clock_ms();
	for (;;) {
		struct kvs *k;
		assert_int_equal(kvs_connect(h->endpoint, 200, &k), 0);
		int ret = kvs_stats(k, NULL);
		kvs_close(k);
		if (ret == 0)
			break;
		int st;
		if (waitpid(h->pid, &st, WNOHANG) == h->pid) {
			fprintf(stderr, "kvstored exited during start (status %d)\n", st);
			fail();
		}
		if (clock_ms() - t0 > 15000) {
			fprintf(stderr, "kvstored did not answer within 15 s\n");
			fail();
		}
		h_sleep_ms(20);
	}
}

/* Start kvstored with the test defaults plus `extra` --set arguments (NULL-terminated). */
static inline void harness_start_env(struct harness *h, const char *const *extra, char *const *env_add)
{
	static int counter;
	memset(h, 0, sizeof *h);
	strcpy(h->dir, "/tmp/fkv-h2-XXXXXX");
	assert_non_null(mkdtemp(h->dir));
	snprintf(h->endpoint, sizeof h->endpoint, "ipc://%s/kvstored.sock", h->dir);
	snprintf(h->shm, sizeof h->shm, "/fkv-t%d-%d", (int)getpid(), counter++);
	snprintf(h->nvme, sizeof h->nvme, "%s/tier.bin", h->dir);
	/* An endpoint among the extra settings replaces the default one (they come later). */
	for (int i = 0; extra && extra[i]; i++)
		if (strncmp(extra[i], "endpoint=", 9) == 0)
			snprintf(h->endpoint, sizeof h->endpoint, "%s", extra[i] + 9);
	harness_spawn(h, extra, env_add);
}

static inline void harness_start(struct harness *h, const char *const *extra)
{
	harness_start_env(h, extra, NULL);
}

static inline bool harness_alive(struct harness *h)
{
	int st;
	return waitpid(h->pid, &st, WNOHANG) == 0;
}

static inline bool shm_exists(const char *name)
{
	char p[256];
	snprintf(p, sizeof p, "/dev/shm%s", name);
	return access(p, F_OK) == 0;
}

/* SIGTERM, wait (10 s at most), expect exit status 0 and the pool unlinked. */
static inline void harness_stop(struct harness *h)
{
	int st = 0;
	h_active = false;
	assert_int_equal(kill(h->pid, SIGTERM), 0);
	uint64_t t0 = clock_ms();
	while (waitpid(h->pid, &st, WNOHANG) == 0) {
		if (clock_ms() - t0 > 10000) {
			kill(h->pid, SIGKILL);
			waitpid(h->pid, &st, 0);
			fprintf(stderr, "kvstored did not stop within 10 s\n");
			fail();
		}
		h_sleep_ms(10);
	}
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_false(shm_exists(h->shm));
	unlink(h->nvme);
	char sock[160];
	snprintf(sock, sizeof sock, "%s/kvstored.sock", h->dir);
	assert_int_not_equal(access(sock, F_OK), 0); /* socket file removed */
	rmdir(h->dir);
}

/* kill -9 of the daemon (a crash); the harness may spawn it again. */
static inline void h_kill9(struct harness *h)
{
	assert_int_equal(kill(h->pid, SIGKILL), 0);
	assert_int_equal(waitpid(h->pid, NULL, 0), h->pid);
}

/* SIGTERM (a planned stop), exit status 0; a persistent daemon keeps its pool. */
static inline void h_term(struct harness *h)
{
	int st;
	assert_int_equal(kill(h->pid, SIGTERM), 0);
	assert_int_equal(waitpid(h->pid, &st, 0), h->pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* Stop a persistent daemon for good: SIGTERM, then remove the kept pool, journal and
 * directory. */
static inline void h_finish(struct harness *h)
{
	h_term(h);
	h_active = false;
	char p[512];
	snprintf(p, sizeof p, "rm -rf %s /dev/shm%s", h->dir, h->shm);
	assert_int_equal(system(p), 0);
}

/* cmocka teardown: after a failed test, kill its daemon and remove what it left behind. */
static inline int h_teardown(void **state)
{
	(void)state;
	struct harness *h = &h_cur;
	if (!h_active)
		return 0;
	h_active = false;
	kill(h->pid, SIGKILL);
	waitpid(h->pid, NULL, 0);
	char p[1024];
	snprintf(p, sizeof p, "rm -rf %s /dev/shm%s /dev/shm%s.lock /dev/shm%s-ring-*", h->dir, h->shm,
		 h->shm, h->shm);
	if (system(p) != 0)
		fprintf(stderr, "cleanup of %s failed\n", h->dir);
	return 0;
}

/* Deterministic contents of (seq tag, layer, page). */
static inline void h_fill(uint8_t *p, size_t n, uint64_t tag, uint32_t layer, uint32_t page)
{
	uint64_t s = (tag * 1000003u + layer) * 1000033u + page + 1;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = test_rand(&s);
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

static inline bool h_check(const uint8_t *p, size_t n, uint64_t tag, uint32_t layer, uint32_t page)
{
	uint8_t buf[H_BLOCK];
	h_fill(buf, n, tag, layer, page);
	return memcmp(buf, p, n) == 0;
}

/* A worker connection, opened and attached to `name`. Returns NULL (with a message) on error. */
static inline struct kvs *h_worker(const struct harness *h, const char *name, uint64_t *seq)
{
	struct kvs *k;
	if (kvs_connect(h->endpoint, 5000, &k))
		return NULL;
	if (kvs_hello(k, KVS_ROLE_WORKER, name) ||
	    kvs_open_sequence(k, name, h_fp, sizeof h_fp, &h_geo, NULL, 0, true, seq) ||
	    kvs_attach(k, *seq, NULL)) {
		fprintf(stderr, "worker %s: %s\n", name, kvs_error(k));
		kvs_close(k);
		return NULL;
	}
	return k;
}

/* Allocate, fill, commit pages [first, first + n) of both layers, 32 pages per ring op. */
static inline int h_write_pages(struct kvs *k, uint64_t seq, uint64_t tag, uint32_t first,
				uint32_t n)
{
	uint8_t *base = kvs_pool_base(k);
	for (uint32_t p0 = first; p0 < first + n; p0 += 32) {
		uint32_t m = first + n - p0 < 32 ? first + n - p0 : 32;
		for (uint32_t l = 0; l < h_geo.n_layers; l++) {
			uint64_t off[32];
			int ret = kvs_alloc(k, seq, l, p0, m, off);
			if (ret)
				return ret;
			for (uint32_t p = 0; p < m; p++)
				h_fill(base + off[p], H_BLOCK, tag, l, p0 + p);
			ret = kvs_commit(k, seq, (uint64_t)(p0 + m) * h_geo.page_size, off, m);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* RECALL pages [first, first + n) of every layer, compare, release. Returns 0, a ring error,
 * or -EILSEQ on a byte mismatch. */
static inline int h_read_pages(struct kvs *k, uint64_t seq, uint64_t tag, uint32_t first,
			       uint32_t n)
{
	uint8_t *base = kvs_pool_base(k);
	for (uint32_t l = 0; l < h_geo.n_layers; l++) {
		for (uint32_t p0 = first; p0 < first + n; p0 += 32) {
			uint32_t m = first + n - p0 < 32 ? first + n - p0 : 32;
			uint32_t pages[32];
			uint64_t masks[32], off[32], leases[32];
			for (uint32_t i = 0; i < m; i++) {
				pages[i] = p0 + i;
				masks[i] = 3;
			}
			int ret = kvs_recall(k, seq, l, pages, masks, m, off, leases);
			if (ret)
				return ret;
			for (uint32_t i = 0; i < m; i++)
				if (!h_check(base + off[i], H_BLOCK, tag, l, p0 + i))
					return -EILSEQ;
			ret = kvs_release(k, leases, m);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* The first of 20 TCP ports this test process may listen on: below the kernel's ephemeral range
 * (32768 and up), where no client socket of a test running beside it can hold one, and apart
 * for processes started close together (their pids differ by less than 500). A Redis cluster
 * node's bus port (its port + 10000) stays below that range too. */
static inline int h_port_base(void)
{
	return 10000 + (int)(getpid() % 500) * 20;
}

/* The daemon's Stats, as a fresh connection sees them (caller frees). */
static inline Freekv__Reply *h_stats(const struct harness *h)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h->endpoint, 5000, &k), 0);
	assert_int_equal(kvs_stats(k, &r), 0);
	kvs_close(k);
	return r;
}

/* Wait until ShowSequence(name) has no I/O in flight; returns the reply (caller frees). */
static inline Freekv__Reply *h_settled(struct kvs *k, const char *name)
{
	uint64_t t0 = clock_ms();
	for (;;) {
		Freekv__Reply *r;
		if (kvs_show_sequence(k, 0, name, false, &r))
			return NULL;
		if (r->sequence->pages->in_flight == 0 || clock_ms() - t0 > 10000)
			return r;
		kvs_reply_free(r);
		h_sleep_ms(5);
	}
}

#endif
