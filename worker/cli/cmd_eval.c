/* cmd_eval — `kvworker eval`: the accuracy harness of the retrieval policies (docs/eval.md).
 *
 * The text is tokenized once and cut into consecutive windows of at most ctx tokens (BOS first
 * when the model has one), exactly as `kvworker perplexity` cuts it. Every policy runs over the
 * same windows teacher-forced, each window a fresh sequence over its own host copy in an
 * embedded store (every policy writes through to it; quest and freekv recall from it, and the
 * copy is dropped after the window). The first --prefill tokens go in as one prefill, then
 * every further token of the window goes through the decode path one step at a time, so a
 * retrieval policy sees the sequence grow past its budget and compresses as it would while
 * generating. Each position's logits score the next token of the text.
 *
 * `full` always runs first (added when not listed): it is the reference of the top-1 agreement,
 * the fraction of scored positions whose argmax equals full's. Per policy: perplexity over all
 * scored tokens, agreement, correction rate (policies that check for correction), full-step
 * rate (refreshkv), pages selected and recalled, bytes recalled, the selected pages a KV head
 * attended per compressed step as a fraction of quest's k = (B - S - W) / p (hardkv and freekv
 * with --kv-top-p attend fewer; n/a for refreshkv, which keeps tokens), rows fetched (refreshkv,
 * specache), the retrieval times the policy counted, wall time, device KV bytes per token at the
 * windows' ends (and against 16-bit K/V), and the speculative-token hit rate (specache: the
 * speculative token equalled the next token of the text).
 * A table on stdout, or with --json one JSON document (json-c; doubles printed round-trip
 * exact, so equal values print equal). Notices go to stderr. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "backend.h"
#include "cmd_common.h"
#include "engine.h"
#include "hostkv.h"
#include "policy_opts.h"
#include "sampler.h"
#include "tokenizer.h"

#define EVAL_MAX_POLICIES 8

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker eval -m MODEL -f TEXTFILE [options] [retrieval options]\n"
		"  -m, --model PATH       .gguf file or Hugging Face folder\n"
		"  -f, --file PATH        text to score; '-' reads stdin\n"
		"      --policies LIST    comma-separated policies (default\n"
		"                         full,streaming,quest,freekv,hardkv,refreshkv;\n"
		"                         built: %s); full always runs as the reference\n"
		"  -c, --ctx N            window length in tokens (default: min(512, the model's))\n"
		"      --prefill N        tokens of each window prefilled before decoding (default 1)\n"
		"      --max-tokens N     stop after scoring N tokens (default: the whole file)\n"
		"  -t, --threads N        compute threads (default: all cores)\n"
		"      --backend B        cuda, cpu or auto (default: cuda when a device is present)\n"
		"      --json             one JSON document instead of the table\n"
		"  -h, --help             this text\n"
		"retrieval options (scaled to the window length unless given):\n  %s\n",
		kvcache_policy_names(), policy_opts_usage());
}

struct eval_args {
	const char *model, *file;
	const char *backend; /* NULL: auto */
	const char *policies[EVAL_MAX_POLICIES];
	int n_policies;
	long ctx, prefill, max_tokens, threads;
	bool json;
	struct policy_opts po;
	char policy_list[256];
};

/* One policy's results over every window. */
struct eval_run {
	const char *policy;
	double nll;		 /* summed over scored tokens */
	long scored;		 /* tokens scored */
	long agree;		 /* positions whose argmax equals full's */
	int32_t *argmax;	 /* (scored) */
	struct kv_layer_stats st; /* summed over windows and layers */
	struct kv_layer_stats *layer; /* (n_layers) summed over windows */
	int n_layers;
	int n_kv;		 /* KV heads of the model */
	long windows;		 /* sequences run */
	double ms;		 /* wall time of the windows */
	int64_t dev_bytes, dev_tokens; /* device KV bytes and tokens at each window's end, summed */
	struct engine_spec_stats spec; /* speculative tokens (specache), summed */
};

static int bad(const char *flag, const char *val)
{
	fprintf(stderr, "kvworker eval: invalid value '%s' for %s\n", val ? val : "", flag);
	return CMD_USAGE;
}

/* Splits list into names (in place, into a->policy_list); full goes first, once. */
static int set_policies(struct eval_args *a, const char *list)
{
	if (strlen(list) >= sizeof a->policy_list)
		return bad("--policies", list);
	strcpy(a->policy_list, list);
	a->n_policies = 0;
	a->policies[a->n_policies++] = "full";
	for (char *save = NULL, *p = strtok_r(a->policy_list, ",", &save); p;
	     p = strtok_r(NULL, ",", &save)) {
		if (!kvcache_policy(p)) {
			fprintf(stderr, "kvworker eval: unknown policy '%s' (built: %s)\n", p,
				kvcache_policy_names());
			return CMD_USAGE;
		}
		bool dup = false;
		for (int k = 0; k < a->n_policies; k++)
			dup |= !strcmp(a->policies[k], p);
		if (dup)
			continue;
		if (a->n_policies == EVAL_MAX_POLICIES)
			return bad("--policies", list);
		a->policies[a->n_policies++] = p;
	}
	return 0;
}

/* 0, -1 after --help, or CMD_USAGE. */
static int parse(int argc, char **argv, struct eval_args *a)
{
	*a = (struct eval_args){ .prefill = 1 };
	policy_opts_default(&a->po);
	const char *list = "full,streaming,quest,freekv,hardkv,refreshkv";
	char err[256];
	enum { O_JSON = 256, O_POLICIES, O_PREFILL, O_MAXTOK, O_BACKEND };
	static const struct option own[] = {
		{ "help", no_argument, NULL, 'h' },	{ "json", no_argument, NULL, O_JSON },
		{ "model", required_argument, NULL, 'm' }, { "file", required_argument, NULL, 'f' },
		{ "policies", required_argument, NULL, O_POLICIES },
		{ "ctx", required_argument, NULL, 'c' }, { "ctx-size", required_argument, NULL, 'c' },
		{ "prefill", required_argument, NULL, O_PREFILL },
		{ "max-tokens", required_argument, NULL, O_MAXTOK },
		{ "threads", required_argument, NULL, 't' },
		{ "backend", required_argument, NULL, O_BACKEND },
	};
	struct option opts[96];
	cmd_options(opts, 96, own, sizeof own / sizeof *own, false);
	optind = 0;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":hm:f:c:t:", opts, NULL)) != -1) {
		const char *v = optarg;
		switch (c) {
		case 'h': usage(stdout); return -1;
		case O_JSON: a->json = true; break;
		case 'm': a->model = v; break;
		case 'f': a->file = v; break;
		case O_POLICIES: list = v; break;
		case 'c':
			if (cmd_parse_long(v, 2, 1L << 24, &a->ctx))
				return bad("--ctx", v);
			break;
		case O_PREFILL:
			if (cmd_parse_long(v, 1, 1L << 24, &a->prefill))
				return bad("--prefill", v);
			break;
		case O_MAXTOK:
			if (cmd_parse_long(v, 1, 1L << 30, &a->max_tokens))
				return bad("--max-tokens", v);
			break;
		case 't':
			if (cmd_parse_long(v, 1, 4096, &a->threads))
				return bad("-t", v);
			break;
		case O_BACKEND:
			if (strcmp(v, "cuda") && strcmp(v, "cpu") && strcmp(v, "auto"))
				return bad("--backend", v);
			a->backend = v;
			break;
		case '?':
		case ':':
			cmd_getopt_error("kvworker eval", c, argv);
			return CMD_USAGE;
		case POLICY_OPT_POLICY: /* eval runs a list */
			fprintf(stderr, "kvworker eval: use --policies LIST (eval compares several)\n");
			return CMD_USAGE;
		default: {
			int r = policy_opts_apply(&a->po, c, v, err, sizeof err);
			if (r < 0) {
				fprintf(stderr, "kvworker eval: %s\n", err);
				return CMD_USAGE;
			}
			break;
		}
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvworker eval: unexpected argument '%s'\n", argv[optind]);
		return CMD_USAGE;
	}
	if (!a->model || !a->file) {
		fprintf(stderr, "kvworker eval: need -m MODEL and -f TEXTFILE\n");
		return CMD_USAGE;
	}
	return set_policies(a, list);
}

static void stats_add(struct kv_layer_stats *d, const struct kv_layer_stats *s)
{
	d->steps += s->steps;
	d->head_checks += s->head_checks;
	d->corrections += s->corrections;
	d->pages_selected += s->pages_selected;
	d->pages_recalled += s->pages_recalled;
	d->bytes_recalled += s->bytes_recalled;
	d->ns_select += s->ns_select;
	d->ns_recall_wait += s->ns_recall_wait;
	d->ns_recall_hidden += s->ns_recall_hidden;
	d->ns_attend += s->ns_attend;
	d->pages_max = s->pages_max > d->pages_max ? s->pages_max : d->pages_max;
	d->calibrations += s->calibrations;
	d->ns_calibrate += s->ns_calibrate;
	d->full_steps += s->full_steps;
	d->tokens_fetched += s->tokens_fetched;
	d->ns_full += s->ns_full;
}

/* Scores the logits rows of positions [first, first + n) of win against the next tokens. */
static void score_rows(struct eval_run *r, const float *logits, int V, const int32_t *win,
		       long first, long n)
{
	for (long i = 0; i < n; i++) {
		const float *row = logits + (size_t)i * V;
		r->nll += cmd_nll(row, V, win[first + i + 1]);
		r->argmax[r->scored++] = sampler_argmax(row, V);
	}
}

/* One window as a fresh sequence over a fresh host copy: prefill, then decode step by step. */
static int eval_window(struct engine *e, struct hostkv *h, const struct fkv_model *m,
		       struct eval_run *r, const int32_t *win, long len, long prefill,
		       float *logits)
{
	char err[512], name[64];
	int V = engine_vocab(e), seq;
	struct kv_geom g;
	struct hostkv_seq *hs = NULL;
	engine_kv_geom(e, &g);
	snprintf(name, sizeof name, "eval-%s-%ld", r->policy, r->windows);
	int ret = hostkv_seq_open(h, name, m->fingerprint, m->cfg.n_layers, &g, true, &hs, err,
				  sizeof err);
	if (!ret)
		ret = engine_seq_open(e, hs, &seq, err, sizeof err);
	if (ret) {
		fprintf(stderr, "kvworker eval: %s: %s\n", r->policy, err);
		if (hs)
			hostkv_seq_close(hs, true);
		return ret;
	}
	long np = prefill < len - 1 ? prefill : len - 1;
	ret = engine_prefill(e, seq, win, (int)np, logits, true, err, sizeof err);
	if (!ret)
		score_rows(r, logits, V, win, 0, np);
	for (long i = np; i < len - 1 && !ret; i++) {
		ret = engine_decode(e, 1, &seq, &win[i], logits, err, sizeof err);
		if (!ret)
			score_rows(r, logits, V, win, i, 1);
	}
	struct kv_stats ks;
	struct engine_spec_stats sp;
	if (!ret && engine_seq_stats(e, seq, &ks) == 0) {
		stats_add(&r->st, &ks.sum);
		r->dev_bytes += ks.device_bytes;
		r->dev_tokens += ks.tokens;
	}
	if (!ret && engine_seq_spec_stats(e, seq, &sp) == 0) {
		r->spec.checked += sp.checked;
		r->spec.hits += sp.hits;
	}
	for (int l = 0; l < r->n_layers && !ret; l++) {
		struct kv_layer_stats ls;
		if (engine_seq_layer_stats(e, seq, l, &ls) == 0)
			stats_add(&r->layer[l], &ls);
	}
	if (ret)
		fprintf(stderr, "kvworker eval: %s: %s\n", r->policy, err);
	engine_seq_free(e, seq);
	hostkv_seq_close(hs, true);
	return ret;
}

/* Runs one policy over every window of the n tokens of toks (the text, without BOS). */
static int eval_policy(const struct fkv_model *m, struct backend *be, struct hostkv *h,
		       const struct eval_args *a, const int32_t *toks, long n, int bos,
		       struct eval_run *r)
{
	char err[512];
	struct engine *e = NULL;
	struct engine_opts eo = { .max_ctx = a->ctx, .max_seqs = 1, .policy = r->policy,
				  .kv = a->po.kv };
	if (engine_new(&e, m, be, &eo, err, sizeof err)) {
		fprintf(stderr, "kvworker eval: %s: %s\n", r->policy, err);
		return CMD_FAIL;
	}
	int V = engine_vocab(e);
	long np = a->prefill < a->ctx ? a->prefill : a->ctx;
	int32_t *win = malloc((size_t)a->ctx * sizeof *win);
	float *logits = malloc((size_t)np * (size_t)V * sizeof *logits);
	int ret = win && logits ? 0 : -ENOMEM;
	if (ret)
		fprintf(stderr, "kvworker eval: out of memory for a %ld-token window\n", a->ctx);
	long per = bos >= 0 ? a->ctx - 1 : a->ctx;
	double t0 = clock_ms_f();
	for (long start = 0; start < n && !ret; start += per) {
		long len = cmd_window(win, toks, n, start, per, bos);
		if (len < 2)
			break;
		ret = eval_window(e, h, m, r, win, len, np, logits);
		r->windows++;
	}
	r->ms = clock_ms_f() - t0;
	free(win);
	free(logits);
	engine_free(e);
	return ret ? CMD_FAIL : 0;
}

static double ppl(const struct eval_run *r)
{
	return r->scored ? exp(r->nll / (double)r->scored) : NAN;
}

static double ns_ms(int64_t ns)
{
	return (double)ns / 1e6;
}

/* Device KV bytes per token at the end of the windows, and against 16-bit K and V of every
 * layer (b16 bytes a token). */
static double dev_per_token(const struct eval_run *r)
{
	return r->dev_tokens ? (double)r->dev_bytes / (double)r->dev_tokens : NAN;
}

/* Selected pages a KV head attended per compressed step; NAN without retrieval steps. */
static double pages_per_head(const struct kv_layer_stats *st, int n_kv)
{
	return st->steps ? (double)st->pages_selected / ((double)st->steps * n_kv) : NAN;
}

/* The same as a fraction of quest's, which attends k = (B - S - W) / p pages every step. */
static double pages_vs_quest(const struct kv_layer_stats *st, int n_kv,
			     const struct kv_policy_opts *k)
{
	return pages_per_head(st, n_kv) / (double)((k->budget - k->sink - k->window) / k->page);
}

/* --kv-top-p as given, or what 0 means. */
static void top_p_str(const struct kv_policy_opts *k, char *buf, size_t len)
{
	if (k->top_p > 0.0f)
		snprintf(buf, len, "%g", (double)k->top_p);
	else
		snprintf(buf, len, "default (hardkv 0.9, freekv top-k)");
}

static void print_table(const struct eval_args *a, const struct eval_run *runs, double b16)
{
	const struct kv_policy_opts *k = &a->po.kv;
	char tp[64];
	top_p_str(k, tp, sizeof tp);
	printf("scored %ld tokens (windows: %ld of up to %ld tokens; prefill %ld, then decode); "
	       "page %d, budget %d, sink %d, window %d, tau %g, full layers %d, kv-top-p %s, "
	       "recalibrate %d, refresh stride %d, refresh threshold %g, kv bits %d, "
	       "spec top-k %d\n\n",
	       runs[0].scored, runs[0].windows, a->ctx, a->prefill, k->page, k->budget, k->sink,
	       k->window, (double)k->tau, k->full_layers, tp,
	       k->recalibrate ? k->recalibrate : 128, k->refresh_stride,
	       (double)k->refresh_threshold, k->kv_bits, k->spec_topk);
	printf("| %-9s | %10s | %9s | %10s | %9s | %12s | %9s | %14s | %12s | %12s | %9s | %9s |"
	       " %9s | %9s | %9s | %8s | %8s | %8s |\n",
	       "policy", "perplexity", "top-1 agr", "correction", "full rate", "pages sel",
	       "vs quest", "pages recalled", "rows fetched", "MiB recalled", "select ms",
	       "wait ms", "hidden ms", "attend ms", "total ms", "B/token", "vs 16bit", "spec hit");
	printf("|-----------|------------|-----------|------------|-----------|--------------|"
	       "-----------|----------------|--------------|--------------|-----------|-----------|"
	       "-----------|-----------|-----------|----------|----------|----------|\n");
	for (int i = 0; i < a->n_policies; i++) {
		const struct eval_run *r = &runs[i];
		char corr[32] = "n/a", full[32] = "n/a", vs[32] = "n/a", hit[32] = "n/a";
		if (r->st.head_checks)
			snprintf(corr, sizeof corr, "%.4f", kv_correction_rate(&r->st));
		if (r->st.full_steps)
			snprintf(full, sizeof full, "%.4f", kv_full_step_rate(&r->st));
		else if (r->st.steps && r->st.pages_selected)
			snprintf(vs, sizeof vs, "%.4f", pages_vs_quest(&r->st, r->n_kv, k));
		if (r->spec.checked)
			snprintf(hit, sizeof hit, "%.4f", (double)r->spec.hits / (double)r->spec.checked);
		printf("| %-9s | %10.4f | %9.4f | %10s | %9s | %12lld | %9s | %14lld | %12lld |"
		       " %12.2f | %9.1f | %9.1f | %9.1f | %9.1f | %9.1f | %8.1f | %8.4f | %8s |\n",
		       r->policy, ppl(r), r->scored ? (double)r->agree / (double)r->scored : NAN,
		       corr, full, (long long)r->st.pages_selected, vs,
		       (long long)r->st.pages_recalled, (long long)r->st.tokens_fetched,
		       (double)r->st.bytes_recalled / (1024.0 * 1024.0), ns_ms(r->st.ns_select),
		       ns_ms(r->st.ns_recall_wait), ns_ms(r->st.ns_recall_hidden),
		       ns_ms(r->st.ns_attend), r->ms, dev_per_token(r), dev_per_token(r) / b16, hit);
	}
}

static void jset(json_object *o, const char *k, json_object *v)
{
	json_object_object_add(o, k, v);
}

/* The counters of s as members of o; pages per head (and as a fraction of quest's) only with
 * retrieval steps. */
static void jstats(json_object *o, const struct kv_layer_stats *s, int n_kv,
		   const struct kv_policy_opts *k)
{
	jset(o, "correction_rate", s->head_checks ?
		json_object_new_double(kv_correction_rate(s)) : NULL);
	jset(o, "head_checks", json_object_new_int64(s->head_checks));
	jset(o, "corrections", json_object_new_int64(s->corrections));
	jset(o, "retrieval_steps", json_object_new_int64(s->steps));
	jset(o, "pages_selected", json_object_new_int64(s->pages_selected));
	jset(o, "pages_recalled", json_object_new_int64(s->pages_recalled));
	jset(o, "bytes_recalled", json_object_new_int64(s->bytes_recalled));
	jset(o, "ms_select", json_object_new_double(ns_ms(s->ns_select)));
	jset(o, "ms_recall_wait", json_object_new_double(ns_ms(s->ns_recall_wait)));
	jset(o, "ms_recall_hidden", json_object_new_double(ns_ms(s->ns_recall_hidden)));
	jset(o, "ms_attend", json_object_new_double(ns_ms(s->ns_attend)));
	/* refreshkv keeps tokens, specache rows, not pages */
	const bool pages = s->steps && !s->full_steps && s->pages_selected;
	jset(o, "pages_per_head", pages ? json_object_new_double(pages_per_head(s, n_kv)) : NULL);
	jset(o, "pages_fraction_of_quest", pages ?
		json_object_new_double(pages_vs_quest(s, n_kv, k)) : NULL);
	jset(o, "pages_max_per_head", json_object_new_int64(s->pages_max));
	jset(o, "calibrations", json_object_new_int64(s->calibrations));
	jset(o, "ms_calibrate", json_object_new_double(ns_ms(s->ns_calibrate)));
	jset(o, "full_step_rate", s->full_steps ?
		json_object_new_double(kv_full_step_rate(s)) : NULL);
	jset(o, "full_steps", json_object_new_int64(s->full_steps));
	jset(o, "tokens_fetched", json_object_new_int64(s->tokens_fetched));
	jset(o, "ms_full", json_object_new_double(ns_ms(s->ns_full)));
}

static int print_json(const struct eval_args *a, const struct eval_run *runs, double b16)
{
	const struct kv_policy_opts *k = &a->po.kv;
	json_object *doc = json_object_new_object(), *ret = json_object_new_object();
	json_object *arr = json_object_new_array();
	if (!doc || !ret || !arr)
		goto oom;
	jset(doc, "model", json_object_new_string(a->model));
	jset(doc, "file", json_object_new_string(a->file));
	jset(doc, "tokens", json_object_new_int64(runs[0].scored));
	jset(doc, "windows", json_object_new_int64(runs[0].windows));
	jset(doc, "ctx", json_object_new_int64(a->ctx));
	jset(doc, "prefill", json_object_new_int64(a->prefill));
	jset(ret, "page", json_object_new_int(k->page));
	jset(ret, "budget", json_object_new_int(k->budget));
	jset(ret, "sink", json_object_new_int(k->sink));
	jset(ret, "window", json_object_new_int(k->window));
	char tau[32]; /* the float as given, not its double expansion */
	snprintf(tau, sizeof tau, "%g", (double)k->tau);
	jset(ret, "tau", json_object_new_double_s(k->tau, tau));
	jset(ret, "full_layers", json_object_new_int(k->full_layers));
	char tp[32]; /* as given; 0: each policy's default */
	snprintf(tp, sizeof tp, "%g", (double)k->top_p);
	jset(ret, "kv_top_p", json_object_new_double_s(k->top_p, tp));
	jset(ret, "recalibrate", json_object_new_int(k->recalibrate ? k->recalibrate : 128));
	jset(ret, "refresh_stride", json_object_new_int(k->refresh_stride));
	char thr[32];
	snprintf(thr, sizeof thr, "%g", (double)k->refresh_threshold);
	jset(ret, "refresh_threshold", json_object_new_double_s(k->refresh_threshold, thr));
	jset(ret, "kv_bits", json_object_new_int(k->kv_bits));
	jset(ret, "spec_topk", json_object_new_int(k->spec_topk));
	jset(doc, "retrieval", ret);
	ret = NULL;
	for (int i = 0; i < a->n_policies; i++) {
		const struct eval_run *r = &runs[i];
		json_object *p = json_object_new_object();
		if (!p)
			goto oom;
		json_object_array_add(arr, p);
		jset(p, "policy", json_object_new_string(r->policy));
		jset(p, "tokens", json_object_new_int64(r->scored));
		jset(p, "nll_sum", json_object_new_double(r->nll));
		jset(p, "perplexity", json_object_new_double(ppl(r)));
		jset(p, "agree", json_object_new_int64(r->agree));
		jset(p, "agreement", json_object_new_double((double)r->agree / (double)r->scored));
		jstats(p, &r->st, r->n_kv, k);
		jset(p, "ms_total", json_object_new_double(r->ms));
		jset(p, "device_bytes_per_token", r->dev_tokens ?
		     json_object_new_double(dev_per_token(r)) : NULL);
		jset(p, "device_ratio_vs_16bit", r->dev_tokens ?
		     json_object_new_double(dev_per_token(r) / b16) : NULL);
		jset(p, "spec_hit_rate", r->spec.checked ?
		     json_object_new_double((double)r->spec.hits / (double)r->spec.checked) : NULL);
		json_object *layers = json_object_new_array();
		if (!layers)
			goto oom;
		jset(p, "layers", layers);
		for (int l = 0; l < r->n_layers; l++) {
			json_object *lo = json_object_new_object();
			if (!lo)
				goto oom;
			json_object_array_add(layers, lo);
			jstats(lo, &r->layer[l], r->n_kv, k);
		}
	}
	jset(doc, "policies", arr);
	puts(json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PRETTY |
					    JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(doc);
	return 0;
oom:
	json_object_put(doc);
	json_object_put(ret);
	json_object_put(arr);
	fprintf(stderr, "kvworker eval: out of memory\n");
	return CMD_FAIL;
}

/* Runs every policy; 0 or CMD_FAIL. */
static int eval_all(const struct fkv_model *m, struct backend *be, struct hostkv *h,
		    const struct eval_args *a, const int32_t *toks, long n, int bos,
		    struct eval_run *runs)
{
	long cap = n + 1; /* scored positions: at most one per token, BOS included */
	for (int i = 0; i < a->n_policies; i++) {
		runs[i].policy = a->policies[i];
		runs[i].argmax = malloc((size_t)cap * sizeof *runs[i].argmax);
		runs[i].n_layers = m->cfg.n_layers;
		runs[i].n_kv = m->cfg.n_kv_heads;
		runs[i].layer = calloc((size_t)m->cfg.n_layers, sizeof *runs[i].layer);
		if (!runs[i].argmax || !runs[i].layer) {
			fprintf(stderr, "kvworker eval: out of memory\n");
			return CMD_FAIL;
		}
		if (!a->json)
			fprintf(stderr, "kvworker eval: running %s\n", runs[i].policy);
		if (eval_policy(m, be, h, a, toks, n, bos, &runs[i]))
			return CMD_FAIL;
		/* Every policy scores the same positions: full is runs[0]. */
		if (runs[i].scored != runs[0].scored) {
			fprintf(stderr, "kvworker eval: %s scored %ld tokens, full %ld\n",
				runs[i].policy, runs[i].scored, runs[0].scored);
			return CMD_FAIL;
		}
		for (long j = 0; j < runs[i].scored; j++)
			runs[i].agree += runs[i].argmax[j] == runs[0].argmax[j];
	}
	return 0;
}

int cmd_eval(int argc, char **argv)
{
	struct eval_args a;
	int r = parse(argc, argv, &a);
	if (r) {
		if (r > 0)
			usage(stderr);
		return r < 0 ? CMD_OK : r;
	}
	char *text = NULL, err[512];
	r = cmd_read_text(a.file, &text);
	if (r) {
		fprintf(stderr, "kvworker eval: cannot read %s: %s\n", a.file, strerror(-r));
		return CMD_FAIL;
	}
	struct fkv_model m = { 0 };
	struct fkv_tokenizer *tok = NULL;
	struct backend *be = NULL;
	struct hostkv *h = NULL;
	struct eval_run runs[EVAL_MAX_POLICIES] = { 0 };
	int *ids = NULL, ret = CMD_FAIL;
	int32_t *toks = NULL;
	if (cmd_load(a.model, &m, &tok))
		goto out;
	int n = tokenizer_encode(tok, text, false, &ids);
	if (n < 0) {
		fprintf(stderr, "kvworker eval: cannot tokenize %s: %s\n", a.file, strerror(-n));
		goto out;
	}
	int bos = tokenizer_bos(tok);
	if (!a.ctx)
		a.ctx = m.cfg.ctx_len > 0 && m.cfg.ctx_len < 512 ? m.cfg.ctx_len : 512;
	long nt = n;
	if (a.max_tokens && nt > a.max_tokens)
		nt = a.max_tokens;
	if (nt + (bos >= 0) < 2) {
		fprintf(stderr, "kvworker eval: %s has too few tokens to score\n", a.file);
		goto out;
	}
	toks = malloc((size_t)nt * sizeof *toks);
	if (!toks) {
		fprintf(stderr, "kvworker eval: out of memory\n");
		goto out;
	}
	for (long i = 0; i < nt; i++)
		toks[i] = ids[i];
	/* The settings are checked for every listed policy but `full` (which reads none of them
	 * unless it runs alone): refreshkv's budget rules differ from the paged policies'. The
	 * scaling does not depend on the policy, so every check gives the same values. */
	for (int i = a.n_policies > 1; i < a.n_policies; i++) {
		struct policy_opts po = a.po;
		snprintf(po.policy, sizeof po.policy, "%s", a.policies[i]);
		if (policy_opts_finalize(&po, (int)a.ctx, i == (a.n_policies > 1) ? stderr : NULL, err,
					 sizeof err)) {
			fprintf(stderr, "kvworker eval: %s: %s\n", a.policies[i], err);
			ret = CMD_USAGE;
			goto out;
		}
		if (i + 1 == a.n_policies)
			a.po = po;
	}
	const char *bname = a.backend;
	for (int i = 0; i < a.n_policies; i++) {
		if (cmd_backend_check(bname, a.policies[i], "kvworker eval"))
			goto out;
		bname = cmd_backend_for(bname, a.policies[i], "kvworker eval");
	}
	if (backend_open(bname, (int)a.threads, &be, err, sizeof err)) {
		fprintf(stderr, "kvworker eval: %s\n", err);
		goto out;
	}
	struct hostkv_opts ho = { .worker_name = "kvworker eval" };
	if (hostkv_open(&ho, &h, err, sizeof err)) {
		fprintf(stderr, "kvworker eval: %s\n", err);
		goto out;
	}
	if (eval_all(&m, be, h, &a, toks, nt, bos, runs))
		goto out;
	const double b16 = 4.0 * m.cfg.n_layers * m.cfg.n_kv_heads * m.cfg.head_dim;
	if (a.json) {
		ret = print_json(&a, runs, b16);
		goto out;
	}
	print_table(&a, runs, b16);
	ret = CMD_OK;
out:
	for (int i = 0; i < EVAL_MAX_POLICIES; i++) {
		free(runs[i].argmax);
		free(runs[i].layer);
	}
	hostkv_close(h);
	backend_free(be);
	free(toks);
	free(ids);
	tokenizer_free(tok);
	model_free(&m);
	free(text);
	return ret;
}
