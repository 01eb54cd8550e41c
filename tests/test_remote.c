/* Beyond one host (docs/design.md §8): two (and three) kvstored "hosts" on one machine — their
 * own pools, NVMe files and endpoints — share a real redis-server on loopback. A sequence
 * generated on A and published resumes on B token for token as one uninterrupted run; A cannot
 * attach it while B holds the lease, and gets -ESTALE once B published a newer copy, which A then
 * adopts and continues; a corrupted block in Redis fails the adoption with a checksum error and
 * leaves nothing behind; with Redis down a publish fails with a clear error in bounded time and
 * the local copy goes on untouched; a Redis that answers nothing times the call out; once Redis is
 * back the publish works; the same moves work through a Redis Cluster of three masters.
 * Skipped (77) when redis-server is not installed. */
#include "clock.h"
#include "test_kvworker_proc.h"

#include <sys/wait.h>

static const char *g_model;
static int g_port;
static pid_t g_redis;
static char g_url[64], g_rdir[64];

#define FLAGS "--policy", "full", "--temp", "0", "--ids", "-t", "1"

static bool redis_ping(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "redis-cli -p %d ping >/dev/null 2>&1", g_port);
	return system(cmd) == 0;
}

static void redis_start(void)
{
	char port[16];
	snprintf(port, sizeof port, "%d", g_port);
	g_redis = fork();
	assert_true(g_redis >= 0);
	if (g_redis == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
		       "--save", "", "--appendonly", "no", "--dir", g_rdir, (char *)NULL);
		_exit(127);
	}
	for (uint64_t t0 = clock_ms(); !redis_ping(); h_sleep_ms(20)) {
		int st;
		if (waitpid(g_redis, &st, WNOHANG) == g_redis || clock_ms() - t0 > 10000)
			fail_msg("redis-server on port %d did not start", g_port);
	}
}

static void redis_stop(void)
{
	if (g_redis > 0) {
		kill(g_redis, SIGKILL);
		waitpid(g_redis, NULL, 0);
	}
	g_redis = 0;
}

static int setup(void **state)
{
	(void)state;
	if (system("command -v redis-server >/dev/null && command -v redis-cli >/dev/null")) {
		fprintf(stderr, "skip: redis-server / redis-cli not installed\n");
		return -1;
	}
	snprintf(g_rdir, sizeof g_rdir, "/tmp/fkv-redis-%d", (int)getpid());
	mkdir(g_rdir, 0700);
	g_port = h_port_base();
	snprintf(g_url, sizeof g_url, "remote_url=redis://127.0.0.1:%d", g_port);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	redis_stop();
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", g_rdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* A kvstored "host" with the remote tier and Redis calls timing out after `timeout` ms; its
 * /metrics on 127.0.0.1:metrics_port when that is not 0. */
static void host_start_m(struct harness *h, const char *id, const char *timeout,
			 int metrics_port)
{
	static char hid[8][64], to[8][64], ml[8][64];
	static int k;
	int i = k++ % 8;
	snprintf(hid[i], sizeof hid[i], "remote_host_id=%s", id);
	snprintf(to[i], sizeof to[i], "remote_timeout_ms=%s", timeout);
	snprintf(ml[i], sizeof ml[i], "metrics_listen=127.0.0.1:%d", metrics_port);
	const char *extra[] = { "--set", g_url, "--set", hid[i], "--set", to[i],
				metrics_port ? "--set" : NULL, ml[i], NULL };
	harness_start(h, extra);
}

static void host_start(struct harness *h, const char *id, const char *timeout)
{
	host_start_m(h, id, timeout, 0);
}

static int publish(const struct harness *h, const char *name, char *err, size_t errlen)
{
	struct kvs *k;
	Freekv__Reply *r = NULL;
	assert_int_equal(kvs_connect(h->endpoint, 10000, &k), 0);
	int ret = kvs_publish(k, 0, name, &r);
	if (ret)
		snprintf(err, errlen, "%s", kvs_error(k));
	kvs_reply_free(r);
	kvs_close(k);
	return ret;
}

/* A worker's attach of name on h: 0, or the error (text in err). */
static int try_attach(const struct harness *h, const char *name, char *err, size_t errlen)
{
	struct kvs *k;
	uint64_t id;
	assert_int_equal(kvs_connect(h->endpoint, 10000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "probe"), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_show_sequence(k, 0, name, false, &r), 0);
	const Freekv__SequenceInfo *si = r->sequence;
	struct kvs_geometry g = { si->geometry->n_layers, si->geometry->n_kv_heads,
				  si->geometry->head_dim, si->geometry->page_size,
				  (uint32_t)si->geometry->dtype };
	int ret = kvs_open_sequence(k, name, si->model_fingerprint.data, si->model_fingerprint.len,
				    &g, NULL, 0, false, &id);
	kvs_reply_free(r);
	if (!ret)
		ret = kvs_attach(k, id, NULL);
	snprintf(err, errlen, "%s", ret ? kvs_error(k) : "");
	kvs_close(k);
	return ret;
}

static Freekv__RemoteStats *remote_stats(const struct harness *h, Freekv__Reply **r)
{
	struct kvs *k;
	assert_int_equal(kvs_connect(h->endpoint, 5000, &k), 0);
	assert_int_equal(kvs_stats(k, r), 0);
	kvs_close(k);
	assert_non_null((*r)->stats->remote);
	return (*r)->stats->remote;
}

static void run_gen(struct proc *p, const struct harness *h, const char *seq, const char *n)
{
	const char *args[] = { "generate", "-m", g_model, "-p", "Once upon a time", "-n", n,
			       "--store", h->endpoint, "--seq", seq, "--keep", FLAGS, NULL };
	assert_int_equal(p_run(p, args), 0);
}

static int run_resume(struct proc *p, const struct harness *h, const char *seq, const char *n)
{
	const char *args[] = { "resume", "-m", g_model, "--store", h->endpoint, "--seq", seq, "-n", n,
			       "--keep", FLAGS, NULL };
	return p_run(p, args);
}

/* A -> B -> A, with the lease in between. */
static void test_publish_resume(void **state)
{
	(void)state;
	static struct proc ref, a, b, a2;
	const char *args[] = { "generate", "-m", g_model, "-p", "Once upon a time", "-n", "90",
			       FLAGS, NULL };
	assert_int_equal(p_run(&ref, args), 0);
	assert_int_equal(ref.n_ids, 90);
	redis_start();
	struct harness A, B;
	host_start(&A, "host-A", "2000");
	host_start(&B, "host-B", "2000");
	char err[512];
	run_gen(&a, &A, "s", "30");
	assert_int_equal(publish(&A, "s", err, sizeof err), 0);
	assert_int_equal(run_resume(&b, &B, "s", "30"), 0);
	assert_int_equal(b.n_ids, 30);
	assert_memory_equal(b.ids, ref.ids + 30, 30 * sizeof(int)); /* as if one run */
	/* B owns the name now: A may not decode it. */
	assert_int_equal(try_attach(&A, "s", err, sizeof err), -EBUSY);
	assert_non_null(strstr(err, "host-B"));
	Freekv__Reply *r;
	Freekv__RemoteStats *st = remote_stats(&B, &r);
	assert_int_equal(st->adopted, 1);
	assert_int_equal(st->owned, 1);
	assert_true(st->bytes_got > 0);
	kvs_reply_free(r);
	st = remote_stats(&A, &r);
	assert_int_equal(st->published, 1);
	kvs_reply_free(r);
	/* B hands it back with its 30 more tokens: A's own copy is older now. */
	assert_int_equal(publish(&B, "s", err, sizeof err), 0);
	assert_int_equal(try_attach(&A, "s", err, sizeof err), -ESTALE);
	struct kvs *k;
	assert_int_equal(kvs_connect(A.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, 0, "s", 0, false,
				   &r), 0);
	kvs_reply_free(r);
	kvs_close(k);
	assert_int_equal(run_resume(&a2, &A, "s", "30"), 0); /* adopts B's copy */
	assert_memory_equal(a2.ids, ref.ids + 60, 30 * sizeof(int));
	harness_stop(&B);
	harness_stop(&A);
	redis_stop();
}

/* One block's bytes changed in Redis: the adoption fails with a checksum error and leaves no
 * sequence and no lease behind. */
static void test_corrupt_block(void **state)
{
	(void)state;
	static struct proc a, b;
	redis_start();
	struct harness A, B;
	host_start(&A, "host-A", "2000");
	host_start(&B, "host-B", "2000");
	char err[512], cmd[256];
	run_gen(&a, &A, "s", "20");
	assert_int_equal(publish(&A, "s", err, sizeof err), 0);
	snprintf(cmd, sizeof cmd, "redis-cli -p %d setrange 'freekv:{s}:blk:1:2:0' 100 XXXX >/dev/null",
		 g_port);
	assert_int_equal(system(cmd), 0);
	assert_int_not_equal(run_resume(&b, &B, "s", "4"), 0);
	assert_int_equal(b.n_ids, 0);
	Freekv__Reply *r;
	Freekv__RemoteStats *st = remote_stats(&B, &r);
	assert_int_equal(st->crc_errors, 1);
	assert_int_equal(st->adopted, 0);
	assert_int_equal(r->stats->sequences, 0);
	kvs_reply_free(r);
	snprintf(cmd, sizeof cmd, "test -z \"$(redis-cli -p %d get 'freekv:{s}:owner')\"", g_port);
	assert_int_equal(system(cmd), 0); /* the lease went back */
	harness_stop(&B);
	harness_stop(&A);
	redis_stop();
}

/* Redis down: a publish fails within its timeout, saying so; the local copy is untouched and
 * continues; Redis back: the publish works. */
static void test_redis_down(void **state)
{
	(void)state;
	static struct proc ref, a, a2;
	const char *args[] = { "generate", "-m", g_model, "-p", "Once upon a time", "-n", "40",
			       FLAGS, NULL };
	assert_int_equal(p_run(&ref, args), 0);
	redis_start();
	struct harness A;
	host_start_m(&A, "host-A", "500", g_port + 1);
	char err[512];
	run_gen(&a, &A, "s", "20");
	redis_stop();
	uint64_t t0 = clock_ms();
	int ret = publish(&A, "s", err, sizeof err);
	uint64_t took = clock_ms() - t0;
	fprintf(stderr, "publish with Redis down: %d (%s) in %llu ms\n", ret, err,
		(unsigned long long)took);
	assert_true(ret < 0);
	assert_non_null(strstr(err, "Redis at"));
	assert_true(took < 5000);
	assert_int_equal(run_resume(&a2, &A, "s", "20"), 0);
	assert_memory_equal(a2.ids, ref.ids + 20, 20 * sizeof(int));
	redis_start();
	/* A Redis that answers nothing (stopped): the call times out (remote_timeout_ms 500). */
	assert_int_equal(kill(g_redis, SIGSTOP), 0);
	t0 = clock_ms();
	ret = publish(&A, "s", err, sizeof err);
	took = clock_ms() - t0;
	fprintf(stderr, "publish with Redis stopped: %d (%s) in %llu ms\n", ret, err,
		(unsigned long long)took);
	assert_true(ret < 0);
	assert_true(took >= 400 && took < 5000);
	assert_int_equal(kill(g_redis, SIGCONT), 0);
	assert_int_equal(publish(&A, "s", err, sizeof err), 0);
	Freekv__Reply *r;
	Freekv__RemoteStats *st = remote_stats(&A, &r);
	assert_true(st->errors >= 1);
	assert_int_equal(st->published, 1);
	kvs_reply_free(r);
	/* The same figures on /metrics, in a page promtool accepts. */
	char cmd[512];
	snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%d/metrics | grep -q "
		 "'^freekv_store_remote_published_total 1$'", g_port + 1);
	assert_int_equal(system(cmd), 0);
	if (!system("command -v promtool >/dev/null 2>&1")) {
		snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%d/metrics | promtool check "
			 "metrics", g_port + 1);
		assert_int_equal(system(cmd), 0);
	}
	harness_stop(&A);
	redis_stop();
}

/* What a publish refuses: an attached sequence, and a daemon without remote_url. */
static void test_publish_refused(void **state)
{
	(void)state;
	redis_start();
	struct harness A, plain;
	host_start(&A, "host-A", "2000");
	harness_start(&plain, NULL);
	uint64_t seq;
	struct kvs *w = h_worker(&A, "held", &seq);
	assert_non_null(w);
	char err[512];
	assert_int_equal(publish(&A, "held", err, sizeof err), -EBUSY);
	assert_non_null(strstr(err, "detach"));
	kvs_close(w);
	struct kvs *w2 = h_worker(&plain, "local", &seq);
	assert_non_null(w2);
	assert_int_equal(kvs_detach(w2, seq), 0);
	assert_int_equal(publish(&plain, "local", err, sizeof err), -ENODEV);
	assert_non_null(strstr(err, "remote_url"));
	kvs_close(w2);
	harness_stop(&plain);
	harness_stop(&A);
	redis_stop();
}

/* The same through a Redis Cluster of three masters (started here, `redis-cli --cluster create`),
 * kvstored given one seed: three sequences, whose names hash to different slots. */
static void test_cluster(void **state)
{
	(void)state;
	pid_t nodes[3];
	int port[3];
	char cmd[512], ep[3][32], url[160];
	for (int i = 0; i < 3; i++) {
		port[i] = g_port + 10 + i;
		char p[16], conf[96];
		snprintf(p, sizeof p, "%d", port[i]);
		snprintf(conf, sizeof conf, "nodes-%d.conf", port[i]);
		nodes[i] = fork();
		assert_true(nodes[i] >= 0);
		if (nodes[i] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			int null = open("/dev/null", O_WRONLY);
			dup2(null, 1);
			execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1",
			       "--cluster-enabled", "yes", "--cluster-config-file", conf, "--save", "",
			       "--appendonly", "no", "--dir", g_rdir, (char *)NULL);
			_exit(127);
		}
		snprintf(ep[i], sizeof ep[i], "127.0.0.1:%d", port[i]);
		snprintf(cmd, sizeof cmd, "redis-cli -p %d ping >/dev/null 2>&1", port[i]);
		for (uint64_t t0 = clock_ms(); system(cmd); h_sleep_ms(20))
			assert_true(clock_ms() - t0 < 10000);
	}
	snprintf(cmd, sizeof cmd, "redis-cli --cluster create %s %s %s --cluster-replicas 0 "
		 "--cluster-yes >/dev/null", ep[0], ep[1], ep[2]);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof cmd, "redis-cli -p %d cluster info | grep -q cluster_state:ok", port[0]);
	for (uint64_t t0 = clock_ms(); system(cmd); h_sleep_ms(50))
		assert_true(clock_ms() - t0 < 20000);
	snprintf(url, sizeof url, "remote_url=redis://%s", ep[1]);
	static const char *const names[3] = { "seq-a", "seq-b", "seq-c" };
	static struct proc ref, a, b;
	const char *args[] = { "generate", "-m", g_model, "-p", "Once upon a time", "-n", "40",
			       FLAGS, NULL };
	assert_int_equal(p_run(&ref, args), 0);
	const char *ea[] = { "--set", url, "--set", "remote_host_id=host-A", NULL };
	const char *eb[] = { "--set", url, "--set", "remote_host_id=host-B", NULL };
	struct harness A, B;
	harness_start(&A, ea);
	harness_start(&B, eb);
	char err[512];
	for (int i = 0; i < 3; i++) {
		run_gen(&a, &A, names[i], "20");
		if (publish(&A, names[i], err, sizeof err))
			fail_msg("publish %s: %s", names[i], err);
		assert_int_equal(run_resume(&b, &B, names[i], "20"), 0);
		assert_memory_equal(b.ids, ref.ids + 20, 20 * sizeof(int));
		assert_int_equal(try_attach(&A, names[i], err, sizeof err), -EBUSY);
	}
	/* The three sequences' keys are spread over the masters. */
	int holding = 0;
	for (int i = 0; i < 3; i++) {
		snprintf(cmd, sizeof cmd, "test \"$(redis-cli -p %d dbsize)\" != 0", port[i]);
		holding += system(cmd) == 0;
	}
	fprintf(stderr, "cluster: %d of 3 masters hold keys\n", holding);
	assert_true(holding >= 2);
	Freekv__Reply *r;
	Freekv__RemoteStats *st = remote_stats(&B, &r);
	assert_true(st->cluster);
	assert_int_equal(st->adopted, 3);
	kvs_reply_free(r);
	harness_stop(&B);
	harness_stop(&A);
	for (int i = 0; i < 3; i++) {
		kill(nodes[i], SIGKILL);
		waitpid(nodes[i], NULL, 0);
	}
}

/* The host that adopted a sequence is killed and restarted (persist = true): it still knows it
 * owns the name and renews the lease (1 s here), so the publisher still cannot attach. */
static void test_restart_keeps_lease(void **state)
{
	(void)state;
	static struct proc a, b;
	redis_start();
	struct harness A, B;
	host_start(&A, "host-A", "2000");
	char lease[] = "remote_lease_ms=1000";
	const char *eb[] = { "--set", g_url, "--set", "remote_host_id=host-B", "--set", lease,
			     "--set", "persist=true", NULL };
	harness_start(&B, eb);
	char err[512];
	run_gen(&a, &A, "s", "10");
	assert_int_equal(publish(&A, "s", err, sizeof err), 0);
	assert_int_equal(run_resume(&b, &B, "s", "4"), 0);
	h_kill9(&B);
	harness_spawn(&B, eb, NULL);
	h_sleep_ms(2500); /* past the lease: only renewals keep it */
	assert_int_equal(try_attach(&A, "s", err, sizeof err), -EBUSY);
	Freekv__Reply *r;
	Freekv__RemoteStats *st = remote_stats(&B, &r);
	assert_int_equal(st->owned, 1);
	kvs_reply_free(r);
	assert_int_equal(try_attach(&B, "s", err, sizeof err), 0); /* its own: still the newest */
	h_finish(&B);
	harness_stop(&A);
	redis_stop();
}

/* The pages of sequence name on h by tier, once nothing is moving (10 s at most). */
static Freekv__TierPages tier_pages(const struct harness *h, const char *name)
{
	struct kvs *k;
	Freekv__Reply *r;
	Freekv__TierPages tp = FREEKV__TIER_PAGES__INIT;
	assert_int_equal(kvs_connect(h->endpoint, 5000, &k), 0);
	r = h_settled(k, name);
	assert_non_null(r);
	tp.dram = r->sequence->pages->dram;
	tp.nvme = r->sequence->pages->nvme;
	tp.remote = r->sequence->pages->remote;
	tp.in_flight = r->sequence->pages->in_flight;
	kvs_reply_free(r);
	kvs_close(k);
	return tp;
}

static void demote_to(const struct harness *h, const char *name, bool remote)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h->endpoint, 5000, &k), 0);
	int ret = kvs_demote_to(k, 0, name, remote, &r);
	if (ret)
		fail_msg("demote %s: %s", name, kvs_error(k));
	kvs_reply_free(r);
	kvs_close(k);
}

/* Waits until every block of name is in the remote tier. */
static uint64_t all_remote(const struct harness *h, const char *name)
{
	Freekv__TierPages tp;
	for (uint64_t t0 = clock_ms();; h_sleep_ms(20)) {
		tp = tier_pages(h, name);
		if (!tp.dram && !tp.nvme && !tp.in_flight && tp.remote)
			return tp.remote;
		if (clock_ms() - t0 > 10000)
			fail_msg("'%s' did not reach the remote tier: %llu DRAM, %llu NVMe, %llu "
				 "remote", name, (unsigned long long)tp.dram,
				 (unsigned long long)tp.nvme, (unsigned long long)tp.remote);
	}
}

/* The tier below NVMe: a sequence's blocks moved NVMe -> Redis (explicitly, then by the NVMe
 * watermark) come back on resume exactly; a corrupted one fails the resume with a checksum
 * error and stays where it is; a stopped Redis fails the resume after the timeout, and once it
 * answers again the resume works; a kill -9 restart keeps the blocks in Redis. */
static void test_tier(void **state)
{
	(void)state;
	static struct proc ref, a, b;
	const char *args[] = { "generate", "-m", g_model, "-p", "Once upon a time", "-n", "60",
			       FLAGS, NULL };
	assert_int_equal(p_run(&ref, args), 0);
	redis_start();
	const char *ex[] = { "--set", g_url, "--set", "remote_host_id=host-T", "--set",
			     "remote_tier=true", "--set", "remote_timeout_ms=500", "--set",
			     "persist=true", "--set", "nvme_bytes=1M", NULL };
	struct harness A;
	harness_start(&A, ex);
	char cmd[512];
	/* Explicitly: to NVMe, then on to Redis. */
	run_gen(&a, &A, "s", "20");
	demote_to(&A, "s", false);
	assert_true(tier_pages(&A, "s").nvme > 0);
	demote_to(&A, "s", true);
	uint64_t n = all_remote(&A, "s");
	snprintf(cmd, sizeof cmd, "test \"$(redis-cli -p %d dbsize)\" = %llu", g_port,
		 (unsigned long long)n);
	assert_int_equal(system(cmd), 0);
	/* A restart keeps them there (journaled). */
	h_kill9(&A);
	harness_spawn(&A, ex, NULL);
	assert_int_equal(tier_pages(&A, "s").remote, n);
	/* One value damaged in Redis: the resume fails, nothing decodes over it. */
	snprintf(cmd, sizeof cmd, "k=$(redis-cli -p %d --scan --pattern 'freekv:{tier:host-T}:*' "
		 "| head -1) && redis-cli -p %d setrange \"$k\" 40 XXXX >/dev/null && "
		 "redis-cli -p %d get \"$k\" > %s/damaged.bin", g_port, g_port, g_port, g_rdir);
	assert_int_equal(system(cmd), 0);
	assert_int_not_equal(run_resume(&b, &A, "s", "20"), 0);
	assert_int_equal(b.n_ids, 0);
	Freekv__Reply *r;
	Freekv__RemoteStats *st = remote_stats(&A, &r);
	assert_true(st->tier);
	assert_true(st->tier_errors >= 1);
	kvs_reply_free(r);
	/* Drop it (its blocks and their Redis keys). */
	{
		struct kvs *k;
		assert_int_equal(kvs_connect(A.endpoint, 5000, &k), 0);
		assert_int_equal(kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, 0, "s", 0,
					   false, &r), 0);
		kvs_reply_free(r);
		kvs_close(k);
	}
	/* By the watermark: NVMe over 1 % (of 1 MiB) moves blocks to Redis by itself. */
	struct kvs *k;
	assert_int_equal(kvs_connect(A.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_config_set(k, "nvme_high_watermark", "1", &r), 0);
	kvs_reply_free(r);
	assert_int_equal(kvs_config_set(k, "nvme_low_watermark", "0", &r), 0);
	kvs_reply_free(r);
	kvs_close(k);
	/* Redis killed while the watermark moves blocks: they stay on NVMe, the failures are
	 * counted; Redis back, they move. */
	redis_stop();
	run_gen(&a, &A, "w", "20");
	demote_to(&A, "w", false);
	h_sleep_ms(300);
	Freekv__TierPages tp = tier_pages(&A, "w");
	assert_int_equal(tp.remote, 0);
	assert_true(tp.nvme > 0);
	st = remote_stats(&A, &r);
	assert_true(st->tier_errors > 0);
	kvs_reply_free(r);
	redis_start();
	demote_to(&A, "w", true); /* any move starts the next pass */
	n = all_remote(&A, "w");
	/* Redis stopped: the resume's reads time out and it fails; the blocks stay in Redis. */
	assert_int_equal(kill(g_redis, SIGSTOP), 0);
	assert_int_not_equal(run_resume(&b, &A, "w", "20"), 0);
	assert_int_equal(kill(g_redis, SIGCONT), 0);
	assert_int_equal(tier_pages(&A, "w").remote, n);
	/* Redis answering again: the resume brings every block back and continues exactly. */
	assert_int_equal(run_resume(&b, &A, "w", "20"), 0);
	assert_memory_equal(b.ids, ref.ids + 20, 20 * sizeof(int));
	st = remote_stats(&A, &r);
	assert_true(st->fetched >= n);
	assert_true(st->offloaded >= n); /* since the restart */
	kvs_reply_free(r);
	h_finish(&A);
	redis_stop();
}

/* A worker's open of name on dst, which adopts it from Redis (dst does not know it; src does,
 * for its geometry), then its disconnect, which leaves it detached and unread. */
static void adopt_only(const struct harness *src, const struct harness *dst, const char *name)
{
	struct kvs *k;
	uint64_t id;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(src->endpoint, 10000, &k), 0);
	assert_int_equal(kvs_show_sequence(k, 0, name, false, &r), 0);
	kvs_close(k);
	const Freekv__SequenceInfo *si = r->sequence;
	struct kvs_geometry g = { si->geometry->n_layers, si->geometry->n_kv_heads,
				  si->geometry->head_dim, si->geometry->page_size,
				  (uint32_t)si->geometry->dtype };
	assert_int_equal(kvs_connect(dst->endpoint, 10000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "probe"), 0);
	int ret = kvs_open_sequence(k, name, si->model_fingerprint.data,
				    si->model_fingerprint.len, &g, NULL, 0, false, &id);
	if (ret)
		fail_msg("adopting '%s': %s", name, kvs_error(k));
	kvs_reply_free(r);
	kvs_close(k);
}

/* A sequence whose blocks went on to the tier below NVMe is published from there: the blocks
 * are read back from Redis (checked) and written as the published copy, which another host
 * resumes exactly. A damaged tier value fails the publish with a checksum error and publishes
 * nothing. A host that adopted a sequence on demand (its blocks still the publisher's keys)
 * publishes it again without recalling it, and the first host resumes that copy exactly. */
static void test_publish_from_tier(void **state)
{
	(void)state;
	static struct proc ref, a, b, a2;
	const char *args[] = { "generate", "-m", g_model, "-p", "Once upon a time", "-n", "60",
			       FLAGS, NULL };
	assert_int_equal(p_run(&ref, args), 0);
	redis_start();
	const char *ea[] = { "--set", g_url, "--set", "remote_host_id=host-A", "--set",
			     "remote_tier=true", NULL };
	const char *eb[] = { "--set", g_url, "--set", "remote_host_id=host-B", "--set",
			     "remote_tier=true", NULL };
	struct harness A, B;
	harness_start(&A, ea);
	harness_start(&B, eb);
	char err[512], cmd[512];
	/* A damaged value in the tier: the publish fails naming it, and nothing is published. */
	run_gen(&a, &A, "d", "20");
	demote_to(&A, "d", false);
	assert_true(tier_pages(&A, "d").nvme > 0); /* settled: --remote moves NVMe blocks */
	demote_to(&A, "d", true);
	all_remote(&A, "d");
	snprintf(cmd, sizeof cmd, "k=$(redis-cli -p %d --scan --pattern 'freekv:{tier:host-A}:*' "
		 "| head -1) && redis-cli -p %d setrange \"$k\" 40 XXXX >/dev/null", g_port, g_port);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(publish(&A, "d", err, sizeof err), -EBADMSG);
	assert_non_null(strstr(err, "checksum"));
	snprintf(cmd, sizeof cmd, "test -z \"$(redis-cli -p %d --scan --pattern 'freekv:{d}:*')\"",
		 g_port);
	assert_int_equal(system(cmd), 0); /* no metadata, no blocks, no lease */
	/* Whole: published from Redis, resumed on B exactly. */
	run_gen(&a, &A, "s", "20");
	demote_to(&A, "s", false);
	assert_true(tier_pages(&A, "s").nvme > 0); /* settled: --remote moves NVMe blocks */
	demote_to(&A, "s", true);
	uint64_t n = all_remote(&A, "s");
	assert_int_equal(publish(&A, "s", err, sizeof err), 0);
	assert_int_equal(tier_pages(&A, "s").remote, n); /* A's blocks stay where they were */
	assert_int_equal(run_resume(&b, &B, "s", "20"), 0);
	assert_memory_equal(b.ids, ref.ids + 20, 20 * sizeof(int));
	/* B publishes its 20 more tokens; C adopts that copy by an open alone (every block still
	 * the publisher's key in Redis) and publishes it again unread; A resumes it exactly. */
	assert_int_equal(publish(&B, "s", err, sizeof err), 0);
	const char *ec[] = { "--set", g_url, "--set", "remote_host_id=host-C", "--set",
			     "remote_tier=true", NULL };
	struct harness C;
	harness_start(&C, ec);
	adopt_only(&B, &C, "s");
	Freekv__TierPages tp = tier_pages(&C, "s");
	assert_true(tp.remote > n && !tp.dram && !tp.nvme);
	assert_int_equal(publish(&C, "s", err, sizeof err), 0);
	harness_stop(&C);
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(A.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, 0, "s", 0, false,
				   &r), 0);
	kvs_reply_free(r);
	kvs_close(k);
	assert_int_equal(run_resume(&a2, &A, "s", "20"), 0);
	assert_memory_equal(a2.ids, ref.ids + 40, 20 * sizeof(int));
	snprintf(cmd, sizeof cmd, "test \"$(redis-cli -p %d hget 'freekv:{s}:seq' host)\" = host-C",
		 g_port);
	assert_int_equal(system(cmd), 0);
	harness_stop(&B);
	harness_stop(&A);
	redis_stop();
}

/* With the tier below NVMe, an adopting host reads the published blocks only as RECALLs name
 * them (a resume's attach leases them all): the control plane reads none, the tier all, and the
 * tokens are exact; a damaged published block fails the resume with a checksum error. */
static void test_adopt_on_demand(void **state)
{
	(void)state;
	static struct proc ref, a, b;
	const char *args[] = { "generate", "-m", g_model, "-p", "Once upon a time", "-n", "40",
			       FLAGS, NULL };
	assert_int_equal(p_run(&ref, args), 0);
	redis_start();
	struct harness A, B;
	host_start(&A, "host-A", "2000");
	const char *eb[] = { "--set", g_url, "--set", "remote_host_id=host-B", "--set",
			     "remote_tier=true", NULL };
	harness_start(&B, eb);
	char err[512], cmd[512];
	run_gen(&a, &A, "s", "20");
	assert_int_equal(publish(&A, "s", err, sizeof err), 0);
	assert_int_equal(run_resume(&b, &B, "s", "20"), 0);
	assert_memory_equal(b.ids, ref.ids + 20, 20 * sizeof(int));
	Freekv__Reply *r;
	Freekv__RemoteStats *st = remote_stats(&B, &r);
	assert_int_equal(st->adopted, 1);
	assert_int_equal(st->bytes_got, 0); /* nothing read at the open */
	assert_true(st->fetched > 0);	    /* every block read by the tier, on recall */
	assert_int_equal(st->tier_blocks, 0);
	kvs_reply_free(r);
	/* A damaged published block: the resume on B fails, nothing decodes over it. */
	run_gen(&a, &A, "t", "20");
	assert_int_equal(publish(&A, "t", err, sizeof err), 0);
	snprintf(cmd, sizeof cmd, "redis-cli -p %d setrange 'freekv:{t}:blk:1:1:0' 100 XXXX "
		 ">/dev/null", g_port);
	assert_int_equal(system(cmd), 0);
	assert_int_not_equal(run_resume(&b, &B, "t", "4"), 0);
	assert_int_equal(b.n_ids, 0);
	st = remote_stats(&B, &r);
	assert_true(st->tier_errors > 0);
	kvs_reply_free(r);
	harness_stop(&B);
	harness_stop(&A);
	redis_stop();
}

/* remote_prefix: pages host A published for its prompt are found by host B for a prompt that
 * shares 3/4 of it: B prefills only the rest and decodes the tokens of its cold run. */
/* How many prefix copies in Redis have a TTL in [lo, hi] (TTL -1: no expiry). */
static int pfx_ttl_count(long lo, long hi)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "redis-cli -p %d --scan --pattern 'freekv:{pfx:*' | while read -r "
		 "k; do redis-cli -p %d TTL \"$k\"; done | awk '$1 >= %ld && $1 <= %ld' | wc -l",
		 g_port, g_port, lo, hi);
	FILE *f = popen(cmd, "r");
	assert_non_null(f);
	int n = -1;
	assert_int_equal(fscanf(f, "%d", &n), 1);
	pclose(f);
	return n;
}

/* With a short remote_prefix_ttl_s, the copies a host wrote leave Redis by themselves. */
static void test_prefix_expiry(void **state)
{
	(void)state;
	char path[1024], cmd[512];
	snprintf(path, sizeof path, "%s/tests/data/stories_corpus.txt", FREEKV_SOURCE_DIR);
	redis_start();
	const char *ea[] = { "--set", g_url, "--set", "remote_host_id=host-A", "--set",
			     "remote_tier=true", "--set", "remote_prefix=true", "--set",
			     "remote_prefix_ttl_s=2", NULL };
	struct harness A;
	harness_start(&A, ea);
	static struct proc a;
	const char *ga[] = { "generate", "-m", g_model, "-f", path, "-n", "4", "--store",
			     A.endpoint, "--seq", "a", "-c", "4096", FLAGS, NULL };
	assert_int_equal(p_run(&a, ga), 0);
	snprintf(cmd, sizeof cmd, "test \"$(redis-cli -p %d --scan --pattern 'freekv:{pfx:*' | "
		 "wc -l)\" -gt 0", g_port);
	uint64_t t0 = clock_ms();
	while (system(cmd)) { /* written in the background */
		assert_true(clock_ms() - t0 < 10000);
		h_sleep_ms(20);
	}
	assert_int_equal(pfx_ttl_count(-1, -1), 0); /* each has its expiry */
	snprintf(cmd, sizeof cmd, "test \"$(redis-cli -p %d --scan --pattern 'freekv:{pfx:*' | "
		 "wc -l)\" -eq 0", g_port);
	for (t0 = clock_ms(); system(cmd); h_sleep_ms(200))
		assert_true(clock_ms() - t0 < 15000);
	harness_stop(&A);
	redis_stop();
}

static void test_prefix_across_hosts(void **state)
{
	(void)state;
	char p1[128], p2[128], path[1024], cmd[4096];
	snprintf(path, sizeof path, "%s/tests/data/stories_corpus.txt", FREEKV_SOURCE_DIR);
	snprintf(p1, sizeof p1, "%s/p1.txt", g_rdir);
	snprintf(p2, sizeof p2, "%s/p2.txt", g_rdir);
	snprintf(cmd, sizeof cmd, "cp %s %s && head -c 4000 %s > %s && printf ' Then a red bird "
		 "flew over the hill.' >> %s", path, p1, path, p2, p2);
	assert_int_equal(system(cmd), 0);
	redis_start();
	/* Two expiries, so that B's renewal of the pages it finds shows. */
	const char *ea[] = { "--set", g_url, "--set", "remote_host_id=host-A", "--set",
			     "remote_tier=true", "--set", "remote_prefix=true", "--set",
			     "remote_prefix_ttl_s=600", NULL };
	const char *eb[] = { "--set", g_url, "--set", "remote_host_id=host-B", "--set",
			     "remote_tier=true", "--set", "remote_prefix=true", "--set",
			     "remote_prefix_ttl_s=900", NULL };
	struct harness A, B;
	harness_start(&A, ea);
	harness_start(&B, eb);
	static struct proc a, cold, b;
	const char *ga[] = { "generate", "-m", g_model, "-f", p1, "-n", "16", "--store", A.endpoint,
			     "--seq", "a", "--keep", "-c", "4096", FLAGS, NULL };
	assert_int_equal(p_run(&a, ga), 0);
	/* A's page copies reach Redis in the background. */
	snprintf(cmd, sizeof cmd, "test \"$(redis-cli -p %d --scan --pattern 'freekv:{pfx:*' | "
		 "wc -l)\" -ge 100", g_port);
	for (uint64_t t0 = clock_ms(); system(cmd); h_sleep_ms(50))
		assert_true(clock_ms() - t0 < 10000);
	/* Every copy expires (A's remote_prefix_ttl_s): none without, none later than 600 s. */
	assert_int_equal(pfx_ttl_count(-1, -1), 0);
	assert_int_equal(pfx_ttl_count(601, 1000000), 0);
	const char *gc[] = { "generate", "-m", g_model, "-f", p2, "-n", "16", "--store", B.endpoint,
			     "--seq", "cold", "--no-prefix", "-c", "4096", FLAGS, NULL };
	assert_int_equal(p_run(&cold, gc), 0);
	const char *gb[] = { "generate", "-m", g_model, "-f", p2, "-n", "16", "--store", B.endpoint,
			     "--seq", "b", "--keep", "-c", "4096", FLAGS, NULL };
	assert_int_equal(p_run(&b, gb), 0);
	assert_int_equal(b.n_ids, 16);
	assert_memory_equal(b.ids, cold.ids, 16 * sizeof(int));
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(B.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_show_sequence(k, 0, "b", false, &r), 0);
	uint64_t covered = r->sequence->prefix_covered_tokens;
	kvs_reply_free(r);
	assert_int_equal(kvs_stats(k, &r), 0);
	fprintf(stderr, "host B found %llu prompt tokens in Redis (%llu pages)\n",
		(unsigned long long)covered, (unsigned long long)r->stats->prefix->remote_pages);
	assert_true(covered >= 512);
	assert_true(r->stats->prefix->remote_pages > 0);
	kvs_reply_free(r);
	kvs_close(k);
	/* The pages B found had their expiry renewed to B's 900 s (GETEX): at least one layer of
	 * every page it attached. */
	int renewed = pfx_ttl_count(601, 900);
	fprintf(stderr, "prefix copies renewed by host B: %d\n", renewed);
	assert_true(renewed >= (int)(covered / 64));
	harness_stop(&B);
	harness_stop(&A);
	redis_stop();
}

int main(void)
{
	g_model = test_model_path("stories260K/stories260K.gguf");
	if (!g_model)
		return TEST_SKIP_EXIT;
	if (system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1")) {
		fprintf(stderr, "skip: redis-server / redis-cli not installed (scripts/bootstrap.sh "
			"installs them)\n");
		return TEST_SKIP_EXIT;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_publish_resume, h_teardown),
		cmocka_unit_test_teardown(test_corrupt_block, h_teardown),
		cmocka_unit_test_teardown(test_redis_down, h_teardown),
		cmocka_unit_test_teardown(test_publish_refused, h_teardown),
		cmocka_unit_test_teardown(test_cluster, h_teardown),
		cmocka_unit_test_teardown(test_restart_keeps_lease, h_teardown),
		cmocka_unit_test_teardown(test_tier, h_teardown),
		cmocka_unit_test_teardown(test_adopt_on_demand, h_teardown),
		cmocka_unit_test_teardown(test_publish_from_tier, h_teardown),
		cmocka_unit_test_teardown(test_prefix_across_hosts, h_teardown),
		cmocka_unit_test_teardown(test_prefix_expiry, h_teardown),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
