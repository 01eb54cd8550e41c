/* `kvworker serve` with the real binaries: a real kvstored, a real serving worker on an ipc
 * socket, real `kvworker client` processes and an in-process DEALER speaking proto/worker.proto.
 *   - three concurrent clients with different prompts each get exactly the ids a solo
 *     `kvworker generate --temp 0` prints; three requests on one connection are batched
 *     together (Done.max_batch) and still match;
 *   - malformed, oversized, wrong-version, multi-frame and out-of-range requests get error
 *     replies, and the worker goes on serving correctly; client exit codes 1/2/3;
 *   - the config file sets what the flags set; a REQ socket gets its Status;
 *   - with one slot, a second request waits in the queue and then runs correctly, a third is
 *     refused (-EBUSY), and a waiting request can be cancelled;
 *   - SIGTERM mid-generation: the worker exits 0, the sequence is detached in kvstored
 *     (`kvctl ls`), `kvworker resume` continues it exactly, and so does a Resume request to a
 *     new serving worker; a Cancel ends a running request and keeps its sequence; READY=1 and
 *     STOPPING=1 reach NOTIFY_SOCKET;
 *   - kill -9 of kvstored while three requests decode, then a new kvstored on the same pool
 *     and journal: every client still gets exactly its solo ids (the worker continues in
 *     place), with full and with freekv;
 *   - a chat's next turn finds the first turn's prompt pages in kvstored and decodes the
 *     tokens of a cold run; another cache_salt finds nothing. */
#include "clock.h"
#include "test_kvworker_proc.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <zmq.h>

#include "kvcache.h"
#include "proto/worker.pb-c.h"
#include "sched_slice.h"

#define N_GEN 100
#define VERSION FREEKV__WORKER__WORKER_PROTOCOL_VERSION__WORKER_PROTOCOL_VERSION_CURRENT

static const char *g_model;
/* The policy under test and its flags (page 8, budget 64, sink 8, window 16 for the retrieval
 * policies, so that retrieval runs from the 65th token on). */
static const char *g_policy = "full";
#define KV_FLAGS "--policy", g_policy, "--page-size", "8", "--budget", "64", "--sink", "8", \
		 "--window", "16"
static const char *const prompts[3] = { "Once upon a time", "The little dog ran",
					"Tom and Lily found a big red ball" };

/* ---------------------------------------------------------------- the serving worker */

struct server {
	struct proc p;
	char listen[160];
};

static void *g_zctx;

static void *w_connect(const char *ep, int type)
{
	void *s = zmq_socket(g_zctx, type);
	assert_non_null(s);
	int zero = 0;
	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
	assert_int_equal(zmq_connect(s, ep), 0);
	return s;
}

static void w_send_raw(void *s, const void *buf, size_t len, int flags)
{
	assert_true(zmq_send(s, buf, len, flags) >= 0);
}

static void w_send(void *s, const Freekv__Worker__Request *rq)
{
	size_t len = freekv__worker__request__get_packed_size(rq);
	uint8_t *buf = malloc(len + 1);
	freekv__worker__request__pack(rq, buf);
	w_send_raw(s, buf, len, 0);
	free(buf);
}

/* The next reply within ms, or NULL. */
static Freekv__Worker__Reply *w_recv(void *s, int ms)
{
	zmq_pollitem_t it = { .socket = s, .events = ZMQ_POLLIN };
	if (zmq_poll(&it, 1, ms) <= 0)
		return NULL;
	zmq_msg_t m;
	zmq_msg_init(&m);
	assert_true(zmq_msg_recv(&m, s, 0) >= 0);
	Freekv__Worker__Reply *r =
		freekv__worker__reply__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
	zmq_msg_close(&m);
	assert_non_null(r);
	return r;
}

static void status_req(Freekv__Worker__Request *rq, Freekv__Worker__Status *st, uint64_t id)
{
	freekv__worker__request__init(rq);
	freekv__worker__status__init(st);
	rq->version = VERSION;
	rq->id = id;
	rq->body_case = FREEKV__WORKER__REQUEST__BODY_STATUS;
	rq->status = st;
}

/* Starts `kvworker serve` with extra args and waits until it answers a Status. */
static void server_start(struct server *sv, const struct harness *h, const char *const *extra)
{
	snprintf(sv->listen, sizeof sv->listen, "ipc://%s/worker.sock", h->dir);
	const char *args[P_MAX_ARGS] = { "serve", "--store", h->endpoint, "--listen", sv->listen,
					 "-t", "1", "--max-seqs", "4", "--backend", "cpu", KV_FLAGS };
	int n = 21;
	for (int i = 0; extra && extra[i] && n < P_MAX_ARGS - 1; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	p_start(&sv->p, args);
	void *s = w_connect(sv->listen, ZMQ_DEALER);
	Freekv__Worker__Request rq;
	Freekv__Worker__Status st;
	status_req(&rq, &st, 1);
	uint64_t t0 = clock_ms();
	Freekv__Worker__Reply *r = NULL;
	while (!r && clock_ms() - t0 < 20000) {
		int stw;
		assert_int_equal(waitpid(sv->p.pid, &stw, WNOHANG), 0); /* still running */
		w_send(s, &rq);
		r = w_recv(s, 200);
	}
	assert_non_null(r);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->body_case, FREEKV__WORKER__REPLY__BODY_STATUS_REPLY);
	assert_string_equal(r->status_reply->backend, "cpu");
	freekv__worker__reply__free_unpacked(r, NULL);
	zmq_close(s);
}

/* SIGTERM; it must exit 0 within 10 s. */
static void server_stop(struct server *sv)
{
	assert_int_equal(kill(sv->p.pid, SIGTERM), 0);
	uint64_t t0 = clock_ms();
	int st;
	pid_t r;
	while ((r = waitpid(sv->p.pid, &st, WNOHANG)) == 0 && clock_ms() - t0 < 10000)
		h_sleep_ms(10);
	if (r == 0) {
		kill(sv->p.pid, SIGKILL);
		waitpid(sv->p.pid, &st, 0);
		fail_msg("kvworker serve did not stop within 10 s");
	}
	close(sv->p.out);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* The ids `kvworker generate --temp 0` prints for prompt (an embedded store). */
static int solo(const char *prompt, int n, int *ids)
{
	char ns[16];
	snprintf(ns, sizeof ns, "%d", n);
	const char *args[] = { "generate", "-m", g_model, "-p", prompt, "-n", ns, "--temp", "0",
			       "--ids", "-t", "1", "--backend", "cpu", KV_FLAGS, NULL };
	static struct proc p;
	assert_int_equal(p_run(&p, args), 0);
	memcpy(ids, p.ids, (size_t)p.n_ids * sizeof *ids);
	return p.n_ids;
}

static void gen_req(Freekv__Worker__Request *rq, Freekv__Worker__Generate *g,
		    Freekv__Worker__Sampling *sp, uint64_t id, const char *prompt, uint32_t n)
{
	freekv__worker__request__init(rq);
	freekv__worker__generate__init(g);
	freekv__worker__sampling__init(sp);
	sp->has_temp = true;
	sp->temp = 0.0f;
	g->prompt = (char *)prompt;
	g->n = n;
	g->sampling = sp;
	rq->version = VERSION;
	rq->id = id;
	rq->body_case = FREEKV__WORKER__REQUEST__BODY_GENERATE;
	rq->generate = g;
}

/* Sends one request and expects one error reply with that status. */
static void expect_error(void *s, const Freekv__Worker__Request *rq, int status)
{
	w_send(s, rq);
	Freekv__Worker__Reply *r = w_recv(s, 5000);
	assert_non_null(r);
	if (r->status != status)
		fprintf(stderr, "expected status %d, got %d (%s)\n", status, r->status,
			r->error ? r->error : "");
	assert_int_equal(r->status, status);
	assert_non_null(r->error);
	assert_int_equal(r->body_case, FREEKV__WORKER__REPLY__BODY__NOT_SET);
	freekv__worker__reply__free_unpacked(r, NULL);
}

static void client_args(const char **a, const char *ep, const char *prompt, const char *n)
{
	const char *v[] = { "client", "-e", ep, "-p", prompt, "-n", n, "--temp", "0", "--ids",
			    NULL };
	memcpy(a, v, sizeof v);
}

/* An abstract-namespace datagram socket for NOTIFY_SOCKET (set in this process's environment,
 * so the next child inherits it). */
static int notify_socket(void)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char name[64], env[80];
	int n = snprintf(name, sizeof name, "fkv-serve-notify-%d", (int)getpid());
	memcpy(a.sun_path + 1, name, (size_t)n);
	assert_int_equal(bind(fd, (struct sockaddr *)&a,
			      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)), 0);
	snprintf(env, sizeof env, "@%s", name);
	setenv("NOTIFY_SOCKET", env, 1);
	struct timeval tv = { 5, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

/* Datagrams until one contains want; false after 5 s of silence. */
static bool notified(int fd, const char *want)
{
	char got[1024];
	for (;;) {
		ssize_t n = recv(fd, got, sizeof got - 1, 0);
		if (n < 0)
			return false;
		got[n] = '\0';
		if (strstr(got, want))
			return true;
	}
}

/* ---------------------------------------------------------------- tests */

static bool use_policy(const char *name)
{
	g_policy = name;
	return p_policy_built(name);
}


static void *slice_probe(void *arg)
{
	*(int *)arg = sched_slice_request(0, SCHED_SLICE_MIN_US, NULL, 0);
	return NULL;
}

/* Whether this kernel keeps slice requests (tried on a thread of its own). */
static bool slices_kept(void)
{
	int ret = -1;
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, slice_probe, &ret), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_true(ret == 0 || ret == -EOPNOTSUPP);
	return ret == 0;
}

/* Every thread of pid (/proc/PID/task) asks for us-microsecond slices (sched_getattr, which
 * test_sched_slice checks against /proc's se.slice). */
static void expect_threads_slice(pid_t pid, long us)
{
	char dir[64];
	snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
	DIR *d = opendir(dir);
	assert_non_null(d);
	int threads = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		long v = sched_slice_current((pid_t)atoi(e->d_name));
		if (v == -ESRCH)
			continue; /* the thread ended */
		if (v != us)
			fail_msg("thread %s of kvworker serve: slice %ld us, want %ld", e->d_name, v, us);
		threads++;
	}
	closedir(d);
	assert_true(threads >= 3); /* main, the store's heartbeat, ZeroMQ's I/O thread at least */
}

static void concurrent_clients(void)
{
	static int ref[3][P_MAX_IDS];
	int n_ref[3];
	for (int i = 0; i < 3; i++) {
		n_ref[i] = solo(prompts[i], N_GEN, ref[i]);
		assert_int_equal(n_ref[i], N_GEN);
	}
	struct harness h;
	harness_start(&h, NULL);
	struct server sv;
	/* With short scheduler slices (where the kernel keeps them): every thread has them, and
	 * the tokens are the same. */
	bool sliced = slices_kept();
	server_start(&sv, &h, sliced ? (const char *const[]){ "-m", g_model, "--slice-us", "200",
							       NULL }
				     : (const char *const[]){ "-m", g_model, NULL });
	if (sliced)
		expect_threads_slice(sv.p.pid, 200);

	/* Three client processes at once. */
	static struct proc c[3];
	const char *args[3][12];
	char n[16];
	snprintf(n, sizeof n, "%d", N_GEN);
	for (int i = 0; i < 3; i++) {
		client_args(args[i], sv.listen, prompts[i], n);
		p_start(&c[i], args[i]);
	}
	for (int i = 0; i < 3; i++) {
		assert_int_equal(p_wait(&c[i]), 0);
		assert_int_equal(c[i].n_ids, N_GEN);
		assert_memory_equal(c[i].ids, ref[i], N_GEN * sizeof(int));
	}

	/* Three requests back to back on one connection: they share engine steps. */
	void *s = w_connect(sv.listen, ZMQ_DEALER);
	Freekv__Worker__Request rq[3];
	Freekv__Worker__Generate g[3];
	Freekv__Worker__Sampling sp[3];
	for (int i = 0; i < 3; i++) {
		gen_req(&rq[i], &g[i], &sp[i], 100 + i, prompts[i], N_GEN);
		w_send(s, &rq[i]);
	}
	int got[3][N_GEN], n_got[3] = { 0 }, done = 0;
	uint32_t max_batch = 0;
	while (done < 3) {
		Freekv__Worker__Reply *r = w_recv(s, 10000);
		assert_non_null(r);
		assert_int_equal(r->status, 0);
		int i = (int)r->id - 100;
		assert_true(i >= 0 && i < 3);
		if (r->body_case == FREEKV__WORKER__REPLY__BODY_PIECE) {
			assert_true(n_got[i] < N_GEN);
			assert_int_equal(r->piece->index, n_got[i]);
			got[i][n_got[i]++] = r->piece->token_id;
		} else {
			assert_int_equal(r->body_case, FREEKV__WORKER__REPLY__BODY_DONE);
			assert_string_equal(r->done->reason, "length");
			assert_int_equal(r->done->generated_tokens, N_GEN);
			assert_false(r->done->kept);
			if (r->done->max_batch > max_batch)
				max_batch = r->done->max_batch;
			done++;
		}
		freekv__worker__reply__free_unpacked(r, NULL);
	}
	for (int i = 0; i < 3; i++) {
		assert_int_equal(n_got[i], N_GEN);
		assert_memory_equal(got[i], ref[i], sizeof got[i]);
	}
	fprintf(stderr, "most sequences in one step: %u\n", max_batch);
	assert_true(max_batch >= 2);
	zmq_close(s);
	server_stop(&sv);
	harness_stop(&h);
}

static void test_bad_requests(void **state)
{
	(void)state;
	use_policy("full");
	int ref[P_MAX_IDS];
	assert_int_equal(solo(prompts[1], 16, ref), 16);
	struct harness h;
	harness_start(&h, NULL);
	/* The model and the request limit come from a config file. */
	char conf[160];
	snprintf(conf, sizeof conf, "%s/kvworker.conf", h.dir);
	FILE *f = fopen(conf, "w");
	assert_non_null(f);
	fprintf(f, "# test\nmodel = %s\nmax-request-bytes = 4096  # small\nctx-size = 64\n", g_model);
	fclose(f);
	struct server sv;
	server_start(&sv, &h, (const char *const[]){ "--config", conf, NULL });
	void *s = w_connect(sv.listen, ZMQ_DEALER);

	/* Not a protobuf at all. */
	w_send_raw(s, "\xff\xff\xff\xff garbage", 13, 0);
	Freekv__Worker__Reply *r = w_recv(s, 5000);
	assert_non_null(r);
	assert_int_equal(r->status, -EPROTO);
	assert_int_equal(r->id, 0);
	freekv__worker__reply__free_unpacked(r, NULL);
	/* Larger than max-request-bytes: refused undecoded. */
	size_t big = 64 << 10;
	char *junk = calloc(1, big);
	w_send_raw(s, junk, big, 0);
	free(junk);
	r = w_recv(s, 5000);
	assert_non_null(r);
	assert_int_equal(r->status, -EMSGSIZE);
	freekv__worker__reply__free_unpacked(r, NULL);
	/* Two frames. */
	w_send_raw(s, "a", 1, ZMQ_SNDMORE);
	w_send_raw(s, "b", 1, 0);
	r = w_recv(s, 5000);
	assert_non_null(r);
	assert_int_equal(r->status, -EPROTO);
	freekv__worker__reply__free_unpacked(r, NULL);

	Freekv__Worker__Request rq;
	Freekv__Worker__Generate g;
	Freekv__Worker__Sampling sp;
	gen_req(&rq, &g, &sp, 7, prompts[1], 4);
	rq.version = 99;
	expect_error(s, &rq, -EPROTONOSUPPORT);
	rq.version = VERSION;
	rq.id = 0;
	expect_error(s, &rq, -EINVAL);
	rq.id = 7;
	rq.body_case = FREEKV__WORKER__REQUEST__BODY__NOT_SET;
	expect_error(s, &rq, -EOPNOTSUPP);
	rq.body_case = FREEKV__WORKER__REQUEST__BODY_GENERATE;
	/* Both a prompt and ids; then neither. */
	int32_t ids[3] = { 1, 2, 3 };
	g.token_ids = ids;
	g.n_token_ids = 3;
	expect_error(s, &rq, -EINVAL);
	g.prompt = NULL;
	g.n_token_ids = 0;
	expect_error(s, &rq, -EINVAL);
	/* An id out of the vocabulary. */
	ids[1] = 100000;
	g.n_token_ids = 3;
	expect_error(s, &rq, -EINVAL);
	/* A prompt longer than the context (ctx-size 64 in the config file). */
	int32_t *many = calloc(3000, sizeof *many);
	for (int i = 0; i < 3000; i++)
		many[i] = 1 + i % 100;
	g.token_ids = many;
	g.n_token_ids = 100;
	expect_error(s, &rq, -E2BIG);
	/* 3000 ids pack into more than max-request-bytes. */
	g.n_token_ids = 3000;
	w_send(s, &rq);
	r = w_recv(s, 5000);
	assert_non_null(r);
	assert_int_equal(r->status, -EMSGSIZE);
	freekv__worker__reply__free_unpacked(r, NULL);
	free(many);
	/* Bad sampling, a bad name. */
	g.token_ids = NULL;
	g.n_token_ids = 0;
	g.prompt = (char *)prompts[1];
	sp.temp = NAN;
	expect_error(s, &rq, -EINVAL);
	sp.temp = 0.0f;
	sp.has_top_p = true;
	sp.top_p = 2.0f;
	expect_error(s, &rq, -EINVAL);
	sp.has_top_p = false;
	g.seq = "bad\nname";
	expect_error(s, &rq, -EINVAL);
	g.seq = NULL;
	/* Resume of a sequence the store does not have; Cancel of nothing. */
	Freekv__Worker__Resume rs = FREEKV__WORKER__RESUME__INIT;
	rs.seq = "nope";
	rs.n = 4;
	Freekv__Worker__Request rr = FREEKV__WORKER__REQUEST__INIT;
	rr.version = VERSION;
	rr.id = 8;
	rr.body_case = FREEKV__WORKER__REQUEST__BODY_RESUME;
	rr.resume = &rs;
	w_send(s, &rr);
	r = w_recv(s, 5000);
	assert_non_null(r);
	assert_true(r->status < 0);
	freekv__worker__reply__free_unpacked(r, NULL);
	Freekv__Worker__Cancel cn = FREEKV__WORKER__CANCEL__INIT;
	cn.target_id = 12345;
	rr.body_case = FREEKV__WORKER__REQUEST__BODY_CANCEL;
	rr.cancel = &cn;
	expect_error(s, &rr, -ENOENT);

	/* Still serving, and still right. */
	int got[16], k = 0;
	rq.id = 9;
	g.n = 16;
	w_send(s, &rq);
	for (;;) {
		r = w_recv(s, 10000);
		assert_non_null(r);
		assert_int_equal(r->status, 0);
		bool fin = r->body_case == FREEKV__WORKER__REPLY__BODY_DONE;
		if (!fin) {
			assert_true(k < 16);
			got[k++] = r->piece->token_id;
		}
		freekv__worker__reply__free_unpacked(r, NULL);
		if (fin)
			break;
	}
	assert_int_equal(k, 16);
	assert_memory_equal(got, ref, sizeof got);
	zmq_close(s);

	/* A REQ socket (empty delimiter frame) gets its Status. */
	void *req = w_connect(sv.listen, ZMQ_REQ);
	Freekv__Worker__Status st;
	status_req(&rq, &st, 5);
	w_send(req, &rq);
	r = w_recv(req, 5000);
	assert_non_null(r);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->status_reply->max_seqs, 4);
	assert_int_equal(r->status_reply->n_active, 0);
	assert_true(r->status_reply->requests_served >= 1);
	freekv__worker__reply__free_unpacked(r, NULL);
	zmq_close(req);

	/* The client's exit codes: refused 1, usage 2, nobody there 3. */
	struct proc p;
	const char *refused[] = { "client", "-e", sv.listen, "--resume", "nope", "-n", "4", NULL };
	assert_int_equal(p_run(&p, refused), 1);
	const char *usage[] = { "client", "-e", sv.listen, NULL };
	assert_int_equal(p_run(&p, usage), 2);
	char nobody[200];
	snprintf(nobody, sizeof nobody, "ipc://%s/nobody.sock", h.dir);
	const char *gone[] = { "client", "-e", nobody, "-p", "x", "--timeout", "300", NULL };
	assert_int_equal(p_run(&p, gone), 3);
	/* The serving worker refuses a tcp endpoint that is not loopback, before loading. */
	const char *tcp[] = { "serve", "-m", g_model, "--store", h.endpoint, "--listen",
			      "tcp://0.0.0.0:5555", NULL };
	assert_int_equal(p_run(&p, tcp), 2);
	server_stop(&sv);
	harness_stop(&h);
}

/* One slot and one queue place: the second request waits and then runs correctly, the third is
 * refused with -EBUSY, and a Cancel takes a waiting request out of the queue. */
static void test_queue(void **state)
{
	(void)state;
	use_policy("full");
	static int ref[2][P_MAX_IDS];
	for (int i = 0; i < 2; i++)
		assert_int_equal(solo(prompts[i], N_GEN, ref[i]), N_GEN);
	struct harness h;
	harness_start(&h, NULL);
	struct server sv;
	server_start(&sv, &h, (const char *const[]){ "-m", g_model, "--max-seqs", "1",
						     "--max-queue", "1", NULL });
	void *s = w_connect(sv.listen, ZMQ_DEALER);
	Freekv__Worker__Request rq[3];
	Freekv__Worker__Generate g[3];
	Freekv__Worker__Sampling sp[3];
	for (int i = 0; i < 3; i++) {
		gen_req(&rq[i], &g[i], &sp[i], 200 + i, prompts[i % 2], N_GEN);
		w_send(s, &rq[i]);
	}
	int got[2][N_GEN], n_got[2] = { 0 }, done = 0;
	bool busy = false;
	while (done < 2 || !busy) {
		Freekv__Worker__Reply *r = w_recv(s, 10000);
		assert_non_null(r);
		if (r->id == 202) {
			assert_int_equal(r->status, -EBUSY);
			busy = true;
		} else {
			int i = (int)r->id - 200;
			assert_true(i == 0 || i == 1);
			assert_int_equal(r->status, 0);
			if (r->body_case == FREEKV__WORKER__REPLY__BODY_PIECE) {
				assert_true(n_got[i] < N_GEN);
				got[i][n_got[i]++] = r->piece->token_id;
			} else {
				assert_int_equal(r->body_case, FREEKV__WORKER__REPLY__BODY_DONE);
				/* Never two at once with one slot; the first ends before the second. */
				assert_int_equal(r->done->max_batch, 1);
				assert_int_equal(done, i);
				done++;
			}
		}
		freekv__worker__reply__free_unpacked(r, NULL);
	}
	for (int i = 0; i < 2; i++) {
		assert_int_equal(n_got[i], N_GEN);
		assert_memory_equal(got[i], ref[i], sizeof got[i]);
	}
	/* A long one holds the slot; the next waits and is cancelled there. */
	gen_req(&rq[0], &g[0], &sp[0], 300, prompts[0], 1400);
	gen_req(&rq[1], &g[1], &sp[1], 301, prompts[1], 8);
	w_send(s, &rq[0]);
	w_send(s, &rq[1]);
	Freekv__Worker__Cancel cn = FREEKV__WORKER__CANCEL__INIT;
	Freekv__Worker__Request cr = FREEKV__WORKER__REQUEST__INIT;
	cn.target_id = 301;
	cr.version = VERSION;
	cr.id = 302;
	cr.body_case = FREEKV__WORKER__REQUEST__BODY_CANCEL;
	cr.cancel = &cn;
	w_send(s, &cr);
	bool cancelled = false, acked = false;
	while (!cancelled || !acked) {
		Freekv__Worker__Reply *r = w_recv(s, 10000);
		assert_non_null(r);
		if (r->id == 301) {
			assert_int_equal(r->status, -ECANCELED);
			cancelled = true;
		} else if (r->id == 302) {
			assert_int_equal(r->status, 0);
			acked = true;
		} else {
			assert_int_equal(r->id, 300);
			assert_int_equal(r->status, 0);
		}
		freekv__worker__reply__free_unpacked(r, NULL);
	}
	zmq_close(s);
	server_stop(&sv);
	harness_stop(&h);
}

/* `kvctl ls` output. */
static void kvctl_ls(const char *ep, char *out, size_t len)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "%s/ctl/kvctl -e %s ls", FREEKV_BUILD_DIR, ep);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, len - 1, p);
	out[n] = '\0';
	assert_int_equal(WEXITSTATUS(pclose(p)), 0);
}

/* A sequence rebuilt from its host copy (resume) continues exactly with `full`, whose whole
 * state is the host copy. A retrieval policy's first step after a rebuild selects with the
 * current query instead of the previous one (docs/design.md §4), so a greedy near-tie can flip
 * a token: for those the comparison is reported, not asserted (seen once in about 8 loaded
 * suite runs with freekv). */
static void same_after_rebuild(const int *got, const int *want, int n, const char *what)
{
	if (!memcmp(got, want, (size_t)n * sizeof *got))
		return;
	int d = 0;
	while (d < n && got[d] == want[d])
		d++;
	if (!strcmp(g_policy, "full"))
		fail_msg("%s: the continuation differs from the uninterrupted run at %d", what, d);
	fprintf(stderr, "%s (%s): the continuation first differs from the uninterrupted run at %d "
		"(a near-tie after a rebuild)\n", what, g_policy, d);
}

static void sigterm_resume(void)
{
	static int ref[P_MAX_IDS], kept[P_MAX_IDS];
	int n_ref = solo(prompts[0], 1500, ref);
	assert_int_equal(n_ref, 1500);
	struct harness h;
	harness_start(&h, NULL);
	struct server sv;
	int nfd = notify_socket();
	server_start(&sv, &h, (const char *const[]){ "-m", g_model, NULL });
	unsetenv("NOTIFY_SOCKET");
	assert_true(notified(nfd, "READY=1"));
	static struct proc c;
	const char *args[] = { "client", "-e", sv.listen, "-p", prompts[0], "-n", "1400", "--temp",
			       "0", "--ids", "--seq", "victim", NULL };
	p_start(&c, args);
	/* Past the budget: retrieval state is in play when it stops. */
	assert_true(p_read_ids(&c, 80) >= 80);
	server_stop(&sv);
	assert_true(notified(nfd, "STOPPING=1"));
	close(nfd);
	assert_int_not_equal(access(sv.listen + 6, F_OK), 0); /* the ipc socket file is gone */
	/* The client got its stream's end (Done, reason shutdown) and exits 0. */
	assert_int_equal(p_wait(&c), 0);
	int streamed = c.n_ids;
	fprintf(stderr, "stopped after %d streamed ids\n", streamed);
	assert_true(streamed >= 80 && streamed + 80 <= n_ref);
	assert_memory_equal(c.ids, ref, (size_t)streamed * sizeof *ref);

	int st;
	uint64_t committed;
	int n_kept = p_seq_ids(h.endpoint, "victim", kept, P_MAX_IDS, &st, &committed);
	assert_int_equal(st, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
	int n_prompt = n_kept - streamed;
	assert_true(n_prompt > 0);
	assert_memory_equal(kept + n_prompt, ref, (size_t)streamed * sizeof *ref);
	char ls[4096];
	kvctl_ls(h.endpoint, ls, sizeof ls);
	char *row = strstr(ls, "victim");
	assert_non_null(row);
	assert_non_null(strstr(row, "detached"));

	/* `kvworker resume` continues it exactly, and keeps it. */
	struct proc p;
	const char *resume[] = { "resume", "-m", g_model, "--store", h.endpoint, "--seq",
				 "victim", "-n", "40", "--temp", "0", "--ids", "--keep", "-t", "1",
				 "--backend", "cpu", KV_FLAGS, NULL };
	assert_int_equal(p_run(&p, resume), 0);
	assert_int_equal(p.n_ids, 40);
	same_after_rebuild(p.ids, ref + streamed, 40, "kvworker resume");

	/* So does a Resume request to a new serving worker. */
	server_start(&sv, &h, (const char *const[]){ "-m", g_model, NULL });
	const char *cres[] = { "client", "-e", sv.listen, "--resume", "victim", "-n", "40",
			       "--temp", "0", "--ids", NULL };
	assert_int_equal(p_run(&p, cres), 0);
	assert_int_equal(p.n_ids, 40);
	same_after_rebuild(p.ids, ref + streamed + 40, 40, "a Resume request");

	/* Cancel: the stream ends with Done (cancelled) and the sequence is kept, detached. */
	void *s = w_connect(sv.listen, ZMQ_DEALER);
	Freekv__Worker__Request rq;
	Freekv__Worker__Generate g;
	Freekv__Worker__Sampling sp;
	gen_req(&rq, &g, &sp, 41, prompts[2], 1400);
	g.seq = "cancelme";
	w_send(s, &rq);
	Freekv__Worker__Cancel cn = FREEKV__WORKER__CANCEL__INIT;
	Freekv__Worker__Request cr = FREEKV__WORKER__REQUEST__INIT;
	cn.target_id = 41;
	cr.version = VERSION;
	cr.id = 42;
	cr.body_case = FREEKV__WORKER__REQUEST__BODY_CANCEL;
	cr.cancel = &cn;
	int pieces = 0;
	bool acked = false, done = false;
	while (!done || !acked) {
		Freekv__Worker__Reply *r = w_recv(s, 10000);
		assert_non_null(r);
		assert_int_equal(r->status, 0);
		if (r->id == 42) {
			acked = true;
		} else if (r->body_case == FREEKV__WORKER__REPLY__BODY_PIECE) {
			if (++pieces == 5)
				w_send(s, &cr);
		} else {
			assert_int_equal(r->body_case, FREEKV__WORKER__REPLY__BODY_DONE);
			assert_string_equal(r->done->reason, "cancelled");
			assert_true(r->done->kept);
			assert_int_equal(r->done->generated_tokens, pieces);
			done = true;
		}
		freekv__worker__reply__free_unpacked(r, NULL);
	}
	assert_true(pieces >= 5 && pieces < 1400);
	zmq_close(s);
	p_seq_ids(h.endpoint, "cancelme", kept, P_MAX_IDS, &st, NULL);
	assert_int_equal(st, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
	server_stop(&sv);
	/* Without --keep a completed Resume drops the sequence. */
	struct kvs *k;
	Freekv__Reply *rep;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_show_sequence(k, 0, "victim", false, &rep), -ENOENT);
	kvs_close(k);
	harness_stop(&h);
}

static void test_concurrent_full(void **state)
{
	(void)state;
	use_policy("full");
	concurrent_clients();
}

static void test_concurrent_freekv(void **state)
{
	(void)state;
	if (!use_policy("freekv"))
		skip();
	concurrent_clients();
}

static void test_sigterm_resume_full(void **state)
{
	(void)state;
	use_policy("full");
	sigterm_resume();
}

static void test_sigterm_resume_freekv(void **state)
{
	(void)state;
	if (!use_policy("freekv"))
		skip();
	sigterm_resume();
}

/* kill -9 of kvstored while three clients' requests decode, then kvstored started again on
 * the same pool and journal: the serving worker reconnects and continues every request in
 * place; each client gets exactly the ids of a solo run and exits 0. */
static void store_restart(void)
{
	enum { N = 400 };
	static int ref[3][P_MAX_IDS];
	for (int i = 0; i < 3; i++)
		assert_int_equal(solo(prompts[i], N, ref[i]), N);
	static const char *const persist_on[] = { "--set", "persist=true", NULL };
	struct harness h;
	harness_start(&h, persist_on);
	struct server sv;
	server_start(&sv, &h, (const char *const[]){ "-m", g_model, "--store-retry", "30", NULL });
	static struct proc c[3];
	const char *args[3][12];
	for (int i = 0; i < 3; i++) {
		client_args(args[i], sv.listen, prompts[i], "400");
		p_start(&c[i], args[i]);
	}
	for (int i = 0; i < 3; i++)
		assert_true(p_read_ids(&c[i], 40 + 20 * i) >= 40 + 20 * i);
	h_kill9(&h);
	harness_spawn(&h, persist_on, NULL);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(p_wait(&c[i]), 0);
		assert_int_equal(c[i].n_ids, N);
		assert_memory_equal(c[i].ids, ref[i], N * sizeof(int));
	}
	server_stop(&sv);
	h_finish(&h);
}

static void test_store_restart_full(void **state)
{
	(void)state;
	use_policy("full");
	store_restart();
}

static void test_store_restart_freekv(void **state)
{
	(void)state;
	if (!use_policy("freekv"))
		skip();
	store_restart();
}

/* A chat's next turn (docs/design.md §4 "Prefix sharing"): its prompt repeats the first turn's,
 * whose pages the first request left in kvstored; the worker finds them (Done.cached_tokens,
 * whole ubatches) and the tokens are a cold run's. Another cache_salt finds nothing. */
static void test_prefix_next_turn(void **state)
{
	(void)state;
	char path[4096];
	snprintf(path, sizeof path, "%s/tests/data/stories_corpus.txt", FREEKV_SOURCE_DIR);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static char turn1[1400], turn2[1600];
	size_t n = fread(turn1, 1, 1200, f);
	fclose(f);
	turn1[n] = 0;
	snprintf(turn2, sizeof turn2, "%s Lily smiled at her mom. What did Lily find in the park?",
		 turn1);
	static int ref[P_MAX_IDS];
	const char *args[] = { "generate", "-m", g_model, "-p", turn2, "-n", "16", "--temp", "0",
			       "--ids", "-t", "1", "--backend", "cpu", "-c", "1024", KV_FLAGS,
			       NULL };
	static struct proc p;
	assert_int_equal(p_run(&p, args), 0);
	assert_int_equal(p.n_ids, 16);
	memcpy(ref, p.ids, sizeof(int) * 16);
	struct harness h;
	harness_start(&h, NULL);
	struct server sv;
	server_start(&sv, &h, (const char *const[]){ "-m", g_model, "-c", "1024", "--ubatch", "64",
						     NULL });
	void *s = w_connect(sv.listen, ZMQ_DEALER);
	const char *salts[3] = { NULL, NULL, "another-tenant" };
	const char *texts[3] = { turn1, turn2, turn2 };
	uint32_t cached[3];
	for (int t = 0; t < 3; t++) {
		Freekv__Worker__Request rq;
		Freekv__Worker__Generate g;
		Freekv__Worker__Sampling sp;
		gen_req(&rq, &g, &sp, 500 + (uint64_t)t, texts[t], 16);
		g.has_keep = true;
		g.keep = true;
		g.cache_salt = (char *)salts[t];
		w_send(s, &rq);
		int got[16], n_got = 0;
		for (bool done = false; !done;) {
			Freekv__Worker__Reply *r = w_recv(s, 20000);
			assert_non_null(r);
			assert_int_equal(r->status, 0);
			if (r->body_case == FREEKV__WORKER__REPLY__BODY_PIECE) {
				assert_true(n_got < 16);
				got[n_got++] = r->piece->token_id;
			} else {
				assert_int_equal(r->body_case, FREEKV__WORKER__REPLY__BODY_DONE);
				cached[t] = r->done->cached_tokens;
				done = true;
			}
			freekv__worker__reply__free_unpacked(r, NULL);
		}
		assert_int_equal(n_got, 16);
		if (t)
			assert_memory_equal(got, ref, sizeof got);
	}
	fprintf(stderr, "next turn: %u prompt tokens found in the pool\n", cached[1]);
	assert_int_equal(cached[0], 0);
	assert_true(cached[1] >= 128);
	assert_int_equal(cached[1] % 64, 0);
	assert_int_equal(cached[2], 0);
	zmq_close(s);
	server_stop(&sv);
	harness_stop(&h);
}

int main(void)
{
	g_model = test_model_path("stories260K/stories260K.gguf");
	if (!g_model)
		return TEST_SKIP_EXIT;
	g_zctx = zmq_ctx_new();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_concurrent_full, h_teardown),
		cmocka_unit_test_teardown(test_concurrent_freekv, h_teardown),
		cmocka_unit_test_teardown(test_bad_requests, h_teardown),
		cmocka_unit_test_teardown(test_queue, h_teardown),
		cmocka_unit_test_teardown(test_sigterm_resume_full, h_teardown),
		cmocka_unit_test_teardown(test_sigterm_resume_freekv, h_teardown),
		cmocka_unit_test_teardown(test_store_restart_full, h_teardown),
		cmocka_unit_test_teardown(test_store_restart_freekv, h_teardown),
		cmocka_unit_test_teardown(test_prefix_next_turn, h_teardown),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	zmq_ctx_term(g_zctx);
	return rc;
}
