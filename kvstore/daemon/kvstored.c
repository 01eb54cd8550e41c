/* kvstored — the KV memory service: main only. Parses the command line, starts the modules
 * (config, sequences, workers, data plane and its thread, control plane, sd_notify), runs the
 * control event loop and shuts the modules down in reverse order. See docs/design.md §4. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "access.h"
#include "clock.h"
#include "config.h"
#include "dataplane.h"
#include "freekv_store.h"
#include "owner.h"
#include "persist.h"
#include "remote_seq.h"
#include "rpc.h"
#include "sched_slice.h"
#include "sdnotify.h"
#include "seq.h"
#include "store_metrics.h"
#include "version.h"
#include "workers.h"
#include "log.h"

#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

#define MAX_POLL 1100
#define STATUS_EVERY_MS 1000
#define LOOP_TICK_MS 100

static void usage(FILE *f)
{
	fprintf(f, "usage: kvstored [--config FILE] [--set KEY=VALUE]... [--print-config]\n"
		   "Runs in the foreground and logs to stderr (systemd supervises it; see kvstored(8)).\n"
		   "  -c, --config FILE   read KEY = VALUE lines (# comments)\n"
		   "  -s, --set K=V       override one key (after the file)\n"
		   "  -p, --print-config  print the effective configuration and exit\n"
		   "      --version       print the version, commit and build, and exit\n");
}

struct daemon_state {
	struct cfg cfg;
	const char *config_path;
	struct seq_table seqs;
	struct wk_registry workers;
	struct dp *dp;
	struct rpc_server rpc;
	struct sdn sdn;
	struct owner owner;
	struct access access;
	struct persist *ps;
	void *zctx;
	int sigfd;
	struct store_metrics sm;	/* metrics_listen (docs/design.md §6) */
	bool sm_on;
	struct remote_seq remote;	/* remote_url (docs/design.md §8) */
};

static int parse_args(struct daemon_state *d, int argc, char **argv, bool *print)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "set", required_argument, NULL, 's' },
		{ "print-config", no_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0, 0, 0, 0 },
	};
	char err[CFG_ERR_MAX];
	int o;
	/* 0 to run, 1 after --help, -EINVAL on bad usage. The file first, then every --set, whatever their order on the command line. */
	while ((o = getopt_long(argc, argv, "c:s:ph", opts, NULL)) != -1) {
		switch (o) {
		case 'c': d->config_path = optarg; break;
		case 's': break;
		case 'p': *print = true; break;
		case 'h': usage(stdout); return 1;
		case 'V': fkv_version_print(stdout, "kvstored"); return 1;
		default: usage(stderr); return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvstored: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (d->config_path && cfg_load_file(&d->cfg, d->config_path, false, err, sizeof err)) {
		fprintf(stderr, "kvstored: %s\n", err);
		return -EINVAL;
	}
	optind = 1;
	while ((o = getopt_long(argc, argv, "c:s:ph", opts, NULL)) != -1) {
		if (o == 's' && cfg_set_arg(&d->cfg, optarg, err, sizeof err)) {
			fprintf(stderr, "kvstored: --set %s: %s\n", optarg, err);
			return -EINVAL;
		}
	}
	return 0;
}

static void reap_workers(struct daemon_state *d)
{
	uint32_t ids[64];
	/* A worker busy on its ring is alive even when its heartbeat thread is starved. */
	for (size_t i = 0; i < d->workers.max; i++) {
		struct wk_worker *w = &d->workers.v[i];
		uint64_t op = w->id ? dp_worker_last_op_ms(d->dp, w->id) : 0;
		if (op > w->last_heartbeat_ms)
			w->last_heartbeat_ms = op;
	}
	size_t n = wk_reap(&d->workers, clock_ms(), d->cfg.heartbeat_timeout_ms, ids, 64);
	for (size_t i = 0; i < n; i++) {
		struct wk_worker *w = wk_find(&d->workers, ids[i]);
		/* A silent worker whose process still runs keeps the pool mapped read-write: freed
		 * blocks handed to others would take its late writes. So it is killed first (its pid
		 * is the connection's own) and its blocks are let go only once it has exited. */
		if (!wk_exited(w) && w->pid_verified && w->pidfd >= 0) {
			if (!w->fenced) {
				w->fenced = true;
				int r = (int)syscall(SYS_pidfd_send_signal, w->pidfd, SIGKILL, NULL, 0);
				log_warn("worker %u (pid %u) silent past heartbeat_timeout_ms: "
					"%s", w->id, w->pid, r == 0 ? "killed, so that it cannot write into "
					"blocks given to others" : "could not kill it; its blocks are let go "
					"anyway");
				if (r == 0)
					continue;
			} else if (wk_exited(w) == false && clock_ms() - w->last_heartbeat_ms <
				   3 * d->cfg.heartbeat_timeout_ms) {
				continue; /* SIGKILL sent: wait for the exit (bounded) */
			}
		}
		dp_worker_gone(d->dp, ids[i]);
		size_t orphaned = seq_orphan_worker(&d->seqs, ids[i]);
		log_msg(orphaned ? LOG_WARN : LOG_INFO, "worker %u (pid %u) gone; %zu sequence(s) "
			"orphaned", ids[i], w->pid, orphaned);
		wk_remove(&d->workers, ids[i]);
	}
}

static void reload(struct daemon_state *d)
{
	char err[CFG_ERR_MAX];
	if (!d->config_path) {
		log_warn("SIGHUP: no --config file to reload");
		return;
	}
	char restart[512];
	if (cfg_reload_file(&d->cfg, d->config_path, restart, sizeof restart, err, sizeof err)) {
		log_warn("SIGHUP reload refused, configuration unchanged: %s", err);
		return;
	}
	log_set_level((enum log_level)d->cfg.log_level);
	if (restart[0])
		log_info("reloaded run-time keys from %s; changed but not applied "
			"until a restart: %s", d->config_path, restart);
	else
		log_info("reloaded run-time keys from %s", d->config_path);
}

static void send_status(struct daemon_state *d)
{
	struct dp_stats st;
	dp_stats(d->dp, &st);
	sdn_send(&d->sdn, "STATUS=%u workers, %zu sequences, DRAM %" PRIu64 "/%" PRIu64 " MiB, NVMe %" PRIu64
		 "/%" PRIu64 " MiB",
		 (unsigned)d->workers.n, d->seqs.n, st.dram_used_bytes >> 20, st.dram_bytes >> 20,
		 st.nvme_used_bytes >> 20, st.nvme_bytes >> 20);
}

/* Another kvstored answering at our endpoint would lose its pool and socket to us: refuse. */
static bool already_served(const struct cfg *c)
{
	struct kvs *k;
	if (!strncmp(c->endpoint, "ipc://", 6) && access(c->endpoint + 6, F_OK) != 0)
		return false;
	if (kvs_connect(c->endpoint, 300, &k))
		return false;
	bool answered = kvs_stats(k, NULL) == 0;
	kvs_close(k);
	return answered;
}

/* Returns when SIGTERM or SIGINT arrives. Holds the data-plane lock except in zmq_poll: the
 * control plane shares the sequences, the config and the pool with the data-plane thread. */
static void event_loop(struct daemon_state *d)
{
	zmq_pollitem_t items[MAX_POLL];
	int fds[8];
	uint32_t ids[1024];
	uint64_t wd_ms = sdn_watchdog_ms(&d->sdn), last_wd = clock_ms(), last_status = 0;
	dp_lock(d->dp);
	for (;;) {
		size_t n = 0;
		items[n++] = (zmq_pollitem_t){ .socket = d->rpc.sock, .events = ZMQ_POLLIN };
		items[n++] = (zmq_pollitem_t){ .fd = d->sigfd, .events = ZMQ_POLLIN };
		size_t nd = dp_pollfds(d->dp, fds, 8);
		for (size_t i = 0; i < nd; i++)
			items[n++] = (zmq_pollitem_t){ .fd = fds[i], .events = ZMQ_POLLIN };
		int pidfds[1024];
		size_t np = wk_pidfds(&d->workers, pidfds, ids, MAX_POLL - n < 1024 ? MAX_POLL - n : 1024);
		for (size_t i = 0; i < np; i++)
			items[n++] = (zmq_pollitem_t){ .fd = pidfds[i], .events = ZMQ_POLLIN };

		int timeout = dp_poll_timeout(d->dp, LOOP_TICK_MS);
		if (wd_ms) {
			uint64_t since = clock_ms() - last_wd;
			int left = since >= wd_ms ? 0 : (int)(wd_ms - since);
			timeout = left < timeout ? left : timeout;
		}
		dp_unlock(d->dp);
		int pr = zmq_poll(items, (int)n, timeout);
		int perr = errno;
		dp_lock(d->dp);
		if (pr < 0 && perr != EINTR) {
			log_error("zmq_poll: %s", zmq_strerror(perr));
			break;
		}
		if (items[1].revents & ZMQ_POLLIN) {
			struct signalfd_siginfo si;
			bool stop = false;
			while (read(d->sigfd, &si, sizeof si) == sizeof si) {
				if (si.ssi_signo == SIGHUP)
					reload(d);
				else
					stop = true;
			}
			if (stop)
				break;
		}
		rpc_serve(&d->rpc, 256);
		int ready[8];
		size_t nr = 0;
		for (size_t i = 0; i < nd; i++)
			if (items[2 + i].revents & ZMQ_POLLIN)
				ready[nr++] = fds[i];
		dp_poll_done(d->dp, ready, nr);
		reap_workers(d);
		remote_seq_tick(&d->remote);

		dp_maintain(d->dp);
		uint64_t t = clock_ms();
		if (wd_ms && t - last_wd >= wd_ms) {
			sdn_send(&d->sdn, "WATCHDOG=1");
			last_wd = t;
		}
		if (t - last_status >= STATUS_EVERY_MS) {
			send_status(d);
			last_status = t;
		}
	}
	dp_unlock(d->dp);
}

int main(int argc, char **argv)
{
	static struct daemon_state d;
	char err[512];
	bool print = false;
	int ret, rc = 1;

	cfg_defaults(&d.cfg);
	d.sigfd = -1;
	if ((ret = parse_args(&d, argc, argv, &print)))
		return ret > 0 ? 0 : 2;
	if (cfg_validate(&d.cfg, err, sizeof err)) {
		fprintf(stderr, "kvstored: %s\n", err);
		return 2;
	}
	log_init("kvstored", (enum log_level)d.cfg.log_level); /* log_level: the same four levels */
	if (print) {
		cfg_print(&d.cfg, stdout);
		return 0;
	}
	/* Before any thread starts, so that all of them have it (docs/design.md §4 "Wake-ups on a
	 * busy host"). A kernel that keeps no slice requests runs the daemon as before. */
	ret = sched_slice_request_process((unsigned)d.cfg.slice_us, err, sizeof err);
	if (ret == -EOPNOTSUPP)
		log_warn("slice_us: %s; the scheduler's own slices are used", err);
	else if (ret) {
		log_error("slice_us: %s", err);
		return 1;
	}

	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	d.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (d.sigfd < 0) {
		log_error("signalfd: %s", strerror(errno));
		return 1;
	}
	if (already_served(&d.cfg)) {
		log_error("another kvstored already serves %s", d.cfg.endpoint);
		goto out_sig;
	}
	if ((ret = access_init(&d.access, &d.cfg, err, sizeof err))) {
		log_error("%s", err);
		goto out_sig;
	}
	if ((ret = owner_take(&d.owner, &d.cfg, err, sizeof err))) {
		log_error("%s", err);
		goto out_sig;
	}
	if ((ret = persist_open(&d.cfg, &d.ps, err, sizeof err))) {
		log_error("%s", strerror(-ret));
		goto out_owner;
	}
	if (!d.ps) /* off by the persist key (info) or for want of a place for the journal (warn) */
		log_msg(d.cfg.persist ? LOG_WARN : LOG_INFO, "%s", err);
	/* With persistence the pool segment a dead owner left is adopted, not removed. */
	owner_clean_stale(&d.owner, &d.cfg, d.ps != NULL);
	if ((ret = sdn_init(&d.sdn))) {
		log_error("NOTIFY_SOCKET: %s", strerror(-ret));
		goto out_owner;
	}
	if ((ret = seq_table_init(&d.seqs, d.cfg.max_sequences)))
		goto out_sdn;
	if ((ret = wk_init(&d.workers, d.cfg.max_workers))) {
		log_error("workers: %s", strerror(-ret));
		goto out_seq;
	}
	err[0] = '\0';
	if ((ret = dp_init(&d.dp, &d.cfg, &d.seqs, err, sizeof err))) {
		log_error("%s", err[0] ? err : strerror(-ret));
		goto out_wk;
	}
	if ((ret = dp_restore(d.dp, d.ps, err, sizeof err))) {
		log_error("%s", err);
		goto out_dp;
	}
	d.zctx = zmq_ctx_new();
	if (!d.zctx) {
		log_error("zmq_ctx_new: %s", zmq_strerror(errno));
		goto out_dp;
	}
	if ((ret = remote_seq_init(&d.remote, &d.cfg, d.dp, &d.seqs, d.ps, err, sizeof err))) {
		log_error("%s", err);
		goto out_zmq;
	}
	if (d.remote.r)
		log_info("remote tier %s, namespace %s, host id %s", d.cfg.remote_url,
			 d.cfg.remote_namespace, remote_host_id(d.remote.r));
	struct rpc_ctx rctx = {
		.cfg = &d.cfg, .seqs = &d.seqs, .workers = &d.workers, .dp = d.dp, .access = &d.access,
		.ps = d.ps, .remote = &d.remote,
		.start_ms = clock_ms(), .now_ms = clock_ms,
	};
	if ((ret = rpc_init(&d.rpc, d.zctx, &rctx, err, sizeof err))) {
		log_error("%s", err);
		goto out_zmq;
	}
	if (d.cfg.metrics_listen[0]) {
		d.sm = (struct store_metrics){ .dp = d.dp, .rpc = &d.rpc, .seqs = &d.seqs,
					       .workers = &d.workers, .remote = &d.remote,
					       .start_ms = rctx.start_ms };
		if ((ret = store_metrics_init(&d.sm)) == 0)
			d.sm_on = true;
		if (!ret && (ret = store_metrics_start(&d.sm, d.cfg.metrics_listen, err, sizeof err)))
			log_error("metrics_listen: %s", err);
		if (ret)
			goto out_rpc;
		d.rpc.latency = &d.sm.rpc_latency;
		log_info("metrics on http://%s/metrics", d.cfg.metrics_listen);
	}
	log_info("serving %s, pool %s (%" PRIu64 " MiB), tier %s", d.cfg.endpoint,
		dp_pool_name(d.dp), dp_pool_bytes(d.dp) >> 20, d.cfg.nvme_path[0] ? d.cfg.nvme_path : "none");
	send_status(&d);
	if ((ret = dp_start(d.dp, err, sizeof err))) {
		log_error("%s", err);
		goto out_rpc;
	}
	sdn_send(&d.sdn, "READY=1");

	event_loop(&d);
	dp_stop(d.dp);
	rc = 0;

	log_info("stopping");
	sdn_send(&d.sdn, "STOPPING=1");
	rpc_notify_shutdown(&d.rpc);
out_rpc:
	if (d.sm_on)
		store_metrics_shutdown(&d.sm); /* its scrapes read the rpc counters */
	rpc_shutdown(&d.rpc);
out_zmq:
	remote_seq_close(&d.remote);
	zmq_ctx_term(d.zctx);
out_dp:
	dp_shutdown(d.dp);
out_wk:
	wk_shutdown(&d.workers);
out_seq:
	seq_table_shutdown(&d.seqs);
out_sdn:
	sdn_shutdown(&d.sdn);
	persist_close(d.ps);
out_owner:
	owner_release(&d.owner);
out_sig:
	close(d.sigfd);
	return rc;
}
