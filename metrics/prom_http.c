/* prom_http — see prom_http.h. */
#include "prom_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct prom_http {
	struct MHD_Daemon *d;
	prom_collect_fn fn;
	void *ctx;
	uint16_t port;
};

int http_listen_parse(const char *s, struct sockaddr_storage *ss, socklen_t *len, bool *loopback,
		      char *err, size_t errlen)
{
	char host[256];
	const char *colon = strrchr(s, ':');
	if (!colon || !colon[1] || (size_t)(colon - s) >= sizeof host) {
		snprintf(err, errlen, "'%s': need HOST:PORT", s);
		return -EINVAL;
	}
	const char *h = s;
	size_t hl = (size_t)(colon - s);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	memcpy(host, h, hl);
	host[hl] = '\0';
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port < 0 || port > 65535) {
		snprintf(err, errlen, "'%s': bad port", s);
		return -EINVAL;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV }, *res = NULL;
	if (strcmp(host, "localhost"))
		hints.ai_flags |= AI_NUMERICHOST;
	int r = getaddrinfo(host, colon + 1, &hints, &res);
	if (r || !res) {
		snprintf(err, errlen, "'%s': %s", s, r ? gai_strerror(r) : "no address");
		return -EINVAL;
	}
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		*loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
	} else {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
		*loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
	}
	return 0;
}

int prom_http_respond(struct MHD_Connection *c, prom_collect_fn fn, void *ctx)
{
	struct prom_buf b;
	prom_buf_init(&b);
	fn(ctx, &b);
	struct MHD_Response *r;
	unsigned status = MHD_HTTP_OK;
	if (b.err) {
		static const char msg[] = "cannot build the metrics page: out of memory\n";
		status = MHD_HTTP_INTERNAL_SERVER_ERROR;
		r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg,
						    MHD_RESPMEM_PERSISTENT);
	} else {
		r = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
		b.p = NULL; /* the response owns it now */
	}
	prom_buf_free(&b);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				status == MHD_HTTP_OK ? PROM_CONTENT_TYPE : "text/plain");
	int ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static int plain(struct MHD_Connection *c, unsigned status, const char *msg)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(msg), (void *)msg,
								 MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	int ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	(void)version;
	(void)upload_data;
	struct prom_http *s = cls;
	if (!*con_cls) { /* first call: headers only; answer once the (ignored) body is read */
		*con_cls = s;
		return MHD_YES;
	}
	if (*upload_data_size) {
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (strcmp(url, "/metrics"))
		return (enum MHD_Result)plain(c, MHD_HTTP_NOT_FOUND, "not found: try /metrics\n");
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return (enum MHD_Result)plain(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET /metrics\n");
	return (enum MHD_Result)prom_http_respond(c, s->fn, s->ctx);
}

int prom_http_start(const char *listen, bool any_addr, prom_collect_fn fn, void *ctx,
		    struct prom_http **out, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	bool lo;
	int ret = http_listen_parse(listen, &ss, &sl, &lo, err, errlen);
	if (ret)
		return ret;
	if (!lo && !any_addr) {
		snprintf(err, errlen, "%s is not a loopback address", listen);
		return -EPERM;
	}
	struct prom_http *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->fn = fn;
	s->ctx = ctx;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
			 (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
	s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
				MHD_OPTION_END);
	if (!s->d) {
		int e = errno ? errno : EADDRINUSE;
		snprintf(err, errlen, "cannot serve metrics on %s: %s", listen, strerror(e));
		free(s);
		return -e;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di ? di->port : 0;
	*out = s;
	return 0;
}

uint16_t prom_http_port(const struct prom_http *s)
{
	return s ? s->port : 0;
}

void prom_http_stop(struct prom_http *s)
{
	if (!s)
		return;
	MHD_stop_daemon(s->d);
	free(s);
}
