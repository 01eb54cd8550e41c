/* gate_http — kvgate's HTTP/1.1 server on libmicrohttpd and its one event loop (docs/design.md
 * §6): the daemon runs in the caller's thread (epoll, no thread of its own), polled together
 * with the router's ZeroMQ sockets, so that a token goes from the worker's socket to the
 * client's in one thread; a completion waiting for tokens suspends its connection. Request
 * bodies are gathered up to --max-body-bytes (more is read and dropped, then answered 413);
 * the routes go to gate_api.c and /metrics to metrics/prom_http.c.
 *
 * Ownership: gate_http_start allocates the server; gate_http_stop lets the connections that
 * the closed router ended send their last events, stops the daemon and frees it. struct gate
 * is borrowed. */
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
/* One turn of the loop: waits up to max_ms for the HTTP connections or the workers, then
 * serves both. 0, or -errno when the poll fails (EINTR: a signal; call again). */
int gate_http_step(struct gate_http *h, int max_ms);
void gate_http_stop(struct gate_http *h);

#endif
