/* gate_api — kvgate's endpoints (docs/design.md §6): GET /health, GET /v1/models, and the two
 * completion endpoints, answered whole or streamed as server-sent events (`data: <chunk>`
 * lines, a blank line after each, `data: [DONE]` last). The completion path: parse and check
 * the body (openai.c), build the prompt (chat_template.c for chat), submit to the router, wait
 * for the first piece so that a refused request still gets its proper status (400 for a prompt
 * longer than the context, 429 when the worker is full, 503 when no worker answers), then
 * return the text through textout.c (stop strings, UTF-8). An error after a stream has started
 * is sent as an event holding an OpenAI error object, which the official clients raise.
 *
 * Nothing here blocks: kvgate runs one event loop (gate_http.c). A completion with nothing to
 * say yet is parked: its connection is suspended and the job goes on the gate's parked list;
 * the router's notify resumes it when pieces or the end arrive, and MHD then calls the access
 * handler (before the response) or the SSE reader (after) again. A stream parked for
 * keepalive_ms is resumed to send a comment (api_tick). */
#include <errno.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "clock.h"
#include "gate.h"
#include "openai.h"
#include "textout.h"

#define MAX_WORKERS 256

/* ---------------------------------------------------------------- /health, /v1/models */

static struct router_worker_info *snapshot(struct gate *g, int *n)
{
	struct router_worker_info *w = calloc(MAX_WORKERS, sizeof *w);
	*n = w ? router_workers(g->r, w, MAX_WORKERS) : 0;
	if (*n > MAX_WORKERS)
		*n = MAX_WORKERS;
	return w;
}

int api_health(struct gate *g, struct MHD_Connection *c, unsigned *status)
{
	int n;
	struct router_worker_info *w = snapshot(g, &n);
	if (!w)
		return MHD_NO;
	struct json_object *o = json_object_new_object(), *arr = json_object_new_array();
	int alive = 0;
	char reason[1024] = "no worker answers:";
	for (int i = 0; i < n; i++) {
		struct json_object *x = json_object_new_object();
		json_object_object_add(x, "endpoint", json_object_new_string(w[i].endpoint));
		json_object_object_add(x, "alive", json_object_new_boolean(w[i].alive));
		json_object_object_add(x, "model", json_object_new_string(w[i].model));
		json_object_object_add(x, "outstanding_tokens", json_object_new_int64(w[i].outstanding));
		json_object_object_add(x, "requests_in_flight", json_object_new_int(w[i].inflight));
		if (!w[i].alive) {
			json_object_object_add(x, "reason", json_object_new_string(w[i].why_down));
			size_t l = strlen(reason);
			snprintf(reason + l, sizeof reason - l, "%s %s (%s)", i ? "," : "",
				 w[i].endpoint, w[i].why_down);
		}
		alive += w[i].alive;
		json_object_array_add(arr, x);
	}
	*status = alive ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
	json_object_object_add(o, "status", json_object_new_string(alive ? "ok" : "unavailable"));
	if (!alive)
		json_object_object_add(o, "reason", json_object_new_string(reason));
	json_object_object_add(o, "workers_alive", json_object_new_int(alive));
	json_object_object_add(o, "workers", arr);
	char *j = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
							   JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
	free(w);
	return gate_respond_json(c, *status, j);
}

int api_models(struct gate *g, struct MHD_Connection *c, unsigned *status)
{
	int n;
	struct router_worker_info *w = snapshot(g, &n);
	if (!w)
		return MHD_NO;
	struct json_object *o = json_object_new_object(), *arr = json_object_new_array();
	for (int i = 0; i < n; i++) {
		bool seen = !w[i].alive || !w[i].model[0];
		for (int k = 0; k < i && !seen; k++)
			seen = w[k].alive && !strcmp(w[k].model, w[i].model);
		if (seen)
			continue;
		struct json_object *m = json_object_new_object();
		json_object_object_add(m, "id", json_object_new_string(w[i].model));
		json_object_object_add(m, "object", json_object_new_string("model"));
		json_object_object_add(m, "created", json_object_new_int64(g->t_start));
		json_object_object_add(m, "owned_by", json_object_new_string("freekv"));
		json_object_array_add(arr, m);
	}
	json_object_object_add(o, "object", json_object_new_string("list"));
	json_object_object_add(o, "data", arr);
	char *j = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
							   JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
	free(w);
	*status = MHD_HTTP_OK;
	return gate_respond_json(c, *status, j);
}

/* ---------------------------------------------------------------- errors */

static int send_error(struct MHD_Connection *c, const struct oa_err *e, unsigned *status)
{
	*status = (unsigned)e->http;
	return gate_respond_json(c, *status, oa_error_json(e));
}

/* An error from router_submit or the worker, before any output, as the API reports it. */
static void map_error(int status, const char *msg, bool chat, struct oa_err *e)
{
	switch (-status) {
	case ENOENT:
		oa_error(e, 404, "invalid_request_error", "model_not_found", "model", "%s", msg);
		break;
	case EBUSY:
		oa_error(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
			 "The server is overloaded, retry later: %s", msg);
		break;
	case E2BIG:
		oa_error(e, 400, "invalid_request_error", "context_length_exceeded",
			 chat ? "messages" : "prompt", "%s", msg);
		break;
	case EINVAL:
	case EILSEQ:
		oa_error(e, 400, "invalid_request_error", NULL, NULL, "%s", msg);
		break;
	case EHOSTUNREACH:
	case ESHUTDOWN:
		oa_error(e, 503, "server_error", "service_unavailable", NULL, "%s", msg);
		break;
	case EHOSTDOWN:
		oa_error(e, 502, "server_error", "worker_failed", NULL, "%s", msg);
		break;
	case ENOMEM:
		oa_error(e, 500, "server_error", NULL, NULL, "out of memory");
		break;
	default:
		oa_error(e, 502, "server_error", "worker_failed", NULL, "the worker failed: %s",
			 msg);
		break;
	}
}

/* ---------------------------------------------------------------- one completion */

/* A completion in progress; owned by its connection's state (gate_http.c), then, streamed,
 * by the response. */
struct job {
	struct gate *g;
	struct MHD_Connection *c;
	struct job *prev, *next;	/* on g->parked while parked */
	bool parked, streaming, keepalive_due;
	double t_park;
	struct oa_req rq;
	enum oa_kind kind;
	char id[48], model[128];
	struct oa_out out;
	struct router_stream *s;
	struct textout to;
	struct tbuf text;		/* text to send (whole response, or the next chunk) */
	double t0, t_first, t_last;
	uint32_t pieces, stop_pieces, prompt_tokens, generated;
	bool stopped_cancel, final, ended, first_chunk_sent;
	int status;
	char error[256], reason[16];
	struct tbuf sse;		/* bytes the SSE reader has yet to hand out */
	size_t sse_pos;
};

/* ---------------------------------------------------------------- parking */

static void park(struct job *j)
{
	struct gate *g = j->g;
	MHD_suspend_connection(j->c);
	j->parked = true;
	j->t_park = clock_ms_f();
	j->prev = NULL;
	j->next = g->parked;
	if (g->parked)
		g->parked->prev = j;
	g->parked = j;
}

static void unlink_job(struct job *j)
{
	if (!j->parked)
		return;
	if (j->prev)
		j->prev->next = j->next;
	else
		j->g->parked = j->next;
	if (j->next)
		j->next->prev = j->prev;
	j->prev = j->next = NULL;
	j->parked = false;
}

static void unpark(struct job *j)
{
	if (!j->parked)
		return;
	unlink_job(j);
	MHD_resume_connection(j->c);
}

/* The router's notify: pieces or the end arrived. */
static void on_stream(void *arg)
{
	unpark(arg);
}

int api_tick(struct gate *g, double now)
{
	double next = g->keepalive_ms;
	for (struct job *j = g->parked, *n; j; j = n) {
		n = j->next;
		if (!j->streaming)
			continue;
		double left = j->t_park + g->keepalive_ms - now;
		if (left <= 0) {
			j->keepalive_due = true;
			unpark(j);
		} else if (left < next) {
			next = left;
		}
	}
	return (int)next + 1;
}

void api_unpark_all(struct gate *g)
{
	while (g->parked)
		unpark(g->parked);
}

static void job_free(struct job *j)
{
	if (!j)
		return;
	unlink_job(j);
	router_release(j->s);
	textout_free(&j->to);
	tbuf_free(&j->text);
	tbuf_free(&j->sse);
	oa_req_free(&j->rq);
	free(j);
}

/* Takes what the stream has and runs it through the stop strings. 0 or -ENOMEM. */
static int pump(struct job *j)
{
	struct router_take t;
	router_take(j->s, &t);
	int ret = 0;
	if (t.pieces > j->pieces) {
		double now = clock_ms_f();
		if (!j->pieces)
			j->t_first = now;
		j->t_last = now;
		j->pieces = t.pieces;
	}
	if (t.len && !j->to.stopped) {
		ret = textout_push(&j->to, t.text, t.len, &j->text);
		if (j->to.stopped && !j->stopped_cancel) {
			/* The text ends here: the worker need not go on. */
			j->stopped_cancel = true;
			j->stop_pieces = j->pieces;
			router_cancel(j->s);
		}
	}
	free(t.text);
	if (t.final && !j->final) {
		j->final = true;
		j->status = t.status;
		snprintf(j->error, sizeof j->error, "%s", t.error);
		snprintf(j->reason, sizeof j->reason, "%s", t.reason);
		j->prompt_tokens = t.prompt_tokens;
		j->out.cached_tokens = t.cached_tokens;
		j->generated = t.generated_tokens;
		if (!ret && !j->to.stopped)
			ret = textout_flush(&j->to, &j->text);
	}
	return ret;
}

static const char *finish_reason(const struct job *j)
{
	if (j->stopped_cancel || !strcmp(j->reason, "eos") || !strcmp(j->reason, "cancelled"))
		return "stop";
	return "length"; /* length, context */
}

static uint32_t completion_tokens(const struct job *j)
{
	return j->stopped_cancel ? j->stop_pieces : j->generated;
}

static void record(struct job *j)
{
	struct gate_metrics *m = j->g->m;
	double now = clock_ms_f();
	prom_hist_observe(&m->duration, (now - j->t0) / 1e3);
	if (j->pieces) {
		prom_hist_observe(&m->ttft, (j->t_first - j->t0) / 1e3);
		if (j->pieces > 1)
			prom_hist_observe(&m->tpot, (j->t_last - j->t_first) / 1e3 / (j->pieces - 1));
	}
	if (j->final && j->status == 0) {
		prom_inc(&m->prompt_tokens, j->prompt_tokens);
		prom_inc(&m->completion_tokens, completion_tokens(j));
	}
}

/* ---------------------------------------------------------------- streaming */

static int sse_event(struct job *j, char *json)
{
	if (!json)
		return -ENOMEM;
	int ret = tbuf_append(&j->sse, "data: ", 6);
	if (!ret)
		ret = tbuf_append(&j->sse, json, strlen(json));
	if (!ret)
		ret = tbuf_append(&j->sse, "\n\n", 2);
	free(json);
	return ret;
}

/* Turns what the job holds into events: text, then at the end the finish, usage, [DONE]. */
static int sse_fill(struct job *j)
{
	int ret = 0;
	if (!j->first_chunk_sent && j->kind == OA_CHAT)
		ret = sse_event(j, oa_chunk_json(j->kind, &j->out, NULL, true, NULL));
	j->first_chunk_sent = true;
	if (!ret && j->text.len) {
		ret = sse_event(j, oa_chunk_json(j->kind, &j->out, j->text.p, false, NULL));
		j->text.len = 0;
	}
	if (ret || !j->final || j->ended)
		return ret;
	j->ended = true;
	if (j->status) {
		struct oa_err e;
		map_error(j->status, j->error, j->kind == OA_CHAT, &e);
		prom_inc(&j->g->m->stream_errors, 1);
		return sse_event(j, oa_error_json(&e));
	}
	ret = sse_event(j, oa_chunk_json(j->kind, &j->out, NULL, false, finish_reason(j)));
	if (!ret && j->rq.include_usage)
		ret = sse_event(j, oa_usage_chunk_json(j->kind, &j->out, j->prompt_tokens,
						       completion_tokens(j)));
	if (!ret)
		ret = tbuf_append(&j->sse, "data: [DONE]\n\n", 14);
	return ret;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct job *j = cls;
	while (j->sse_pos == j->sse.len) {
		j->sse.len = j->sse_pos = 0;
		if (j->ended)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (pump(j) || sse_fill(j))
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (j->sse.len)
			break;
		/* A comment now and then keeps proxies from closing an idle stream (and finds a
		 * client that left). */
		if (j->keepalive_due) {
			j->keepalive_due = false;
			if (tbuf_append(&j->sse, ": keep-alive\n\n", 14))
				return MHD_CONTENT_READER_END_WITH_ERROR;
			break;
		}
		park(j);
		return 0;
	}
	size_t n = j->sse.len - j->sse_pos < max ? j->sse.len - j->sse_pos : max;
	memcpy(buf, j->sse.p + j->sse_pos, n);
	j->sse_pos += n;
	return (ssize_t)n;
}

static void sse_done(void *cls)
{
	struct job *j = cls;
	record(j);
	job_free(j); /* cancels the worker's request if the client left early */
}

/* ---------------------------------------------------------------- the endpoint */

static void new_id(char *out, size_t len, const char *prefix)
{
	uint8_t r[12];
	if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
		uint64_t t = clock_ns();
		memcpy(r, &t, 8);
		memset(r + 8, 0x5a, 4);
	}
	int at = snprintf(out, len, "%s", prefix);
	for (size_t i = 0; i < sizeof r && at + 2 < (int)len; i++)
		at += snprintf(out + at, len - (size_t)at, "%02x", r[i]);
}

/* The chat prompt from the model's template family (or --chat-template). */
static int chat_prompt(struct gate *g, struct job *j, char **prompt, struct oa_err *e)
{
	char msg[256];
	int ret = router_check_model(g->r, j->rq.model, msg, sizeof msg);
	if (ret) {
		map_error(ret, msg, true, e);
		return ret;
	}
	enum chat_family f = g->chat_override;
	if (f == CHAT_NONE) {
		bool known;
		char *src = router_chat_template(g->r, j->rq.model, &known);
		f = chat_family_detect(src);
		bool had = src != NULL;
		free(src);
		if (f == CHAT_NONE) {
			oa_error(e, 400, "invalid_request_error", "chat_template_unknown", "messages",
				 "model '%s' %s: start kvgate with --chat-template NAME (llama3, "
				 "llama2, chatml, mistral), or use /v1/completions", j->rq.model,
				 had ? "has a chat template of no family kvgate knows"
				     : "ships no chat template");
			return -EINVAL;
		}
	}
	char err[256];
	ret = chat_render(f, j->rq.msgs, j->rq.n_msgs, prompt, err, sizeof err);
	if (ret)
		oa_error(e, ret == -ENOMEM ? 500 : 400, ret == -ENOMEM ? "server_error" :
			 "invalid_request_error", NULL, "messages", "%s", err);
	return ret;
}

/* The job's next step on its connection: parked again while it waits, else its response
 * queued (the job then belongs to the response, or is freed). */
static int advance(struct job *j, void **state, unsigned *status)
{
	struct MHD_Connection *c = j->c;
	bool chat = j->kind == OA_CHAT;
	struct oa_err e;
	if (pump(j)) {
		*state = NULL;
		job_free(j);
		return MHD_NO;
	}
	/* The first piece (or the refusal) decides the status line; a whole response waits for
	 * the end. */
	if ((!j->pieces && !j->final) || (!j->rq.stream && !j->final)) {
		park(j);
		return MHD_YES;
	}
	*state = NULL;
	if (j->final && j->status && (!j->pieces || !j->rq.stream)) {
		map_error(j->status, j->error, chat, &e);
		if (j->pieces && e.http < 500) /* a refusal after output started: the worker failed */
			oa_error(&e, 502, "server_error", "worker_failed", NULL, "%s", j->error);
		record(j);
		job_free(j);
		return send_error(c, &e, status);
	}
	if (j->rq.stream) {
		struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
									   sse_read, j, sse_done);
		if (!r) {
			job_free(j);
			return MHD_NO;
		}
		j->streaming = true;
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
		MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		*status = MHD_HTTP_OK;
		int ret = MHD_queue_response(c, MHD_HTTP_OK, r);
		MHD_destroy_response(r); /* sse_done frees the job with the response */
		return ret;
	}
	record(j);
	char *json = oa_completion_json(j->kind, &j->out, j->text.p ? j->text.p : "",
					finish_reason(j), j->prompt_tokens, completion_tokens(j));
	job_free(j);
	*status = MHD_HTTP_OK;
	return gate_respond_json(c, *status, json);
}

int api_completion(struct gate *g, struct MHD_Connection *c, bool chat, const char *body,
		   size_t len, bool too_big, void **state, unsigned *status)
{
	if (*state)
		return advance(*state, state, status);
	struct oa_err e;
	if (too_big) {
		oa_error(&e, 413, "invalid_request_error", "request_too_large", NULL,
			 "The request body exceeds %zu bytes (--max-body-bytes)", g->max_body);
		return send_error(c, &e, status);
	}
	struct job *j = calloc(1, sizeof *j);
	if (!j)
		return MHD_NO;
	j->g = g;
	j->c = c;
	j->t0 = clock_ms_f();
	j->kind = chat ? OA_CHAT : OA_COMPLETION;
	if (oa_parse(j->kind, body, len, &j->rq, &e)) {
		job_free(j);
		return send_error(c, &e, status);
	}
	char *prompt = NULL;
	if (chat && chat_prompt(g, j, &prompt, &e)) {
		job_free(j);
		return send_error(c, &e, status);
	}
	snprintf(j->model, sizeof j->model, "%s", j->rq.model);
	new_id(j->id, sizeof j->id, chat ? "chatcmpl-" : "cmpl-");
	j->out = (struct oa_out){ .id = j->id, .model = j->model, .created = (long long)time(NULL) };
	textout_init(&j->to, (const char *const *)j->rq.stop, j->rq.n_stop);
	struct router_gen gen = {
		.model = j->rq.model, .prompt = chat ? prompt : j->rq.prompt, .ids = j->rq.ids,
		.n_ids = j->rq.n_ids, .temp = j->rq.temperature, .top_p = j->rq.top_p,
		.has_seed = j->rq.has_seed, .seed = j->rq.seed, .cache_salt = j->rq.cache_salt,
		/* The API's default: 16 for completions, up to the context for chat. */
		.max_tokens = j->rq.has_max_tokens ? j->rq.max_tokens :
			      chat ? g->chat_max_tokens : 16,
	};
	char msg[256];
	int ret = router_submit(g->r, &gen, on_stream, j, &j->s, msg, sizeof msg);
	free(prompt);
	if (ret) {
		map_error(ret, msg, chat, &e);
		job_free(j);
		return send_error(c, &e, status);
	}
	*state = j;
	return advance(j, state, status);
}

void api_job_abort(void *state)
{
	job_free(state);
}
