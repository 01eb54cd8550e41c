/* bench_rpc — control-plane and ring round trips of a real kvstored, against a baseline measured
 * in the same run.
 *
 *   control: kvs_heartbeat() (Request encode, ROUTER, table dispatch, Reply encode, decode)
 *   baseline: a raw ZeroMQ REQ -> REP ping-pong between two processes over the same transport
 *             (ipc, a socket in the same temp dir) with messages of the same sizes
 *   ring:     a COMMIT of 0 blocks through the worker's shared-memory ring (submit, futex
 *             doorbell, the daemon's watch thread + eventfd, completion)
 *
 * Prints p50/p99 in microseconds and the control/baseline ratio (target p50 <= 1.5x).
 * usage: bench_rpc [ROUNDS]   (default 20000) */
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

static void pct(double *v, int n, double *p50, double *p99)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	*p50 = v[n / 2];
	*p99 = v[(int)((double)n * 0.99)];
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

static pid_t start_kvstored(const char *dir, const char *ep, const char *shm)
{
	char exe[4096], a_ep[300], a_shm[300];
	snprintf(exe, sizeof exe, "%s/kvstore/kvstored", FREEKV_BUILD_DIR);
	snprintf(a_ep, sizeof a_ep, "endpoint=%s", ep);
	snprintf(a_shm, sizeof a_shm, "shm_name=%s", shm);
	(void)dir;
	pid_t pid = fork();
	if (pid == 0) {
		execl(exe, exe, "--foreground", "--set", a_ep, "--set", a_shm, "--set", "lock_memory=false",
		      "--set", "dram_bytes=64M", "--set", "nvme_path=", "--set", "log_level=error", (char *)NULL);
		_exit(127);
	}
	return pid;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20000;
	if (rounds < 100)
		rounds = 100;
	char dir[] = "/tmp/fkv-bench-rpc-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	char ep_store[128], ep_raw[128], shm[64];
	snprintf(ep_store, sizeof ep_store, "ipc://%s/kvstored.sock", dir);
	snprintf(ep_raw, sizeof ep_raw, "ipc://%s/raw.sock", dir);
	snprintf(shm, sizeof shm, "/fkv-bench-rpc-%d", (int)getpid());
	double *lat = malloc(sizeof *lat * (size_t)rounds);

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
	size_t req_len = freekv__request__get_packed_size(&q);
	Freekv__Reply rp = FREEKV__REPLY__INIT;
	Freekv__Empty e = FREEKV__EMPTY__INIT;
	rp.id = 123456;
	rp.body_case = FREEKV__REPLY__BODY_ACK;
	rp.ack = &e;
	size_t rep_len = freekv__reply__get_packed_size(&rp);

	/* Baseline. */
	pid_t srv = fork();
	if (srv == 0)
		rep_server(ep_raw, rep_len);
	void *ctx = zmq_ctx_new(), *req = zmq_socket(ctx, ZMQ_REQ);
	zmq_connect(req, ep_raw);
	char buf[4096];
	memset(buf, 0x11, sizeof buf);
	for (int i = 0; i < rounds / 10; i++) { /* warm-up */
		zmq_send(req, buf, req_len, 0);
		zmq_recv(req, buf, sizeof buf, 0);
	}
	for (int i = 0; i < rounds; i++) {
		double t0 = now_us();
		zmq_send(req, buf, req_len, 0);
		zmq_recv(req, buf, sizeof buf, 0);
		lat[i] = now_us() - t0;
	}
	double raw50, raw99;
	pct(lat, rounds, &raw50, &raw99);
	zmq_send(req, "quit", 4, 0);
	zmq_recv(req, buf, sizeof buf, 0);
	zmq_close(req);
	zmq_ctx_term(ctx);
	waitpid(srv, NULL, 0);

	/* kvstored. */
	pid_t d = start_kvstored(dir, ep_store, shm);
	struct kvs *k = NULL;
	for (int i = 0; i < 500; i++) {
		if (kvs_connect(ep_store, 200, &k) == 0 && kvs_stats(k, NULL) == 0)
			break;
		kvs_close(k);
		k = NULL;
		usleep(20000);
	}
	int rc = 1;
	if (!k || kvs_hello(k, KVS_ROLE_WORKER, "bench")) {
		fprintf(stderr, "bench_rpc: kvstored did not start: %s\n", k ? kvs_error(k) : "no answer");
		goto out;
	}
	for (int i = 0; i < rounds / 10; i++)
		kvs_heartbeat(k);
	for (int i = 0; i < rounds; i++) {
		double t0 = now_us();
		if (kvs_heartbeat(k)) {
			fprintf(stderr, "bench_rpc: heartbeat: %s\n", kvs_error(k));
			goto out;
		}
		lat[i] = now_us() - t0;
	}
	double c50, c99;
	pct(lat, rounds, &c50, &c99);

	struct kvs_geometry g = { 1, 1, 64, 16, 2 };
	uint64_t seq;
	if (kvs_open_sequence(k, "bench", "fp", 2, &g, NULL, 0, true, &seq) || kvs_attach(k, seq, NULL)) {
		fprintf(stderr, "bench_rpc: %s\n", kvs_error(k));
		goto out;
	}
	for (int i = 0; i < rounds / 10; i++)
		kvs_commit(k, seq, 0, NULL, 0);
	for (int i = 0; i < rounds; i++) {
		double t0 = now_us();
		if (kvs_commit(k, seq, 0, NULL, 0)) {
			fprintf(stderr, "bench_rpc: commit: %s\n", kvs_error(k));
			goto out;
		}
		lat[i] = now_us() - t0;
	}
	double r50, r99;
	pct(lat, rounds, &r50, &r99);

	printf("bench_rpc: %d rounds, ipc transport, request %zu B, reply %zu B\n", rounds, req_len, rep_len);
	printf("  raw ZeroMQ REQ/REP   p50 %8.1f us  p99 %8.1f us\n", raw50, raw99);
	printf("  kvstored Heartbeat   p50 %8.1f us  p99 %8.1f us   ratio p50 %.2fx  p99 %.2fx\n", c50, c99,
	       c50 / raw50, c99 / raw99);
	printf("  ring COMMIT (0 blk)  p50 %8.1f us  p99 %8.1f us\n", r50, r99);
	rc = 0;
out:
	kvs_close(k);
	kill(d, SIGTERM);
	waitpid(d, NULL, 0);
	free(lat);
	snprintf(ep_raw, sizeof ep_raw, "%s/raw.sock", dir);
	unlink(ep_raw);
	rmdir(dir);
	return rc;
}
