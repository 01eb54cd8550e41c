/* cmd_generate — `kvworker generate`: prefill a prompt, then sample a continuation token by
 * token, streaming only the continuation to stdout (text, or ids with --ids). --stats prints one
 * JSON line of timings to stderr. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cmd_common.h"
#include "engine.h"
#include "sampler.h"
#include "tokenizer.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker generate -m MODEL (-p PROMPT | -p - | -f FILE) [options]\n"
		"  -m, --model PATH     .gguf file or Hugging Face folder\n"
		"  -p, --prompt TEXT    prompt text; '-' reads it from stdin\n"
		"  -f, --file PATH      read the prompt from a file\n"
		"  -n, --n-predict N    tokens to generate (default 64); stops early at EOS\n"
		"      --temp T         temperature, 0 = greedy (default 0.8)\n"
		"      --top-k K        keep the K most likely tokens, 0 = all (default 40)\n"
		"      --top-p P        nucleus mass, 1 = off (default 0.95)\n"
		"  -s, --seed S         sampling seed (default: from the clock)\n"
		"  -t, --threads N      compute threads (default: all cores)\n"
		"  -c, --ctx-size N     context limit in tokens (default: the model's)\n"
		"      --ids            print token ids, space-separated, instead of text\n"
		"      --stats          print a JSON line of timings to stderr\n"
		"  -h, --help           this text\n");
}

enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_IDS, OPT_STATS };

static const struct option opts[] = {
	{ "model", required_argument, NULL, 'm' },
	{ "prompt", required_argument, NULL, 'p' },
	{ "file", required_argument, NULL, 'f' },
	{ "n-predict", required_argument, NULL, 'n' },
	{ "threads", required_argument, NULL, 't' },
	{ "ctx", required_argument, NULL, 'c' },
	{ "ctx-size", required_argument, NULL, 'c' },
	{ "temp", required_argument, NULL, OPT_TEMP },
	{ "top-k", required_argument, NULL, OPT_TOPK },
	{ "top-p", required_argument, NULL, OPT_TOPP },
	{ "seed", required_argument, NULL, 's' },
	{ "ids", no_argument, NULL, OPT_IDS },
	{ "stats", no_argument, NULL, OPT_STATS },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

struct gen_args {
	const char *model, *prompt, *file;
	long n, threads, ctx;
	struct sampler_params sp;
	bool ids, stats;
};

static int bad(const char *flag, const char *val)
{
	fprintf(stderr, "kvworker generate: invalid value '%s' for %s\n", val, flag);
	usage(stderr);
	return CMD_USAGE;
}

static int parse(int argc, char **argv, struct gen_args *a)
{
	double d;
	*a = (struct gen_args){ .n = 64, .sp = { .temp = 0.8f, .top_k = 40, .top_p = 0.95f } };
	a->sp.seed = (uint64_t)time(NULL);
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "m:p:f:n:t:c:s:h", opts, NULL)) != -1) {
		long v;
		switch (c) {
		case 'm': a->model = optarg; break;
		case 'p': a->prompt = optarg; break;
		case 'f': a->file = optarg; break;
		case 'n':
			if (cmd_parse_long(optarg, 0, 1L << 30, &a->n))
				return bad("-n", optarg);
			break;
		case 't':
			if (cmd_parse_long(optarg, 1, 4096, &a->threads))
				return bad("-t", optarg);
			break;
		case 'c':
			if (cmd_parse_long(optarg, 1, 1L << 30, &a->ctx))
				return bad("--ctx", optarg);
			break;
		case OPT_TEMP:
			if (cmd_parse_float(optarg, 0.0, 100.0, &d))
				return bad("--temp", optarg);
			a->sp.temp = (float)d;
			break;
		case OPT_TOPK:
			if (cmd_parse_long(optarg, 0, 1L << 30, &v))
				return bad("--top-k", optarg);
			a->sp.top_k = (int)v;
			break;
		case OPT_TOPP:
			if (cmd_parse_float(optarg, 0.0, 1.0, &d))
				return bad("--top-p", optarg);
			a->sp.top_p = (float)d;
			break;
		case 's':
			if (cmd_parse_u64(optarg, &a->sp.seed))
				return bad("--seed", optarg);
			break;
		case OPT_IDS: a->ids = true; break;
		case OPT_STATS: a->stats = true; break;
		case 'h': usage(stdout); return -1;
		default: usage(stderr); return CMD_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvworker generate: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return CMD_USAGE;
	}
	if (!a->model || (!a->prompt && !a->file) || (a->prompt && a->file)) {
		fprintf(stderr, "kvworker generate: need -m and exactly one of -p / -f\n");
		usage(stderr);
		return CMD_USAGE;
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

/* Prefill + decode loop; the engine, model and tokenizer are set up by the caller. */
static int run(const struct gen_args *a, const struct fkv_model *m,
	       const struct fkv_tokenizer *tok, struct backend *be, struct engine *e,
	       const int *prompt, int n_prompt)
{
	char err[512];
	int V = engine_vocab(e), seq, ret = CMD_FAIL;
	struct sampler smp = { 0 };
	float *logits = malloc((size_t)V * sizeof *logits);
	if (!logits || sampler_init(&smp, &a->sp, V)) {
		fprintf(stderr, "kvworker generate: out of memory\n");
		goto out;
	}
	if (engine_seq_new(e, &seq, err, sizeof err)) {
		fprintf(stderr, "kvworker generate: %s\n", err);
		goto out;
	}
	int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
	if (!ids)
		goto out;
	for (int i = 0; i < n_prompt; i++)
		ids[i] = prompt[i];
	double t0 = cmd_now_ms();
	int r = engine_prefill(e, seq, ids, n_prompt, logits, false, err, sizeof err);
	free(ids);
	if (r) {
		fprintf(stderr, "kvworker generate: prefill: %s\n", err);
		goto out;
	}
	double t1 = cmd_now_ms();
	int generated = 0, steps = 0;
	bool hit_limit = false;
	while (generated < a->n) {
		int32_t next = sampler_sample(&smp, logits);
		if (is_eos(m, tok, next))
			break;
		emit(tok, next, a->ids, generated++);
		if (generated == a->n)
			break;
		if (engine_seq_len(e, seq) >= engine_max_ctx(e)) {
			hit_limit = true;
			break;
		}
		if (engine_decode(e, 1, &seq, &next, logits, err, sizeof err)) {
			fprintf(stderr, "\nkvworker generate: decode: %s\n", err);
			goto out;
		}
		steps++;
	}
	double t2 = cmd_now_ms();
	if (a->ids || generated)
		printf("\n");
	fflush(stdout);
	if (hit_limit)
		fprintf(stderr, "kvworker generate: stopped at the context limit of %lld tokens\n",
			(long long)engine_max_ctx(e));
	if (a->stats)
		fprintf(stderr,
			"{\"prompt_tokens\": %d, \"generated_tokens\": %d, \"decode_steps\": %d, "
			"\"prefill_ms\": %.3f, \"decode_ms\": %.3f, \"prefill_tok_s\": %.2f, "
			"\"decode_tok_s\": %.2f, \"threads\": %d, \"seed\": %llu}\n",
			n_prompt, generated, steps, t1 - t0, t2 - t1,
			t1 > t0 ? n_prompt / ((t1 - t0) / 1e3) : 0.0,
			steps && t2 > t1 ? steps / ((t2 - t1) / 1e3) : 0.0,
			be->ops->get_threads ? be->ops->get_threads(be->ctx) : (int)a->threads,
			(unsigned long long)a->sp.seed);
	ret = CMD_OK;
out:
	sampler_free(&smp);
	free(logits);
	return ret;
}

int cmd_generate(int argc, char **argv)
{
	struct gen_args a;
	int ret = parse(argc, argv, &a);
	if (ret)
		return ret < 0 ? CMD_OK : ret;
	char *text = NULL;
	if (a.file || !strcmp(a.prompt, "-")) {
		const char *path = a.file ? a.file : "-";
		int r = cmd_read_text(path, &text);
		if (r) {
			fprintf(stderr, "kvworker generate: cannot read %s: %s\n",
				strcmp(path, "-") ? path : "stdin", strerror(-r));
			return CMD_FAIL;
		}
	}
	struct fkv_model m = { 0 };
	struct fkv_tokenizer *tok = NULL;
	struct backend *be = NULL;
	struct engine *e = NULL;
	int *prompt = NULL;
	char err[512];
	ret = CMD_FAIL;
	if (cmd_load(a.model, &m, &tok))
		goto out;
	int n_prompt = tokenizer_encode(tok, text ? text : a.prompt, true, &prompt);
	if (n_prompt < 0) {
		fprintf(stderr, "kvworker generate: cannot tokenize the prompt: %s\n",
			strerror(-n_prompt));
		goto out;
	}
	if (n_prompt == 0) {
		fprintf(stderr, "kvworker generate: empty prompt and the model has no BOS token\n");
		goto out;
	}
	if (backend_cpu_new(&be, (int)a.threads)) {
		fprintf(stderr, "kvworker generate: cannot create the CPU backend\n");
		goto out;
	}
	struct engine_opts eo = { .max_ctx = a.ctx, .max_seqs = 1 };
	if (engine_new(&e, &m, be, &eo, err, sizeof err)) {
		fprintf(stderr, "kvworker generate: %s\n", err);
		goto out;
	}
	if (n_prompt > engine_max_ctx(e)) {
		fprintf(stderr, "kvworker generate: the prompt has %d tokens, more than the context "
			"limit of %lld\n", n_prompt, (long long)engine_max_ctx(e));
		goto out;
	}
	ret = run(&a, &m, tok, be, e, prompt, n_prompt);
out:
	engine_free(e);
	backend_free(be);
	free(prompt);
	tokenizer_free(tok);
	model_free(&m);
	free(text);
	return ret;
}
