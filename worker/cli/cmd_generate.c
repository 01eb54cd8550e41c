/* cmd_generate — `kvworker generate`: prefill a prompt, then sample a continuation token by
 * token, streaming only the continuation to stdout (text, or ids with --ids). Every token's KV
 * goes to a host copy — a kvstored sequence with --store, else an embedded store — committed
 * after each step, so a run that dies can be continued by `kvworker resume`. --stats prints one
 * JSON line of timings and retrieval statistics to stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "tokenizer.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker generate -m MODEL (-p PROMPT | -p - | -f FILE) [options]\n"
		"  -p, --prompt TEXT    prompt text; '-' reads it from stdin\n"
		"  -f, --file PATH      read the prompt from a file\n");
	cmd_session_usage(f);
	fprintf(f, "  -h, --help           this text\n");
}

/* 0 parsed, -1 help shown, CMD_USAGE. */
static int parse(int argc, char **argv, struct cmd_session_opts *o, const char **prompt,
		 const char **file)
{
	static const struct option own[] = {
		{ "prompt", required_argument, NULL, 'p' },
		{ "file", required_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
	};
	struct option opts[128];
	cmd_options(opts, 128, own, sizeof own / sizeof *own, true);
	cmd_session_defaults(o, "kvworker generate");
	*prompt = *file = NULL;
	optind = 0; /* getopt_long starts afresh */
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":p:f:h" CMD_SESSION_SHORT, opts, NULL)) != -1) {
		switch (c) {
		case 'p': *prompt = optarg; break;
		case 'f': *file = optarg; break;
		case 'h': usage(stdout); return -1;
		case '?':
		case ':':
			cmd_getopt_error(o->prog, c, argv);
			usage(stderr);
			return CMD_USAGE;
		default:
			if (cmd_session_apply(o, c, optarg) != 1) {
				usage(stderr);
				return CMD_USAGE;
			}
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvworker generate: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return CMD_USAGE;
	}
	if (!o->model || (!*prompt && !*file) || (*prompt && *file)) {
		fprintf(stderr, "kvworker generate: need -m and exactly one of -p / -f\n");
		usage(stderr);
		return CMD_USAGE;
	}
	if (cmd_session_check(o)) {
		usage(stderr);
		return CMD_USAGE;
	}
	return 0;
}

int cmd_generate(int argc, char **argv)
{
	struct cmd_session_opts o;
	const char *prompt_arg, *file;
	int ret = parse(argc, argv, &o, &prompt_arg, &file);
	if (ret)
		return ret < 0 ? CMD_OK : ret;
	char *text = NULL;
	if (file || !strcmp(prompt_arg, "-")) {
		const char *path = file ? file : "-";
		int r = cmd_read_text(path, &text);
		if (r) {
			fprintf(stderr, "kvworker generate: cannot read %s: %s\n",
				strcmp(path, "-") ? path : "stdin", strerror(-r));
			return CMD_FAIL;
		}
	}
	struct cmd_session s;
	int *prompt = NULL;
	int32_t *ids = NULL;
	ret = CMD_FAIL;
	if (cmd_session_load(&s, &o, false))
		goto out;
	int n_prompt = tokenizer_encode(s.tok, text ? text : prompt_arg, true, &prompt);
	if (n_prompt < 0) {
		fprintf(stderr, "kvworker generate: cannot tokenize the prompt: %s\n",
			strerror(-n_prompt));
		goto out;
	}
	if (n_prompt == 0) {
		fprintf(stderr, "kvworker generate: empty prompt and the model has no BOS token\n");
		goto out;
	}
	if (n_prompt > engine_max_ctx(s.e)) {
		fprintf(stderr, "kvworker generate: the prompt has %d tokens, more than the context "
			"limit of %lld\n", n_prompt, (long long)engine_max_ctx(s.e));
		goto out;
	}
	ids = malloc((size_t)n_prompt * sizeof *ids);
	if (!ids) {
		fprintf(stderr, "kvworker generate: out of memory\n");
		goto out;
	}
	for (int i = 0; i < n_prompt; i++)
		ids[i] = prompt[i];
	if (cmd_session_open_seq(&s, ids, n_prompt))
		goto out;
	/* The prompt's leading tokens found in kvstored's pool are not run again. */
	ret = cmd_session_exit(&s, cmd_session_run(&s, ids + s.prefix_covered,
						   n_prompt - (int)s.prefix_covered));
out:
	cmd_session_close(&s);
	free(ids);
	free(prompt);
	free(text);
	return ret;
}
