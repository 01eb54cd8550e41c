/* cmd_serve — `kvworker serve`: the worker as a long-lived service. It loads the model once,
 * attaches to kvstored (hostkv: heartbeat thread, pool mapping, ring), listens on a ZeroMQ
 * ROUTER (proto/worker.proto) and serves Generate/Resume/Cancel/Status requests with
 * continuous batching (serve_batch.c): between two engine steps it takes every request that
 * arrived, and each step runs all active sequences together.
 *
 * Configuration: every long flag is also a config file key (`key = value`, `#` comments; the
 * key is the flag without its dashes, e.g. `model = /srv/m.gguf`, `max-seqs = 8`). The file
 * given with --config is read first and the command line wins; both go through one flag
 * parser, so they cannot disagree.
 *
 * Service: sd_notify READY=1 once it listens, STATUS= with the active count, WATCHDOG=1 when
 * asked for; SIGTERM/SIGINT finish the current step, keep every active sequence in kvstored
 * (detached, resumable with Resume or `kvworker resume`), send STOPPING=1 and exit 0. Bad
 * requests get error replies; nothing a client sends makes the process exit. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "conffile.h"
#include "backend.h"
#include "chat_source.h"
#include "cmd_common.h"
#include "prom_http.h"
#include "sched_slice.h"
#include "sdnotify.h"
#include "serve_batch.h"
#include "serve_metrics.h"
#include "tokenizer.h"
#include "log.h"

#define SERVE_DEFAULT_LISTEN "ipc:///run/freekv/kvworker-%d.sock"
#define SERVE_DEFAULT_STORE "ipc:///run/freekv/kvstored.sock"

struct serve_opts {
	const char *model, *store, *listen, *config, *name, *backend, *metrics;
	long threads, ctx, max_seqs, max_queue, gpu, max_request_bytes, ubatch, lease_budget,
	     store_retry, slice_us;
	bool print_config;
	enum log_level log_level;	/* --log-level (default info) */
	struct policy_opts po;
	char listen_buf[256];
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
		"usage: kvworker serve -m MODEL [--store ENDPOINT] [--listen ENDPOINT] [--gpu N]\n"
		"                      [--config FILE] [options]\n"
		"  serves generation requests (proto/worker.proto) with continuous batching; talk\n"
		"  to it with `kvworker client`\n"
		"  -m, --model PATH          .gguf file or Hugging Face folder\n"
		"      --store ENDPOINT      kvstored endpoint (default %s)\n"
		"      --lease-budget N      lease at most N full, committed blocks per sequence;\n"
		"                            the others may go to kvstored's NVMe tier and are\n"
		"                            recalled when read (default 0: all leased, in DRAM)\n"
		"      --store-retry S       when kvstored goes away (restarted), reconnect for up\n"
		"                            to S seconds and continue every sequence in place\n"
		"                            (0..86400, default 30; 0: requests fail)\n"
		"      --listen ENDPOINT     ROUTER endpoint: ipc://PATH or tcp on a loopback\n"
		"                            address (default ipc:///run/freekv/kvworker-GPU.sock)\n"
		"      --gpu N               CUDA device of the cuda backend (default 0); it also\n"
		"                            names the default socket. Without a CUDA device (or a\n"
		"                            build without CUDA) it is recorded and the CPU backend\n"
		"                            is used; the log says so\n"
		"      --backend B           cuda, cpu or auto (default auto: cuda when a device is\n"
		"                            present and the policy runs there, else cpu)\n"
		"      --config FILE         read flags from FILE first: `key = value` lines, key =\n"
		"                            a long flag without dashes; the command line wins\n"
		"  -t, --threads N           compute threads (default: all cores)\n"
		"      --max-seqs N          sequences decoded together at most (default 8)\n"
		"      --max-queue N         requests that wait for a slot beyond those (default\n"
		"                            64); more are refused with -EBUSY\n"
		"  -c, --ctx-size N          context limit in tokens (default: the model's)\n"
		"      --ubatch N            tokens per forward chunk (default 256)\n"
		"      --max-request-bytes N larger request frames are refused (default 1048576)\n"
		"      --name NAME           worker name shown by `kvctl workers`\n"
		"      --metrics HOST:PORT   serve Prometheus /metrics there (loopback only)\n"
		"      --log-level L         error, warn, info or debug (default info): which log\n"
		"                            lines reach stderr (the journal under systemd)\n"
		"      --slice-us N          ask the scheduler for N-us time slices, 100 to 100000\n"
		"                            (Linux 6.12+), so that a thread kvstored wakes\n"
		"                            preempts CPU-bound work on a busy host (default 0: the\n"
		"                            scheduler's own)\n"
		"      --print-config        print the effective settings (config file, then\n"
		"                            flags) as a config file and exit\n"
		"  retrieval: %s\n"
		"             policies built: %s\n"
		"  -h, --help                this text\n",
		SERVE_DEFAULT_STORE, policy_opts_usage(), kvcache_policy_names());
}

enum { F_MODEL, F_STORE, F_LISTEN, F_GPU, F_CONFIG, F_THREADS, F_MAXSEQS, F_CTX, F_UBATCH,
       F_MAXREQ, F_NAME, F_BACKEND, F_MAXQUEUE, F_LEASE, F_METRICS, F_RETRY, F_LOGLEVEL, F_SLICE };

static const struct {
	const char *flag, *brief;
	long lo, hi;	/* bounds of a numeric flag (hi 0: a string) */
} sflags[] = {
	[F_MODEL] = { "--model", "-m", 0, 0 },
	[F_STORE] = { "--store", NULL, 0, 0 },
	[F_LISTEN] = { "--listen", NULL, 0, 0 },
	[F_GPU] = { "--gpu", NULL, 0, 1024 },
	[F_CONFIG] = { "--config", NULL, 0, 0 },
	[F_THREADS] = { "--threads", "-t", 1, 4096 },
	[F_MAXSEQS] = { "--max-seqs", NULL, 1, 1024 },
	[F_CTX] = { "--ctx-size", "-c", 1, 1L << 30 },
	[F_UBATCH] = { "--ubatch", NULL, 1, 65536 },
	[F_MAXREQ] = { "--max-request-bytes", NULL, 64, 1L << 30 },
	[F_NAME] = { "--name", NULL, 0, 0 },
	[F_BACKEND] = { "--backend", NULL, 0, 0 },
	[F_MAXQUEUE] = { "--max-queue", NULL, 0, 65536 },
	[F_LEASE] = { "--lease-budget", NULL, 0, HOSTKV_MAX_BUDGET },
	[F_METRICS] = { "--metrics", NULL, 0, 0 },
	[F_RETRY] = { "--store-retry", NULL, 0, 86400 },
	[F_LOGLEVEL] = { "--log-level", NULL, 0, 0 },
	[F_SLICE] = { "--slice-us", NULL, 0, SCHED_SLICE_MAX_US },
};

#define SERVE_OPT_BASE 0x100 /* getopt_long vals of sflags[] */

/* getopt_long's table: sflags (val SERVE_OPT_BASE + index; -m, -t, -c also as their letter),
 * --help, --print-config, then the retrieval options. */
enum { O_HELP = 'h', O_PRINT = 0x200 };
static size_t serve_options(struct option *out, size_t max)
{
	size_t n = 0;
	for (size_t f = 0; f < sizeof sflags / sizeof *sflags; f++)
		out[n++] = (struct option){ sflags[f].flag + 2, required_argument, NULL,
					    SERVE_OPT_BASE + (int)f };
	out[n++] = (struct option){ "help", no_argument, NULL, O_HELP };
	out[n++] = (struct option){ "print-config", no_argument, NULL, O_PRINT };
	n += policy_opts_options(out + n, max - 1 - n);
	out[n] = (struct option){ 0 };
	return n;
}

/* What getopt_long returned (c, its value v): 1 taken, 0 not one of ours, -EINVAL after printing
 * why (where: "" or "FILE:LINE: "). */
static int apply(struct serve_opts *o, int c, const char *v, const char *where)
{
	char err[256];
	int ret = policy_opts_apply(&o->po, c, v, err, sizeof err);
	if (ret < 0) {
		fprintf(stderr, "kvworker serve: %s%s\n", where, err);
		return -EINVAL;
	}
	if (ret)
		return 1;
	c = c == 'm' ? SERVE_OPT_BASE + F_MODEL : c == 't' ? SERVE_OPT_BASE + F_THREADS
	  : c == 'c' ? SERVE_OPT_BASE + F_CTX : c;
	if (c < SERVE_OPT_BASE || c >= SERVE_OPT_BASE + (int)(sizeof sflags / sizeof *sflags))
		return 0;
	size_t f = (size_t)(c - SERVE_OPT_BASE);
	long l = 0;
	if (sflags[f].hi && cmd_parse_long(v, sflags[f].lo, sflags[f].hi, &l)) {
		fprintf(stderr, "kvworker serve: %sinvalid value '%s' for %s (%ld..%ld)\n", where, v,
			sflags[f].flag, sflags[f].lo, sflags[f].hi);
		return -EINVAL;
	}
		switch (f) {
		case F_MODEL: o->model = v; break;
		case F_STORE: o->store = v; break;
		case F_LISTEN: o->listen = v; break;
		case F_CONFIG: o->config = v; break;
		case F_NAME: o->name = v; break;
		case F_METRICS: o->metrics = v; break;
		case F_LOGLEVEL:
			if (log_parse_level(v, &o->log_level)) {
				fprintf(stderr, "kvworker serve: %s--log-level: need error, warn, info or "
					"debug\n", where);
				return -EINVAL;
			}
			break;
		case F_BACKEND:
			if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
				fprintf(stderr, "kvworker serve: %s--backend: need cuda, cpu or auto\n",
					where);
				return -EINVAL;
			}
			o->backend = v;
			break;
		case F_GPU: o->gpu = l; break;
		case F_THREADS: o->threads = l; break;
		case F_MAXSEQS: o->max_seqs = l; break;
		case F_MAXQUEUE: o->max_queue = l; break;
		case F_CTX: o->ctx = l; break;
		case F_UBATCH: o->ubatch = l; break;
		case F_MAXREQ: o->max_request_bytes = l; break;
		case F_LEASE: o->lease_budget = l; break;
		case F_RETRY: o->store_retry = l; break;
		case F_SLICE:
			if (cmd_parse_slice(v, &o->slice_us)) {
				fprintf(stderr, "kvworker serve: %s--slice-us: need 0 or %u..%u\n",
					where, SCHED_SLICE_MIN_US, SCHED_SLICE_MAX_US);
				return -EINVAL;
			}
			break;
		}
	return 1;
}

/* Config file: each `key = value` line is the flag `--key value` (common/conffile.h). The
 * strings stay allocated (in *cf) for as long as the options point into them. 0 or -errno
 * after printing why. */
static int load_config(struct serve_opts *o, const char *path, struct conffile *cf)
{
	char err[512];
	int ret = conffile_read(path, cf, err, sizeof err);
	if (ret) {
		fprintf(stderr, "kvworker serve: config %s\n", err);
		return ret;
	}
	struct option opts[96];
	serve_options(opts, 96);
	for (int k = 0; k < cf->n; k++) {
		char where[300];
		const char *key = cf->argv[2 * k] + 2;
		snprintf(where, sizeof where, "%s:%d: ", path, cf->line[k]);
		const char *v;
		int c = conffile_getopt(cf, k, opts, &v), r;
		if (c < 0) {
			fprintf(stderr, "kvworker serve: %s'%s' takes no value here\n", where, key);
			return -EINVAL;
		}
		if (c == 0 || c == O_HELP || c == O_PRINT) {
			fprintf(stderr, "kvworker serve: %sunknown key '%s'\n", where, key);
			return -ENOENT;
		}
		if ((r = apply(o, c, v, where)) <= 0)
			return r ? r : -ENOENT;
	}
	return 0;
}

/* The effective settings as `key = value` lines that load_config reads back; 0 = default. */
static void print_config(const struct serve_opts *o)
{
	printf("model = %s\nstore = %s\nlisten = %s\n", o->model, o->store, o->listen);
	if (o->gpu >= 0)
		printf("gpu = %ld\n", o->gpu);
	if (o->name)
		printf("name = %s\n", o->name);
	if (o->metrics)
		printf("metrics = %s\n", o->metrics);
	printf("backend = %s\n", o->backend ? o->backend : "auto");
	printf("log-level = %s\n", log_level_name(o->log_level));
	if (o->threads)
		printf("threads = %ld\n", o->threads);
	if (o->ctx)
		printf("ctx-size = %ld\n", o->ctx);
	if (o->ubatch)
		printf("ubatch = %ld\n", o->ubatch);
	if (o->lease_budget)
		printf("lease-budget = %ld\n", o->lease_budget);
	if (o->slice_us)
		printf("slice-us = %ld\n", o->slice_us);
	printf("max-seqs = %ld\nmax-queue = %ld\nmax-request-bytes = %ld\nstore-retry = %ld\n"
	       "policy = %s\n", o->max_seqs, o->max_queue, o->max_request_bytes, o->store_retry,
	       o->po.policy);
	if (o->po.set_page)
		printf("page-size = %d\n", o->po.kv.page);
	if (o->po.set_budget)
		printf("budget = %d\n", o->po.kv.budget);
	if (o->po.set_sink)
		printf("sink = %d\n", o->po.kv.sink);
	if (o->po.set_window)
		printf("window = %d\n", o->po.kv.window);
	printf("full-layers = %d\ntau = %g\n", o->po.kv.full_layers, (double)o->po.kv.tau);
	printf("refresh-stride = %d\nrefresh-threshold = %g\n", o->po.kv.refresh_stride,
	       (double)o->po.kv.refresh_threshold);
	printf("kv-bits = %d\nspec-topk = %d\n", o->po.kv.kv_bits, o->po.kv.spec_topk);
}

/* 0 parsed, -1 help or config shown, CMD_USAGE. */
static int parse(int argc, char **argv, struct serve_opts *o, struct conffile *cfg_store)
{
	*o = (struct serve_opts){ .gpu = -1, .max_seqs = 8, .max_queue = 64, .store_retry = 30,
				  .max_request_bytes = 1 << 20, .log_level = LOG_INFO };
	policy_opts_default(&o->po);
	/* The config file first, wherever --config stands, so that flags override it. */
	struct option opts[96];
	serve_options(opts, 96);
	optind = 0;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":hm:t:c:", opts, NULL)) != -1) {
		if (c == O_HELP) {
			usage(stdout);
			return -1;
		}
		if (c == SERVE_OPT_BASE + F_CONFIG)
			o->config = optarg;
	}
	if (o->config && load_config(o, o->config, cfg_store))
		return CMD_USAGE;
	optind = 0;
	while ((c = getopt_long(argc, argv, ":hm:t:c:", opts, NULL)) != -1) {
		if (c == O_PRINT) {
			o->print_config = true;
			continue;
		}
		int r = c == '?' || c == ':' ? cmd_getopt_error("kvworker serve", c, argv)
					     : apply(o, c, optarg, "");
		if (r <= 0) {
			usage(stderr);
			return CMD_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvworker serve: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return CMD_USAGE;
	}
	if (!o->model) {
		fprintf(stderr, "kvworker serve: need -m MODEL (or `model =` in the config file)\n");
		usage(stderr);
		return CMD_USAGE;
	}
	if (!o->store)
		o->store = SERVE_DEFAULT_STORE;
	if (!o->listen) {
		snprintf(o->listen_buf, sizeof o->listen_buf, SERVE_DEFAULT_LISTEN,
			 o->gpu >= 0 ? (int)o->gpu : 0);
		o->listen = o->listen_buf;
	}
	if (!strncmp(o->listen, "tcp://", 6)) {
		const char *h = o->listen + 6;
		if (strncmp(h, "127.", 4) && strncmp(h, "localhost:", 10) && strncmp(h, "[::1]:", 6)) {
			fprintf(stderr, "kvworker serve: --listen %s: tcp only on a loopback address\n",
				o->listen);
			return CMD_USAGE;
		}
	} else if (strncmp(o->listen, "ipc://", 6) || !o->listen[6]) {
		fprintf(stderr, "kvworker serve: --listen %s: need ipc://PATH or tcp://127.0.0.1:PORT\n",
			o->listen);
		return CMD_USAGE;
	}
	if (o->print_config) {
		print_config(o);
		return -1;
	}
	return 0;
}

/* Everything the service holds; torn down in reverse order by serve_close. */
struct service {
	struct fkv_model m;
	struct fkv_tokenizer *tok;
	struct backend *be;
	struct engine *e;
	struct hostkv *hk;
	void *zctx, *sock;
	const char *bound;		/* the endpoint once bound */
	struct sdn sdn;
	struct serve srv;
	bool srv_init, m_loaded;
	char *chat_template;		/* for kvgate's Status (docs/design.md §6) */
	struct serve_metrics sm;	/* --metrics */
	struct prom_http *metrics;
	bool sm_init;
};

/* cuda on --gpu when asked for (or auto with a device), else the CPU backend, saying why. */
static int open_backend(struct service *v, const struct serve_opts *o, const char *policy)
{
	const char *name = cmd_backend_for(o->backend, policy, "kvworker serve");
	int devices = backend_cuda_devices(), ret;
	bool cuda = name && !strcmp(name, "cuda");
	if (!name || !strcmp(name, "auto"))
		cuda = devices > 0;
	if (cuda) {
		int dev = o->gpu >= 0 ? (int)o->gpu : 0;
		if ((ret = backend_cuda_new(&v->be, dev)))
			log_error("cannot use CUDA device %d (%d found): %s",
				dev, devices, strerror(-ret));
		else
			log_info("CUDA backend on device %d", dev);
		return ret;
	}
	if (o->gpu >= 0 || !name || strcmp(name, "cpu"))
		log_info("%s: using the CPU backend%s",
			devices ? "--backend cpu" : "no CUDA device (or no CUDA in this build)",
			o->gpu >= 0 ? " (--gpu recorded, unused)" : "");
	if ((ret = backend_cpu_new(&v->be, (int)o->threads)))
		log_error("cannot create the CPU backend");
	return ret;
}

static int service_open(struct service *v, const struct serve_opts *o)
{
	char err[512];
	/* First, so that every thread the backend, the store and the server start inherits it. */
	int ret = sched_slice_request_process((unsigned)o->slice_us, err, sizeof err);
	if (ret == -EOPNOTSUPP) {
		log_warn("--slice-us: %s; the scheduler's own slices are used", err);
	} else if (ret) {
		log_error("--slice-us: %s", err);
		return ret;
	}
	ret = cmd_load(o->model, &v->m, &v->tok);
	if (ret)
		return ret;
	v->m_loaded = true;
	if ((ret = model_chat_template(o->model, &v->chat_template, err, sizeof err)))
		log_warn("no chat template: %s", err);
	struct policy_opts po = o->po;
	int64_t ctx = o->ctx ? o->ctx : (v->m.cfg.ctx_len > 0 ? v->m.cfg.ctx_len : 2048);
	FILE *notice = strcmp(po.policy, "full") ? stderr : NULL;
	ret = policy_opts_finalize(&po, (int)(ctx < INT32_MAX ? ctx : INT32_MAX), notice, err,
				   sizeof err);
	if (!ret)
		ret = policy_opts_check_model(&po, v->m.cfg.n_layers, err, sizeof err);
	if (ret) {
		log_error("%s", err);
		return ret;
	}
	if ((ret = open_backend(v, o, po.policy)))
		return ret;
	struct engine_opts eo = { .max_ctx = o->ctx, .max_seqs = (int)o->max_seqs,
				  .ubatch = (int)o->ubatch, .policy = po.policy, .kv = po.kv };
	if ((ret = engine_new(&v->e, &v->m, v->be, &eo, err, sizeof err))) {
		log_error("%s", err);
		return ret;
	}
	char wname[64];
	if (o->name)
		snprintf(wname, sizeof wname, "%s", o->name);
	else
		snprintf(wname, sizeof wname, "kvworker-serve-%d", (int)getpid());
	struct hostkv_opts ho = { .endpoint = o->store, .worker_name = wname,
				  .lease_budget = (uint32_t)o->lease_budget,
				  .retry_s = (int)o->store_retry };
	if ((ret = hostkv_open(&ho, &v->hk, err, sizeof err))) {
		log_error("%s", err); /* err names the endpoint */
		return ret;
	}
	if (!(v->zctx = zmq_ctx_new()) || !(v->sock = zmq_socket(v->zctx, ZMQ_ROUTER))) {
		fprintf(stderr, "kvworker serve: cannot create a ZeroMQ socket: %s",
			zmq_strerror(errno));
		return -ENOMEM;
	}
	int one = 1, zero = 0, hwm = 100000;
	zmq_setsockopt(v->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
	zmq_setsockopt(v->sock, ZMQ_LINGER, &zero, sizeof zero);
	zmq_setsockopt(v->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
	if (zmq_bind(v->sock, o->listen)) {
		int e = errno;
		log_error("cannot listen on %s: %s", o->listen,
			zmq_strerror(e));
		return -e;
	}
	v->bound = o->listen;
	/* The trust boundary is the freekv group (docs/design.md §4): owner and group only. */
	if (!strncmp(o->listen, "ipc://", 6) && chmod(o->listen + 6, 0660))
		log_error("chmod %s: %s", o->listen + 6, strerror(errno));
	v->srv = (struct serve){ .m = &v->m, .tok = v->tok, .e = v->e, .hk = v->hk, .sock = v->sock,
				 .model_path = o->model, .backend_name = v->be->ops->name,
				 .chat_template = v->chat_template,
				 .gpu = (int)o->gpu,
				 .max_seqs = (int)o->max_seqs, .max_queue = (int)o->max_queue,
				 .max_request_bytes = (size_t)o->max_request_bytes };
	if ((ret = serve_init(&v->srv))) {
		log_error("out of memory");
		return ret;
	}
	v->srv_init = true;
	if (o->metrics) {
		if ((ret = serve_metrics_init(&v->sm))) {
			log_error("out of memory");
			return ret;
		}
		v->sm_init = true;
		v->srv.metrics = &v->sm;
		if ((ret = prom_http_start(o->metrics, false, serve_metrics_collect, &v->sm,
					   &v->metrics, err, sizeof err))) {
			log_error("--metrics: %s", err);
			return ret;
		}
		log_info("metrics on http://%s/metrics", o->metrics);
	}
	return 0;
}

static void service_close(struct service *v)
{
	prom_http_stop(v->metrics); /* its scrapes read v->sm */
	if (v->sm_init)
		serve_metrics_free(&v->sm);
	if (v->srv_init)
		serve_free(&v->srv);
	if (v->sock) {
		/* Let the last replies (Done, reason shutdown) reach their clients. */
		int linger = 2000;
		zmq_setsockopt(v->sock, ZMQ_LINGER, &linger, sizeof linger);
		zmq_close(v->sock);
	}
	if (v->zctx)
		zmq_ctx_term(v->zctx);
	/* libzmq leaves the ipc socket file behind; it is ours since the bind succeeded. */
	if (v->bound && !strncmp(v->bound, "ipc://", 6))
		unlink(v->bound + 6);
	hostkv_close(v->hk);
	engine_free(v->e);
	backend_free(v->be);
	tokenizer_free(v->tok);
	if (v->m_loaded)
		model_free(&v->m);
	free(v->chat_template);
}

static void report(struct service *v)
{
	char *txt = serve_stats_json(&v->srv);
	if (!txt)
		return;
	int ret = hostkv_report_stats(v->hk, txt);
	if (ret)
		log_warn("cannot report statistics to kvstored: %s",
			strerror(-ret));
	free(txt);
}

static int loop(struct service *v)
{
	struct serve *s = &v->srv;
	uint64_t wd_ms = sdn_watchdog_ms(&v->sdn);
	double last_report = clock_ms_f(), last_wd = last_report;
	int last_active = -1;
	while (!g_stop) {
		/* Block only while idle; with work, take what arrived and step. */
		long timeout = s->n_active ? 0 : 200;
		zmq_pollitem_t it = { .socket = v->sock, .events = ZMQ_POLLIN };
		int n = zmq_poll(&it, 1, timeout);
		if (n < 0 && errno != EINTR) {
			log_error("poll: %s", zmq_strerror(errno));
			return -errno;
		}
		if (n > 0) {
			int events = 0;
			size_t el = sizeof events;
			while (!g_stop && zmq_getsockopt(v->sock, ZMQ_EVENTS, &events, &el) == 0 &&
			       (events & ZMQ_POLLIN)) {
				int ret = serve_handle(s);
				if (ret) {
					log_error("receive: %s",
						zmq_strerror(-ret));
					return ret;
				}
			}
		}
		if (g_stop)
			break;
		serve_step(s);
		if (s->metrics) {
			atomic_store(&s->metrics->active, s->n_active);
			atomic_store(&s->metrics->queued, s->n_wait);
		}
		double now = clock_ms_f();
		if (s->n_active != last_active) {
			sdn_send(&v->sdn, "STATUS=serving: %d active sequences, %llu requests done",
				 s->n_active, (unsigned long long)s->requests_served);
			last_active = s->n_active;
		}
		if (now - last_report > 500) {
			report(v);
			last_report = now;
		}
		if (wd_ms && now - last_wd >= (double)wd_ms) {
			sdn_send(&v->sdn, "WATCHDOG=1");
			last_wd = now;
		}
	}
	return 0;
}

int cmd_serve(int argc, char **argv)
{
	struct serve_opts o;
	struct conffile cfg_store = { 0 };
	int ret = parse(argc, argv, &o, &cfg_store);
	if (ret) {
		conffile_free(&cfg_store);
		return ret < 0 ? CMD_OK : ret;
	}
	log_init("kvworker serve", o.log_level);
	struct service v = { 0 };
	if ((ret = sdn_init(&v.sdn))) {
		log_error("NOTIFY_SOCKET: %s", strerror(-ret));
		conffile_free(&cfg_store);
		return CMD_FAIL;
	}
	struct sigaction sa = { .sa_handler = on_stop };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	int rc = CMD_FAIL;
	if (service_open(&v, &o) == 0) {
		log_info("listening on %s (model %s, policy %s, backend %s, "
			"max %ld sequences, store %s)", o.listen, o.model,
			engine_policy_name(v.e), v.be->ops->name, o.max_seqs, o.store);
		sdn_send(&v.sdn, "READY=1\nSTATUS=serving on %s", o.listen);
		ret = loop(&v);
		sdn_send(&v.sdn, "STOPPING=1\nSTATUS=stopping: keeping %d sequences",
			 v.srv.n_active);
		serve_shutdown(&v.srv);
		report(&v);
		log_info("stopped after %llu requests, %llu tokens",
			(unsigned long long)v.srv.requests_served,
			(unsigned long long)v.srv.tokens_generated);
		rc = ret ? CMD_FAIL : CMD_OK;
	}
	service_close(&v);
	sdn_shutdown(&v.sdn);
	conffile_free(&cfg_store);
	return rc;
}
