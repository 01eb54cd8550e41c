/* gate_http — kvgate's HTTP/1.1 server on libmicrohttpd (docs/design.md §6): one thread per
 * connection (a streamed completion blocks its thread while it waits for tokens, and no other),
 * request bodies gathered up to --max-body-bytes (more is read and dropped, then answered 413),
 * and dispatch of the routes to gate_api.c and /metrics to metrics/prom_http.c.
 *
 * Ownership: gate_http_start allocates the server; gate_http_stop stops the daemon (joining
 * every connection thread) and frees it. struct gate is borrowed. */
#ifndef FREEKV_GATE_HTTP_H
#define FREEKV_GATE_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gate.h"

struct gate_http;

/* 0 or -errno with err set; a non-loopback address only with any_addr. */
int gate_http_start(struct gate *g, const char *listen, bool any_addr, unsigned max_conn,
		    struct gate_http **out, char *err, size_t errlen);
uint16_t gate_http_port(const struct gate_http *h);
void gate_http_stop(struct gate_http *h);

#endif
