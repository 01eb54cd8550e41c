/* gate_metrics — see gate_metrics.h. */
#include "gate_metrics.h"

#include <stdio.h>
#include <string.h>

#include "router.h"

#define MAX_WORKERS 256

static const char *const paths[GM_N_PATHS] = {
	[GM_COMPLETIONS] = "/v1/completions", [GM_CHAT] = "/v1/chat/completions",
	[GM_MODELS] = "/v1/models", [GM_HEALTH] = "/health", [GM_METRICS] = "/metrics",
	[GM_OTHER] = "other",
};
/* The statuses kvgate answers with; the last slot counts any other. */
static const unsigned codes[GM_N_CODES] = { 200, 400, 404, 405, 413, 429, 500, 502, 503, 504,
					    408, 0 };

int gm_init(struct gate_metrics *m, struct router *r)
{
	memset(m, 0, sizeof *m);
	m->r = r;
	int ret = prom_hist_init(&m->duration, prom_latency_buckets, prom_n_latency_buckets);
	if (!ret)
		ret = prom_hist_init(&m->ttft, prom_latency_buckets, prom_n_latency_buckets);
	if (!ret)
		ret = prom_hist_init(&m->tpot, prom_latency_buckets, prom_n_latency_buckets);
	if (ret)
		gm_free(m);
	return ret;
}

void gm_free(struct gate_metrics *m)
{
	prom_hist_free(&m->duration);
	prom_hist_free(&m->ttft);
	prom_hist_free(&m->tpot);
}

void gm_http(struct gate_metrics *m, enum gm_path p, unsigned status)
{
	int i = 0;
	while (i < GM_N_CODES - 1 && codes[i] != status)
		i++;
	prom_inc(&m->http[p][i], 1);
}

void gm_collect(void *ctx, struct prom_buf *b)
{
	struct gate_metrics *m = ctx;
	prom_family(b, "freekv_gate_http_requests_total", "counter",
		    "HTTP requests answered, by path and status code");
	for (int p = 0; p < GM_N_PATHS; p++)
		for (int i = 0; i < GM_N_CODES; i++) {
			uint64_t v = prom_get(&m->http[p][i]);
			if (!v)
				continue;
			char code[16];
			snprintf(code, sizeof code, "%u", codes[i]);
			struct prom_label l[2] = { { "path", paths[p] },
						   { "code", codes[i] ? code : "other" } };
			prom_sample(b, "freekv_gate_http_requests_total", l, 2, (double)v);
		}
	prom_one(b, "freekv_gate_prompt_tokens_total", "counter",
		 "Prompt tokens the workers ran for completed requests",
		 (double)prom_get(&m->prompt_tokens));
	prom_one(b, "freekv_gate_completion_tokens_total", "counter",
		 "Tokens returned to clients", (double)prom_get(&m->completion_tokens));
	prom_one(b, "freekv_gate_stream_errors_total", "counter",
		 "Requests that ended with an error after their response had started",
		 (double)prom_get(&m->stream_errors));
	prom_family(b, "freekv_gate_request_duration_seconds", "histogram",
		    "Completion requests, arrival to last byte");
	prom_hist_write(b, "freekv_gate_request_duration_seconds", NULL, 0, &m->duration);
	prom_family(b, "freekv_gate_time_to_first_token_seconds", "histogram",
		    "Completion requests, arrival to the first token from the worker");
	prom_hist_write(b, "freekv_gate_time_to_first_token_seconds", NULL, 0, &m->ttft);
	prom_family(b, "freekv_gate_time_per_output_token_seconds", "histogram",
		    "Mean time between output tokens after the first, per request");
	prom_hist_write(b, "freekv_gate_time_per_output_token_seconds", NULL, 0, &m->tpot);

	static struct router_worker_info w[MAX_WORKERS];
	static pthread_mutex_t wmu = PTHREAD_MUTEX_INITIALIZER; /* w is too large for a stack */
	pthread_mutex_lock(&wmu);
	int n = router_workers(m->r, w, MAX_WORKERS);
	if (n > MAX_WORKERS)
		n = MAX_WORKERS;
	int64_t inflight = 0;
	for (int i = 0; i < n; i++)
		inflight += w[i].inflight;
	prom_one(b, "freekv_gate_requests_in_flight", "gauge",
		 "Requests sent to a worker and not finished", (double)inflight);
	static const struct {
		const char *name, *type, *help;
	} fam[] = {
		{ "freekv_gate_worker_up", "gauge", "1 when the worker answers its Status probes" },
		{ "freekv_gate_worker_outstanding_tokens", "gauge",
		  "Tokens the worker still has to run for kvgate's requests (routing load)" },
		{ "freekv_gate_worker_requests_total", "counter", "Requests routed to the worker" },
		{ "freekv_gate_worker_failures_total", "counter",
		  "Requests the worker refused or lost" },
		{ "freekv_gate_worker_recoveries_total", "counter",
		  "Times the worker was (re)taken into service" },
	};
	for (size_t f = 0; f < sizeof fam / sizeof *fam; f++) {
		prom_family(b, fam[f].name, fam[f].type, fam[f].help);
		for (int i = 0; i < n; i++) {
			struct prom_label l[1] = { { "worker", w[i].endpoint } };
			double v = f == 0 ? w[i].alive : f == 1 ? (double)w[i].outstanding :
				   f == 2 ? (double)w[i].requests : f == 3 ? (double)w[i].failures :
				   (double)w[i].up_transitions;
			prom_sample(b, fam[f].name, l, 1, v);
		}
	}
	pthread_mutex_unlock(&wmu);
}
