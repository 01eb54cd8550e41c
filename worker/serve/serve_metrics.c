/* serve_metrics — see serve_metrics.h. */
#include "serve_metrics.h"

#include <string.h>

static const char *const end_names[SM_N_ENDS] = { "eos", "length", "context", "cancelled",
						  "shutdown", "error" };
/* Sequences in one engine step. */
static const double batch_buckets[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256 };

int serve_metrics_init(struct serve_metrics *m)
{
	memset(m, 0, sizeof *m);
	int ret = prom_hist_init(&m->ttft, prom_latency_buckets, prom_n_latency_buckets);
	if (!ret)
		ret = prom_hist_init(&m->tpot, prom_latency_buckets, prom_n_latency_buckets);
	if (!ret)
		ret = prom_hist_init(&m->step, prom_latency_buckets, prom_n_latency_buckets);
	if (!ret)
		ret = prom_hist_init(&m->batch, batch_buckets, sizeof batch_buckets / sizeof *batch_buckets);
	if (ret)
		serve_metrics_free(m);
	return ret;
}

void serve_metrics_free(struct serve_metrics *m)
{
	prom_hist_free(&m->ttft);
	prom_hist_free(&m->tpot);
	prom_hist_free(&m->step);
	prom_hist_free(&m->batch);
}

void serve_metrics_end(struct serve_metrics *m, const char *reason, const struct kv_stats *st)
{
	int k = SM_ERROR;
	for (int i = 0; i < SM_N_ENDS; i++)
		if (!strcmp(reason, end_names[i]))
			k = i;
	prom_inc(&m->ended[k], 1);
	if (st) {
		prom_inc(&m->recall_bytes, (uint64_t)st->sum.bytes_recalled);
		prom_inc(&m->recall_wait_ns, (uint64_t)st->sum.ns_recall_wait);
		prom_inc(&m->recall_hidden_ns, (uint64_t)st->sum.ns_recall_hidden);
		prom_inc(&m->corrections, (uint64_t)st->sum.corrections);
		prom_inc(&m->head_checks, (uint64_t)st->sum.head_checks);
		prom_inc(&m->retrieval_steps, (uint64_t)st->sum.steps);
		prom_inc(&m->full_steps, (uint64_t)st->sum.full_steps);
		prom_inc(&m->tokens_fetched, (uint64_t)st->sum.tokens_fetched);
		prom_inc(&m->full_ns, (uint64_t)st->sum.ns_full);
	}
}

void serve_metrics_collect(void *ctx, struct prom_buf *b)
{
	struct serve_metrics *m = ctx;
	prom_family(b, "freekv_worker_requests_total", "counter",
		    "Generate and Resume requests that ran, by how they ended");
	for (int i = 0; i < SM_N_ENDS; i++) {
		struct prom_label l = { "reason", end_names[i] };
		prom_sample(b, "freekv_worker_requests_total", &l, 1, (double)prom_get(&m->ended[i]));
	}
	prom_one(b, "freekv_worker_refused_requests_total", "counter",
		 "Requests answered with an error before they ran (busy, too long, malformed)",
		 (double)prom_get(&m->refused));
	prom_one(b, "freekv_worker_prompt_tokens_total", "counter",
		 "Tokens run before each request's first sample", (double)prom_get(&m->prompt_tokens));
	prom_one(b, "freekv_worker_generated_tokens_total", "counter", "Tokens sampled and streamed",
		 (double)prom_get(&m->generated_tokens));
	prom_one(b, "freekv_worker_steps_total", "counter", "Engine steps (batched forwards)",
		 (double)prom_get(&m->steps));
	prom_one(b, "freekv_worker_active_requests", "gauge", "Requests decoding now",
		 (double)atomic_load(&m->active));
	prom_one(b, "freekv_worker_queued_requests", "gauge", "Requests waiting for a slot",
		 (double)atomic_load(&m->queued));
	prom_one(b, "freekv_worker_recall_bytes_total", "counter",
		 "KV bytes recalled from the host copy by retrieval policies (finished requests)",
		 (double)prom_get(&m->recall_bytes));
	prom_one(b, "freekv_worker_recall_wait_seconds_total", "counter",
		 "Recall time attention waited for (finished requests)",
		 (double)prom_get(&m->recall_wait_ns) / 1e9);
	prom_one(b, "freekv_worker_recall_hidden_seconds_total", "counter",
		 "Recall time overlapped with the rest of the step; hidden fraction = hidden / "
		 "(hidden + wait)", (double)prom_get(&m->recall_hidden_ns) / 1e9);
	prom_one(b, "freekv_worker_corrections_total", "counter",
		 "KV heads whose speculative selection was corrected", (double)prom_get(&m->corrections));
	prom_one(b, "freekv_worker_correction_checks_total", "counter",
		 "KV heads checked for correction", (double)prom_get(&m->head_checks));
	prom_one(b, "freekv_worker_retrieval_steps_total", "counter",
		 "Decode steps past the budget at retrieval layers, summed over layers",
		 (double)prom_get(&m->retrieval_steps));
	prom_one(b, "freekv_worker_full_steps_total", "counter",
		 "refreshkv: of those, full-attention steps; full-step rate = full / retrieval steps",
		 (double)prom_get(&m->full_steps));
	prom_one(b, "freekv_worker_tokens_fetched_total", "counter",
		 "refreshkv: head-token rows fetched into the partial sets",
		 (double)prom_get(&m->tokens_fetched));
	prom_one(b, "freekv_worker_full_step_seconds_total", "counter",
		 "refreshkv: time in full steps", (double)prom_get(&m->full_ns) / 1e9);
	prom_family(b, "freekv_worker_time_to_first_token_seconds", "histogram",
		    "Admission to the first sampled token");
	prom_hist_write(b, "freekv_worker_time_to_first_token_seconds", NULL, 0, &m->ttft);
	prom_family(b, "freekv_worker_time_per_output_token_seconds", "histogram",
		    "Mean time between sampled tokens after the first, per request");
	prom_hist_write(b, "freekv_worker_time_per_output_token_seconds", NULL, 0, &m->tpot);
	prom_family(b, "freekv_worker_step_duration_seconds", "histogram", "One engine step");
	prom_hist_write(b, "freekv_worker_step_duration_seconds", NULL, 0, &m->step);
	prom_family(b, "freekv_worker_step_sequences", "histogram", "Sequences in one engine step");
	prom_hist_write(b, "freekv_worker_step_sequences", NULL, 0, &m->batch);
}
