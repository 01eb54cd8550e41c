/* bench_rpc — control-plane and ring round trips of a real kvstored, against a baseline measured
 * in the same run.
 *
 *   control:  kvs_heartbeat() (Request encode, ROUTER, table dispatch, Reply encode, decode)
 *   baseline: a raw ZeroMQ REQ -> REP ping-pong between two processes over the same transport
 *             (ipc, a socket in the same temp dir) with messages of the same sizes
 *   ring:     a COMMIT of 0 blocks through the worker's shared-memory ring (submit, the daemon's
 *             data-plane thread, completion; futex doorbells only when a side went to sleep)
 *
 * Fairness on a shared machine: the three measurements run interleaved in REPS repetitions of
 * ROUNDS round trips each (after a warm-up), so load drifts hit them alike; each repetition
 * gives p50/p99 and a control/baseline ratio, and the report is the median over repetitions with
 * the spread (min..max).
 * usage: bench_rpc [ROUNDS [REPS]]   (default 20000 rounds, 5 repetitions) */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "freekv_store.h"

#define MAX_REPS 32

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Percentile q (0..1) of v[0..n) (sorts v). */
static double pctl(double *v, int n, double q)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	int i = (int)((double)n * q);
	return v[i < n ? i : n - 1];
}

/* Median and spread over repetitions; v is sorted. */
struct summary {
	double med, lo, hi;
};

static struct summary summarize(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	return (struct summary){ v[n / 2], v[0], v[n - 1] };
}

/* REP echo server: answers every request with rep_len bytes. */
static void rep_server(const char *ep, size_t rep_len)
{
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_REP);
	char in[4096], out[4096];
	memset(out, 0x5a, sizeof out);
	if (zmq_bind(s, ep) != 0)
		_exit(1);
	for (;;) {
		int n = zmq_recv(s, in, sizeof in, 0);
		if (n < 0)
			break;
		if (n == 4 && !memcmp(in, "quit", 4)) {
			zmq_send(s, out, 1, 0);
			break;
		}
		zmq_send(s, out, rep_len, 0);
	}
	zmq_close(s);
	zmq_ctx_term(ctx);
	_exit(0);
}

static pid_t start_kvstored(const char *ep, const char *shm)
{
	char exe[4096], a_ep[300], a_shm[300];
	snprintf(exe, sizeof exe, "%s/kvstore/kvstored", FREEKV_BUILD_DIR);
	snprintf(a_ep, sizeof a_ep, "endpoint=%s", ep);
	snprintf(a_shm, sizeof a_shm, "shm_name=%s", shm);
	pid_t pid = fork();
	if (pid == 0) {
		execl(exe, exe, "--set", a_ep, "--set", a_shm, "--set", "lock_memory=false",
		      "--set", "dram_bytes=64M", "--set", "nvme_path=", "--set", "log_level=error",
		      /* The worker heartbeats only in its own blocks; the other blocks take seconds. */
		      "--set", "heartbeat_timeout_ms=600000", (char *)NULL);
		_exit(127);
	}
	return pid;
}

struct bench {
	void *req;	/* baseline REQ socket */
	char buf[4096];
	size_t req_len;
	struct kvs *k;
	uint64_t seq;
	double *lat;
	int rounds;
};

/* One block of round trips of the given kind (0 baseline, 1 control, 2 ring) into b->lat.
 * warm: untimed. 0 or -1 on an error (printed). */
static int block(struct bench *b, int kind, int n, bool warm)
{
	for (int i = 0; i < n; i++) {
		double t0 = now_us();
		int ret = 0;
		if (kind == 0) {
			if (zmq_send(b->req, b->buf, b->req_len, 0) < 0 ||
			    zmq_recv(b->req, b->buf, sizeof b->buf, 0) < 0)
				ret = -errno;
		} else if (kind == 1) {
			ret = kvs_heartbeat(b->k);
		} else {
			ret = kvs_commit(b->k, b->seq, 0, NULL, 0);
		}
		if (ret) {
			fprintf(stderr, "bench_rpc: %s: %s\n", kind == 0 ? "zmq" : kind == 1 ? "heartbeat" : "commit",
				kind == 0 ? strerror(-ret) : kvs_error(b->k));
			return -1;
		}
		if (!warm)
			b->lat[i] = now_us() - t0;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20000, reps = argc > 2 ? atoi(argv[2]) : 5;
	if (rounds < 100)
		rounds = 100;
	if (reps < 1 || reps > MAX_REPS)
		reps = reps < 1 ? 1 : MAX_REPS;
	char dir[] = "/tmp/fkv-bench-rpc-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	char ep_store[128], ep_raw[128], shm[64];
	snprintf(ep_store, sizeof ep_store, "ipc://%s/kvstored.sock", dir);
	snprintf(ep_raw, sizeof ep_raw, "ipc://%s/raw.sock", dir);
	snprintf(shm, sizeof shm, "/fkv-bench-rpc-%d", (int)getpid());
	struct bench b = { .rounds = rounds };
	b.lat = malloc(sizeof *b.lat * (size_t)rounds);
	memset(b.buf, 0x11, sizeof b.buf);

	/* Sizes of the real exchange: a packed Heartbeat request and its ack reply. */
	Freekv__Request q = FREEKV__REQUEST__INIT;
	Freekv__Heartbeat hb = FREEKV__HEARTBEAT__INIT;
	q.version = 1;
	q.id = 123456;
	q.has_worker_id = true;
	q.worker_id = 1;
	q.body_case = FREEKV__REQUEST__BODY_HEARTBEAT;
	q.heartbeat = &hb;
	hb.worker_id = 1;
	b.req_len = freekv__request__get_packed_size(&q);
	Freekv__Reply rp = FREEKV__REPLY__INIT;
	Freekv__Empty e = FREEKV__EMPTY__INIT;
	rp.id = 123456;
	rp.body_case = FREEKV__REPLY__BODY_ACK;
	rp.ack = &e;
	size_t rep_len = freekv__reply__get_packed_size(&rp);

	pid_t srv = fork();
	if (srv == 0)
		rep_server(ep_raw, rep_len);
	void *ctx = zmq_ctx_new();
	b.req = zmq_socket(ctx, ZMQ_REQ);
	zmq_connect(b.req, ep_raw);
	pid_t d = start_kvstored(ep_store, shm);
	for (int i = 0; i < 500; i++) {
		if (kvs_connect(ep_store, 200, &b.k) == 0 && kvs_stats(b.k, NULL) == 0)
			break;
		kvs_close(b.k);
		b.k = NULL;
		usleep(20000);
	}
	int rc = 1;
	if (!b.k || kvs_hello(b.k, KVS_ROLE_WORKER, "bench")) {
		fprintf(stderr, "bench_rpc: kvstored did not start: %s\n", b.k ? kvs_error(b.k) : "no answer");
		goto out;
	}
	struct kvs_geometry g = { 1, 1, 64, 16, 2 };
	if (kvs_open_sequence(b.k, "bench", "fp", 2, &g, NULL, 0, true, &b.seq) || kvs_attach(b.k, b.seq, NULL)) {
		fprintf(stderr, "bench_rpc: %s\n", kvs_error(b.k));
		goto out;
	}
	double p50[3][MAX_REPS], p99[3][MAX_REPS], p10r[MAX_REPS], ratio50[MAX_REPS], ratio99[MAX_REPS];
	for (int kind = 0; kind < 3; kind++)
		if (block(&b, kind, rounds / 10, true))
			goto out;
	for (int r = 0; r < reps; r++) {
		for (int kind = 0; kind < 3; kind++) {
			if (block(&b, kind, rounds, false))
				goto out;
			if (kind == 2)
				p10r[r] = pctl(b.lat, rounds, 0.10);
			p50[kind][r] = pctl(b.lat, rounds, 0.50);
			p99[kind][r] = pctl(b.lat, rounds, 0.99);
		}
		ratio50[r] = p50[1][r] / p50[0][r];
		ratio99[r] = p99[1][r] / p99[0][r];
	}
	printf("bench_rpc: %d repetitions x %d rounds, ipc transport, request %zu B, reply %zu B\n", reps, rounds,
	       b.req_len, rep_len);
	printf("  median over repetitions [min..max]\n");
	static const char *const names[3] = { "raw ZeroMQ REQ/REP", "kvstored Heartbeat", "ring COMMIT (0 blk)" };
	for (int kind = 0; kind < 3; kind++) {
		struct summary s50 = summarize(p50[kind], reps), s99 = summarize(p99[kind], reps);
		printf("  %-20s p50 %7.1f us [%.1f..%.1f]  p99 %8.1f us [%.1f..%.1f]\n", names[kind], s50.med, s50.lo,
		       s50.hi, s99.med, s99.lo, s99.hi);
	}
	struct summary s10 = summarize(p10r, reps), r50 = summarize(ratio50, reps), r99 = summarize(ratio99, reps);
	printf("  ring COMMIT p10 %.1f us [%.1f..%.1f]\n", s10.med, s10.lo, s10.hi);
	printf("  control/baseline ratio p50 %.2fx [%.2f..%.2f]  p99 %.2fx [%.2f..%.2f]  (target p50 <= 1.5x)\n",
	       r50.med, r50.lo, r50.hi, r99.med, r99.lo, r99.hi);
	rc = 0;
out:
	zmq_send(b.req, "quit", 4, 0);
	zmq_recv(b.req, b.buf, sizeof b.buf, 0);
	zmq_close(b.req);
	zmq_ctx_term(ctx);
	waitpid(srv, NULL, 0);
	kvs_close(b.k);
	kill(d, SIGTERM);
	waitpid(d, NULL, 0);
	free(b.lat);
	snprintf(ep_raw, sizeof ep_raw, "%s/raw.sock", dir);
	unlink(ep_raw);
	rmdir(dir);
	return rc;
}
