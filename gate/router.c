/* router — see router.h. */
#include "router.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "proto/worker.pb-c.h"
#include "log.h"

#define VERSION FREEKV__WORKER__WORKER_PROTOCOL_VERSION__WORKER_PROTOCOL_VERSION_CURRENT
/* Request ids: Status probes and Cancels are told apart from Generates by their top bits. */
#define PROBE_BIT (1ull << 63)
#define CANCEL_BIT (1ull << 62)
/* Outstanding-token charge of a request with no max_tokens bound worth counting. */
#define CHARGE_CAP 4096

struct router_stream {
	struct router *r;
	uint64_t id;
	int worker;
	void (*notify)(void *);		/* told of new pieces and of the end */
	void *notify_arg;
	char *buf;			/* text not yet taken */
	size_t len, cap;
	uint32_t pieces;
	bool sent, final, released, cancel_wanted, cancel_sent, in_table;
	int status;
	char error[256], reason[16];
	uint32_t prompt_tokens, generated, cached_tokens;
	int64_t charged;		/* tokens counted in the worker's outstanding */
	uint8_t *req;			/* packed Request until sent */
	size_t req_len;
};

struct gworker {
	const char *endpoint;
	void *sock, *mon;
	bool alive;
	double probe_sent;		/* 0: no Status unanswered */
	double last_probe;
	uint64_t probe_seq;
	char model[128];
	char *tmpl;			/* chat template source from the last Status */
	char why[128];
	int64_t outstanding;
	int inflight;
	uint64_t requests, failures, ups;
};

struct router {
	struct router_opts o;
	pthread_mutex_t mu;
	bool closing;
	void *zctx;
	struct gworker *w;
	int n;
	struct router_stream **tab;	/* streams in flight or waiting to be sent */
	int n_tab, cap_tab;
	int inflight;
	uint64_t next_id, rr;
	int tick_ms;			/* monitors and probes: at least this often */
	double last_tick;
	bool dirty;			/* something for send_pending to do */
};

/* After a change for send_pending (r->mu held): sent at the end of the loop's turn
 * (router_flush), or by its next router_run. */
static void wake(struct router *r)
{
	r->dirty = true;
}

/* ---------------------------------------------------------------- streams (r->mu held) */

static void stream_free(struct router_stream *s)
{
	free(s->buf);
	free(s->req);
	free(s);
}

/* The request ended: out of the table, its charge off its worker; freed if the caller is
 * done with it, else its caller is told. */
static void finish(struct router *r, struct router_stream *s, int status, const char *err)
{
	if (s->final)
		return;
	s->final = true;
	s->status = status;
	if (err)
		snprintf(s->error, sizeof s->error, "%s", err);
	if (s->in_table) {
		for (int i = 0; i < r->n_tab; i++)
			if (r->tab[i] == s) {
				r->tab[i] = r->tab[--r->n_tab];
				break;
			}
		s->in_table = false;
		struct gworker *w = &r->w[s->worker];
		w->outstanding -= s->charged;
		w->inflight--;
		r->inflight--;
		s->charged = 0;
	}
	if (s->released)
		stream_free(s);
	else if (s->notify)
		s->notify(s->notify_arg);
}

static struct router_stream *find(struct router *r, uint64_t id, int wi)
{
	for (int i = 0; i < r->n_tab; i++)
		if (r->tab[i]->id == id && r->tab[i]->worker == wi)
			return r->tab[i];
	return NULL;
}

static void down(struct router *r, int wi, const char *why)
{
	struct gworker *w = &r->w[wi];
	if (w->alive)
		log_warn("worker %s taken out: %s", w->endpoint, why);
	w->alive = false;
	w->probe_sent = 0;
	snprintf(w->why, sizeof w->why, "%s", why);
	char msg[256];
	snprintf(msg, sizeof msg, "worker %s went away during the request: %s", w->endpoint, why);
	for (int i = r->n_tab - 1; i >= 0; i--) {
		struct router_stream *s = r->tab[i];
		if (s->worker == wi && s->sent) {
			w->failures++;
			finish(r, s, -EHOSTDOWN, msg); /* tab[i] now holds an entry seen already */
		}
	}
}

/* ---------------------------------------------------------------- the loop's side */

static int send_packed(void *sock, const void *buf, size_t len)
{
	return zmq_send(sock, buf, len, ZMQ_DONTWAIT) < 0 ? -errno : 0;
}

static int send_request(void *sock, const Freekv__Worker__Request *rq)
{
	uint8_t stackbuf[256];
	size_t len = freekv__worker__request__get_packed_size(rq);
	uint8_t *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
	if (!buf)
		return -ENOMEM;
	freekv__worker__request__pack(rq, buf);
	int ret = send_packed(sock, buf, len);
	if (buf != stackbuf)
		free(buf);
	return ret;
}

static void probe(struct router *r, int wi, double now)
{
	struct gworker *w = &r->w[wi];
	if (w->probe_sent && now - w->probe_sent < r->o.dead_ms)
		return;
	if (w->probe_sent && w->alive) {
		char why[128];
		snprintf(why, sizeof why, "no answer to Status for %d ms", r->o.dead_ms);
		down(r, wi, why);
	}
	Freekv__Worker__Request rq = FREEKV__WORKER__REQUEST__INIT;
	Freekv__Worker__Status st = FREEKV__WORKER__STATUS__INIT;
	rq.version = VERSION;
	rq.id = PROBE_BIT | ((uint64_t)wi << 32) | (++w->probe_seq & 0xffffffffu);
	rq.body_case = FREEKV__WORKER__REQUEST__BODY_STATUS;
	rq.status = &st;
	w->last_probe = now;
	/* Not connected (ZMQ_IMMEDIATE): nothing was queued; try again next period. */
	if (send_request(w->sock, &rq) == 0)
		w->probe_sent = now;
}

static void on_status(struct router *r, int wi, const Freekv__Worker__StatusReply *st)
{
	struct gworker *w = &r->w[wi];
	w->probe_sent = 0;
	router_model_id(st->model, w->model, sizeof w->model);
	free(w->tmpl);
	w->tmpl = st->chat_template && st->chat_template[0] ? strdup(st->chat_template) : NULL;
	if (!w->alive) {
		w->alive = true;
		w->ups++;
		w->why[0] = '\0';
		log_info("worker %s is serving (model %s, policy %s, %u sequences)",
			w->endpoint, w->model, st->policy, st->max_seqs);
	}
}

static void on_reply(struct router *r, int wi, const uint8_t *data, size_t len)
{
	Freekv__Worker__Reply *rp = freekv__worker__reply__unpack(NULL, len, data);
	if (!rp) {
		log_warn("worker %s sent a malformed reply", r->w[wi].endpoint);
		return;
	}
	if (rp->id & PROBE_BIT) {
		if (rp->body_case == FREEKV__WORKER__REPLY__BODY_STATUS_REPLY)
			on_status(r, wi, rp->status_reply);
	} else if (!(rp->id & CANCEL_BIT)) {
		struct router_stream *s = find(r, rp->id, wi);
		struct gworker *w = &r->w[wi];
		if (!s) {
			/* Already ended here (cancelled, or its worker was taken out). */
		} else if (rp->status < 0) {
			w->failures++;
			finish(r, s, rp->status, rp->error ? rp->error : strerror(-rp->status));
		} else if (rp->body_case == FREEKV__WORKER__REPLY__BODY_PIECE) {
			const Freekv__Worker__Piece *pc = rp->piece;
			size_t n = pc->has_text ? pc->text.len : 0;
			if (s->len + n > s->cap) {
				size_t cap = s->cap ? s->cap * 2 : 256;
				while (cap < s->len + n)
					cap *= 2;
				char *b = realloc(s->buf, cap);
				if (!b) {
					finish(r, s, -ENOMEM, "out of memory");
					goto out;
				}
				s->buf = b;
				s->cap = cap;
			}
			if (n)
				memcpy(s->buf + s->len, pc->text.data, n);
			s->len += n;
			s->pieces++;
			if (s->charged > 0) {
				s->charged--;
				w->outstanding--;
			}
			if (s->notify)
				s->notify(s->notify_arg);
		} else if (rp->body_case == FREEKV__WORKER__REPLY__BODY_DONE) {
			snprintf(s->reason, sizeof s->reason, "%s", rp->done->reason);
			s->prompt_tokens = rp->done->prompt_tokens;
			s->cached_tokens = rp->done->cached_tokens;
			s->generated = rp->done->generated_tokens;
			finish(r, s, 0, NULL);
		}
	}
out:
	freekv__worker__reply__free_unpacked(rp, NULL);
}

/* A monitor event: two frames, (u16 event, u32 value) and the endpoint. */
static void on_monitor(struct router *r, int wi)
{
	zmq_msg_t m;
	zmq_msg_init(&m);
	if (zmq_msg_recv(&m, r->w[wi].mon, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&m);
		return;
	}
	uint16_t ev = 0;
	if (zmq_msg_size(&m) >= 2)
		memcpy(&ev, zmq_msg_data(&m), 2);
	bool more = zmq_msg_more(&m);
	zmq_msg_close(&m);
	while (more) {
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, r->w[wi].mon, 0) < 0)
			more = false;
		else
			more = zmq_msg_more(&m);
		zmq_msg_close(&m);
	}
	if (ev == ZMQ_EVENT_DISCONNECTED)
		down(r, wi, "connection lost");
	else if (ev == ZMQ_EVENT_CONNECTED)
		r->w[wi].last_probe = 0; /* ask at once */
}

static void send_pending(struct router *r)
{
	r->dirty = false;
	for (int i = 0; i < r->n_tab; i++) {
		struct router_stream *s = r->tab[i];
		struct gworker *w = &r->w[s->worker];
		if (!s->sent) {
			int ret = send_packed(w->sock, s->req, s->req_len);
			if (ret) {
				char msg[256];
				snprintf(msg, sizeof msg, "worker %s cannot take the request: %s",
					 w->endpoint, zmq_strerror(-ret));
				w->failures++;
				finish(r, s, -EHOSTUNREACH, msg);
				i--;
				continue;
			}
			s->sent = true;
			free(s->req);
			s->req = NULL;
		}
		if (s->cancel_wanted && !s->cancel_sent) {
			Freekv__Worker__Request rq = FREEKV__WORKER__REQUEST__INIT;
			Freekv__Worker__Cancel c = FREEKV__WORKER__CANCEL__INIT;
			rq.version = VERSION;
			rq.id = CANCEL_BIT | s->id;
			rq.body_case = FREEKV__WORKER__REQUEST__BODY_CANCEL;
			rq.cancel = &c;
			c.target_id = s->id;
			s->cancel_sent = send_request(w->sock, &rq) == 0;
		}
	}
}

int router_pollitems(struct router *r, zmq_pollitem_t *it, int max)
{
	if (!it)
		return r->n;
	if (max < r->n)
		return -ENOSPC;
	for (int i = 0; i < r->n; i++)
		it[i] = (zmq_pollitem_t){ .socket = r->w[i].sock, .events = ZMQ_POLLIN };
	return r->n;
}

int router_run(struct router *r, const zmq_pollitem_t *it)
{
	pthread_mutex_lock(&r->mu);
	for (int i = 0; i < r->n; i++) {
		if (it && !(it[i].revents & ZMQ_POLLIN))
			continue;
		for (int k = 0; k < 64; k++) { /* bounded: others get their turn */
			zmq_msg_t m;
			zmq_msg_init(&m);
			if (zmq_msg_recv(&m, r->w[i].sock, ZMQ_DONTWAIT) < 0) {
				zmq_msg_close(&m);
				break;
			}
			if (!zmq_msg_more(&m))
				on_reply(r, i, zmq_msg_data(&m), zmq_msg_size(&m));
			zmq_msg_close(&m);
		}
	}
	double now = clock_ms_f();
	if (now - r->last_tick >= r->tick_ms) {
		/* The monitors are not polled (each zmq socket polled costs system calls on
		 * every turn); a dropped connection is seen within a tick. */
		r->last_tick = now;
		for (int i = 0; i < r->n; i++) {
			int events = 0;
			size_t el = sizeof events;
			while (zmq_getsockopt(r->w[i].mon, ZMQ_EVENTS, &events, &el) == 0 &&
			       (events & ZMQ_POLLIN))
				on_monitor(r, i);
		}
	}
	send_pending(r);
	for (int i = 0; i < r->n; i++)
		if (now - r->w[i].last_probe >= r->o.probe_ms)
			probe(r, i, now);
	double left = r->last_tick + r->tick_ms - now;
	pthread_mutex_unlock(&r->mu);
	return left > 0 ? (int)left + 1 : 0;
}

void router_flush(struct router *r)
{
	pthread_mutex_lock(&r->mu);
	if (r->dirty)
		send_pending(r);
	pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- API */

void router_model_id(const char *path, char *out, size_t outlen)
{
	if (!path)
		path = "";
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	const char *b = path;
	for (size_t i = 0; i < n; i++)
		if (path[i] == '/')
			b = path + i + 1;
	size_t bl = (size_t)(path + n - b);
	if (bl > 5 && !strncmp(b + bl - 5, ".gguf", 5))
		bl -= 5;
	snprintf(out, outlen, "%.*s", (int)bl, b);
}

int router_start(const struct router_opts *o, struct router **out, char *err, size_t errlen)
{
	struct router *r = calloc(1, sizeof *r);
	if (!r)
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	r->o = *o;
	pthread_mutex_init(&r->mu, NULL);
	int ret = -ENOMEM;
	r->n = o->n_endpoints;
	if (!(r->w = calloc((size_t)r->n, sizeof *r->w)) || !(r->zctx = zmq_ctx_new())) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (int i = 0; i < r->n; i++) {
		struct gworker *w = &r->w[i];
		w->endpoint = o->endpoints[i];
		snprintf(w->why, sizeof w->why, "not answered yet");
		int one = 1, zero = 0, ivl = 100, ivl_max = 1000;
		char mon[64];
		snprintf(mon, sizeof mon, "inproc://kvgate-monitor-%d", i);
		if (!(w->sock = zmq_socket(r->zctx, ZMQ_DEALER))) {
			ret = -errno;
			snprintf(err, errlen, "socket: %s", zmq_strerror(errno));
			goto fail;
		}
		zmq_setsockopt(w->sock, ZMQ_LINGER, &zero, sizeof zero);
		/* A disconnected worker fails the send instead of queueing it for later. */
		zmq_setsockopt(w->sock, ZMQ_IMMEDIATE, &one, sizeof one);
		/* Never drop a piece: the worker takes a full queue for a client that left. */
		zmq_setsockopt(w->sock, ZMQ_RCVHWM, &zero, sizeof zero);
		zmq_setsockopt(w->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
		zmq_setsockopt(w->sock, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
		if (zmq_socket_monitor(w->sock, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) ||
		    !(w->mon = zmq_socket(r->zctx, ZMQ_PAIR)) || zmq_connect(w->mon, mon)) {
			ret = -errno;
			snprintf(err, errlen, "socket monitor: %s", zmq_strerror(errno));
			goto fail;
		}
		zmq_setsockopt(w->mon, ZMQ_LINGER, &zero, sizeof zero);
		if (zmq_connect(w->sock, w->endpoint)) {
			ret = -errno;
			snprintf(err, errlen, "--worker %s: %s", w->endpoint, zmq_strerror(errno));
			goto fail;
		}
	}
	r->tick_ms = o->probe_ms < 50 ? o->probe_ms : 50;
	*out = r;
	return 0;
fail:
	router_stop(r);
	return ret;
}

void router_close(struct router *r)
{
	pthread_mutex_lock(&r->mu);
	r->closing = true;
	while (r->n_tab)
		finish(r, r->tab[r->n_tab - 1], -ESHUTDOWN, "kvgate is stopping");
	pthread_mutex_unlock(&r->mu);
}

void router_stop(struct router *r)
{
	if (!r)
		return;
	router_close(r);
	for (int i = 0; r->w && i < r->n; i++) {
		if (r->w[i].sock) {
			zmq_socket_monitor(r->w[i].sock, NULL, 0);
			zmq_close(r->w[i].sock);
		}
		if (r->w[i].mon)
			zmq_close(r->w[i].mon);
		free(r->w[i].tmpl);
	}
	if (r->zctx)
		zmq_ctx_term(r->zctx);
	free(r->w);
	free(r->tab);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

static int pack_generate(const struct router_gen *g, uint64_t id, uint8_t **buf, size_t *len)
{
	Freekv__Worker__Request rq = FREEKV__WORKER__REQUEST__INIT;
	Freekv__Worker__Generate gen = FREEKV__WORKER__GENERATE__INIT;
	Freekv__Worker__Sampling sp = FREEKV__WORKER__SAMPLING__INIT;
	rq.version = VERSION;
	rq.id = id;
	rq.body_case = FREEKV__WORKER__REQUEST__BODY_GENERATE;
	rq.generate = &gen;
	gen.prompt = g->ids ? NULL : (char *)g->prompt;
	gen.token_ids = (int32_t *)g->ids;
	gen.n_token_ids = g->ids ? (size_t)g->n_ids : 0;
	gen.n = g->max_tokens;
	gen.sampling = &sp;
	/* The API samples from the whole distribution: no top-k unless top_p says so. */
	sp.has_temp = sp.has_top_k = sp.has_top_p = true;
	sp.temp = g->temp;
	sp.top_k = 0;
	sp.top_p = g->top_p;
	sp.has_seed = g->has_seed;
	sp.seed = g->seed;
	gen.cache_salt = (char *)g->cache_salt;
	*len = freekv__worker__request__get_packed_size(&rq);
	if (!(*buf = malloc(*len)))
		return -ENOMEM;
	freekv__worker__request__pack(&rq, *buf);
	return 0;
}

/* The live worker serving model with the fewest outstanding tokens (r->mu held). */
static int pick(struct router *r, const char *model, int *best, char *msg, size_t msglen)
{
	bool any_alive = false, model_known = false;
	*best = -1;
	for (int k = 0; k < r->n; k++) {
		int i = (int)((r->rr + (uint64_t)k) % (uint64_t)r->n);
		struct gworker *w = &r->w[i];
		any_alive |= w->alive;
		if (strcmp(w->model, model))
			continue;
		model_known = true;
		if (w->alive && (*best < 0 || w->outstanding < r->w[*best].outstanding))
			*best = i;
	}
	if (r->closing)
		return snprintf(msg, msglen, "kvgate is stopping"), -ESHUTDOWN;
	if (*best < 0 && !model_known && any_alive)
		return snprintf(msg, msglen, "The model '%s' does not exist", model), -ENOENT;
	if (*best < 0)
		return snprintf(msg, msglen, "no worker serving '%s' answers", model), -EHOSTUNREACH;
	return 0;
}

int router_check_model(struct router *r, const char *model, char *msg, size_t msglen)
{
	int best;
	pthread_mutex_lock(&r->mu);
	int ret = pick(r, model, &best, msg, msglen);
	pthread_mutex_unlock(&r->mu);
	return ret;
}

int router_submit(struct router *r, const struct router_gen *g, void (*notify)(void *),
		  void *arg, struct router_stream **out, char *msg, size_t msglen)
{
	struct router_stream *s = calloc(1, sizeof *s);
	if (!s)
		return snprintf(msg, msglen, "out of memory"), -ENOMEM;
	s->r = r;
	s->notify = notify;
	s->notify_arg = arg;
	pthread_mutex_lock(&r->mu);
	int best, ret = pick(r, g->model, &best, msg, msglen);
	if (ret) {
		/* said in msg */
	} else if (r->inflight >= r->o.max_inflight) {
		ret = -EBUSY;
		snprintf(msg, msglen, "kvgate has %d requests in flight (--max-inflight)",
			 r->inflight);
	} else if (r->n_tab == r->cap_tab) {
		int cap = r->cap_tab ? r->cap_tab * 2 : 64;
		struct router_stream **t = realloc(r->tab, (size_t)cap * sizeof *t);
		if (!t)
			ret = -ENOMEM;
		else
			r->tab = t, r->cap_tab = cap;
	}
	if (!ret) {
		s->id = ++r->next_id;
		ret = pack_generate(g, s->id, &s->req, &s->req_len);
	}
	if (ret) {
		if (ret == -ENOMEM)
			snprintf(msg, msglen, "out of memory");
		pthread_mutex_unlock(&r->mu);
		stream_free(s);
		return ret;
	}
	struct gworker *w = &r->w[best];
	r->rr++;
	int64_t prompt = g->ids ? g->n_ids : (int64_t)(strlen(g->prompt) / 4 + 1);
	s->worker = best;
	s->charged = (g->max_tokens < CHARGE_CAP ? g->max_tokens : CHARGE_CAP) + prompt;
	w->outstanding += s->charged;
	w->inflight++;
	w->requests++;
	r->inflight++;
	s->in_table = true;
	r->tab[r->n_tab++] = s;
	wake(r);
	pthread_mutex_unlock(&r->mu);
	*out = s;
	return 0;
}

void router_take(struct router_stream *s, struct router_take *t)
{
	struct router *r = s->r;
	memset(t, 0, sizeof *t);
	pthread_mutex_lock(&r->mu);
	t->text = s->buf;
	t->len = s->len;
	s->buf = NULL;
	s->len = s->cap = 0;
	t->pieces = s->pieces;
	t->final = s->final;
	t->status = s->status;
	t->worker = s->worker;
	snprintf(t->error, sizeof t->error, "%s", s->error);
	snprintf(t->reason, sizeof t->reason, "%s", s->reason);
	t->prompt_tokens = s->prompt_tokens;
	t->cached_tokens = s->cached_tokens;
	t->generated_tokens = s->generated;
	pthread_mutex_unlock(&r->mu);
}

void router_cancel(struct router_stream *s)
{
	struct router *r = s->r;
	pthread_mutex_lock(&r->mu);
	if (!s->final) {
		s->cancel_wanted = true;
		wake(r);
	}
	pthread_mutex_unlock(&r->mu);
}

void router_release(struct router_stream *s)
{
	if (!s)
		return;
	struct router *r = s->r;
	pthread_mutex_lock(&r->mu);
	s->released = true;
	if (s->final)
		stream_free(s);
	else if (!s->sent)
		finish(r, s, -ECANCELED, "released before it was sent");
	else {
		s->cancel_wanted = true; /* freed when its Done arrives */
		wake(r);
	}
	pthread_mutex_unlock(&r->mu);
}

int router_workers(struct router *r, struct router_worker_info *out, int max)
{
	pthread_mutex_lock(&r->mu);
	for (int i = 0; i < r->n && i < max; i++) {
		const struct gworker *w = &r->w[i];
		struct router_worker_info *o = &out[i];
		memset(o, 0, sizeof *o);
		o->endpoint = w->endpoint;
		o->alive = w->alive;
		snprintf(o->model, sizeof o->model, "%s", w->model);
		snprintf(o->why_down, sizeof o->why_down, "%s", w->why);
		o->outstanding = w->outstanding;
		o->inflight = w->inflight;
		o->requests = w->requests;
		o->failures = w->failures;
		o->up_transitions = w->ups;
	}
	pthread_mutex_unlock(&r->mu);
	return r->n;
}

char *router_chat_template(struct router *r, const char *model, bool *known)
{
	char *t = NULL;
	*known = false;
	pthread_mutex_lock(&r->mu);
	for (int i = 0; i < r->n; i++) {
		const struct gworker *w = &r->w[i];
		if (strcmp(w->model, model))
			continue;
		*known = true;
		if (w->tmpl && !t)
			t = strdup(w->tmpl);
	}
	pthread_mutex_unlock(&r->mu);
	return t;
}
