/* gate_metrics — kvgate's Prometheus figures (docs/design.md §6): HTTP requests by path and
 * status, completion latency, time to first token and per output token, tokens in and out, and
 * per worker whether it is up, its outstanding tokens, requests and failures (read from the
 * router at scrape time). Rendered with metrics/prom.h on GET /metrics.
 *
 * Any thread may record; the collect callback runs on the scraping connection's thread.
 * Ownership: gm_init/gm_free own the histograms; the router is borrowed. */
#ifndef FREEKV_GATE_METRICS_H
#define FREEKV_GATE_METRICS_H

#include "prom.h"

struct router;

enum gm_path { GM_COMPLETIONS, GM_CHAT, GM_MODELS, GM_HEALTH, GM_METRICS, GM_OTHER, GM_N_PATHS };
#define GM_N_CODES 12

struct gate_metrics {
	struct router *r;
	struct prom_counter http[GM_N_PATHS][GM_N_CODES];
	struct prom_counter prompt_tokens, completion_tokens, stream_errors;
	struct prom_hist duration, ttft, tpot;
};

int gm_init(struct gate_metrics *m, struct router *r);
void gm_free(struct gate_metrics *m);
void gm_http(struct gate_metrics *m, enum gm_path p, unsigned status);
/* prom_collect_fn: ctx is the struct gate_metrics. */
void gm_collect(void *ctx, struct prom_buf *b);

#endif
