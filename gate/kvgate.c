/* kvgate — the OpenAI-compatible HTTP front of a host's `kvworker serve` processes
 * (docs/design.md §6). main() reads the flags (or a config file of the same keys), starts the
 * router (router.c: one ZeroMQ DEALER per worker, least outstanding tokens, liveness), then the
 * HTTP server (gate_http.c, libmicrohttpd), tells systemd READY=1, and waits for SIGTERM or
 * SIGINT; it then says STOPPING=1, ends every request in flight with an error, stops the HTTP
 * server (joining its threads) and the router, in reverse order of their start.
 *
 * Exit codes: 0 after a signal, 1 when it cannot start, 2 on a usage error. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conffile.h"
#include "clock.h"
#include "gate.h"
#include "gate_http.h"
#include "sdnotify.h"
#include "version.h"
#include "log.h"

#define DEFAULT_LISTEN "127.0.0.1:8000"
#define MAX_ENDPOINTS 64

struct opts {
	const char *listen, *config, *chat_template;
	const char *workers[MAX_ENDPOINTS];
	int n_workers;
	bool allow_remote;
	enum log_level log_level;	/* --log-level (default info) */
	long max_body, max_inflight, max_conn, probe_ms, dead_ms, chat_max_tokens, keepalive_s;
};

static volatile sig_atomic_t g_stop;

static void on_stop(int sig)
{
	(void)sig;
	g_stop = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvgate --worker ENDPOINT [--worker ENDPOINT ...] [--listen HOST:PORT]\n"
		"              [--config FILE] [options]\n"
		"  serves the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models),\n"
		"  /health and /metrics over HTTP, in front of `kvworker serve` processes\n"
		"      --worker ENDPOINT      a kvworker serve endpoint (ipc://PATH or tcp://...);\n"
		"                             repeat for each worker\n"
		"      --listen HOST:PORT     HTTP address (default %s); loopback only\n"
		"                             unless --allow-remote\n"
		"      --allow-remote         allow --listen on an address other hosts can reach\n"
		"      --chat-template NAME   llama3, llama2, chatml (qwen) or mistral: overrides\n"
		"                             the family recognised from the model's template\n"
		"      --config FILE          `key = value` lines, key = a long flag without\n"
		"                             dashes (`worker` may repeat); flags win\n"
		"      --max-body-bytes N     larger request bodies get 413 (default 1048576)\n"
		"      --max-inflight N       requests in flight at most; more get 429 (default 256)\n"
		"      --max-connections N    HTTP connections at most (default 512)\n"
		"      --chat-max-tokens N    chat completions without max_tokens stop after N\n"
		"                             tokens (default: the worker's context)\n"
		"      --probe-ms N           Status probe period per worker (default 1000)\n"
		"      --worker-timeout-ms N  a worker silent this long is taken out (default 10000)\n"
		"      --keepalive-s N        SSE keep-alive comment period (default 15)\n"
		"      --log-level L          error, warn, info or debug (default info)\n"
		"  -h, --help                 this text\n"
		"      --version              the version, commit and build\n", DEFAULT_LISTEN);
}

enum { F_WORKER, F_LISTEN, F_CHAT, F_CONFIG, F_MAXBODY, F_MAXINFLIGHT, F_MAXCONN, F_CHATMAX,
       F_PROBE, F_DEAD, F_KEEPALIVE, F_ALLOW, F_LOGLEVEL };

/* The flag table: both the command line and the config file go through it. */
static const struct {
	const char *flag;
	long lo, hi;		/* bounds of a numeric flag (hi 0: a string; -1: no value) */
} flags[] = {
	[F_WORKER] = { "--worker", 0, 0 },
	[F_LISTEN] = { "--listen", 0, 0 },
	[F_CHAT] = { "--chat-template", 0, 0 },
	[F_CONFIG] = { "--config", 0, 0 },
	[F_MAXBODY] = { "--max-body-bytes", 64, 1L << 30 },
	[F_MAXINFLIGHT] = { "--max-inflight", 1, 1 << 20 },
	[F_MAXCONN] = { "--max-connections", 1, 1 << 16 },
	[F_CHATMAX] = { "--chat-max-tokens", 1, 1 << 30 },
	[F_PROBE] = { "--probe-ms", 10, 600000 },
	[F_DEAD] = { "--worker-timeout-ms", 100, 3600000 },
	[F_KEEPALIVE] = { "--keepalive-s", 1, 3600 },
	[F_ALLOW] = { "--allow-remote", 0, -1 },
	[F_LOGLEVEL] = { "--log-level", 0, 0 },
};

/* getopt_long's table: flags[] (val 0x100 + index), --help, --version. */
enum { O_BASE = 0x100, O_HELP = 'h', O_VERSION = 0x200 };
static void gate_options(struct option *out)
{
	size_t n = 0;
	for (size_t f = 0; f < sizeof flags / sizeof *flags; f++)
		out[n++] = (struct option){ flags[f].flag + 2,
					    flags[f].hi < 0 ? no_argument : required_argument, NULL,
					    O_BASE + (int)f };
	out[n++] = (struct option){ "help", no_argument, NULL, O_HELP };
	out[n++] = (struct option){ "version", no_argument, NULL, O_VERSION };
	out[n] = (struct option){ 0 };
}

/* What getopt_long returned for flags[f] (value v): 0 taken, -1 after printing why. */
static int apply(struct opts *o, size_t f, const char *v, const char *where)
{
	long l = 0;
	if (flags[f].hi > 0) {
		char *end;
		errno = 0;
		l = strtol(v, &end, 10);
		if (errno || *end || !*v || l < flags[f].lo || l > flags[f].hi) {
			fprintf(stderr, "kvgate: %sinvalid value '%s' for %s (%ld..%ld)\n", where, v,
				flags[f].flag, flags[f].lo, flags[f].hi);
			return -1;
		}
	}
	switch (f) {
	case F_WORKER:
		if (o->n_workers == MAX_ENDPOINTS) {
			fprintf(stderr, "kvgate: at most %d workers\n", MAX_ENDPOINTS);
			return -1;
		}
		o->workers[o->n_workers++] = v;
		break;
	case F_LISTEN: o->listen = v; break;
	case F_CHAT: o->chat_template = v; break;
	case F_CONFIG: o->config = v; break;
	case F_MAXBODY: o->max_body = l; break;
	case F_MAXINFLIGHT: o->max_inflight = l; break;
	case F_MAXCONN: o->max_conn = l; break;
	case F_CHATMAX: o->chat_max_tokens = l; break;
	case F_PROBE: o->probe_ms = l; break;
	case F_DEAD: o->dead_ms = l; break;
	case F_KEEPALIVE: o->keepalive_s = l; break;
	case F_ALLOW: o->allow_remote = true; break;
	case F_LOGLEVEL:
		if (log_parse_level(v, &o->log_level)) {
			fprintf(stderr, "kvgate: %s--log-level: need error, warn, info or debug\n",
				where);
			return -1;
		}
		break;
	}
	return 0;
}

/* Config file: `key = value` is `--key value` (`allow-remote = true`; common/conffile.h). The
 * strings stay in *cf (freed by main). 0 or -1 after printing why. */
static int load_config(struct opts *o, const char *path, struct conffile *cf)
{
	char err[512];
	if (conffile_read(path, cf, err, sizeof err)) {
		fprintf(stderr, "kvgate: config %s\n", err);
		return -1;
	}
	for (int k = 0; k < cf->n; k++) {
		char where[300];
		const char *key = cf->argv[2 * k] + 2, *val = cf->argv[2 * k + 1];
		snprintf(where, sizeof where, "%s:%d: ", path, cf->line[k]);
		if (!strcmp(key, "allow-remote")) {
			if (strcmp(val, "true") && strcmp(val, "false")) {
				fprintf(stderr, "kvgate: %sallow-remote = true or false\n", where);
				return -1;
			}
			o->allow_remote = !strcmp(val, "true");
			continue;
		}
		struct option opts[32];
		gate_options(opts);
		const char *v;
		int c = conffile_getopt(cf, k, opts, &v);
		if (c < 0) {
			fprintf(stderr, "kvgate: %s'%s' takes no value here\n", where, key);
			return -1;
		}
		if (c < O_BASE || c >= O_BASE + (int)(sizeof flags / sizeof *flags)) {
			fprintf(stderr, "kvgate: %sunknown key '%s'\n", where, key);
			return -1;
		}
		if (apply(o, (size_t)(c - O_BASE), v, where))
			return -1;
	}
	return 0;
}

/* 0 parsed, 1 help shown, 2 usage error. */
static int parse(int argc, char **argv, struct opts *o, struct conffile *cf)
{
	*o = (struct opts){ .max_body = 1 << 20, .max_inflight = 256, .max_conn = 512,
			    .probe_ms = 1000, .dead_ms = 10000, .keepalive_s = 15,
			    .log_level = LOG_INFO };
	struct option opts[32];
	gate_options(opts);
	optind = 0;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		if (c == O_HELP) {
			usage(stdout);
			return 1;
		}
		if (c == O_VERSION) {
			fkv_version_print(stdout, "kvgate");
			return 1;
		}
		if (c == O_BASE + F_CONFIG)
			o->config = optarg;
	}
	if (o->config && load_config(o, o->config, cf))
		return 2;
	/* Workers on the command line replace the file's. */
	bool cli_workers = false;
	optind = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		if (c == '?' || c == ':') {
			const char *a = argv[optind - 1];
			fprintf(stderr, "kvgate: %s '%s'\n", c == ':' ? "a value is needed for"
				: "unknown option", a);
			usage(stderr);
			return 2;
		}
		if (c == O_BASE + F_WORKER && !cli_workers) {
			o->n_workers = 0;
			cli_workers = true;
		}
		if (apply(o, (size_t)(c - O_BASE), optarg, "")) {
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvgate: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!o->n_workers) {
		fprintf(stderr, "kvgate: need at least one --worker ENDPOINT\n");
		usage(stderr);
		return 2;
	}
	if (!o->listen)
		o->listen = DEFAULT_LISTEN;
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct conffile cf = { 0 };
	int rc = 1, ret;
	int pr = parse(argc, argv, &o, &cf);
	struct gate g = { 0 };
	struct gate_metrics gm;
	struct router *r = NULL;
	struct gate_http *h = NULL;
	struct sdn sdn = { .fd = -1 };
	bool gm_ok = false;
	char err[512];
	if (pr) {
		rc = pr == 1 ? 0 : 2;
		goto out;
	}
	log_init("kvgate", o.log_level);
	if (o.chat_template && chat_family_parse(o.chat_template, &g.chat_override)) {
		fprintf(stderr, "kvgate: --chat-template %s: unknown (llama3, llama2, chatml, qwen, "
			"mistral)\n", o.chat_template);
		rc = 2;
		goto out;
	}
	if ((ret = sdn_init(&sdn))) {
		log_error("NOTIFY_SOCKET: %s", strerror(-ret));
		goto out;
	}
	struct sigaction sa = { .sa_handler = on_stop };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct router_opts ro = { .endpoints = o.workers, .n_endpoints = o.n_workers,
				  .probe_ms = (int)o.probe_ms, .dead_ms = (int)o.dead_ms,
				  .max_inflight = (int)o.max_inflight };
	if ((ret = router_start(&ro, &r, err, sizeof err))) {
		log_error("%s", err);
		goto out;
	}
	if ((ret = gm_init(&gm, r))) {
		log_error("metrics: %s", strerror(-ret));
		goto out;
	}
	gm_ok = true;
	g = (struct gate){ .r = r, .m = &gm, .chat_override = g.chat_override,
			   .chat_max_tokens = o.chat_max_tokens ? (uint32_t)o.chat_max_tokens : 1u << 30,
			   .max_body = (size_t)o.max_body, .keepalive_ms = (int)o.keepalive_s * 1000,
			   .t_start = (long long)time(NULL) };
	if ((ret = gate_http_start(&g, o.listen, o.allow_remote, (unsigned)o.max_conn, &h, err,
				   sizeof err))) {
		log_error("%s", err);
		goto out;
	}
	log_info("listening on %s (port %u), %d worker%s, chat template %s",
		o.listen, gate_http_port(h), o.n_workers, o.n_workers == 1 ? "" : "s",
		g.chat_override ? chat_family_name(g.chat_override) : "from the model");
	sdn_send(&sdn, "READY=1\nSTATUS=serving on %s", o.listen);
	uint64_t wd_ms = sdn_watchdog_ms(&sdn);
	double last_wd = clock_ms_f(), last_status = 0;
	while (!g_stop) {
		if ((ret = gate_http_step(h, 100)) && ret != -EINTR) {
			log_error("event loop: %s", strerror(-ret));
			rc = 1;
			break;
		}
		double now = clock_ms_f();
		if (wd_ms && now - last_wd >= (double)wd_ms) {
			sdn_send(&sdn, "WATCHDOG=1");
			last_wd = now;
		}
		if (now - last_status >= 2000) {
			struct router_worker_info w[MAX_ENDPOINTS];
			int n = router_workers(r, w, MAX_ENDPOINTS), alive = 0;
			for (int i = 0; i < n && i < MAX_ENDPOINTS; i++)
				alive += w[i].alive;
			sdn_send(&sdn, "STATUS=serving on %s: %d of %d workers answer", o.listen,
				 alive, n);
			last_status = now;
		}
	}
	sdn_send(&sdn, "STOPPING=1\nSTATUS=stopping");
	log_info("stopping");
	if (g_stop)
		rc = 0;
out:
	if (r)
		router_close(r); /* wakes every request waiting for tokens */
	gate_http_stop(h);
	router_stop(r);
	if (gm_ok)
		gm_free(&gm);
	sdn_shutdown(&sdn);
	conffile_free(&cf);
	return rc;
}
