/* store_metrics — kvstored's Prometheus page (docs/design.md §6), served on `metrics_listen`
 * by metrics/prom_http.c: pool and tier bytes, blocks by tier, leases, sequences, workers,
 * demotions, promotions, swaps, checksum failures, RPC calls, errors and a latency histogram
 * per command table, ring ops with their errors and time. A scrape runs on libmicrohttpd's
 * thread and reads the daemon's state under the data-plane lock (dp_lock), the lock the event
 * loop holds whenever it touches the same state.
 *
 * Ownership: struct store_metrics is kvstored's; the daemon modules are borrowed; start
 * allocates the histogram and the server, stop frees them. */
#ifndef FREEKV_STORE_METRICS_H
#define FREEKV_STORE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "prom.h"
#include "prom_http.h"
#include "rpc.h"

struct store_metrics {
	struct dp *dp;
	struct rpc_server *rpc;
	struct seq_table *seqs;
	struct wk_registry *workers;
	const struct remote_seq *remote;	/* NULL or without a url: no remote figures */
	uint64_t start_ms;
	struct prom_hist rpc_latency;	/* seconds per control request (observed by rpc.c) */
	struct prom_http *http;
};

/* Creates the RPC latency histogram (before rpc_init, which records into it). -ENOMEM. */
int store_metrics_init(struct store_metrics *m);
/* Serves the page on listen (loopback only). 0 or -errno with err set. */
int store_metrics_start(struct store_metrics *m, const char *listen, char *err, size_t errlen);
/* Stops the server (if started) and frees the histogram. */
void store_metrics_shutdown(struct store_metrics *m);

#endif
