/* decode_bench — per-step decode time of each KV policy at long contexts on the CPU backend,
 * broken down into selection, recall exposed (attention waited for it), recall hidden (the copy
 * thread's recall that overlapped the rest of the step), attention and the rest of the step,
 * with the freekv / quest step-time ratio and the hidden fraction of recall per context.
 *
 * Model: a synthetic model with Llama-3.1-8B geometry (32 query heads, 8 KV heads, head dim
 * 128, hidden 4096, FFN 14336) and few layers (default 2, bf16, vocabulary 4096) written to a
 * temporary folder with synth_write, or -m DIR.
 *
 * Context: prefilling 32K tokens through an 8B-wide model is hours of work on two cores, so the
 * context is made the way a resumed sequence is: the host copy (embedded store) is filled with
 * C tokens of K/V drawn from a fixed-seed generator (keys and values uniform in [-1, 1), written
 * with layout_store_tokens in the model's dtype; random token ids) and committed, and the
 * engine resumes the sequence, so the policy rebuilds its device state from the host copy
 * (restore). Every step measured after that is a real decode step of the engine: projections,
 * RoPE, retrieval, attention over the restored context, MLP, logits, greedy next token. The
 * synthetic keys make page scores close to each other, so selections change much from step to
 * step: a recall-heavy regime. The correction rate depends on how much adjacent queries of the
 * random-weight model agree; rows with tau 0 (pure speculation) show the other end.
 *
 * Each row: one fresh sequence per (context, policy, tau), W warm-up steps, then N measured
 * steps; the step time is the mean and the median of the measured steps (the median is what
 * the freekv / quest ratio uses: it shrugs off steps slowed by other load on the machine); the
 * breakdown columns are means per step from the policy's counters (kv_layer_stats), "rest" is
 * the mean step time minus selection, exposed recall and attention on the compute thread.
 * refreshkv rows add their full steps (time per decode step, "full", and the full-step rate:
 * full steps / steps past the budget, summed over layers); its selection (the pooled top-B)
 * and exposed recall are parts of its full steps, its attention that of the other steps, and
 * its "rest" the step minus full steps and attention.
 * "pg/head" is the selected pages a KV head attended per step (quest's k; fewer under top-p
 * selection, hardkv and freekv with a P); "ms/cal" the time of one calibration of one layer's
 * temperatures (reading the layer's host copy and the true attention mass: a resumed sequence
 * calibrates at its first step, a warm-up step here, then every R steps, so it is reported
 * apart from the step time; its share of a step is layers * ms/cal / R).
 *
 * specache rows (docs/design.md §5) also show the exact rows fetched per step, the device KV
 * bytes against a 16-bit copy of every K and V (the compression ratio; every row shows it) and
 * the speculative tokens' hit rate; their context is quantised from the host copy by restore,
 * and the first (warm-up) step after it is a pre-step.
 *
 * usage: decode_bench [--quick] [--ctx LIST] [--rows LIST] [-n STEPS] [-w WARMUP] [-t THREADS]
 *                     [-m MODEL_DIR] [--layers N] [--vocab N] [--page-size N] [--budget N]
 *                     [--sink N] [--window N] [--full-layers N] [--kv-bits B] [--spec-topk K]
 *   --ctx LIST   contexts in tokens (default 4096,8192,16384,32768; --quick: 4096)
 *   --rows LIST  policy[:tau][/P][+nospec][+frag][+single] rows, P the row's --kv-top-p, the
 *                + suffixes the Fig. 8 ablations (docs/design.md §5: no speculation, per-token
 *                recall pieces, one staging buffer), and specache[:bits]; "fig8" is
 *                quest,freekv,freekv+nospec,freekv+single,freekv+frag,quest+frag+single (the
 *                last stands in for ArkVale) (default
 *                full,streaming,quest,freekv,freekv:0,hardkv,refreshkv,specache:2,specache:1) */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "backend.h"
#include "dtype.h"
#include "engine.h"
#include "hostkv.h"
#include "layout.h"
#include "model.h"
#include "policy_opts.h"
#include "sampler.h"
#include "synth.h"

#include "bench_ablation.h"

#define MAX_LIST 16

struct row {
	char policy[16];
	char label[40];	/* policy and its ablations, as given */
	struct kv_policy_opts abl; /* the ablation flags only (bench_ablation.h) */
	float tau;
	float top_p; /* 0: the policy's default */
	int bits;    /* specache */
};

struct bench_args {
	int ctx[MAX_LIST], n_ctx;
	struct row rows[MAX_LIST];
	int n_rows;
	int steps, warmup, threads, layers, vocab;
	const char *model;
	struct kv_policy_opts kv;
};

/* What one row measured, per step. */
struct result {
	double step_ms, median_ms, select_ms, wait_ms, hidden_ms, attend_ms, rest_ms;
	double pages_recalled, mib_recalled, corr_rate, pages_head, ms_cal, full_ms, full_rate;
	bool has_corr, has_full;
	double rows_fetched, kv_ratio, hit_rate; /* per step; device bytes / 16-bit; specache */
	bool has_hit;
	bool counted; /* the policy keeps retrieval counters */
};

static double loadavg(void)
{
	double l = -1.0;
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf", &l) != 1)
			l = -1.0;
		fclose(f);
	}
	return l;
}

/* xorshift64*; uniform in [-1, 1). */
static float rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	uint64_t x = *s * 2685821657736338717ull;
	return (float)((double)(x >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static int parse_ints(const char *s, int *out, int max)
{
	int n = 0;
	char buf[256];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
		char *end;
		long v = strtol(p, &end, 10);
		if (*end || v < 1 || v > (1L << 24) || n == max)
			return -EINVAL;
		out[n++] = (int)v;
	}
	return n ? n : -EINVAL;
}

static int parse_rows(const char *s, struct row *out, float tau, int bits, int max)
{
	int n = 0;
	char buf[256];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
		if (n == max)
			return -EINVAL;
		snprintf(out[n].label, sizeof out[n].label, "%s", p);
		if (bench_ablations(p, &out[n].abl))
			return -EINVAL;
		char *sl = strchr(p, '/'), *c = strchr(p, ':');
		out[n].tau = tau;
		out[n].top_p = 0.0f;
		out[n].bits = bits;
		if (sl) {
			*sl = '\0';
			char *end;
			out[n].top_p = strtof(sl + 1, &end);
			if (*end || sl[1] == '\0' || !(out[n].top_p > 0.0f && out[n].top_p <= 1.0f))
				return -EINVAL;
		}
		if (c) {
			*c = '\0';
			char *end;
			float x = strtof(c + 1, &end);
			if (*end || c[1] == '\0' || !(x >= 0.0f))
				return -EINVAL;
			/* After specache the number is its bits, after any other policy tau. */
			if (!strcmp(p, "specache") && x != 1.0f && x != 2.0f)
				return -EINVAL;
			if (!strcmp(p, "specache"))
				out[n].bits = (int)x;
			else
				out[n].tau = x;
		}
		if (!kvcache_policy(p) || strlen(p) >= sizeof out[n].policy) {
			fprintf(stderr, "decode_bench: unknown policy '%s' (built: %s)\n", p,
				kvcache_policy_names());
			return -EINVAL;
		}
		strcpy(out[n++].policy, p);
	}
	return n ? n : -EINVAL;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: decode_bench [--quick] [--ctx LIST] [--rows policy[:tau][/P],...] [-n STEPS] "
		   "[-w WARMUP] [-t THREADS] [-m MODEL_DIR] [--layers N] [--vocab N] [--page-size N] "
		   "[--budget N] [--sink N] [--window N] [--full-layers N] [--tau F] [--kv-bits B] "
		   "[--spec-topk K]\n");
}

static int parse(int argc, char **argv, struct bench_args *a)
{
	*a = (struct bench_args){ .steps = 16, .warmup = 3, .layers = 2, .vocab = 4096 };
	struct policy_opts po;
	policy_opts_default(&po);
	po.kv.full_layers = 0;
	const char *ctx = "4096,8192,16384,32768";
	const char *rows = "full,streaming,quest,freekv,freekv:0,hardkv,refreshkv,specache:2,"
			   "specache:1";
	bool quick = false, set_n = false, set_ctx = false;
	char err[256];
	/* getopt_long, the retrieval options from policy_opts' table, as kvworker's commands. */
	enum { O_QUICK = 256, O_CTX, O_ROWS, O_LAYERS, O_VOCAB };
	static const struct option own[] = {
		{ "quick", no_argument, NULL, O_QUICK },
		{ "ctx", required_argument, NULL, O_CTX },
		{ "rows", required_argument, NULL, O_ROWS },
		{ "layers", required_argument, NULL, O_LAYERS },
		{ "vocab", required_argument, NULL, O_VOCAB },
		{ "help", no_argument, NULL, 'h' },
	};
	struct option opts[64];
	size_t n = sizeof own / sizeof *own;
	memcpy(opts, own, sizeof own);
	n += policy_opts_options(opts + n, 63 - n);
	opts[n] = (struct option){ 0 };
	optind = 1;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":n:w:t:m:h", opts, NULL)) != -1) {
		long x = 0;
		char *end = NULL;
		if (c == 'n' || c == 'w' || c == 't' || c == O_LAYERS || c == O_VOCAB) {
			x = strtol(optarg, &end, 10);
			if (*end || x < 0 || x > (1L << 20)) {
				fprintf(stderr, "decode_bench: bad value '%s' for %s\n", optarg,
					argv[optind - 1]);
				return -EINVAL;
			}
		}
		switch (c) {
		case O_QUICK: quick = true; break;
		case O_CTX: ctx = optarg; set_ctx = true; break;
		case O_ROWS: rows = strcmp(optarg, "fig8") ? optarg : BENCH_FIG8_ROWS; break;
		case O_LAYERS: a->layers = (int)x; break;
		case O_VOCAB: a->vocab = (int)x; break;
		case 'n': a->steps = (int)x; set_n = true; break;
		case 'w': a->warmup = (int)x; break;
		case 't': a->threads = (int)x; break;
		case 'm': a->model = optarg; break;
		case 'h': usage(stdout); exit(0);
		case ':':
			fprintf(stderr, "decode_bench: %s needs a value\n", argv[optind - 1]);
			return -EINVAL;
		case '?':
			fprintf(stderr, "decode_bench: unknown option %s\n", argv[optind - 1]);
			return -EINVAL;
		default:
			if (c == POLICY_OPT_POLICY) {
				fprintf(stderr, "decode_bench: use --rows policy[:tau],...\n");
				return -EINVAL;
			}
			if (policy_opts_apply(&po, c, optarg, err, sizeof err) != 1) {
				fprintf(stderr, "decode_bench: %s\n", err);
				return -EINVAL;
			}
		}
	}
	if (optind < argc) {
		fprintf(stderr, "decode_bench: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (quick) {
		if (!set_ctx)
			ctx = "4096";
		if (!set_n)
			a->steps = 6;
		a->warmup = a->warmup < 2 ? a->warmup : 2;
	}
	a->n_ctx = parse_ints(ctx, a->ctx, MAX_LIST);
	a->n_rows = parse_rows(rows, a->rows, po.kv.tau, po.kv.kv_bits, MAX_LIST);
	if (a->n_ctx < 0 || a->n_rows < 0 || a->steps < 1 || a->layers < 1) {
		fprintf(stderr, "decode_bench: bad --ctx, --rows, -n or --layers\n");
		return -EINVAL;
	}
	/* The retrieval settings are the unscaled defaults (or the flags): every context here is
	 * longer than the budget. */
	if (policy_opts_finalize(&po, 1 << 30, NULL, err, sizeof err)) {
		fprintf(stderr, "decode_bench: %s\n", err);
		return -EINVAL;
	}
	a->kv = po.kv;
	return 0;
}

/* Fills the host copy hs with ctx tokens: every layer's pages, synthetic K/V (the same for
 * every row: one seed), and random token ids, then commits them. */
static int fill_host(struct hostkv_seq *hs, const struct kv_geom *g, int layers, int ctx, int V,
		     char *err, size_t errlen)
{
	size_t rows = (size_t)g->p * g->n_kv * g->d;
	float *k = malloc(rows * sizeof *k), *v = malloc(rows * sizeof *v);
	int32_t *ids = malloc((size_t)ctx * sizeof *ids);
	int ret = k && v && ids ? 0 : -ENOMEM;
	if (ret)
		snprintf(err, errlen, "out of memory");
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (int l = 0; l < layers && !ret; l++) {
		for (int pg = 0; pg * g->p < ctx && !ret; pg++) {
			int t1 = ctx - pg * g->p < g->p ? ctx - pg * g->p : g->p;
			for (size_t i = 0; i < (size_t)t1 * g->n_kv * g->d; i++) {
				k[i] = rnd(&s);
				v[i] = rnd(&s);
			}
			void *blk;
			ret = hostkv_block(hs, l, pg, &blk, err, errlen);
			if (!ret)
				layout_store_tokens(g, blk, 0, t1, k, v);
		}
	}
	for (int i = 0; i < ctx && !ret; i++) {
		rnd(&s);
		ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
	}
	if (!ret)
		ret = hostkv_commit(hs, ctx, ids, 0, ctx, err, errlen);
	free(k);
	free(v);
	free(ids);
	return ret;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

static void stats_sum(const struct engine *e, int seq, int layers, struct kv_layer_stats *out)
{
	memset(out, 0, sizeof *out);
	for (int l = 0; l < layers; l++) {
		struct kv_layer_stats s;
		if (engine_seq_layer_stats(e, seq, l, &s))
			continue;
		out->steps += s.steps;
		out->head_checks += s.head_checks;
		out->corrections += s.corrections;
		out->pages_selected += s.pages_selected;
		out->pages_recalled += s.pages_recalled;
		out->bytes_recalled += s.bytes_recalled;
		out->ns_select += s.ns_select;
		out->ns_recall_wait += s.ns_recall_wait;
		out->ns_recall_hidden += s.ns_recall_hidden;
		out->ns_attend += s.ns_attend;
		out->calibrations += s.calibrations;
		out->ns_calibrate += s.ns_calibrate;
		out->full_steps += s.full_steps;
		out->ns_full += s.ns_full;
		out->tokens_fetched += s.tokens_fetched;
	}
}

/* One row: a fresh engine and sequence resumed at ctx tokens, warm-up, measured steps. */
static int run_row(const struct fkv_model *m, struct backend *be, struct hostkv *h,
		   const struct bench_args *a, int ctx, const struct row *rw, struct result *res)
{
	char err[512] = "";
	struct engine *e = NULL;
	struct hostkv_seq *hs = NULL;
	struct engine_opts eo = { .max_ctx = ctx + a->warmup + a->steps + 1, .max_seqs = 1,
				  .policy = rw->policy, .kv = a->kv };
	eo.kv.tau = rw->tau;
	eo.kv.top_p = rw->top_p;
	eo.kv.kv_bits = rw->bits;
	eo.kv.no_speculation = rw->abl.no_speculation;
	eo.kv.recall_fragmented = rw->abl.recall_fragmented;
	eo.kv.recall_single_buffer = rw->abl.recall_single_buffer;
	int seq = -1, V = m->cfg.vocab_size, L = m->cfg.n_layers;
	float *lg = malloc((size_t)V * sizeof *lg);
	int ret = lg ? 0 : -ENOMEM;
	if (!ret)
		ret = engine_new(&e, m, be, &eo, err, sizeof err);
	struct kv_geom g;
	if (!ret) {
		engine_kv_geom(e, &g);
		char name[64];
		snprintf(name, sizeof name, "bench-%d-%s-%g-%g-%d", ctx, rw->label, (double)rw->tau,
			 (double)rw->top_p, rw->bits);
		ret = hostkv_seq_open(h, name, m->fingerprint, L, &g, true, &hs, err, sizeof err);
	}
	if (!ret)
		ret = fill_host(hs, &g, L, ctx, V, err, sizeof err);
	if (!ret)
		ret = engine_seq_open(e, hs, &seq, err, sizeof err);
	/* The engine resumes at the committed length, minus the last token when no id was kept
	 * past it: that one is run again first, as a resume does. */
	const int32_t *kept;
	int32_t tok = 0;
	int64_t len = ret ? 0 : engine_seq_len(e, seq);
	if (!ret && (len < ctx - 1 || len > ctx || hostkv_seq_tokens(hs, &kept) != ctx)) {
		snprintf(err, sizeof err, "resumed at %lld tokens of %d", (long long)len, ctx);
		ret = -EPROTO;
	}
	if (!ret)
		tok = kept[len < ctx ? len : ctx - 1];
	struct kv_layer_stats s0 = { 0 }, s1;
	struct engine_spec_stats h0 = { 0 }, h1 = { 0 };
	double t0 = 0.0, *each = calloc((size_t)a->steps, sizeof *each);
	if (!ret && !each)
		ret = -ENOMEM;
	for (int i = 0; i < a->warmup + a->steps && !ret; i++) {
		if (i == a->warmup) {
			stats_sum(e, seq, L, &s0);
			engine_seq_spec_stats(e, seq, &h0);
			t0 = clock_ms_f();
		}
		double ts = clock_ms_f();
		ret = engine_decode(e, 1, &seq, &tok, lg, err, sizeof err);
		tok = sampler_argmax(lg, V);
		if (i >= a->warmup)
			each[i - a->warmup] = clock_ms_f() - ts;
	}
	if (!ret) {
		double n = a->steps, ms = (clock_ms_f() - t0) / n;
		stats_sum(e, seq, L, &s1);
		engine_seq_spec_stats(e, seq, &h1);
		struct kv_stats ks;
		engine_seq_stats(e, seq, &ks);
		const double b16 = 4.0 * L * m->cfg.n_kv_heads * m->cfg.head_dim;
		qsort(each, (size_t)a->steps, sizeof *each, cmp_double);
		*res = (struct result){
			.step_ms = ms,
			.median_ms = a->steps % 2 ? each[a->steps / 2] :
				     (each[a->steps / 2 - 1] + each[a->steps / 2]) / 2.0,
			.select_ms = (double)(s1.ns_select - s0.ns_select) / 1e6 / n,
			.wait_ms = (double)(s1.ns_recall_wait - s0.ns_recall_wait) / 1e6 / n,
			.hidden_ms = (double)(s1.ns_recall_hidden - s0.ns_recall_hidden) / 1e6 / n,
			.attend_ms = (double)(s1.ns_attend - s0.ns_attend) / 1e6 / n,
			.pages_recalled = (double)(s1.pages_recalled - s0.pages_recalled) / n,
			.mib_recalled = (double)(s1.bytes_recalled - s0.bytes_recalled) /
					(1024.0 * 1024.0) / n,
			.has_corr = s1.head_checks > s0.head_checks,
			.counted = s1.ns_attend > 0 || s1.ns_full > 0,
			.full_ms = (double)(s1.ns_full - s0.ns_full) / 1e6 / n,
			.has_full = s1.full_steps > 0,
			.pages_head = s1.steps > s0.steps && !s1.full_steps ?
				(double)(s1.pages_selected - s0.pages_selected) /
				((double)(s1.steps - s0.steps) * m->cfg.n_kv_heads) : 0.0,
			.ms_cal = s1.calibrations ? (double)s1.ns_calibrate / 1e6 /
						    (double)s1.calibrations : 0.0,
			.rows_fetched = (double)(s1.tokens_fetched - s0.tokens_fetched) / n,
			.kv_ratio = (double)ks.device_bytes / (double)ks.tokens / b16,
			.has_hit = h1.checked > h0.checked,
			.hit_rate = h1.checked > h0.checked ? (double)(h1.hits - h0.hits) /
							       (double)(h1.checked - h0.checked) : 0.0,
		};
		if (res->has_corr)
			res->corr_rate = (double)(s1.corrections - s0.corrections) /
					 (double)(s1.head_checks - s0.head_checks);
		if (s1.steps > s0.steps)
			res->full_rate = (double)(s1.full_steps - s0.full_steps) /
					 (double)(s1.steps - s0.steps);
		/* refreshkv's selection and recall waits happen inside its full steps. */
		res->rest_ms = ms - res->attend_ms - (res->has_full ? res->full_ms :
						      res->select_ms + res->wait_ms);
	}
	if (ret)
		fprintf(stderr, "decode_bench: ctx %d, %s: %s\n", ctx, rw->label,
			err[0] ? err : strerror(-ret));
	if (seq >= 0)
		engine_seq_free(e, seq);
	if (hs)
		hostkv_seq_close(hs, true);
	engine_free(e);
	free(each);
	free(lg);
	return ret;
}

/* Policies without retrieval counters (full) get "-" in the breakdown: their attention is in
 * "rest". tau only matters to freekv, P to hardkv and freekv. */
static void print_row(int ctx, const struct row *rw, const struct result *r)
{
	char corr[16] = "n/a", tau[16] = "-", tp[16] = "-", cal[16] = "-", b[6][16];
	char full[16] = "-", rate[16] = "n/a", hit[16] = "n/a", rows[16] = "-";
	if (r->has_corr)
		snprintf(corr, sizeof corr, "%.3f", r->corr_rate);
	if (r->has_full) {
		snprintf(full, sizeof full, "%.2f", r->full_ms);
		snprintf(rate, sizeof rate, "%.3f", r->full_rate);
	}
	if (!strcmp(rw->policy, "freekv"))
		snprintf(tau, sizeof tau, "%g", (double)rw->tau);
	if (!strcmp(rw->policy, "specache")) {
		snprintf(tau, sizeof tau, "b%d", rw->bits);
		snprintf(rows, sizeof rows, "%.1f", r->rows_fetched);
	}
	if (r->has_hit)
		snprintf(hit, sizeof hit, "%.3f", r->hit_rate);
	if (rw->top_p > 0.0f)
		snprintf(tp, sizeof tp, "%g", (double)rw->top_p);
	else if (!strcmp(rw->policy, "hardkv"))
		snprintf(tp, sizeof tp, "0.9");
	if (r->ms_cal > 0.0)
		snprintf(cal, sizeof cal, "%.1f", r->ms_cal);
	double v[6] = { r->select_ms, r->wait_ms, r->hidden_ms, r->attend_ms, r->pages_recalled,
			r->pages_head };
	for (int i = 0; i < 6; i++)
		snprintf(b[i], sizeof b[i], r->counted && !(i == 5 && (r->has_full || !v[5])) ?
			 (i < 4 ? "%.2f" : "%.1f") : "-", v[i]);
	printf("| %6d | %-17s | %4s | %4s | %8.2f | %8.2f | %7s | %8s | %7s | %7s | %7s | %8.2f |"
	       " %10s | %7.2f | %7s | %6s | %5s | %5s | %9s | %8.4f | %5s |\n",
	       ctx, rw->label, tau, tp, r->step_ms, r->median_ms, b[0], b[1], b[2], b[3], full,
	       r->rest_ms, b[4], r->mib_recalled, b[5], cal, corr, rate, rows, r->kv_ratio, hit);
	fflush(stdout);
}

/* The per-context summary: freekv rows against the quest row, and the rows with top-p
 * selection (hardkv, freekv with a P) in pages per head and recall against quest's. */
static void print_summary(const struct bench_args *a, int ctx, const struct result *res)
{
	const struct result *q = NULL;
	for (int i = 0; i < a->n_rows; i++)
		if (!strcmp(a->rows[i].label, "quest")) /* the plain one, not an ablation */
			q = &res[i];
	for (int i = 0; i < a->n_rows; i++) {
		if (strcmp(a->rows[i].policy, "freekv"))
			continue;
		const struct result *f = &res[i];
		double hf = f->hidden_ms + f->wait_ms > 0 ?
				    f->hidden_ms / (f->hidden_ms + f->wait_ms) : 0.0;
		char tp[24] = "";
		if (a->rows[i].top_p > 0.0f)
			snprintf(tp, sizeof tp, " P %g", (double)a->rows[i].top_p);
		printf("ctx %6d: %s tau %g%s: hidden fraction of recall %.3f", ctx,
		       a->rows[i].label, (double)a->rows[i].tau, tp, hf);
		if (q) {
			double hq = q->hidden_ms + q->wait_ms > 0 ?
					    q->hidden_ms / (q->hidden_ms + q->wait_ms) : 0.0;
			printf(" (quest %.3f); median step time vs quest %.3f; exposed recall "
			       "vs quest %.3f", hq, f->median_ms / q->median_ms,
			       q->wait_ms > 0 ? f->wait_ms / q->wait_ms : 0.0);
		}
		printf("\n");
	}
	for (int i = 0; i < a->n_rows && q && q->pages_head > 0.0; i++) {
		const struct row *rw = &a->rows[i];
		if (strcmp(rw->policy, "hardkv") && !(rw->top_p > 0.0f && !strcmp(rw->policy, "freekv")))
			continue;
		const struct result *h = &res[i];
		printf("ctx %6d: %s P %g: pages per head vs quest %.3f; MiB recalled vs quest %.3f; "
		       "median step time vs quest %.3f\n", ctx, rw->policy,
		       rw->top_p > 0.0f ? (double)rw->top_p : 0.9, h->pages_head / q->pages_head,
		       q->mib_recalled > 0 ? h->mib_recalled / q->mib_recalled : 0.0,
		       h->median_ms / q->median_ms);
	}
}

static int run_all(const struct bench_args *a, const char *model_dir, const char *label)
{
	struct fkv_model m;
	char err[1024];
	int ret = model_load(model_dir, &m, err, sizeof err);
	if (ret) {
		fprintf(stderr, "decode_bench: cannot load %s: %s\n", model_dir, err);
		return ret;
	}
	struct backend *be = NULL;
	struct hostkv *h = NULL;
	int max_ctx = 0;
	for (int i = 0; i < a->n_ctx; i++)
		max_ctx = a->ctx[i] > max_ctx ? a->ctx[i] : max_ctx;
	/* One host copy at a time: the largest context's blocks, all layers, plus slack. */
	size_t tok_bytes = (size_t)m.cfg.n_kv_heads * m.cfg.head_dim * 2 *
			   dtype_size(m.cfg.dtype) * (size_t)m.cfg.n_layers;
	struct hostkv_opts ho = { .worker_name = "decode_bench",
				  .embedded_bytes = tok_bytes * (size_t)(max_ctx + 4096) +
						    (64u << 20) };
	ret = backend_cpu_new(&be, a->threads);
	if (ret)
		fprintf(stderr, "decode_bench: cannot create the CPU backend\n");
	if (!ret && (ret = hostkv_open(&ho, &h, err, sizeof err)))
		fprintf(stderr, "decode_bench: %s\n", err);
	if (!ret) {
		char th[32] = "all";
		if (a->threads)
			snprintf(th, sizeof th, "%d", a->threads);
		printf("decode_bench: %s; CPU backend, %s threads (%ld cores, load %.2f)\n", label,
		       th, sysconf(_SC_NPROCESSORS_ONLN), loadavg());
		printf("page %d, budget %d, sink %d, window %d, full layers %d, refresh stride %d, "
		       "refresh threshold %g; context restored from a synthetic host copy, then %d "
		       "warm-up and %d measured decode steps; times are ms per step (hidden: "
		       "copy-thread recall overlapped with the step, not part of the step time; full: "
		       "refreshkv's full steps and their rate; KV ratio: device KV bytes per token / "
		       "a 16-bit copy's; specache: top-k %d, rows fetched per step, hit: speculative "
		       "token = the next token)\n\n",
		       a->kv.page, a->kv.budget, a->kv.sink, a->kv.window, a->kv.full_layers,
		       a->kv.refresh_stride, (double)a->kv.refresh_threshold, a->warmup, a->steps,
		       a->kv.spec_topk);
		printf("|    ctx | policy            |  tau |    P |  step ms |   median |  select | exposed  |"
		       "  hidden |  attend |    full |     rest | head-pages | MiB rec | pg/head |"
		       " ms/cal | corr  | full  | rows/step | KV ratio | hit   |\n");
		printf("|--------|-------------------|------|------|----------|----------|---------|----------|"
		       "---------|---------|---------|----------|------------|---------|---------|"
		       "--------|-------|-------|-----------|----------|-------|\n");
	}
	struct result res[MAX_LIST];
	for (int c = 0; c < a->n_ctx && !ret; c++) {
		for (int i = 0; i < a->n_rows && !ret; i++) {
			ret = run_row(&m, be, h, a, a->ctx[c], &a->rows[i], &res[i]);
			if (!ret)
				print_row(a->ctx[c], &a->rows[i], &res[i]);
		}
		if (!ret)
			print_summary(a, a->ctx[c], res);
	}
	if (!ret)
		printf("\nload average %.2f at end\n", loadavg());
	hostkv_close(h);
	backend_free(be);
	model_free(&m);
	return ret;
}

int main(int argc, char **argv)
{
	struct bench_args a;
	if (parse(argc, argv, &a)) {
		usage(stderr);
		return 2;
	}
	if (a.model)
		return run_all(&a, a.model, a.model) ? 1 : 0;
	char dir[] = "/tmp/freekv-decode-bench-XXXXXX", err[512], label[160];
	if (!mkdtemp(dir)) {
		perror("decode_bench: mkdtemp");
		return 1;
	}
	int ret = synth_write("llama-3.1-8b", a.layers, FKV_BF16, dir, 1, a.vocab, err, sizeof err);
	if (ret)
		fprintf(stderr, "decode_bench: synth_write: %s\n", err);
	snprintf(label, sizeof label, "synthetic llama-3.1-8b geometry, %d layers, vocab %d, bf16",
		 a.layers, a.vocab);
	if (!ret)
		ret = run_all(&a, dir, label);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd))
		fprintf(stderr, "decode_bench: could not remove %s\n", dir);
	return ret ? 1 : 0;
}
