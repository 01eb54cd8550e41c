/* gate_http — see gate_http.h. */
#include "gate_http.h"

#include <errno.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "clock.h"
#include "openai.h"
#include "prom_http.h"
#include "textout.h"

struct gate_http {
	struct MHD_Daemon *d;
	struct gate *g;
	uint16_t port;
	zmq_pollitem_t *it;		/* [0] the daemon's epoll fd, then the workers' sockets */
	int n_it;
	double next_tick;		/* when api_tick is due */
	int tick;			/* what router_run asked for */
};

/* One request on a connection: its route, its body, and its completion while it waits. */
struct conn {
	enum gm_path path;
	bool post, too_big;
	struct tbuf body;
	void *job;
};

int gate_respond_json(struct MHD_Connection *c, unsigned status, char *json)
{
	if (!json)
		return MHD_NO;
	size_t n = strlen(json);
	/* A trailing newline, as curl users expect. */
	char *p = realloc(json, n + 2);
	if (!p) {
		free(json);
		return MHD_NO;
	}
	p[n] = '\n';
	p[n + 1] = '\0';
	struct MHD_Response *r = MHD_create_response_from_buffer(n + 1, p, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(p);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	if (status == MHD_HTTP_TOO_MANY_REQUESTS || status == MHD_HTTP_SERVICE_UNAVAILABLE)
		MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
	int ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static int error_json(struct MHD_Connection *c, unsigned status, const char *type,
		      const char *code, const char *msg, const char *allow)
{
	struct oa_err e;
	oa_error(&e, (int)status, type, code, NULL, "%s", msg);
	char *j = oa_error_json(&e);
	if (!allow)
		return gate_respond_json(c, status, j);
	struct MHD_Response *r = j ? MHD_create_response_from_buffer(strlen(j), j,
								     MHD_RESPMEM_MUST_FREE) : NULL;
	if (!r) {
		free(j);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	int ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum gm_path route(const char *url)
{
	if (!strcmp(url, "/v1/completions"))
		return GM_COMPLETIONS;
	if (!strcmp(url, "/v1/chat/completions"))
		return GM_CHAT;
	if (!strcmp(url, "/v1/models"))
		return GM_MODELS;
	if (!strcmp(url, "/health"))
		return GM_HEALTH;
	if (!strcmp(url, "/metrics"))
		return GM_METRICS;
	return GM_OTHER;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	(void)version;
	struct gate *g = cls;
	struct conn *k = *con_cls;
	if (!k) {
		if (!(k = calloc(1, sizeof *k)))
			return MHD_NO;
		k->path = route(url);
		k->post = !strcmp(method, MHD_HTTP_METHOD_POST);
		*con_cls = k;
		return MHD_YES;
	}
	if (*upload_data_size) {
		/* Past the limit the rest is read and dropped, so that the client, still
		 * sending, gets its 413 instead of a reset connection. */
		if (!k->too_big && k->body.len + *upload_data_size > g->max_body)
			k->too_big = true;
		if (!k->too_big && tbuf_append(&k->body, upload_data, *upload_data_size))
			return MHD_NO;
		*upload_data_size = 0;
		return MHD_YES;
	}
	unsigned status = 0;
	int ret;
	bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
	switch (k->path) {
	case GM_COMPLETIONS:
	case GM_CHAT:
		if (!k->post) {
			status = MHD_HTTP_METHOD_NOT_ALLOWED;
			ret = error_json(c, status, "invalid_request_error", NULL,
					 "use POST for this endpoint", "POST");
			break;
		}
		ret = api_completion(g, c, k->path == GM_CHAT, k->body.p ? k->body.p : "",
				     k->body.len, k->too_big, &k->job, &status);
		if (k->job) /* parked: answered later */
			return (enum MHD_Result)ret;
		break;
	case GM_MODELS:
	case GM_HEALTH:
	case GM_METRICS:
		if (!get) {
			status = MHD_HTTP_METHOD_NOT_ALLOWED;
			ret = error_json(c, status, "invalid_request_error", NULL,
					 "use GET for this endpoint", "GET, HEAD");
			break;
		}
		if (k->path == GM_MODELS) {
			ret = api_models(g, c, &status);
		} else if (k->path == GM_HEALTH) {
			ret = api_health(g, c, &status);
		} else {
			status = MHD_HTTP_OK;
			ret = prom_http_respond(c, gm_collect, g->m);
		}
		break;
	default: {
		char msg[300];
		snprintf(msg, sizeof msg, "Invalid URL (%s %.200s)", method, url);
		status = MHD_HTTP_NOT_FOUND;
		ret = error_json(c, status, "invalid_request_error", NULL, msg, NULL);
		break;
	}
	}
	gm_http(g->m, k->path, status);
	return (enum MHD_Result)ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)cls;
	(void)c;
	(void)toe;
	struct conn *k = *con_cls;
	if (!k)
		return;
	api_job_abort(k->job);
	tbuf_free(&k->body);
	free(k);
	*con_cls = NULL;
}

int gate_http_start(struct gate *g, const char *listen, bool any_addr, unsigned max_conn,
		    struct gate_http **out, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	bool lo;
	int ret = http_listen_parse(listen, &ss, &sl, &lo, err, errlen);
	if (ret)
		return ret;
	if (!lo && !any_addr) {
		snprintf(err, errlen, "--listen %s is not a loopback address (add --allow-remote "
			 "to serve other hosts)", listen);
		return -EPERM;
	}
	struct gate_http *h = calloc(1, sizeof *h);
	if (!h)
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	h->g = g;
	int n_router = router_pollitems(g->r, NULL, 0);
	h->n_it = 1 + n_router;
	if (!(h->it = calloc((size_t)h->n_it, sizeof *h->it))) {
		free(h);
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	}
	router_pollitems(g->r, h->it + 1, n_router);
	/* No thread of MHD's own: gate_http_step runs it (epoll) beside the router. */
	unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
			 (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
	h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, g,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_CONNECTION_LIMIT, max_conn,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
				MHD_OPTION_END);
	if (!h->d) {
		int e = errno ? errno : EADDRINUSE;
		snprintf(err, errlen, "cannot listen on %s: %s", listen, strerror(e));
		free(h->it);
		free(h);
		return -e;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = di ? di->port : 0;
	di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
	if (!di || di->epoll_fd < 0) {
		snprintf(err, errlen, "libmicrohttpd gave no epoll descriptor");
		MHD_stop_daemon(h->d);
		free(h->it);
		free(h);
		return -ENOTSUP;
	}
	h->it[0] = (zmq_pollitem_t){ .fd = di->epoll_fd, .events = ZMQ_POLLIN };
	*out = h;
	return 0;
}

int gate_http_step(struct gate_http *h, int max_ms)
{
	int wait = max_ms;
	if (h->tick < wait)
		wait = h->tick;
	double now = clock_ms_f();
	if (h->next_tick - now < wait)
		wait = h->next_tick > now ? (int)(h->next_tick - now) : 0;
	MHD_UNSIGNED_LONG_LONG mt;
	if (MHD_get_timeout(h->d, &mt) == MHD_YES && mt < (MHD_UNSIGNED_LONG_LONG)wait)
		wait = (int)mt;
	int ret = zmq_poll(h->it, h->n_it, wait);
	if (ret < 0 && errno != EINTR)
		return -errno;
	/* Pieces first: the connections they resume are served by the MHD_run after. */
	h->tick = router_run(h->g->r, ret > 0 ? h->it + 1 : NULL);
	MHD_run(h->d);
	now = clock_ms_f();
	if (now >= h->next_tick)
		h->next_tick = now + api_tick(h->g, now);
	/* What the handlers submitted goes out now, not after the next wait. */
	router_flush(h->g->r);
	return ret < 0 ? -EINTR : 0;
}

uint16_t gate_http_port(const struct gate_http *h)
{
	return h->port;
}

void gate_http_stop(struct gate_http *h)
{
	if (!h)
		return;
	/* The router is closed: the parked completions were resumed with its error. Let them
	 * send it (a few turns), then resume what is left, as MHD requires before it stops. */
	for (int i = 0; i < 20 && h->g->parked; i++)
		gate_http_step(h, 10);
	gate_http_step(h, 0);
	api_unpark_all(h->g);
	MHD_stop_daemon(h->d);
	free(h->it);
	free(h);
}
