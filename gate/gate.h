/* gate — what kvgate's HTTP side shares (docs/design.md §6): the settings from the command
 * line and the handles the endpoints use. One struct gate, owned by kvgate.c's main and passed
 * to gate_http/gate_api explicitly; the router and the metrics are borrowed from it. */
#ifndef FREEKV_GATE_H
#define FREEKV_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "gate_metrics.h"
#include "router.h"

struct MHD_Connection;
struct job;

struct gate {
	struct router *r;
	struct gate_metrics *m;
	enum chat_family chat_override;	/* --chat-template; CHAT_NONE: from the model */
	uint32_t chat_max_tokens;	/* chat without max_tokens: up to this many */
	size_t max_body;		/* --max-body-bytes */
	int keepalive_ms;		/* SSE comment while a stream waits this long */
	long long t_start;		/* Unix seconds, the models' `created` */
	struct job *parked;		/* completions waiting for the router (gate_api.c) */
};

/* Queues a JSON body (taken: freed here) with status; MHD_YES/MHD_NO. */
int gate_respond_json(struct MHD_Connection *c, unsigned status, char *json);

/* gate_api.c: the endpoints. Each queues its response and returns MHD_YES/MHD_NO; *status
 * gets the HTTP status sent (for the metrics). */
int api_health(struct gate *g, struct MHD_Connection *c, unsigned *status);
int api_models(struct gate *g, struct MHD_Connection *c, unsigned *status);
/* A completion step: *state is NULL on the first call; while it stays set the connection is
 * suspended and the access handler is called again when it is resumed (*status 0 until a
 * response is queued). A connection that ends with *state set hands it to api_job_abort. */
int api_completion(struct gate *g, struct MHD_Connection *c, bool chat, const char *body,
		   size_t len, bool too_big, void **state, unsigned *status);
void api_job_abort(void *state);
/* Sends the keep-alive comments due at now (ms); returns ms until the next may be due. */
int api_tick(struct gate *g, double now);
/* Resumes every parked connection (before the HTTP daemon stops). */
void api_unpark_all(struct gate *g);

#endif
