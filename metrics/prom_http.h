/* prom_http — serves /metrics over HTTP/1.1 with libmicrohttpd (no HTTP parsing of our own),
 * for kvstored (`metrics_listen`) and `kvworker serve` (`--metrics`); kvgate serves the same
 * page from its own daemon through prom_http_respond(). docs/design.md §6.
 *
 * A scrape runs the owner's collect callback on libmicrohttpd's thread: the callback must take
 * whatever lock guards the figures it reads and write them with prom.h. Addresses are loopback
 * only unless the caller allows another (the metrics say how busy the host is).
 *
 * Ownership: prom_http_start allocates the server and starts its thread; prom_http_stop joins it
 * and frees it (NULL is a no-op). The callback and its context are borrowed until then. */
#ifndef FREEKV_PROM_HTTP_H
#define FREEKV_PROM_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "prom.h"

struct MHD_Connection;
struct prom_http;

typedef void (*prom_collect_fn)(void *ctx, struct prom_buf *b);

/* "HOST:PORT" or "[V6]:PORT" (numeric, or localhost) into a socket address. *loopback tells
 * whether it is 127.0.0.0/8 or ::1. 0 or -EINVAL with err set. */
int http_listen_parse(const char *s, struct sockaddr_storage *ss, socklen_t *len, bool *loopback,
		      char *err, size_t errlen);

/* Listens on `listen` (port 0: any free port, see prom_http_port); a non-loopback address only
 * with any_addr. 0 or -errno with err set. */
int prom_http_start(const char *listen, bool any_addr, prom_collect_fn fn, void *ctx,
		    struct prom_http **out, char *err, size_t errlen);
uint16_t prom_http_port(const struct prom_http *s);
void prom_http_stop(struct prom_http *s);

/* Queues the metrics page (200, text/plain; version=0.0.4) on a connection of the caller's
 * daemon; 500 when the page could not be built. Returns MHD_YES or MHD_NO as
 * MHD_queue_response does. */
int prom_http_respond(struct MHD_Connection *c, prom_collect_fn fn, void *ctx);

#endif
