/* bench_journal — what durable metadata (docs/design.md §4 "Restart without loss") costs, against
 * a baseline measured in the same run.
 *
 *   commit:  three real kvstored processes: persist = true (the journal in a temp dir on the
 *            file system of /tmp: every COMMIT waits for an fdatasync), its records written
 *            over zeros written ahead (journal_preallocate, the default); the same appending
 *            to the file's end (journal_preallocate = 0); and persist = false. A worker on
 *            each makes the two calls of one decode step that reach the store: a ring COMMIT
 *            of a fresh page (one 8 KiB block, ALLOCated ahead, not timed) and a CommitTokens
 *            of one id. The daemons are measured interleaved in REPS repetitions of ROUNDS
 *            steps (after a warm-up), so load drifts hit them alike; each repetition gives
 *            p50 / p99 and the ratios journal / no journal and zeros ahead / appending, the
 *            report is the median with the spread (min..max).
 *   restart: a persistent kvstored with a 1 GiB pool is filled with BLOCKS committed 64 KiB blocks
 *            (one sequence per 100 blocks), killed with SIGKILL and started again: the time until
 *            it answers Stats, and its own replay + verification + adoption time; the same start
 *            with persist = false on the same pool size is the baseline.
 * usage: bench_journal [ROUNDS [REPS [BLOCKS]]]   (default 2000 rounds, 5 repetitions, 10000) */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "freekv_store.h"

#define MAX_REPS 32

static double pctl(double *v, int n, double q)
{
	qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
	int i = (int)((double)n * q);
	return v[i < n ? i : n - 1];
}

struct daemon {
	char dir[64], ep[128], shm[64], nvme[128];
	pid_t pid;
};

static pid_t spawn(struct daemon *d, bool persist, const char *dram, const char *prealloc)
{
	char exe[4096], a[6][300];
	snprintf(exe, sizeof exe, "%s/kvstore/kvstored", FREEKV_BUILD_DIR);
	snprintf(a[0], 300, "endpoint=%s", d->ep);
	snprintf(a[1], 300, "shm_name=%s", d->shm);
	snprintf(a[2], 300, "nvme_path=%s", d->nvme);
	snprintf(a[3], 300, "persist=%s", persist ? "true" : "false");
	snprintf(a[4], 300, "dram_bytes=%s", dram);
	snprintf(a[5], 300, "journal_preallocate=%s", prealloc);
	pid_t pid = fork();
	if (pid == 0) {
		execl(exe, exe, "--set", a[0], "--set", a[1], "--set", a[2], "--set",
		      a[3], "--set", a[4], "--set", a[5], "--set", "lock_memory=false", "--set",
		      "nvme_bytes=64M",
		      "--set", "log_level=warn", "--set", "heartbeat_timeout_ms=600000", (char *)NULL);
		_exit(127);
	}
	d->pid = pid;
	return pid;
}

/* Seconds until the daemon answers Stats; -1 when it died. */
static double wait_ready(struct daemon *d)
{
	double t0 = bench_now_s();
	for (;;) {
		struct kvs *k;
		if (kvs_connect(d->ep, 200, &k) == 0) {
			int ret = kvs_stats(k, NULL);
			kvs_close(k);
			if (ret == 0)
				return bench_now_s() - t0;
		}
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid)
			return -1;
		struct timespec ts = { 0, 2000000 };
		nanosleep(&ts, NULL);
	}
}

static void make(struct daemon *d, int i)
{
	snprintf(d->dir, sizeof d->dir, "/tmp/fkv-bj-XXXXXX");
	if (!mkdtemp(d->dir)) {
		perror("mkdtemp");
		exit(1);
	}
	snprintf(d->ep, sizeof d->ep, "ipc://%s/kvstored.sock", d->dir);
	snprintf(d->shm, sizeof d->shm, "/fkv-bj-%d-%d", (int)getpid(), i);
	snprintf(d->nvme, sizeof d->nvme, "%s/tier.bin", d->dir);
}

static void finish(struct daemon *d)
{
	kill(d->pid, SIGTERM);
	waitpid(d->pid, NULL, 0);
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf %s /dev/shm%s", d->dir, d->shm);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_journal: cleanup of %s failed\n", d->dir);
}

struct worker {
	struct kvs *k;
	uint64_t seq, tokens;
	int gen;
};

static const struct kvs_geometry step_geo = { 1, 2, 64, 16, 2 }; /* 8 KiB blocks */
static const uint8_t fp[32] = { 0xbe, 0x4c };

static int open_seq(struct worker *w)
{
	char name[32];
	snprintf(name, sizeof name, "s%d", w->gen++);
	w->tokens = 0;
	if (kvs_open_sequence(w->k, name, fp, sizeof fp, &step_geo, NULL, 0, true, &w->seq) ||
	    kvs_attach(w->k, w->seq, NULL))
		return -1;
	return 0;
}

/* n decode steps as a worker makes them: one token id and the new length each step
 * (CommitTokens), and a ring COMMIT of the new page's block when the length enters it (its
 * ALLOC, ahead, is not timed). step[i]: the whole step; page[*np]: the ring COMMITs alone. */
static int steps(struct worker *w, int n, double *step, double *page, int *np)
{
	for (int i = 0; i < n; i++) {
		uint64_t off = 0;
		bool fresh = w->tokens % step_geo.page_size == 0;
		if (fresh) {
			if (kvs_alloc(w->k, w->seq, 0, (uint32_t)(w->tokens / step_geo.page_size), 1,
				      &off))
				return -1;
			memset((uint8_t *)kvs_pool_base(w->k) + off, i & 0xff, 8192);
		}
		uint32_t id = (uint32_t)i % 1000;
		double t0 = bench_now_s();
		if (fresh && kvs_commit(w->k, w->seq, w->tokens + 1, &off, 1))
			return -1;
		double t1 = bench_now_s();
		if (kvs_commit_tokens(w->k, w->seq, w->tokens + 1, w->tokens, &id, 1))
			return -1;
		if (step)
			step[i] = (bench_now_s() - t0) * 1e6;
		if (fresh && page)
			page[(*np)++] = (t1 - t0) * 1e6;
		w->tokens++;
	}
	/* The next block of steps runs on a fresh sequence: the pool never fills. */
	if (kvs_close_sequence(w->k, w->seq, true))
		return -1;
	return open_seq(w);
}

#define VARIANTS 3

static int bench_commit(int rounds, int reps)
{
	static const char *const names[VARIANTS] = { "journal, zeros ahead", "journal, appending",
						      "persist = false" };
	struct daemon d[VARIANTS];
	struct worker w[VARIANTS] = { 0 };
	for (int i = 0; i < VARIANTS; i++) {
		make(&d[i], i);
		spawn(&d[i], i < 2, "256M", i == 1 ? "0" : "16M");
		if (wait_ready(&d[i]) < 0 || kvs_connect(d[i].ep, 10000, &w[i].k) ||
		    kvs_hello(w[i].k, KVS_ROLE_WORKER, "bench") || open_seq(&w[i])) {
			fprintf(stderr, "bench_journal: daemon %d: %s\n", i,
				w[i].k ? kvs_error(w[i].k) : "did not start");
			return 1;
		}
	}
	double *step = malloc(sizeof *step * (size_t)rounds), *page = malloc(sizeof *page * (size_t)rounds);
	double p50[VARIANTS][MAX_REPS], p99[VARIANTS][MAX_REPS], pg[VARIANTS][MAX_REPS];
	double ratio[MAX_REPS], pratio[MAX_REPS], zratio[MAX_REPS], zpratio[MAX_REPS];
	for (int i = 0; i < VARIANTS; i++)
		if (steps(&w[i], rounds / 10 + 1, NULL, NULL, NULL)) { /* warm-up */
			fprintf(stderr, "bench_journal: %s\n", kvs_error(w[i].k));
			return 1;
		}
	for (int r = 0; r < reps; r++) {
		for (int i = 0; i < VARIANTS; i++) {
			int np = 0;
			if (steps(&w[i], rounds, step, page, &np)) {
				fprintf(stderr, "bench_journal: %s\n", kvs_error(w[i].k));
				return 1;
			}
			p50[i][r] = pctl(step, rounds, 0.5);
			p99[i][r] = pctl(step, rounds, 0.99);
			pg[i][r] = pctl(page, np, 0.5);
		}
		ratio[r] = p50[0][r] / p50[2][r];
		pratio[r] = pg[0][r] / pg[2][r];
		zratio[r] = p50[0][r] / p50[1][r];
		zpratio[r] = pg[0][r] / pg[1][r];
	}
	printf("bench_journal commit: %d repetitions x %d decode steps (CommitTokens of one id; a "
	       "ring COMMIT of one 8 KiB block every 16 steps), journals in %s, %s\n", reps, rounds,
	       d[0].dir, d[1].dir);
	for (int i = 0; i < VARIANTS; i++) {
		struct bench_summary a = bench_summarize(p50[i], reps),
				     b = bench_summarize(p99[i], reps), c = bench_summarize(pg[i], reps);
		printf("  %-22s step p50 %7.1f us [%.1f..%.1f]  p99 %7.1f us [%.1f..%.1f]  ring "
		       "COMMIT p50 %7.1f us [%.1f..%.1f]\n", names[i], a.med, a.lo, a.hi, b.med, b.lo,
		       b.hi, c.med, c.lo, c.hi);
	}
	struct bench_summary x = bench_summarize(ratio, reps), y = bench_summarize(pratio, reps),
			     zx = bench_summarize(zratio, reps), zy = bench_summarize(zpratio, reps);
	printf("  ratio journal / none: step p50 %.2f [%.2f..%.2f], ring COMMIT p50 %.2f "
	       "[%.2f..%.2f]\n", x.med, x.lo, x.hi, y.med, y.lo, y.hi);
	printf("  ratio zeros ahead / appending: step p50 %.2f [%.2f..%.2f], ring COMMIT p50 %.2f "
	       "[%.2f..%.2f]\n", zx.med, zx.lo, zx.hi, zy.med, zy.lo, zy.hi);
	for (int i = 0; i < 2; i++) {
		Freekv__Reply *st;
		if (kvs_stats(w[i].k, &st) == 0 && st->stats->journal) {
			printf("  %s: %" PRIu64 " syncs, %" PRIu64 " bytes now\n", names[i],
			       st->stats->journal->syncs, st->stats->journal->bytes);
			kvs_reply_free(st);
		}
	}
	free(step);
	free(page);
	for (int i = 0; i < VARIANTS; i++) {
		kvs_close(w[i].k);
		finish(&d[i]);
	}
	return 0;
}

/* Fills blocks committed 64 KiB blocks, 100 to a sequence, with their token ids. */
static int fill(struct daemon *d, int blocks)
{
	static const struct kvs_geometry g = { 1, 8, 64, 32, 2 }; /* 64 KiB blocks */
	struct kvs *k;
	if (kvs_connect(d->ep, 10000, &k) || kvs_hello(k, KVS_ROLE_WORKER, "fill"))
		return -1;
	uint32_t *ids = calloc(100 * 32, sizeof *ids);
	for (int done = 0, s = 0; done < blocks; s++) {
		char name[32];
		uint64_t seq, off[64];
		snprintf(name, sizeof name, "f%d", s);
		if (kvs_open_sequence(k, name, fp, sizeof fp, &g, NULL, 0, true, &seq) ||
		    kvs_attach(k, seq, NULL))
			goto fail;
		int n = blocks - done < 100 ? blocks - done : 100;
		for (int p0 = 0; p0 < n; p0 += 50) {
			int m = n - p0 < 50 ? n - p0 : 50;
			if (kvs_alloc(k, seq, 0, (uint32_t)p0, (uint32_t)m, off))
				goto fail;
			for (int i = 0; i < m; i++)
				memset((uint8_t *)kvs_pool_base(k) + off[i], (s + p0 + i) & 0xff, 65536);
			if (kvs_commit(k, seq, (uint64_t)(p0 + m) * g.page_size, off, (uint32_t)m))
				goto fail;
		}
		if (kvs_commit_tokens(k, seq, (uint64_t)n * g.page_size, 0, ids,
				      (size_t)n * g.page_size) ||
		    kvs_detach(k, seq))
			goto fail;
		done += n;
	}
	free(ids);
	kvs_close(k);
	return 0;
fail:
	fprintf(stderr, "bench_journal: fill: %s\n", kvs_error(k));
	free(ids);
	kvs_close(k);
	return -1;
}

static int bench_restart(int blocks)
{
	struct daemon d;
	make(&d, 9);
	spawn(&d, false, "1G", "16M");
	double t_empty0 = wait_ready(&d);
	kill(d.pid, SIGKILL);
	waitpid(d.pid, NULL, 0);
	spawn(&d, false, "1G", "16M"); /* baseline: persist = false starts a 1 GiB pool afresh */
	double t_empty = wait_ready(&d);
	kill(d.pid, SIGKILL);
	waitpid(d.pid, NULL, 0);
	spawn(&d, true, "1G", "16M");
	if (wait_ready(&d) < 0 || fill(&d, blocks))
		return 1;
	kill(d.pid, SIGKILL);
	waitpid(d.pid, NULL, 0);
	spawn(&d, true, "1G", "16M");
	double t_restart = wait_ready(&d);
	struct kvs *k;
	Freekv__Reply *r;
	if (t_restart < 0 || kvs_connect(d.ep, 10000, &k) || kvs_stats(k, &r) || !r->stats->journal) {
		fprintf(stderr, "bench_journal: restart failed\n");
		return 1;
	}
	const Freekv__JournalStats *j = r->stats->journal;
	printf("bench_journal restart: 1 GiB pool, %d committed 64 KiB blocks in %" PRIu64
	       " sequences, killed with SIGKILL\n", blocks, j->adopted_sequences);
	printf("  restart with the journal: %.0f ms to answer (replay + verify + adopt %" PRIu64
	       " ms: %" PRIu64 " records, %" PRIu64 " blocks, %" PRIu64 " damaged)\n",
	       t_restart * 1e3, j->replay_ms, j->replayed, j->adopted_blocks, j->damaged_blocks);
	printf("  start with persist = false (empty pool): %.0f ms (first start %.0f ms)\n",
	       t_empty * 1e3, t_empty0 * 1e3);
	printf("  journal after the start's compaction: %" PRIu64 " bytes\n", j->bytes);
	kvs_reply_free(r);
	kvs_close(k);
	finish(&d);
	return 0;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 2000;
	int reps = argc > 2 ? atoi(argv[2]) : 5;
	int blocks = argc > 3 ? atoi(argv[3]) : 10000;
	if (rounds < 10 || reps < 1 || reps > MAX_REPS || blocks < 1 || blocks > 16000) {
		fprintf(stderr, "usage: bench_journal [ROUNDS>=10 [REPS<=%d [BLOCKS<=16000]]]\n",
			MAX_REPS);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (bench_commit(rounds, reps))
		return 1;
	return bench_restart(blocks);
}
