/* cmd_perplexity — `kvworker perplexity`: teacher-forced perplexity of a text file. The text is
 * tokenized once and cut into consecutive windows; each window is a fresh sequence of at most
 * ctx tokens (BOS first when the model has one) and every token after the first position is
 * scored against the logits of the position before it. One line per window, then
 * `perplexity: X` last. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cmd_common.h"
#include "engine.h"
#include "tokenizer.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker perplexity -m MODEL -f TEXTFILE [options]\n"
		"  -m, --model PATH     .gguf file or Hugging Face folder\n"
		"  -f, --file PATH      text to score; '-' reads stdin\n"
		"  -c, --ctx-size N     window length in tokens (default: min(512, the model's))\n"
		"  -t, --threads N      compute threads (default: all cores)\n"
		"      --backend B      cuda, cpu or auto (default: cuda when a device is present)\n"
		"  -h, --help           this text\n");
}

static const struct option opts[] = {
	{ "model", required_argument, NULL, 'm' },
	{ "file", required_argument, NULL, 'f' },
	{ "ctx", required_argument, NULL, 'c' },
	{ "ctx-size", required_argument, NULL, 'c' },
	{ "threads", required_argument, NULL, 't' },
	{ "backend", required_argument, NULL, 'B' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* Scores every window; returns 0 with *sum / *count filled, or CMD_FAIL. */
static int score(struct engine *e, const int *toks, int n, int bos, long ctx, double *sum,
		 long *count)
{
	int V = engine_vocab(e);
	char err[512];
	int32_t *win = malloc((size_t)ctx * sizeof *win);
	float *logits = malloc((size_t)ctx * (size_t)V * sizeof *logits);
	int ret = CMD_FAIL;
	if (!win || !logits) {
		fprintf(stderr, "kvworker perplexity: out of memory for a %ld-token window\n", ctx);
		goto out;
	}
	long per = bos >= 0 ? ctx - 1 : ctx; /* text tokens per window */
	int w = 0;
	for (long start = 0; start < n; start += per, w++) {
		long len = cmd_window(win, toks, n, start, per, bos);
		if (len < 2)
			break;
		int seq;
		if (engine_seq_new(e, &seq, err, sizeof err) ||
		    engine_prefill(e, seq, win, (int)len, logits, true, err, sizeof err)) {
			fprintf(stderr, "kvworker perplexity: window %d: %s\n", w, err);
			goto out;
		}
		engine_seq_free(e, seq);
		double ws = 0.0;
		for (long i = 1; i < len; i++)
			ws += cmd_nll(logits + (size_t)(i - 1) * V, V, win[i]);
		*sum += ws;
		*count += len - 1;
		printf("window %d: %ld tokens, perplexity %.4f\n", w, len - 1, exp(ws / (len - 1)));
	}
	ret = 0;
out:
	free(win);
	free(logits);
	return ret;
}

int cmd_perplexity(int argc, char **argv)
{
	const char *model = NULL, *file = NULL, *backend = NULL;
	long ctx = 0, threads = 0;
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "m:f:c:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'f': file = optarg; break;
		case 'B': backend = optarg; break;
		case 'c':
			if (cmd_parse_long(optarg, 2, 1L << 24, &ctx)) {
				fprintf(stderr, "kvworker perplexity: invalid --ctx '%s'\n", optarg);
				usage(stderr);
				return CMD_USAGE;
			}
			break;
		case 't':
			if (cmd_parse_long(optarg, 1, 4096, &threads)) {
				fprintf(stderr, "kvworker perplexity: invalid -t '%s'\n", optarg);
				usage(stderr);
				return CMD_USAGE;
			}
			break;
		case 'h': usage(stdout); return CMD_OK;
		default: usage(stderr); return CMD_USAGE;
		}
	}
	if (optind < argc || !model || !file) {
		fprintf(stderr, "kvworker perplexity: need -m MODEL and -f TEXTFILE\n");
		usage(stderr);
		return CMD_USAGE;
	}
	char *text = NULL, err[512];
	int r = cmd_read_text(file, &text);
	if (r) {
		fprintf(stderr, "kvworker perplexity: cannot read %s: %s\n", file, strerror(-r));
		return CMD_FAIL;
	}
	struct fkv_model m = { 0 };
	struct fkv_tokenizer *tok = NULL;
	struct backend *be = NULL;
	struct engine *e = NULL;
	int *toks = NULL, ret = CMD_FAIL;
	if (cmd_load(model, &m, &tok))
		goto out;
	int n = tokenizer_encode(tok, text, false, &toks);
	if (n < 0) {
		fprintf(stderr, "kvworker perplexity: cannot tokenize %s: %s\n", file, strerror(-n));
		goto out;
	}
	int bos = tokenizer_bos(tok);
	if (n + (bos >= 0) < 2) {
		fprintf(stderr, "kvworker perplexity: %s has too few tokens to score\n", file);
		goto out;
	}
	if (!ctx)
		ctx = m.cfg.ctx_len > 0 && m.cfg.ctx_len < 512 ? m.cfg.ctx_len : 512;
	else if (m.cfg.ctx_len > 0 && ctx > m.cfg.ctx_len)
		fprintf(stderr, "kvworker perplexity: warning: --ctx %ld is past the model's trained "
			"context of %d tokens; positions beyond it were never trained\n", ctx,
			(int)m.cfg.ctx_len);
	if (bos >= 0 && ctx < 2) {
		fprintf(stderr, "kvworker perplexity: --ctx must leave room for BOS and a token\n");
		goto out;
	}
	if (backend_open(backend, (int)threads, &be, err, sizeof err)) {
		fprintf(stderr, "kvworker perplexity: %s\n", err);
		goto out;
	}
	struct engine_opts eo = { .max_ctx = ctx, .max_seqs = 1 };
	if (engine_new(&e, &m, be, &eo, err, sizeof err)) {
		fprintf(stderr, "kvworker perplexity: %s\n", err);
		goto out;
	}
	double sum = 0.0;
	long count = 0;
	if (score(e, toks, n, bos, ctx, &sum, &count))
		goto out;
	printf("tokens scored: %ld\n", count);
	printf("perplexity: %.4f\n", exp(sum / count));
	ret = CMD_OK;
out:
	engine_free(e);
	backend_free(be);
	free(toks);
	tokenizer_free(tok);
	model_free(&m);
	free(text);
	return ret;
}
