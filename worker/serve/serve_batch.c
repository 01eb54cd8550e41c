/* serve_batch — see serve_batch.h. */
#include "clock.h"
#include "serve_batch.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/worker.pb-c.h"
#include "sampler.h"
#include "serve_metrics.h"
#include "tokenizer.h"
#include "log.h"

#define IDENT_MAX 256

/* One active Generate or Resume. */
struct serve_req {
	bool used, cancel;
	uint64_t id;			/* the client's request id */
	uint8_t ident[IDENT_MAX];	/* the client's ROUTER identity */
	size_t ident_len;
	bool delim;			/* the client sent an empty delimiter frame (REQ) */
	char name[128];
	struct hostkv_seq *hs;
	int seq;			/* engine handle */
	struct sampler smp;
	int32_t *pending;		/* ids to run at the next step */
	int n_pending, cap_pending;
	uint32_t n, generated, prompt_tokens, max_batch, cached_tokens;
	bool keep, started;
	/* Its prompt runs alone in the step, in whole ubatches from where the pages found in the
	 * pool end, so that the pages it writes may be shared (docs/design.md §4). */
	bool alone;
	double t0, t1;			/* admitted, first token sampled */
};

/* The sender of the message being handled. */
struct peer {
	uint8_t ident[IDENT_MAX];
	size_t ident_len;
	bool delim;
};

/* A Generate or Resume waiting for a slot: the decoded request (owned) and its sender. */
struct serve_wait {
	Freekv__Worker__Request *rq;
	struct peer p;
};

int serve_init(struct serve *s)
{
	int V = engine_vocab(s->e);
	s->reqs = calloc((size_t)s->max_seqs, sizeof *s->reqs);
	s->logits = malloc((size_t)s->max_seqs * (size_t)V * sizeof *s->logits);
	s->b_seqs = malloc((size_t)s->max_seqs * sizeof *s->b_seqs);
	s->b_ns = malloc((size_t)s->max_seqs * sizeof *s->b_ns);
	s->b_ids = malloc((size_t)s->max_seqs * sizeof *s->b_ids);
	s->b_reqs = malloc((size_t)s->max_seqs * sizeof *s->b_reqs);
	s->b_next = malloc((size_t)s->max_seqs * sizeof *s->b_next);
	s->b_kept = malloc((size_t)s->max_seqs * sizeof *s->b_kept);
	s->wait = calloc((size_t)(s->max_queue > 0 ? s->max_queue : 1), sizeof *s->wait);
	if (!s->reqs || !s->logits || !s->b_seqs || !s->b_ns || !s->b_ids || !s->b_reqs ||
	    !s->b_next || !s->b_kept || !s->wait) {
		serve_free(s);
		return -ENOMEM;
	}
	s->n_active = s->n_wait = s->wait_head = 0;
	s->t_start = clock_ms_f();
	return 0;
}

void serve_free(struct serve *s)
{
	for (int i = 0; s->wait && i < s->n_wait; i++)
		freekv__worker__request__free_unpacked(
			s->wait[(s->wait_head + i) % s->max_queue].rq, NULL);
	free(s->wait);
	s->wait = NULL;
	s->n_wait = 0;
	free(s->reqs);
	free(s->logits);
	free(s->b_seqs);
	free(s->b_ns);
	free(s->b_ids);
	free(s->b_reqs);
	free(s->b_next);
	free(s->b_kept);
	s->b_next = NULL;
	s->b_kept = NULL;
	s->reqs = NULL;
	s->logits = NULL;
	s->b_seqs = s->b_ns = NULL;
	s->b_ids = NULL;
	s->b_reqs = NULL;
}

/* ---------------------------------------------------------------- replies */

/* Sends one reply; -EHOSTUNREACH when the client is gone (ROUTER_MANDATORY). */
static int send_to(struct serve *s, const uint8_t *ident, size_t ident_len, bool delim,
		   const Freekv__Worker__Reply *r)
{
	size_t len = freekv__worker__reply__get_packed_size(r);
	uint8_t stackbuf[512], *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
	if (!buf)
		return -ENOMEM;
	freekv__worker__reply__pack(r, buf);
	int ret = 0;
	if (zmq_send(s->sock, ident, ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    (delim && zmq_send(s->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
	    zmq_send(s->sock, buf, len, ZMQ_DONTWAIT) < 0)
		ret = -errno;
	if (buf != stackbuf)
		free(buf);
	return ret;
}

static void send_error(struct serve *s, const struct peer *p, uint64_t id, int status,
		       const char *msg)
{
	Freekv__Worker__Reply r = FREEKV__WORKER__REPLY__INIT;
	r.id = id;
	r.status = status;
	r.error = (char *)msg;
	send_to(s, p->ident, p->ident_len, p->delim, &r);
}

/* ---------------------------------------------------------------- ending a request */

static void req_end(struct serve *s, struct serve_req *q, const char *reason)
{
	bool keep = q->keep || !strcmp(reason, "cancelled") || !strcmp(reason, "shutdown") ||
		    !strcmp(reason, "error");
	const int32_t *ids;
	int64_t n_ids = hostkv_seq_tokens(q->hs, &ids);
	if (s->metrics) {
		struct kv_stats st;
		bool have = engine_seq_stats(s->e, q->seq, &st) == 0;
		serve_metrics_end(s->metrics, reason, have ? &st : NULL);
		if (q->generated > 1)
			prom_hist_observe(&s->metrics->tpot, (clock_ms_f() - q->t1) / 1e3 /
							     (q->generated - 1));
	}
	engine_seq_free(s->e, q->seq);
	int ret = hostkv_seq_close(q->hs, !keep);
	if (ret) {
		log_error("closing sequence '%s': %s", q->name,
			strerror(-ret));
		keep = true; /* whatever the store holds, it was not dropped by us */
	}
	double now = clock_ms_f(), dec = q->started ? now - q->t1 : 0.0;
	Freekv__Worker__Done d = FREEKV__WORKER__DONE__INIT;
	d.seq = q->name;
	d.reason = (char *)reason;
	d.prompt_tokens = q->prompt_tokens;
	d.has_cached_tokens = true;
	d.cached_tokens = q->cached_tokens;
	d.generated_tokens = q->generated;
	d.seq_tokens = (uint64_t)n_ids;
	d.kept = keep;
	d.has_prefill_ms = d.has_decode_ms = d.has_decode_tok_s = d.has_max_batch = true;
	d.prefill_ms = q->started ? q->t1 - q->t0 : now - q->t0;
	d.decode_ms = dec;
	d.decode_tok_s = q->generated > 1 && dec > 0 ? (q->generated - 1) / (dec / 1e3) : 0.0;
	d.max_batch = q->max_batch;
	Freekv__Worker__Reply r = FREEKV__WORKER__REPLY__INIT;
	r.id = q->id;
	r.body_case = FREEKV__WORKER__REPLY__BODY_DONE;
	r.done = &d;
	send_to(s, q->ident, q->ident_len, q->delim, &r);
	log_info("request %llu: sequence '%s' %s after %u tokens (%s)",
		(unsigned long long)q->id, q->name, keep ? "kept" : "dropped", q->generated, reason);
	sampler_free(&q->smp);
	free(q->pending);
	memset(q, 0, sizeof *q);
	s->n_active--;
	s->requests_served++;
}

void serve_shutdown(struct serve *s)
{
	for (int i = 0; i < s->max_seqs; i++)
		if (s->reqs[i].used)
			req_end(s, &s->reqs[i], "shutdown");
	for (; s->n_wait; s->n_wait--) {
		struct serve_wait *w = &s->wait[s->wait_head];
		send_error(s, &w->p, w->rq->id, -ESHUTDOWN, "the worker is stopping; the request "
			   "did not start");
		freekv__worker__request__free_unpacked(w->rq, NULL);
		s->wait_head = (s->wait_head + 1) % s->max_queue;
	}
}

/* ---------------------------------------------------------------- admission */

static int set_pending(struct serve_req *q, const int32_t *ids, int n)
{
	if (n > q->cap_pending) {
		int32_t *p = realloc(q->pending, (size_t)n * sizeof *p);
		if (!p)
			return -ENOMEM;
		q->pending = p;
		q->cap_pending = n;
	}
	memcpy(q->pending, ids, (size_t)n * sizeof *ids);
	q->n_pending = n;
	return 0;
}

static struct serve_req *find_name(struct serve *s, const char *name)
{
	for (int i = 0; i < s->max_seqs; i++)
		if (s->reqs[i].used && !strcmp(s->reqs[i].name, name))
			return &s->reqs[i];
	return NULL;
}

/* Sampling parameters from the request, with kvworker generate's defaults. */
static int sampling(const Freekv__Worker__Sampling *w, struct sampler_params *sp, char *err,
		    size_t errlen)
{
	*sp = (struct sampler_params){ .temp = 0.8f, .top_k = 40, .top_p = 0.95f,
				       .seed = (uint64_t)time(NULL) };
	if (!w)
		return 0;
	if (w->has_temp) {
		if (!(w->temp >= 0.0f && w->temp <= 100.0f))
			return snprintf(err, errlen, "temp must be in [0, 100]"), -EINVAL;
		sp->temp = w->temp;
	}
	if (w->has_top_k) {
		if (w->top_k > (1u << 30))
			return snprintf(err, errlen, "top_k is too large"), -EINVAL;
		sp->top_k = (int)w->top_k;
	}
	if (w->has_top_p) {
		if (!(w->top_p >= 0.0f && w->top_p <= 1.0f))
			return snprintf(err, errlen, "top_p must be in [0, 1]"), -EINVAL;
		sp->top_p = w->top_p;
	}
	if (w->has_seed)
		sp->seed = w->seed;
	return 0;
}

static bool name_ok(const char *name)
{
	size_t n = strlen(name);
	if (!n || n >= sizeof ((struct serve_req *)0)->name)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
			return false;
	return true;
}

/* Admits a Generate (resume false) or Resume: a free slot, the sequence opened in the store
 * and the engine, the ids to run first. On failure nothing is held and err says why. */
static int admit(struct serve *s, const struct peer *p, uint64_t id,
		 const Freekv__Worker__Request *rq, char *err, size_t errlen)
{
	const bool resume = rq->body_case == FREEKV__WORKER__REQUEST__BODY_RESUME;
	const Freekv__Worker__Generate *g = rq->generate;
	const Freekv__Worker__Resume *rs = rq->resume;
	const char *name = resume ? rs->seq : g->seq;
	uint32_t n = resume ? rs->n : g->n;
	struct sampler_params sp;
	int ret = sampling(resume ? rs->sampling : g->sampling, &sp, err, errlen);
	if (ret)
		return ret;
	if (n > (1u << 30))
		return snprintf(err, errlen, "n is too large"), -EINVAL;
	if (name && !name_ok(name))
		return snprintf(err, errlen, "bad sequence name"), -EINVAL;
	if (name && find_name(s, name))
		return snprintf(err, errlen, "sequence '%s' is being generated by another request",
				name), -EBUSY;
	for (int i = 0; i < s->max_seqs; i++)
		if (s->reqs[i].used && s->reqs[i].id == id &&
		    s->reqs[i].ident_len == p->ident_len &&
		    !memcmp(s->reqs[i].ident, p->ident, p->ident_len))
			return snprintf(err, errlen, "request id %llu is already active",
					(unsigned long long)id), -EEXIST;
	struct serve_req *q = NULL;
	for (int i = 0; i < s->max_seqs && !q; i++)
		if (!s->reqs[i].used)
			q = &s->reqs[i];
	if (!q)
		return snprintf(err, errlen, "busy: %d sequences are being generated (--max-seqs)",
				s->max_seqs), -EBUSY;

	/* The prompt, validated before anything is opened. */
	int *tokens = NULL;
	int n_prompt = 0;
	const int V = engine_vocab(s->e);
	if (!resume) {
		if (!!g->prompt == !!g->n_token_ids)
			return snprintf(err, errlen, "need exactly one of prompt and token_ids"),
			       -EINVAL;
		if (g->prompt) {
			n_prompt = tokenizer_encode(s->tok, g->prompt, true, &tokens);
			if (n_prompt < 0)
				return snprintf(err, errlen, "cannot tokenize the prompt: %s",
						strerror(-n_prompt)), n_prompt;
		} else {
			if (g->n_token_ids > (size_t)engine_max_ctx(s->e))
				n_prompt = -1;
			else if (!(tokens = malloc(g->n_token_ids * sizeof *tokens)))
				return snprintf(err, errlen, "out of memory"), -ENOMEM;
			for (size_t i = 0; tokens && i < g->n_token_ids; i++) {
				if (g->token_ids[i] < 0 || g->token_ids[i] >= V) {
					free(tokens);
					return snprintf(err, errlen, "token id %d out of range "
							"[0, %d)", g->token_ids[i], V), -EINVAL;
				}
				tokens[i] = g->token_ids[i];
			}
			if (tokens)
				n_prompt = (int)g->n_token_ids;
		}
		if (n_prompt == 0) {
			free(tokens);
			return snprintf(err, errlen, "empty prompt and the model has no BOS token"),
			       -EINVAL;
		}
		if (n_prompt < 0 || n_prompt > engine_max_ctx(s->e)) {
			free(tokens);
			return snprintf(err, errlen, "the prompt is longer than the context limit "
					"of %lld tokens", (long long)engine_max_ctx(s->e)), -E2BIG;
		}
	}

	memset(q, 0, sizeof *q);
	q->seq = -1;
	if (name)
		snprintf(q->name, sizeof q->name, "%s", name);
	else
		snprintf(q->name, sizeof q->name, "serve-%d-%llu", (int)getpid(),
			 (unsigned long long)++s->name_counter);
	struct kv_geom geom;
	engine_kv_geom(s->e, &geom);
	char sub[256], variant[256];
	engine_prefix_variant(s->e, variant, sizeof variant);
	_Static_assert(sizeof(int) == sizeof(int32_t), "prompt ids are int32");
	struct hostkv_prefix px = { .ids = (const int32_t *)tokens, .n_ids = (size_t)n_prompt,
				    .ubatch = (uint32_t)engine_ubatch(s->e),
				    .salt = resume ? NULL : g->cache_salt, .variant = variant };
	ret = resume ? hostkv_seq_open(s->hk, q->name, s->m->fingerprint, s->m->cfg.n_layers,
				       &geom, false, &q->hs, sub, sizeof sub)
		     : hostkv_seq_open_prefix(s->hk, q->name, s->m->fingerprint,
					      s->m->cfg.n_layers, &geom, &px, &q->hs, sub,
					      sizeof sub);
	if (ret) {
		snprintf(err, errlen, "sequence '%s': %s", q->name, sub);
		goto fail;
	}
	const int32_t *kept;
	int64_t n_kept = hostkv_seq_tokens(q->hs, &kept), covered = 0;
	if (!resume && n_kept == n_prompt && !memcmp(kept, tokens, (size_t)n_prompt * sizeof *kept)) {
		/* Kept with the open; the committed length is what the pool already had. */
		covered = hostkv_seq_committed(q->hs);
		n_kept = 0;
	}
	if (!resume && n_kept) {
		snprintf(err, errlen, "sequence '%s' already holds %lld tokens (continue it with "
			 "Resume)", q->name, (long long)n_kept);
		ret = -EEXIST;
		goto fail;
	}
	if (resume && !n_kept) {
		snprintf(err, errlen, "sequence '%s' holds no tokens: nothing to resume", q->name);
		ret = -ENODATA;
		goto fail;
	}
	if ((ret = engine_seq_open(s->e, q->hs, &q->seq, sub, sizeof sub))) {
		snprintf(err, errlen, "%s", sub);
		goto fail;
	}
	if (resume) {
		int64_t len = engine_seq_len(s->e, q->seq);
		n_kept = hostkv_seq_tokens(q->hs, &kept);
		if (n_kept - len > engine_max_ctx(s->e) - len) {
			snprintf(err, errlen, "too many pending tokens");
			ret = -E2BIG;
			goto fail;
		}
		if (n_kept <= len) { /* engine_seq_open leaves at least one id to run */
			snprintf(err, errlen, "sequence '%s' has no id to continue from", q->name);
			ret = -EPROTO;
			goto fail;
		}
		ret = set_pending(q, kept + len, (int)(n_kept - len));
	} else {
		ret = -ENOMEM;
		q->pending = malloc((size_t)n_prompt * sizeof *q->pending);
		if (q->pending) {
			for (int i = (int)covered; i < n_prompt; i++)
				q->pending[i - covered] = tokens[i];
			q->n_pending = q->cap_pending = n_prompt - (int)covered;
			ret = 0;
		}
		q->alone = true;
		q->cached_tokens = (uint32_t)covered;
	}
	if (ret || (ret = sampler_init(&q->smp, &sp, V))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	free(tokens);
	q->used = true;
	q->id = id;
	memcpy(q->ident, p->ident, p->ident_len);
	q->ident_len = p->ident_len;
	q->delim = p->delim;
	q->n = n;
	q->keep = resume ? rs->keep : g->keep;
	q->prompt_tokens = (uint32_t)q->n_pending + q->cached_tokens;
	q->t0 = clock_ms_f();
	s->n_active++;
	log_info("request %llu: %s sequence '%s', %d tokens to run (%u found in the pool), n %u",
		(unsigned long long)id, resume ? "resume" : "generate", q->name, q->n_pending,
		q->cached_tokens, n);
	return 0;
fail:
	free(tokens);
	if (q->seq >= 0)
		engine_seq_free(s->e, q->seq);
	/* Never dropped here: a refused request must not lose a kept sequence. */
	if (q->hs)
		hostkv_seq_close(q->hs, false);
	sampler_free(&q->smp);
	free(q->pending);
	memset(q, 0, sizeof *q);
	return ret;
}

/* ---------------------------------------------------------------- status and cancel */

static void reply_status(struct serve *s, const struct peer *p, uint64_t id)
{
	Freekv__Worker__StatusReply st = FREEKV__WORKER__STATUS_REPLY__INIT;
	Freekv__Worker__ActiveSequence *act = calloc((size_t)s->max_seqs, sizeof *act);
	Freekv__Worker__ActiveSequence **ptrs = calloc((size_t)s->max_seqs, sizeof *ptrs);
	if (!act || !ptrs) {
		free(act);
		free(ptrs);
		send_error(s, p, id, -ENOMEM, "out of memory");
		return;
	}
	size_t k = 0;
	for (int i = 0; i < s->max_seqs; i++) {
		const struct serve_req *q = &s->reqs[i];
		if (!q->used)
			continue;
		freekv__worker__active_sequence__init(&act[k]);
		act[k].request_id = q->id;
		act[k].seq = (char *)q->name;
		act[k].seq_tokens = (uint64_t)hostkv_seq_tokens(q->hs, &(const int32_t *){ NULL });
		act[k].generated_tokens = q->generated;
		act[k].n = q->n;
		ptrs[k] = &act[k];
		k++;
	}
	st.model = (char *)s->model_path;
	st.policy = (char *)engine_policy_name(s->e);
	st.backend = (char *)s->backend_name;
	st.gpu = s->gpu;
	st.max_seqs = (uint32_t)s->max_seqs;
	st.has_queued = true;
	st.queued = (uint32_t)s->n_wait;
	st.chat_template = (char *)s->chat_template;
	st.n_active = k;
	st.active = ptrs;
	st.tokens_generated = s->tokens_generated;
	st.requests_served = s->requests_served;
	st.steps = s->steps;
	st.uptime_s = (clock_ms_f() - s->t_start) / 1e3;
	Freekv__Worker__Reply r = FREEKV__WORKER__REPLY__INIT;
	r.id = id;
	r.body_case = FREEKV__WORKER__REPLY__BODY_STATUS_REPLY;
	r.status_reply = &st;
	send_to(s, p->ident, p->ident_len, p->delim, &r);
	free(act);
	free(ptrs);
}

static bool same_peer(const struct peer *a, const uint8_t *ident, size_t len)
{
	return a->ident_len == len && !memcmp(a->ident, ident, len);
}

static void ack(struct serve *s, const struct peer *p, uint64_t id)
{
	Freekv__Worker__Reply r = FREEKV__WORKER__REPLY__INIT;
	r.id = id;
	send_to(s, p->ident, p->ident_len, p->delim, &r);
}

static void cancel(struct serve *s, const struct peer *p, uint64_t id, uint64_t target)
{
	/* A waiting request leaves the queue; it never had a sequence. */
	for (int i = 0; i < s->n_wait; i++) {
		struct serve_wait *w = &s->wait[(s->wait_head + i) % s->max_queue];
		if (w->rq->id != target || !same_peer(p, w->p.ident, w->p.ident_len))
			continue;
		send_error(s, &w->p, target, -ECANCELED, "cancelled before it started");
		freekv__worker__request__free_unpacked(w->rq, NULL);
		for (int j = i; j + 1 < s->n_wait; j++)
			s->wait[(s->wait_head + j) % s->max_queue] =
				s->wait[(s->wait_head + j + 1) % s->max_queue];
		s->n_wait--;
		ack(s, p, id);
		return;
	}
	for (int i = 0; i < s->max_seqs; i++) {
		struct serve_req *q = &s->reqs[i];
		if (q->used && q->id == target && same_peer(p, q->ident, q->ident_len)) {
			q->cancel = true;
			ack(s, p, id);
			return;
		}
	}
	send_error(s, p, id, -ENOENT, "no active request with that id from this client");
}

/* ---------------------------------------------------------------- receiving */

/* Receives the rest of a multipart message and throws it away. */
static void drain_more(void *sock)
{
	int more = 1;
	size_t ml = sizeof more;
	while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml) == 0 && more) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, sock, 0) < 0) {
			zmq_msg_close(&m);
			return;
		}
		zmq_msg_close(&m);
	}
}

static void admit_or_refuse(struct serve *s, const struct peer *p,
			    const Freekv__Worker__Request *rq)
{
	char err[512];
	int ret = admit(s, p, rq->id, rq, err, sizeof err);
	if (ret) {
		log_warn("request %llu refused: %s",
			(unsigned long long)rq->id, err);
		if (s->metrics)
			prom_inc(&s->metrics->refused, 1);
		send_error(s, p, rq->id, ret, err);
	}
}

int serve_handle(struct serve *s)
{
	struct peer p = { 0 };
	zmq_msg_t id_msg, body;
	zmq_msg_init(&id_msg);
	if (zmq_msg_recv(&id_msg, s->sock, ZMQ_DONTWAIT) < 0) {
		int e = errno;
		zmq_msg_close(&id_msg);
		return e == EAGAIN || e == EINTR ? 0 : -e;
	}
	size_t il = zmq_msg_size(&id_msg);
	bool more = zmq_msg_more(&id_msg);
	if (il > IDENT_MAX || !more) {
		zmq_msg_close(&id_msg);
		if (more)
			drain_more(s->sock);
		return 0;
	}
	memcpy(p.ident, zmq_msg_data(&id_msg), il);
	p.ident_len = il;
	zmq_msg_close(&id_msg);
	zmq_msg_init(&body);
	if (zmq_msg_recv(&body, s->sock, 0) < 0) {
		zmq_msg_close(&body);
		return 0;
	}
	if (zmq_msg_size(&body) == 0 && zmq_msg_more(&body)) {
		p.delim = true;
		zmq_msg_close(&body);
		zmq_msg_init(&body);
		if (zmq_msg_recv(&body, s->sock, 0) < 0) {
			zmq_msg_close(&body);
			return 0;
		}
	}
	bool extra = zmq_msg_more(&body);
	if (extra)
		drain_more(s->sock);
	size_t len = zmq_msg_size(&body);
	char err[512];
	if (extra) {
		send_error(s, &p, 0, -EPROTO, "a request is one frame");
	} else if (len > s->max_request_bytes) {
		snprintf(err, sizeof err, "request of %zu bytes exceeds the limit of %zu", len,
			 s->max_request_bytes);
		send_error(s, &p, 0, -EMSGSIZE, err);
	} else {
		Freekv__Worker__Request *rq =
			freekv__worker__request__unpack(NULL, len, zmq_msg_data(&body));
		if (!rq) {
			send_error(s, &p, 0, -EPROTO, "malformed request");
		} else if (rq->version != FREEKV__WORKER__WORKER_PROTOCOL_VERSION__WORKER_PROTOCOL_VERSION_CURRENT) {
			snprintf(err, sizeof err, "protocol version %u is not supported (this worker "
				 "speaks %d)", rq->version,
				 FREEKV__WORKER__WORKER_PROTOCOL_VERSION__WORKER_PROTOCOL_VERSION_CURRENT);
			send_error(s, &p, rq->id, -EPROTONOSUPPORT, err);
		} else if (rq->id == 0) {
			send_error(s, &p, 0, -EINVAL, "request id 0 is reserved");
		} else {
			switch (rq->body_case) {
			case FREEKV__WORKER__REQUEST__BODY_GENERATE:
			case FREEKV__WORKER__REQUEST__BODY_RESUME:
				if (s->n_active < s->max_seqs && !s->n_wait) {
					admit_or_refuse(s, &p, rq);
				} else if (s->n_wait < s->max_queue) {
					/* Admitted in order as slots free up (serve_step). */
					struct serve_wait *w = &s->wait[(s->wait_head + s->n_wait) %
									s->max_queue];
					w->rq = rq;
					w->p = p;
					s->n_wait++;
					rq = NULL;
				} else {
					snprintf(err, sizeof err, "busy: %d sequences active and %d "
						 "waiting (--max-seqs, --max-queue)", s->n_active,
						 s->n_wait);
					if (s->metrics)
						prom_inc(&s->metrics->refused, 1);
					send_error(s, &p, rq->id, -EBUSY, err);
				}
				break;
			case FREEKV__WORKER__REQUEST__BODY_CANCEL:
				cancel(s, &p, rq->id, rq->cancel->target_id);
				break;
			case FREEKV__WORKER__REQUEST__BODY_STATUS:
				reply_status(s, &p, rq->id);
				break;
			default:
				send_error(s, &p, rq->id, -EOPNOTSUPP, "unknown request type");
				break;
			}
		}
		if (rq)
			freekv__worker__request__free_unpacked(rq, NULL);
	}
	zmq_msg_close(&body);
	return 0;
}

/* ---------------------------------------------------------------- the batch step */

static bool is_eos(const struct serve *s, int id)
{
	const struct fkv_model *m = s->m;
	if (id == tokenizer_eos(s->tok) || id == m->cfg.eos_id)
		return true;
	for (int i = 0; i < m->cfg.n_eos && i < FKV_MAX_EOS; i++)
		if (m->cfg.eos_ids[i] == id)
			return true;
	return false;
}

/* Streams one sampled token; false when the client is gone. */
static bool send_piece(struct serve *s, struct serve_req *q, int32_t tok)
{
	char text[256];
	int n = tokenizer_is_special(s->tok, tok) ? 0 : tokenizer_piece(s->tok, tok, text,
									 sizeof text);
	Freekv__Worker__Piece pc = FREEKV__WORKER__PIECE__INIT;
	pc.token_id = tok;
	pc.index = q->generated;
	if (n > 0) {
		pc.has_text = true;
		pc.text.data = (uint8_t *)text;
		pc.text.len = (size_t)n < sizeof text ? (size_t)n : sizeof text;
	}
	Freekv__Worker__Reply r = FREEKV__WORKER__REPLY__INIT;
	r.id = q->id;
	r.body_case = FREEKV__WORKER__REPLY__BODY_PIECE;
	r.piece = &pc;
	return send_to(s, q->ident, q->ident_len, q->delim, &r) == 0;
}

/* After the step that ran q's pending ids: the next id sampled into *next, true; or the request
 * ended (its length reached, or EOS), false. */
static bool sample_next(struct serve *s, struct serve_req *q, const float *logits, int32_t *next)
{
	if (!q->started) {
		q->started = true;
		q->t1 = clock_ms_f();
		if (s->metrics) {
			prom_hist_observe(&s->metrics->ttft, (q->t1 - q->t0) / 1e3);
			prom_inc(&s->metrics->prompt_tokens, q->prompt_tokens);
		}
	}
	q->n_pending = 0;
	if (q->generated >= q->n) {
		req_end(s, q, "length");
		return false;
	}
	*next = sampler_sample(&q->smp, logits);
	if (is_eos(s, next[0])) {
		req_end(s, q, "eos");
		return false;
	}
	return true;
}

/* Once next is kept with the sequence (kept: engine_seqs_keep's result for it, err its
 * message): stream it, and decide what runs next. Kept before it is streamed: what the
 * client saw survives a crash. */
static void stream_next(struct serve *s, struct serve_req *q, int32_t next, int kept,
			const char *err)
{
	if (kept) {
		log_warn("request %llu: %s", (unsigned long long)q->id, err);
		return req_end(s, q, "error");
	}
	bool alive = send_piece(s, q, next);
	q->generated++;
	s->tokens_generated++;
	if (s->metrics)
		prom_inc(&s->metrics->generated_tokens, 1);
	if (!alive) {
		log_info("request %llu: the client is gone",
			(unsigned long long)q->id);
		return req_end(s, q, "cancelled");
	}
	if (q->generated >= q->n)
		return req_end(s, q, "length");
	if (engine_seq_len(s->e, q->seq) >= engine_max_ctx(s->e))
		return req_end(s, q, "context");
	q->pending[0] = next;
	q->n_pending = 1;
}

/* One engine step over qs[0..k): each request's pending ids; then sampling and streaming. */
static void run_batch(struct serve *s, struct serve_req **qs, int k)
{
	int *seqs = s->b_seqs, *ns = s->b_ns;
	const int32_t **ids = s->b_ids;
	for (int j = 0; j < k; j++) {
		seqs[j] = qs[j]->seq;
		ids[j] = qs[j]->pending;
		ns[j] = qs[j]->n_pending;
		qs[j]->alone = false; /* its prompt runs now; what follows are decode steps */
	}
	char err[512];
	double t0 = clock_ms_f();
	int ret = engine_forward(s->e, k, seqs, ids, ns, s->logits, false, err, sizeof err);
	s->ms_in_steps += clock_ms_f() - t0;
	s->steps++;
	if (s->metrics) {
		prom_inc(&s->metrics->steps, 1);
		prom_hist_observe(&s->metrics->step, (clock_ms_f() - t0) / 1e3);
		prom_hist_observe(&s->metrics->batch, k);
	}
	if (ret) {
		/* The engine validated the batch as a whole: end each request alone so that one
		 * bad sequence cannot stop the others for good. */
		log_error("engine step of %d sequences: %s", k, err);
		for (int j = 0; j < k; j++)
			req_end(s, qs[j], "error");
		return;
	}
	/* Each request's next id sampled, all of them kept in one go (a round trip to kvstored
	 * for the batch, not one per request), then streamed. */
	const int V = engine_vocab(s->e);
	int m = 0;
	for (int j = 0; j < k; j++) {
		s->step_tokens += (uint64_t)ns[j];
		if ((uint32_t)k > qs[j]->max_batch)
			qs[j]->max_batch = (uint32_t)k;
		if (sample_next(s, qs[j], s->logits + (size_t)j * (size_t)V, &s->b_next[m])) {
			qs[m] = qs[j]; /* j >= m: the batch's tail is read no more */
			seqs[m++] = qs[j]->seq;
		}
	}
	int *kept = s->b_kept;
	int first = engine_seqs_keep(s->e, seqs, s->b_next, m, kept, err, sizeof err);
	for (int j = 0; j < m; j++)
		stream_next(s, qs[j], s->b_next[j], kept[j],
			    kept[j] == first ? err : strerror(-kept[j]));
}

void serve_step(struct serve *s)
{
	while (s->n_wait && s->n_active < s->max_seqs) {
		struct serve_wait w = s->wait[s->wait_head];
		s->wait_head = (s->wait_head + 1) % s->max_queue;
		s->n_wait--;
		admit_or_refuse(s, &w.p, w.rq);
		freekv__worker__request__free_unpacked(w.rq, NULL);
	}
	int k = 0, n_alone = 0;
	struct serve_req **qs = s->b_reqs, *alone[64];
	for (int i = 0; i < s->max_seqs; i++) {
		struct serve_req *q = &s->reqs[i];
		if (!q->used)
			continue;
		if (q->cancel) {
			req_end(s, q, "cancelled");
			continue;
		}
		if (q->n_pending <= 0) { /* a bug: every active request has ids to run */
			req_end(s, q, "error");
			continue;
		}
		/* A new prompt runs in its own engine call, chunked in whole ubatches from its
		 * start as a lone `generate` would, so the pages it writes are the ones a cold
		 * run writes and may be shared (docs/design.md §4 "Prefix sharing"). */
		if (q->alone && n_alone < (int)(sizeof alone / sizeof *alone))
			alone[n_alone++] = q;
		else
			qs[k++] = q;
	}
	if (k)
		run_batch(s, qs, k);
	for (int i = 0; i < n_alone; i++)
		if (alone[i]->used && !alone[i]->cancel)
			run_batch(s, &alone[i], 1);
}

char *serve_stats_json(const struct serve *s)
{
	struct json_object *o = json_object_new_object();
	double up = clock_ms_f() - s->t_start;
	json_object_object_add(o, "tokens_decoded", json_object_new_uint64(s->tokens_generated));
	json_object_object_add(o, "decode_tok_s",
			       json_object_new_double(s->ms_in_steps > 0
							      ? s->tokens_generated /
									(s->ms_in_steps / 1e3)
							      : 0.0));
	json_object_object_add(o, "active_sequences", json_object_new_int(s->n_active));
	json_object_object_add(o, "queued_requests", json_object_new_int(s->n_wait));
	json_object_object_add(o, "requests_served", json_object_new_uint64(s->requests_served));
	json_object_object_add(o, "steps", json_object_new_uint64(s->steps));
	json_object_object_add(o, "tokens_run", json_object_new_uint64(s->step_tokens));
	json_object_object_add(o, "policy", json_object_new_string(engine_policy_name(s->e)));
	json_object_object_add(o, "backend", json_object_new_string(s->backend_name));
	json_object_object_add(o, "gpu", json_object_new_int(s->gpu));
	json_object_object_add(o, "uptime_s", json_object_new_double(up / 1e3));
	char *txt = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return txt;
}
