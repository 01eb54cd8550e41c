/* router — kvgate's side of proto/worker.proto: one ZeroMQ DEALER per `kvworker serve`, and
 * the streams that carry a request's pieces back to the HTTP side (docs/design.md §6). The
 * router has no thread of its own: kvgate's event loop polls its sockets (router_pollitems)
 * beside the HTTP server's and calls router_run, which reads the replies, sends what is
 * waiting and probes, and router_flush at the end of its turn; a stream's notify callback
 * says that it has something new to take.
 *
 * Routing: a request goes to the live worker serving its model with the fewest outstanding
 * tokens (the prompt's estimate and the tokens still to sample of every request in flight
 * there; ties go round-robin). Liveness: every worker is sent a Status every probe_ms; its
 * reply marks it live and says its model and chat template. A worker is taken out when its
 * connection drops (a ZeroMQ socket monitor reports the disconnect as the process dies) or a
 * Status stays unanswered for dead_ms, and put back when a Status is answered again. The
 * requests in flight on a worker that was taken out end with -EHOSTDOWN: the gateway does not
 * resume them elsewhere (their sequences are dropped by the worker, not kept).
 *
 * Threads: every function may be called from any thread (one mutex); router_run and
 * router_flush from the loop's only. What router_submit, router_cancel and router_release leave
 * to send goes out at the loop's router_flush or next router_run (kvgate calls them from the
 * loop itself, so at the end of the same turn). notify runs inside router_run (and
 * router_close) with that mutex held: it must not call the router; it is never called for a
 * released stream.
 *
 * Ownership: router_submit gives the caller a stream that it must hand back with
 * router_release (which cancels it on the worker if it has not finished); the router frees it
 * once both sides are done. router_close ends every stream with -ESHUTDOWN and refuses new
 * ones (callers then release theirs); router_stop closes and frees. */
#ifndef FREEKV_ROUTER_H
#define FREEKV_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

struct router;
struct router_stream;

struct router_opts {
	const char *const *endpoints;	/* borrowed for the router's lifetime */
	int n_endpoints;
	int probe_ms;			/* Status period */
	int dead_ms;			/* unanswered Status for this long: taken out */
	int max_inflight;		/* requests in flight over all workers; more: -EBUSY */
};

/* What a request asks of a worker. */
struct router_gen {
	const char *model;		/* the model id (router_model_id of the worker's path) */
	const char *prompt;		/* or ids */
	const int32_t *ids;
	int n_ids;
	uint32_t max_tokens;
	float temp, top_p;
	bool has_seed;
	uint64_t seed;
	const char *cache_salt;		/* prefix-sharing namespace (NULL: the default one) */
};

/* What a stream holds when router_take returns. */
struct router_take {
	char *text;			/* bytes of the pieces since the last take (malloc'd or NULL) */
	size_t len;
	uint32_t pieces;		/* pieces received so far, in all */
	bool final;			/* the request ended (below: how) */
	int status;			/* 0 or -errno from the worker or the router */
	char error[256];
	char reason[16];		/* Done.reason: eos, length, context, cancelled, shutdown */
	uint32_t prompt_tokens, generated_tokens;
	uint32_t cached_tokens;		/* of prompt_tokens, found in kvstored's pool */
	int worker;			/* index of the worker that ran it */
};

/* A snapshot of one worker, for /health, /v1/models and /metrics. */
struct router_worker_info {
	const char *endpoint;		/* borrowed from the options */
	bool alive;
	char model[128];		/* model id; empty before the first Status */
	char template_family[16];	/* filled by the caller; the router stores the source */
	char why_down[128];
	int64_t outstanding;
	int inflight;
	uint64_t requests, failures, up_transitions;
};

int router_start(const struct router_opts *o, struct router **out, char *err, size_t errlen);
void router_close(struct router *r);
void router_stop(struct router *r);

/* The items kvgate's loop polls for the router: one per worker (it NULL: just the count;
 * -ENOSPC above max). They stay valid until router_stop. */
int router_pollitems(struct router *r, zmq_pollitem_t *it, int max);
/* Handles what those items, as polled (revents; NULL: all of them), have ready, without
 * blocking; every tick also the socket monitors and the Status probes; sends what waits.
 * Returns the longest the loop may wait before calling it again, in ms. */
int router_run(struct router *r, const zmq_pollitem_t *it);
/* Sends what router_submit, router_cancel and router_release left to send (the loop calls
 * it at the end of each turn). */
void router_flush(struct router *r);

/* 0 with *s, or: -EHOSTUNREACH (no live worker serves that model; msg says which answer),
 * -ENOENT (no worker serves that model), -EBUSY (max_inflight), -ENOMEM. notify(arg) is
 * called whenever pieces or the end arrive (see Threads). */
int router_submit(struct router *r, const struct router_gen *g, void (*notify)(void *),
		  void *arg, struct router_stream **s, char *msg, size_t msglen);
/* What router_submit would say about model now: 0, -ENOENT, -EHOSTUNREACH, -ESHUTDOWN. */
int router_check_model(struct router *r, const char *model, char *msg, size_t msglen);
/* Moves what arrived since the last take into *t, without waiting (t->text, NULL when nothing
 * came, is the caller's to free). */
void router_take(struct router_stream *s, struct router_take *t);
/* Stops generation early (a stop string matched): the worker is sent a Cancel. */
void router_cancel(struct router_stream *s);
/* The caller is done with s (cancelled on the worker if it still runs). */
void router_release(struct router_stream *s);

/* Worker snapshots (up to max); returns the number of workers. */
int router_workers(struct router *r, struct router_worker_info *w, int max);
/* The chat template source of a live worker serving model (malloc'd copy, NULL when none is
 * known); *known says whether any worker serves model. */
char *router_chat_template(struct router *r, const char *model, bool *known);
/* The model id kvgate shows for a worker's model path: its file name without .gguf, or the
 * folder's name. */
void router_model_id(const char *path, char *out, size_t outlen);

#endif
