/* cmd_common — see cmd_common.h. */
#include "clock.h"
#include "cmd_common.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"
#include "sched_slice.h"
#include "tokenizer.h"

int cmd_parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

int cmd_parse_float(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || isnan(v) || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

int cmd_parse_u64(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (*s == '-')
		return -EINVAL;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

int cmd_read_text(const char *path, char **out)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	if (!f)
		return -errno;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	int ret = 0;
	while (buf) {
		if (len + 1 >= cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb)
				break;
			buf = nb;
			cap *= 2;
		}
		size_t got = fread(buf + len, 1, cap - len - 1, f);
		len += got;
		if (got == 0)
			break;
	}
	if (!buf || ferror(f) || len + 1 >= cap)
		ret = buf && ferror(f) ? -EIO : -ENOMEM;
	if (f != stdin)
		fclose(f);
	if (ret) {
		free(buf);
		return ret;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

int cmd_load(const char *path, struct fkv_model *m, struct fkv_tokenizer **tok)
{
	char err[1024];
	int ret = model_load(path, m, err, sizeof err);
	if (ret) {
		fprintf(stderr, "kvworker: cannot load model %s: %s\n", path, err);
		return ret;
	}
	ret = tokenizer_load(m, tok, err, sizeof err);
	if (ret) {
		fprintf(stderr, "kvworker: cannot load the tokenizer of %s: %s\n", path, err);
		model_free(m);
		return ret;
	}
	return 0;
}

double cmd_nll(const float *logits, int V, int target)
{
	double mx = -INFINITY, z = 0.0;
	for (int i = 0; i < V; i++)
		mx = fmax(mx, logits[i]);
	for (int i = 0; i < V; i++)
		z += exp(logits[i] - mx);
	return log(z) + mx - logits[target];
}

long cmd_window(int32_t *win, const int32_t *toks, long n, long start, long per, int bos)
{
	long take = n - start < per ? n - start : per, len = 0;
	if (bos >= 0)
		win[len++] = bos;
	for (long i = 0; i < take; i++)
		win[len++] = toks[start + i];
	return len;
}

/* ---------------------------------------------------------------- decoding sessions */

static volatile sig_atomic_t g_stop;

static void on_stop(int sig)
{
	g_stop = sig;
}

/* ---------------------------------------------------------------- progress line */

/* One line on stderr, rewritten in place (carriage return, no escape sequences), at most every
 * 200 ms: what, done/total tokens, tokens/s and the time left. Only on a terminal (s->progress),
 * and only for work long enough to want one. */
static void progress_show(struct cmd_session *s, const char *what, int64_t done, int64_t total)
{
	double now = clock_ms_f();
	if (!s->progress || (now - s->progress_last < 200 && done < total))
		return;
	s->progress_last = now;
	double secs = (now - s->progress_t0) / 1e3, rate = secs > 0 ? (double)done / secs : 0;
	fprintf(stderr, "\r%s: %lld/%lld tokens, %.0f tok/s, %.1f s left      ", what,
		(long long)done, (long long)total, rate, rate > 0 ? (double)(total - done) / rate : 0.0);
}

static void progress_clear(struct cmd_session *s)
{
	if (s->progress && s->progress_last > 0)
		fprintf(stderr, "\r%72s\r", "");
	s->progress_last = 0;
}

static void prefill_progress(void *ctx, int64_t done, int64_t total)
{
	struct cmd_session *s = ctx;
	if (total >= 512) /* a long prefill: a few ubatches at least */
		progress_show(s, "prefill", done, total);
}

int cmd_session_check(const struct cmd_session_opts *o)
{
	if ((o->keep || o->seq_name) && !o->endpoint) {
		fprintf(stderr, "%s: %s needs --store ENDPOINT: without it the KV is in an embedded "
			"store that ends with this process, so there is nothing to keep or name\n",
			o->prog, o->keep ? "--keep" : "--seq");
		return -EINVAL;
	}
	return 0;
}

int cmd_session_exit(const struct cmd_session *s, int run_ret)
{
	if (run_ret)
		return CMD_FAIL;
	return s->interrupted ? CMD_SIGNALLED + s->stop_signal : CMD_OK;
}

void cmd_session_defaults(struct cmd_session_opts *o, const char *prog)
{
	*o = (struct cmd_session_opts){ .prog = prog, .n = 64, .store_retry = 30,
					.sp = { .temp = 0.8f, .top_k = 40, .top_p = 0.95f } };
	o->sp.seed = (uint64_t)time(NULL);
	policy_opts_default(&o->po);
}

void cmd_session_usage(FILE *f)
{
	fprintf(f,
		"  -m, --model PATH     .gguf file or Hugging Face folder\n"
		"  -n, --n-predict N    tokens to generate, 0 to 2^30 (default 64); stops early at\n"
		"                       EOS or at the context limit\n"
		"      --temp T         temperature, 0 to 100, 0 = greedy (default 0.8)\n"
		"      --top-k K        keep the K most likely tokens, 0 = all (default 40)\n"
		"      --top-p P        nucleus mass, 0 to 1, 1 = off (default 0.95)\n"
		"  -s, --seed S         sampling seed, an unsigned 64-bit number (default: from\n"
		"                       the clock)\n"
		"  -t, --threads N      compute threads, 1 to 4096 (default: all cores)\n"
		"      --backend B      cuda, cpu or auto (default auto: cuda when a device is\n"
		"                       present, else cpu)\n"
		"  -c, --ctx-size N     context limit in tokens, 1 to 2^30 (default: the model's)\n"
		"      --ids            print token ids, space-separated, instead of text\n"
		"      --stats          print a JSON line of timings and retrieval statistics to\n"
		"                       stderr (also reported to kvstored with --store)\n"
		"      --store ENDPOINT keep the KV in the kvstored at ENDPOINT (default: an\n"
		"                       embedded in-process store)\n"
		"      --lease-budget N lease at most N full, committed blocks of the sequence;\n"
		"                       with --store the others may go to kvstored's NVMe tier and\n"
		"                       are recalled when read, so the KV may exceed the DRAM pool\n"
		"                       (0 to 2^24; default 0: every block leased, in DRAM)\n"
		"      --store-retry S  when kvstored goes away, reconnect for up to S seconds and\n"
		"                       go on where it left off (0 to 86400, default 30; 0: fail)\n"
		"      --log-level L    error, warn, info or debug (default info): which log\n"
		"                       lines (store reconnects, host-copy errors) are shown\n"
		"      --slice-us N     ask the scheduler for N-us time slices, 100 to 100000 (Linux\n"
		"                       6.12+), so that a thread kvstored wakes preempts CPU-bound\n"
		"                       work on a busy host (default 0: the scheduler's own)\n"
		"      --seq NAME       the sequence's name in the store, 1 to 127 bytes (default:\n"
		"                       generated); needs --store\n"
		"      --cache-salt S   prefix-sharing namespace (default: the empty one): a new\n"
		"                       sequence reuses the prompt pages that sequences of the same\n"
		"                       model and salt left in kvstored, and prefills the rest\n"
		"      --no-prefix      neither reuse nor offer prompt pages (with --store)\n"
		"      --keep           keep the sequence in the store when done (detach), so a\n"
		"                       later `kvworker resume` can continue it; without it the\n"
		"                       sequence is dropped at the end (a crash leaves it orphaned);\n"
		"                       needs --store\n"
		"  retrieval: %s\n"
		"             policies built: %s; default policy freekv (full: every token);\n"
		"             defaults page 32, budget 2048, sink 512, window 512, tau 0.9,\n"
		"             full layers 1, refresh stride 5 and threshold 0.85, scaled down\n"
		"             for short contexts\n",
		policy_opts_usage(), kvcache_policy_names());
}

const char *cmd_backend_for(const char *backend, const char *policy, const char *prog)
{
	(void)policy;
	(void)prog;
	return backend;
}

int cmd_backend_check(const char *backend, const char *policy, const char *prog)
{
	(void)backend;
	if (!policy || kvcache_policy(policy))
		return 0;
	fprintf(stderr, "%s: unknown KV policy '%s' (built: %s)\n", prog, policy,
		kvcache_policy_names());
	return -EINVAL;
}

/* The shared options, as getopt_long entries: the short ones are their letter, the others
 * SESSION_OPT_BASE and up (the retrieval options follow, from policy_opts). */
enum { SO_TEMP = CMD_SESSION_OPT_BASE, SO_TOPK, SO_TOPP, SO_STORE, SO_SEQ, SO_BACKEND, SO_LEASE,
       SO_RETRY, SO_LOGLEVEL, SO_IDS, SO_STATS, SO_KEEP, SO_SALT, SO_NOPREFIX, SO_SLICE };

static const struct option session_options[] = {
	{ "model", required_argument, NULL, 'm' },
	{ "n-predict", required_argument, NULL, 'n' },
	{ "threads", required_argument, NULL, 't' },
	{ "ctx-size", required_argument, NULL, 'c' },
	{ "ctx", required_argument, NULL, 'c' },
	{ "seed", required_argument, NULL, 's' },
	{ "temp", required_argument, NULL, SO_TEMP },
	{ "top-k", required_argument, NULL, SO_TOPK },
	{ "top-p", required_argument, NULL, SO_TOPP },
	{ "store", required_argument, NULL, SO_STORE },
	{ "seq", required_argument, NULL, SO_SEQ },
	{ "backend", required_argument, NULL, SO_BACKEND },
	{ "lease-budget", required_argument, NULL, SO_LEASE },
	{ "store-retry", required_argument, NULL, SO_RETRY },
	{ "log-level", required_argument, NULL, SO_LOGLEVEL },
	{ "ids", no_argument, NULL, SO_IDS },
	{ "stats", no_argument, NULL, SO_STATS },
	{ "keep", no_argument, NULL, SO_KEEP },
	{ "cache-salt", required_argument, NULL, SO_SALT },
	{ "no-prefix", no_argument, NULL, SO_NOPREFIX },
	{ "slice-us", required_argument, NULL, SO_SLICE },
};

size_t cmd_options(struct option *out, size_t max, const struct option *own, size_t n_own,
		   bool session)
{
	size_t n = 0;
	for (size_t i = 0; i < n_own && n < max; i++)
		out[n++] = own[i];
	for (size_t i = 0; session && i < sizeof session_options / sizeof *session_options &&
			   n < max; i++)
		out[n++] = session_options[i];
	n += policy_opts_options(out + n, max - 1 - n);
	out[n] = (struct option){ 0 };
	return n;
}

int cmd_getopt_error(const char *prog, int c, char **argv)
{
	const char *a = argv[optind - 1];
	if (c == ':')
		fprintf(stderr, "%s: %s needs a value\n", prog, a);
	else if (optopt && optopt < 256)
		fprintf(stderr, "%s: unknown option '-%c'\n", prog, optopt);
	else
		fprintf(stderr, "%s: unknown option '%s'\n", prog, a);
	return -EINVAL;
}

static int bad_value(const struct cmd_session_opts *o, const char *flag, const char *val)
{
	fprintf(stderr, "%s: invalid value '%s' for %s\n", o->prog, val, flag);
	return -EINVAL;
}

int cmd_session_apply(struct cmd_session_opts *o, int c, const char *v)
{
	char err[256];
	int ret = policy_opts_apply(&o->po, c, v, err, sizeof err);
	if (ret < 0) {
		fprintf(stderr, "%s: %s\n", o->prog, err);
		return -EINVAL;
	}
	if (ret)
		return 1;
	long l;
	double d;
	switch (c) {
	case SO_IDS: o->ids = true; break;
	case SO_STATS: o->stats = true; break;
	case SO_KEEP: o->keep = true; break;
	case 'm': o->model = v; break;
	case SO_STORE: o->endpoint = v; break;
	case SO_BACKEND:
		if (strcmp(v, "cuda") && strcmp(v, "cpu") && strcmp(v, "auto"))
			return bad_value(o, "--backend", v);
		o->backend = v;
		break;
	case SO_SALT:
		if (strlen(v) > 256)
			return bad_value(o, "--cache-salt", v);
		o->cache_salt = v;
		break;
	case SO_NOPREFIX: o->no_prefix = true; break;
	case SO_SEQ:
		if (!*v || strlen(v) >= sizeof ((struct cmd_session *)0)->seq_name)
			return bad_value(o, "--seq", v);
		o->seq_name = v;
		break;
	case 'n':
		if (cmd_parse_long(v, 0, 1L << 30, &o->n))
			return bad_value(o, "-n", v);
		break;
	case 't':
		if (cmd_parse_long(v, 1, 4096, &o->threads))
			return bad_value(o, "-t", v);
		break;
	case 'c':
		if (cmd_parse_long(v, 1, 1L << 30, &o->ctx))
			return bad_value(o, "--ctx", v);
		break;
	case SO_TEMP:
		if (cmd_parse_float(v, 0.0, 100.0, &d))
			return bad_value(o, "--temp", v);
		o->sp.temp = (float)d;
		break;
	case SO_TOPK:
		if (cmd_parse_long(v, 0, 1L << 30, &l))
			return bad_value(o, "--top-k", v);
		o->sp.top_k = (int)l;
		break;
	case SO_TOPP:
		if (cmd_parse_float(v, 0.0, 1.0, &d))
			return bad_value(o, "--top-p", v);
		o->sp.top_p = (float)d;
		break;
	case 's':
		if (cmd_parse_u64(v, &o->sp.seed))
			return bad_value(o, "--seed", v);
		break;
	case SO_LEASE:
		if (cmd_parse_long(v, 0, HOSTKV_MAX_BUDGET, &l))
			return bad_value(o, "--lease-budget", v);
		o->lease_budget = (uint32_t)l;
		break;
	case SO_RETRY:
		if (cmd_parse_long(v, 0, 86400, &o->store_retry))
			return bad_value(o, "--store-retry", v);
		break;
	case SO_SLICE:
		if (cmd_parse_slice(v, &o->slice_us))
			return bad_value(o, "--slice-us", v);
		break;
	case SO_LOGLEVEL: {
		enum log_level lvl;
		if (log_parse_level(v, &lvl))
			return bad_value(o, "--log-level", v);
		log_set_level(lvl);
		break;
	}
	default:
		return 0;
	}
	return 1;
}

/* Pool bytes an embedded store needs for one sequence of ctx tokens (plus allocation ahead). */
static size_t embedded_bytes(const struct fkv_model *m, const struct kv_geom *g, int64_t ctx)
{
	size_t pages = (size_t)((ctx + g->p - 1) / g->p) + 16;
	size_t need = (size_t)m->cfg.n_layers * pages * layout_block_bytes(g);
	return need + need / 8 + (8u << 20);
}

int cmd_session_open(struct cmd_session *s, const struct cmd_session_opts *o, bool resume)
{
	int ret = cmd_session_load(s, o, resume);
	return ret ? ret : cmd_session_open_seq(s, NULL, 0);
}

int cmd_parse_slice(const char *v, long *out)
{
	long l;
	if (cmd_parse_long(v, 0, SCHED_SLICE_MAX_US, &l) || !sched_slice_valid((unsigned long long)l))
		return -EINVAL;
	*out = l;
	return 0;
}

int cmd_session_load(struct cmd_session *s, const struct cmd_session_opts *o, bool resume)
{
	char err[512];
	memset(s, 0, sizeof *s);
	s->resumed = resume;
	s->o = *o;
	s->seq = -1;
	/* First, so that every thread the backend and the store start inherits it. */
	int ret = sched_slice_request_process((unsigned)o->slice_us, err, sizeof err);
	if (ret == -EOPNOTSUPP) {
		log_warn("--slice-us: %s; the scheduler's own slices are used", err);
	} else if (ret) {
		fprintf(stderr, "%s: --slice-us: %s\n", o->prog, err);
		return ret;
	}
	ret = cmd_load(o->model, &s->m, &s->tok);
	if (ret)
		return ret;
	int64_t ctx = o->ctx ? o->ctx : (s->m.cfg.ctx_len > 0 ? s->m.cfg.ctx_len : 2048);
	/* `full` uses only the page size (of the host copy): no notice about the rest. */
	FILE *notice = strcmp(s->o.po.policy, "full") ? stderr : NULL;
	ret = policy_opts_finalize(&s->o.po, (int)(ctx < INT32_MAX ? ctx : INT32_MAX), notice, err,
				   sizeof err);
	if (!ret)
		ret = policy_opts_check_model(&s->o.po, s->m.cfg.n_layers, err, sizeof err);
	if (ret) {
		fprintf(stderr, "%s: %s\n", o->prog, err);
		return ret;
	}
	if ((ret = cmd_backend_check(o->backend, s->o.po.policy, o->prog)))
		return ret;
	if ((ret = backend_open(cmd_backend_for(o->backend, s->o.po.policy, o->prog),
				(int)o->threads, &s->be, err, sizeof err))) {
		fprintf(stderr, "%s: %s\n", o->prog, err);
		return ret;
	}
	s->progress = isatty(STDERR_FILENO);
	struct engine_opts eo = { .max_ctx = o->ctx, .max_seqs = 1, .policy = s->o.po.policy,
				  .kv = s->o.po.kv, .progress = prefill_progress, .progress_ctx = s };
	if ((ret = engine_new(&s->e, &s->m, s->be, &eo, err, sizeof err))) {
		fprintf(stderr, "%s: %s\n", o->prog, err);
		return ret;
	}
	struct kv_geom g;
	engine_kv_geom(s->e, &g);
	snprintf(s->worker_name, sizeof s->worker_name, "kvworker-%d", (int)getpid());
	s->ho = (struct hostkv_opts){ .endpoint = o->endpoint, .worker_name = s->worker_name,
				      .embedded_bytes = embedded_bytes(&s->m, &g, engine_max_ctx(s->e)),
				      .lease_budget = o->lease_budget, .retry_s = (int)o->store_retry };
	if ((ret = hostkv_open(&s->ho, &s->hk, err, sizeof err))) {
		fprintf(stderr, "%s: %s\n", o->prog, err);
		return ret;
	}
	if (o->seq_name)
		snprintf(s->seq_name, sizeof s->seq_name, "%s", o->seq_name);
	else
		snprintf(s->seq_name, sizeof s->seq_name, "gen-%d-%lld", (int)getpid(),
			 (long long)time(NULL));
	return 0;
}

static int open_seq(struct cmd_session *s, const int32_t *prompt, int n_prompt);

/* One try at opening the session's sequence: with its prompt for prefix sharing (px), else
 * plain (created unless resuming). */
static int open_once(struct cmd_session *s, const struct kv_geom *g,
		     const struct hostkv_prefix *px, char *err, size_t errlen)
{
	return px ? hostkv_seq_open_prefix(s->hk, s->seq_name, s->m.fingerprint, s->m.cfg.n_layers,
					   g, px, &s->hs, err, errlen)
		  : hostkv_seq_open(s->hk, s->seq_name, s->m.fingerprint, s->m.cfg.n_layers, g,
				    !s->resumed, &s->hs, err, errlen);
}

int cmd_session_open_seq(struct cmd_session *s, const int32_t *prompt, int n_prompt)
{
	double t0 = clock_ms_f();
	int ret = open_seq(s, prompt, n_prompt);
	s->open_ms = clock_ms_f() - t0;
	return ret;
}

static int open_seq(struct cmd_session *s, const int32_t *prompt, int n_prompt)
{
	char err[512], variant[256];
	const struct cmd_session_opts *o = &s->o;
	bool resume = s->resumed;
	struct kv_geom g;
	engine_kv_geom(s->e, &g);
	engine_prefix_variant(s->e, variant, sizeof variant);
	struct hostkv_prefix px = { .ids = prompt, .n_ids = (size_t)n_prompt,
				    .ubatch = (uint32_t)engine_ubatch(s->e), .salt = o->cache_salt,
				    .variant = variant };
	bool share = !resume && prompt && n_prompt > 0 && o->endpoint && !o->no_prefix;
	int ret = open_once(s, &g, share ? &px : NULL, err, sizeof err);
	/* kvstored went away while the sequence was being opened (it answered Hello, so this is
	 * not a missing daemon): ride it out as a run does (docs/design.md §4). A sequence the
	 * dead daemon journaled comes back empty and detached; opening it again is fine. */
	uint64_t deadline = clock_ms() + (uint64_t)o->store_retry * 1000;
	long backoff = 50;
	bool said = false;
	while (ret && o->endpoint && o->store_retry > 0 && clock_ms() < deadline &&
	       (!s->hk || hostkv_store_gone(s->hk))) {
		if (!said)
			fprintf(stderr, "%s: kvstored at %s is gone; reconnecting\n", o->prog,
				o->endpoint);
		said = true;
		hostkv_close(s->hk);
		s->hk = NULL;
		struct timespec ts = { backoff / 1000, (backoff % 1000) * 1000000L };
		nanosleep(&ts, NULL);
		backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
		if (hostkv_open(&s->ho, &s->hk, err, sizeof err)) {
			s->hk = NULL;
			continue;
		}
		ret = open_once(s, &g, share ? &px : NULL, err, sizeof err);
	}
	if (ret) {
		fprintf(stderr, "%s: sequence '%s': %s\n", o->prog, s->seq_name, err);
		return ret;
	}
	const int32_t *ids;
	int64_t n_ids = hostkv_seq_tokens(s->hs, &ids);
	if (share && n_ids == n_prompt && !memcmp(ids, prompt, (size_t)n_prompt * sizeof *ids)) {
		/* The store kept the prompt with the open; its committed length is what it found. */
		s->prefix_covered = hostkv_seq_committed(s->hs);
		if (s->prefix_covered)
			fprintf(stderr, "%s: sequence '%s': %lld of %d prompt tokens found in "
				"kvstored's pool; prefill runs %lld\n", o->prog, s->seq_name,
				(long long)s->prefix_covered, n_prompt,
				(long long)(n_prompt - s->prefix_covered));
		n_ids = 0;
	}
	if (!resume && n_ids) {
		fprintf(stderr, "%s: sequence '%s' already holds %lld tokens (continue it with "
			"`kvworker resume`)\n", o->prog, s->seq_name, (long long)n_ids);
		return -EEXIST;
	}
	if (resume && !n_ids) {
		fprintf(stderr, "%s: sequence '%s' holds no tokens: nothing to resume\n", o->prog,
			s->seq_name);
		return -ENODATA;
	}
	if ((ret = engine_seq_open(s->e, s->hs, &s->seq, err, sizeof err))) {
		fprintf(stderr, "%s: %s\n", o->prog, err);
		return ret;
	}
	return 0;
}

static bool is_eos(const struct fkv_model *m, const struct fkv_tokenizer *tok, int id)
{
	if (id == tokenizer_eos(tok) || id == m->cfg.eos_id)
		return true;
	for (int i = 0; i < m->cfg.n_eos && i < FKV_MAX_EOS; i++)
		if (m->cfg.eos_ids[i] == id)
			return true;
	return false;
}

static void emit(const struct fkv_tokenizer *tok, int id, bool ids, int index)
{
	if (ids) {
		printf(index ? " %d" : "%d", id);
	} else if (!tokenizer_is_special(tok, id)) {
		char buf[256];
		int n = tokenizer_piece(tok, id, buf, sizeof buf);
		if (n > 0)
			fwrite(buf, 1, (size_t)n < sizeof buf ? (size_t)n : sizeof buf, stdout);
	}
	fflush(stdout);
}

struct run_times {
	int n_first, generated, steps;
	double t0, t1, t2; /* start, prefill done, now */
};

/* refreshkv's counters (docs/design.md §5) into o, when the layers ran any step past the budget:
 * the full-step rate, its inverse the effective stride (decode steps per full step), the
 * head-token rows fetched and the time in full steps. */
static void refresh_json(struct json_object *o, const struct kv_layer_stats *s)
{
	if (!s->full_steps)
		return;
	json_object_object_add(o, "full_steps", json_object_new_int64(s->full_steps));
	json_object_object_add(o, "full_step_rate", json_object_new_double(kv_full_step_rate(s)));
	json_object_object_add(o, "effective_stride",
			       json_object_new_double((double)s->steps / (double)s->full_steps));
	json_object_object_add(o, "tokens_fetched", json_object_new_int64(s->tokens_fetched));
	json_object_object_add(o, "full_step_ms", json_object_new_double(s->ns_full / 1e6));
}

/* Per layer: the selected pages a KV head attended per compressed step (mean and most), the
 * calibrations and, for top-p selection, the calibrated temperature of each KV head. */
static void layer_pages_json(struct cmd_session *s, int l, const struct kv_layer_stats *ls,
			     struct json_object *j)
{
	const int H = s->m.cfg.n_kv_heads;
	double mean = ls->steps ? (double)ls->pages_selected / ((double)ls->steps * H) : 0.0;
	json_object_object_add(j, "pages_mean_per_head", json_object_new_double(mean));
	json_object_object_add(j, "pages_max_per_head", json_object_new_int64(ls->pages_max));
	json_object_object_add(j, "calibrations", json_object_new_int64(ls->calibrations));
	json_object_object_add(j, "calibrate_ms", json_object_new_double(ls->ns_calibrate / 1e6));
	float *theta = malloc((size_t)H * sizeof *theta);
	if (theta && !engine_seq_layer_select(s->e, s->seq, l, NULL, theta) && theta[0] > 0.0f) {
		struct json_object *a = json_object_new_array();
		for (int h = 0; h < H; h++)
			json_object_array_add(a, json_object_new_double(theta[h]));
		json_object_object_add(j, "temperatures", a);
	}
	free(theta);
}

/* The --stats object: timings, the policy's settings, its retrieval counters per layer and
 * summed, device bytes per token against 16-bit K/V, and the speculative-token hit rate
 * (specache). Caller frees with json_object_put. */
static struct json_object *stats_json(struct cmd_session *s, const struct run_times *t)
{
	struct json_object *o = json_object_new_object();
	const struct kv_policy_opts *k = engine_kv_opts(s->e);
	double pre = t->t1 - t->t0, dec = t->t2 - t->t1;
#define ADD(key, val) json_object_object_add(o, key, val)
	ADD("prompt_tokens", json_object_new_int(t->n_first + (int)s->prefix_covered));
	ADD("prefix_covered", json_object_new_int64(s->prefix_covered));
	ADD("prefill_tokens", json_object_new_int(t->n_first));
	/* Opening the sequence (with prefix sharing: the lookup, and rebuilding the policy's
	 * state from the pages found) + the prefill: the time to the first token's logits. */
	ADD("open_ms", json_object_new_double(s->open_ms));
	ADD("ttft_ms", json_object_new_double(s->open_ms + pre));
	ADD("generated_tokens", json_object_new_int(t->generated));
	ADD("decode_steps", json_object_new_int(t->steps));
	ADD("tokens_decoded", json_object_new_int(t->steps));
	ADD("prefill_ms", json_object_new_double(pre));
	ADD("decode_ms", json_object_new_double(dec));
	ADD("prefill_tok_s", json_object_new_double(pre > 0 ? t->n_first / (pre / 1e3) : 0.0));
	ADD("decode_tok_s", json_object_new_double(t->steps && dec > 0 ? t->steps / (dec / 1e3)
									: 0.0));
	ADD("threads", json_object_new_int(s->be->ops->get_threads
						   ? s->be->ops->get_threads(s->be->ctx)
						   : (int)s->o.threads));
	ADD("backend", json_object_new_string(s->be->ops->name));
	/* Decode steps through CUDA Graphs (engine.h): whether, and how many segments ran as
	 * graphs, were recorded, or ran as plain ops because recording failed. */
	struct engine_graph_stats gs;
	engine_graph_stats(s->e, &gs);
	struct json_object *gj = json_object_new_object();
	json_object_object_add(gj, "on", json_object_new_boolean(gs.on));
	json_object_object_add(gj, "launched", json_object_new_int64(gs.launched));
	json_object_object_add(gj, "recorded", json_object_new_int64(gs.recorded));
	json_object_object_add(gj, "plain", json_object_new_int64(gs.plain));
	ADD("graphs", gj);
	ADD("seed", json_object_new_uint64(s->o.sp.seed));
	ADD("policy", json_object_new_string(engine_policy_name(s->e)));
	ADD("page", json_object_new_int(k->page));
	ADD("budget", json_object_new_int(k->budget));
	ADD("sink", json_object_new_int(k->sink));
	ADD("window", json_object_new_int(k->window));
	ADD("full_layers", json_object_new_int(k->full_layers));
	ADD("tau", json_object_new_double(k->tau));
	ADD("kv_top_p", json_object_new_double(k->top_p)); /* 0: the policy's default */
	ADD("recalibrate", json_object_new_int(k->recalibrate));
	ADD("kv_bits", json_object_new_int(k->kv_bits));
	ADD("spec_topk", json_object_new_int(k->spec_topk));
	ADD("store", json_object_new_string(hostkv_is_remote(s->hk) ? "kvstored" : "embedded"));
	ADD("seq", json_object_new_string(s->seq_name));
	struct hostkv_lease_stats hl;
	hostkv_seq_lease_stats(s->hs, &hl);
	ADD("lease_budget", json_object_new_uint64(hl.budget));
	ADD("leases_held", json_object_new_uint64(hl.held));
	ADD("lease_recalls", json_object_new_uint64(hl.recalls));
	ADD("lease_recall_ops", json_object_new_uint64(hl.recall_ops));
	ADD("lease_releases", json_object_new_uint64(hl.releases));
	ADD("seq_tokens", json_object_new_int64(engine_seq_len(s->e, s->seq)));
	struct kv_layer_stats sum = { 0 };
	struct json_object *layers = json_object_new_array();
	for (int l = 0; l < s->m.cfg.n_layers; l++) {
		struct kv_layer_stats ls;
		if (engine_seq_layer_stats(s->e, s->seq, l, &ls))
			continue;
		struct json_object *j = json_object_new_object();
		json_object_object_add(j, "layer", json_object_new_int(l));
		json_object_object_add(j, "steps", json_object_new_int64(ls.steps));
		json_object_object_add(j, "correction_rate",
				       json_object_new_double(kv_correction_rate(&ls)));
		json_object_object_add(j, "pages_selected", json_object_new_int64(ls.pages_selected));
		json_object_object_add(j, "pages_recalled", json_object_new_int64(ls.pages_recalled));
		json_object_object_add(j, "bytes_recalled", json_object_new_int64(ls.bytes_recalled));
		json_object_object_add(j, "select_ms", json_object_new_double(ls.ns_select / 1e6));
		json_object_object_add(j, "recall_wait_ms",
				       json_object_new_double(ls.ns_recall_wait / 1e6));
		json_object_object_add(j, "recall_hidden_ms",
				       json_object_new_double(ls.ns_recall_hidden / 1e6));
		json_object_object_add(j, "attend_ms", json_object_new_double(ls.ns_attend / 1e6));
		json_object_object_add(j, "tokens_fetched", json_object_new_int64(ls.tokens_fetched));
		refresh_json(j, &ls);
		layer_pages_json(s, l, &ls, j);
		json_object_array_add(layers, j);
		sum.steps += ls.steps;
		sum.head_checks += ls.head_checks;
		sum.corrections += ls.corrections;
		sum.pages_selected += ls.pages_selected;
		sum.pages_recalled += ls.pages_recalled;
		sum.bytes_recalled += ls.bytes_recalled;
		sum.ns_recall_wait += ls.ns_recall_wait;
		sum.ns_recall_hidden += ls.ns_recall_hidden;
		sum.full_steps += ls.full_steps;
		sum.tokens_fetched += ls.tokens_fetched;
		sum.ns_full += ls.ns_full;
	}
	ADD("correction_rate", json_object_new_double(kv_correction_rate(&sum)));
	ADD("pages_selected", json_object_new_int64(sum.pages_selected));
	ADD("pages_recalled", json_object_new_int64(sum.pages_recalled));
	ADD("bytes_recalled", json_object_new_int64(sum.bytes_recalled));
	ADD("recall_wait_ms", json_object_new_double(sum.ns_recall_wait / 1e6));
	ADD("recall_hidden_ms", json_object_new_double(sum.ns_recall_hidden / 1e6));
	if (!strcmp(engine_policy_name(s->e), "refreshkv")) {
		ADD("refresh_stride", json_object_new_int(k->refresh_stride));
		ADD("refresh_threshold", json_object_new_double(k->refresh_threshold));
	}
	refresh_json(o, &sum);
	ADD("tokens_fetched", json_object_new_int64(sum.tokens_fetched));
	/* Device memory per token against a 16-bit copy of every K and V (docs/design.md §5
	 * specache: the compression ratio). */
	struct kv_stats ks;
	const struct fkv_model_config *c = &s->m.cfg;
	const double b16 = 4.0 * c->n_layers * c->n_kv_heads * c->head_dim;
	if (!engine_seq_stats(s->e, s->seq, &ks) && ks.tokens > 0) {
		ADD("device_bytes", json_object_new_int64(ks.device_bytes));
		ADD("device_bytes_per_token", json_object_new_double((double)ks.device_bytes /
								      (double)ks.tokens));
		ADD("device_ratio_vs_16bit", json_object_new_double((double)ks.device_bytes /
								     (double)ks.tokens / b16));
	}
	struct engine_spec_stats sp;
	if (!engine_seq_spec_stats(s->e, s->seq, &sp) && sp.checked) {
		ADD("spec_checked", json_object_new_int64(sp.checked));
		ADD("spec_hits", json_object_new_int64(sp.hits));
		ADD("spec_hit_rate", json_object_new_double((double)sp.hits / (double)sp.checked));
	}
	ADD("layers", layers);
#undef ADD
	return o;
}

static void report(struct cmd_session *s, const struct run_times *t, bool print)
{
	struct json_object *j = stats_json(s, t);
	const char *txt = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN);
	if (print)
		fprintf(stderr, "%s\n", txt);
	if (hostkv_is_remote(s->hk)) {
		int ret = hostkv_report_stats(s->hk, txt);
		if (ret)
			fprintf(stderr, "%s: cannot report statistics to kvstored: %s\n", s->o.prog,
				strerror(-ret));
	}
	json_object_put(j);
}

/* The run's token ids: what the store keeps plus what this run decided (prompt, sampled). A
 * reconnect runs again the part the restarted store did not keep. */
struct hist {
	int32_t *v;
	int64_t n, cap;
	int64_t n_prefill;	/* h[0..n_prefill) ran through prefill, the rest through decode */
};

static int hist_push(struct hist *h, const int32_t *ids, int64_t n)
{
	if (h->n + n > h->cap) {
		int64_t cap = h->cap ? h->cap : 1024;
		while (cap < h->n + n)
			cap *= 2;
		int32_t *v = realloc(h->v, (size_t)cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	if (n) /* with nothing kept yet h->v is NULL, and memcpy's arguments must not be */
		memcpy(h->v + h->n, ids, (size_t)n * sizeof *ids);
	h->n += n;
	return 0;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* kvstored went away and the store handle could not continue in place (hostkv_reconnect.c:
 * a new pool segment, a damaged sequence; or it did not come back in time): drop the dead
 * handles (the store keeps the sequence, docs/design.md §4 "Restart without loss"), reconnect
 * with backoff for o.store_retry seconds, re-open the
 * sequence as a resume does and run again what the store lost (h[len..]): logits then follow
 * h's last id, exactly as if nothing had happened. 0, or -errno after saying why. */
static int reconnect(struct cmd_session *s, const struct hist *h, float *logits)
{
	const struct cmd_session_opts *o = &s->o;
	char err[512];
	/* The in-place attempt already waited o.store_retry seconds for a store that never came. */
	bool waited = s->hk && !hostkv_store_came_back(s->hk);
	if (!waited)
		fprintf(stderr, "\n%s: kvstored at %s is gone; reconnecting\n", o->prog,
			o->endpoint);
	uint64_t t0 = clock_ms(), deadline = waited ? t0 : t0 + (uint64_t)o->store_retry * 1000;
	long backoff = 50;
	for (int attempt = 0;; attempt++) {
		if (s->seq >= 0)
			engine_seq_free(s->e, s->seq);
		s->seq = -1;
		if (s->hs)
			hostkv_seq_close(s->hs, false); /* fails against a dead store: nothing to undo */
		s->hs = NULL;
		hostkv_close(s->hk);
		s->hk = NULL;
		if (attempt && clock_ms() >= deadline)
			break;
		int ret = hostkv_open(&s->ho, &s->hk, err, sizeof err);
		if (ret) {
			s->hk = NULL;
			if (clock_ms() >= deadline)
				break;
			sleep_ms(backoff);
			backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
			continue;
		}
		struct kv_geom g;
		engine_kv_geom(s->e, &g);
		ret = hostkv_seq_open(s->hk, s->seq_name, s->m.fingerprint, s->m.cfg.n_layers, &g,
				      false, &s->hs, err, sizeof err);
		if (ret && hostkv_store_gone(s->hk))
			continue; /* gone again while we reopened: next attempt */
		if (ret) {
			fprintf(stderr, "%s: kvstored at %s is back but sequence '%s' cannot be reopened "
				"(%s): was it restarted with persist = false?\n", o->prog, o->endpoint,
				s->seq_name, err);
			return ret;
		}
		const int32_t *ids;
		int64_t n_ids = hostkv_seq_tokens(s->hs, &ids);
		if (n_ids > h->n || memcmp(ids, h->v, (size_t)n_ids * sizeof *ids) != 0) {
			fprintf(stderr, "%s: kvstored at %s is back but sequence '%s' holds other token "
				"ids than this run: not continuing it\n", o->prog, o->endpoint,
				s->seq_name);
			return -EPROTO;
		}
		if ((ret = engine_seq_open(s->e, s->hs, &s->seq, err, sizeof err))) {
			if (hostkv_store_gone(s->hk))
				continue;
			fprintf(stderr, "%s: %s\n", o->prog, err);
			return ret;
		}
		/* Each id runs again the way it ran first — the prompt's through prefill, sampled
		 * ones one decode step at a time — since the two differ numerically (a retrieval
		 * policy's prefill attends to every token, its decode to the selected pages). */
		int64_t len = engine_seq_len(s->e, s->seq), at = len;
		ret = 0;
		if (at < h->n_prefill) {
			ret = engine_prefill(s->e, s->seq, h->v + at, (int)(h->n_prefill - at), logits,
					     false, err, sizeof err);
			at = h->n_prefill;
		}
		for (; !ret && at < h->n; at++)
			ret = engine_decode(s->e, 1, &s->seq, h->v + at, logits, err, sizeof err);
		if (ret && hostkv_store_gone(s->hk))
			continue;
		if (ret) {
			fprintf(stderr, "%s: after reconnecting: %s\n", o->prog, err);
			return ret;
		}
		fprintf(stderr, "%s: reconnected to kvstored at %s after %.1f s: sequence '%s' "
			"continues at %lld tokens (%lld run again)\n", o->prog, o->endpoint,
			(clock_ms() - t0) / 1e3, s->seq_name, (long long)h->n,
			(long long)(h->n - len));
		return 0;
	}
	fprintf(stderr, "%s: kvstored at %s did not come back within %ld s; sequence '%s' is kept "
		"in its journal up to the last commit: continue it with `kvworker resume --seq %s` "
		"once kvstored runs again\n", o->prog, o->endpoint, o->store_retry, s->seq_name,
		s->seq_name);
	return -ECONNRESET;
}

/* Whether a failed step should reconnect: kvstored went away and retrying is allowed. */
static bool store_lost(const struct cmd_session *s)
{
	return s->o.endpoint && s->o.store_retry > 0 && hostkv_store_gone(s->hk);
}

int cmd_session_run(struct cmd_session *s, const int32_t *first, int n_first)
{
	char err[512];
	const struct cmd_session_opts *o = &s->o;
	int V = engine_vocab(s->e), ret;
	struct sampler smp = { 0 };
	struct hist hist = { 0 };
	float *logits = malloc((size_t)V * sizeof *logits);
	if (!logits || sampler_init(&smp, &o->sp, V)) {
		fprintf(stderr, "%s: out of memory\n", o->prog);
		ret = -ENOMEM;
		goto out;
	}
	if (engine_seq_len(s->e, s->seq) + n_first > engine_max_ctx(s->e)) {
		fprintf(stderr, "%s: %d tokens to run after %lld exceed the context limit of %lld\n",
			o->prog, n_first, (long long)engine_seq_len(s->e, s->seq),
			(long long)engine_max_ctx(s->e));
		ret = -ENOSPC;
		goto out;
	}
	struct sigaction sa = { .sa_handler = on_stop }, old_int, old_term;
	sigemptyset(&sa.sa_mask);
	g_stop = 0;
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	struct run_times t = { .n_first = n_first, .t0 = clock_ms_f() };
	const int32_t *kept;
	hostkv_seq_tokens(s->hs, &kept);
	if (hist_push(&hist, kept, engine_seq_len(s->e, s->seq)) ||
	    hist_push(&hist, first, n_first)) {
		fprintf(stderr, "%s: out of memory\n", o->prog);
		ret = -ENOMEM;
		goto restore;
	}
	if (s->first_by_decode) {
		/* Sampled ids a dead or stopped worker kept: run as it ran them, one decode step
		 * each (a retrieval policy's prefill attends to every token, its decode to the
		 * selected pages, and the two differ numerically). */
		hist.n_prefill = hist.n - n_first;
		ret = 0;
		for (int i = 0; i < n_first && !ret; i++)
			ret = engine_decode(s->e, 1, &s->seq, first + i, logits, err, sizeof err);
	} else {
		hist.n_prefill = hist.n;
		s->progress_t0 = clock_ms_f();
		ret = engine_prefill(s->e, s->seq, first, n_first, logits, false, err, sizeof err);
		progress_clear(s);
	}
	if (ret && store_lost(s))
		ret = reconnect(s, &hist, logits);
	else if (ret)
		fprintf(stderr, "%s: prefill: %s\n", o->prog, err);
	if (ret) {
		s->store_lost = hostkv_store_gone(s->hk) || !s->hk;
		goto restore;
	}
	t.t1 = t.t2 = clock_ms_f();
	double last_report = t.t1;
	/* Generation's progress only when the text itself does not go to the terminal. */
	const bool gen_progress = s->progress && !isatty(STDOUT_FILENO) && o->n >= 64;
	s->progress_t0 = t.t1;
	bool hit_limit = false;
	while (t.generated < o->n && !g_stop) {
		int32_t next = sampler_sample(&smp, logits);
		if (is_eos(&s->m, s->tok, next))
			break;
		if ((ret = hist_push(&hist, &next, 1))) {
			fprintf(stderr, "\n%s: out of memory\n", o->prog);
			goto restore;
		}
		/* Kept before it is shown: what the user saw survives a crash. A store that went
		 * away is reconnected to, and `next` run there (its logits are the next step's). */
		bool decoded = false;
		if ((ret = engine_seq_keep(s->e, s->seq, &next, 1, err, sizeof err))) {
			if (!store_lost(s) || (ret = reconnect(s, &hist, logits))) {
				if (!store_lost(s) && s->hk)
					fprintf(stderr, "\n%s: %s\n", o->prog, err);
				s->store_lost = !s->hk || hostkv_store_gone(s->hk);
				goto restore;
			}
			decoded = true;
		}
		emit(s->tok, next, o->ids, t.generated++);
		if (gen_progress)
			progress_show(s, "generate", t.generated, o->n);
		if (t.generated == o->n)
			break;
		if (engine_seq_len(s->e, s->seq) >= engine_max_ctx(s->e)) {
			hit_limit = true;
			break;
		}
		if (!decoded &&
		    (ret = engine_decode(s->e, 1, &s->seq, &next, logits, err, sizeof err))) {
			if (!store_lost(s) || (ret = reconnect(s, &hist, logits))) {
				if (!store_lost(s) && s->hk)
					fprintf(stderr, "\n%s: decode: %s\n", o->prog, err);
				s->store_lost = !s->hk || hostkv_store_gone(s->hk);
				goto restore;
			}
		}
		t.steps++;
		t.t2 = clock_ms_f();
		if (hostkv_is_remote(s->hk) && t.t2 - last_report > 500) {
			report(s, &t, false);
			last_report = t.t2;
		}
	}
	t.t2 = clock_ms_f();
	progress_clear(s);
	if (o->ids || t.generated)
		printf("\n");
	fflush(stdout);
	if (g_stop) {
		s->interrupted = true;
		s->stop_signal = (int)g_stop;
		fprintf(stderr, "%s: interrupted: sequence '%s' kept at %lld tokens\n", o->prog,
			s->seq_name, (long long)engine_seq_len(s->e, s->seq));
	}
	if (hit_limit)
		fprintf(stderr, "%s: stopped at the context limit of %lld tokens\n", o->prog,
			(long long)engine_max_ctx(s->e));
	report(s, &t, o->stats);
	s->completed = true;
	ret = 0;
restore:
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
out:
	sampler_free(&smp);
	free(logits);
	free(hist.v);
	return ret;
}

void cmd_session_close(struct cmd_session *s)
{
	if (s->seq >= 0)
		engine_seq_free(s->e, s->seq);
	if (s->hs && s->store_lost) {
		/* The store is gone: the sequence stays in its journal; nothing to close there. */
		hostkv_seq_close(s->hs, false);
	} else if (s->hs) {
		/* A failed run keeps what it has when there is something to resume; a sequence that
		 * holds no token id is only clutter (resume refuses it), so it goes unless --keep. */
		const int32_t *ids;
		int64_t n_ids = hostkv_seq_tokens(s->hs, &ids);
		bool failed = !s->interrupted && !s->completed;
		bool keep = s->o.keep || s->interrupted || (failed && n_ids > 0);
		int ret = hostkv_seq_close(s->hs, !keep);
		if (ret)
			fprintf(stderr, "%s: closing sequence '%s': %s\n", s->o.prog, s->seq_name,
				strerror(-ret));
		else if (keep && failed && !s->o.keep && hostkv_is_remote(s->hk))
			fprintf(stderr, "%s: sequence '%s' kept in the store (%lld token ids): continue "
				"it with `kvworker resume --seq %s`, or drop it with `kvctl evict %s`\n",
				s->o.prog, s->seq_name, (long long)n_ids, s->seq_name, s->seq_name);
		else if (keep && hostkv_is_remote(s->hk))
			fprintf(stderr, "%s: sequence '%s' kept in the store\n", s->o.prog,
				s->seq_name);
		else if (s->resumed && hostkv_is_remote(s->hk))
			fprintf(stderr, "%s: sequence '%s' is done and was dropped from the store "
				"(--keep keeps it)\n", s->o.prog, s->seq_name);
	}
	hostkv_close(s->hk);
	engine_free(s->e);
	backend_free(s->be);
	tokenizer_free(s->tok);
	model_free(&s->m);
	memset(s, 0, sizeof *s);
	s->seq = -1;
}
