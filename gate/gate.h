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

struct gate {
	struct router *r;
	struct gate_metrics *m;
	enum chat_family chat_override;	/* --chat-template; CHAT_NONE: from the model */
	uint32_t chat_max_tokens;	/* chat without max_tokens: up to this many */
	size_t max_body;		/* --max-body-bytes */
	int keepalive_ms;		/* SSE comment while a stream waits this long */
	long long t_start;		/* Unix seconds, the models' `created` */
};

/* Queues a JSON body (taken: freed here) with status; MHD_YES/MHD_NO. */
int gate_respond_json(struct MHD_Connection *c, unsigned status, char *json);

/* gate_api.c: the endpoints. Each queues its response and returns MHD_YES/MHD_NO; *status
 * gets the HTTP status sent (for the metrics). */
int api_health(struct gate *g, struct MHD_Connection *c, unsigned *status);
int api_models(struct gate *g, struct MHD_Connection *c, unsigned *status);
int api_completion(struct gate *g, struct MHD_Connection *c, bool chat, const char *body,
		   size_t len, bool too_big, unsigned *status);

#endif
