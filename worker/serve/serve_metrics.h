/* serve_metrics — the Prometheus figures of `kvworker serve` (docs/design.md §6): requests by
 * how they ended, refusals, prompt and generated tokens, time to first token and per output
 * token, engine step time and batch size, active and queued requests, and the retrieval
 * counters of the policies (recall bytes, recall time waited for and hidden, head corrections
 * and checks; refreshkv's steps past the budget, full steps, rows fetched and time in full
 * steps) summed over finished requests. serve_batch.c records them on its one thread;
 * kvworker serve's --metrics server (metrics/prom_http.c) renders them on another, which is why
 * every field is atomic or a locked histogram.
 *
 * Ownership: serve_metrics_init/serve_metrics_free own the histograms; struct serve borrows the
 * struct (NULL: no metrics). */
#ifndef FREEKV_SERVE_METRICS_H
#define FREEKV_SERVE_METRICS_H

#include <stdatomic.h>

#include "kvcache.h"
#include "prom.h"

enum sm_end { SM_EOS, SM_LENGTH, SM_CONTEXT, SM_CANCELLED, SM_SHUTDOWN, SM_ERROR, SM_N_ENDS };

struct serve_metrics {
	struct prom_counter ended[SM_N_ENDS], refused, prompt_tokens, generated_tokens, steps;
	struct prom_counter recall_bytes, recall_wait_ns, recall_hidden_ns, corrections, head_checks;
	struct prom_counter retrieval_steps, full_steps, tokens_fetched, full_ns;
	_Atomic int active, queued;
	struct prom_hist ttft, tpot, step, batch;
};

int serve_metrics_init(struct serve_metrics *m);
void serve_metrics_free(struct serve_metrics *m);
/* A request ended with reason (serve_batch's Done.reason). */
void serve_metrics_end(struct serve_metrics *m, const char *reason, const struct kv_stats *st);
/* prom_collect_fn: ctx is the struct serve_metrics. */
void serve_metrics_collect(void *ctx, struct prom_buf *b);

#endif
