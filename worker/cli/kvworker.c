/* kvworker — the worker executable: a table of commands (generate, resume, perplexity, eval,
 * synth, serve, client, info), each parsing its own flags. Exit codes: 0 ok, 1 failed, 2 usage,
 * 128 + the signal when SIGINT/SIGTERM stopped a generate or resume (130, 143). */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "cmd_common.h"
#include "log.h"
#include "version.h"

static const struct cmd commands[] = {
	{ "generate", "continue a prompt with a model", cmd_generate },
	{ "resume", "continue a sequence kept by kvstored", cmd_resume },
	{ "perplexity", "teacher-forced perplexity of a text file", cmd_perplexity },
	{ "eval", "compare KV retrieval policies on a text file (perplexity, top-1 agreement)",
	  cmd_eval },
	{ "synth", "write a random-weight model with a real model's geometry", cmd_synth },
	{ "serve", "serve generation requests with continuous batching (a service)", cmd_serve },
	{ "client", "send a request to `kvworker serve` and stream its output", cmd_client },
	{ "info", "describe a model file from its headers (geometry, tokenizer, tensor types)",
	  cmd_info },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvworker COMMAND [OPTIONS]   (kvworker COMMAND --help for its options)\n"
		   "       kvworker --version             version, commit, build, CUDA devices\n\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
		fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\nexit codes: 0 ok, 1 failed, 2 usage, 130 / 143 generate or resume stopped by "
		   "SIGINT / SIGTERM\n(the sequence kept in kvstored)\n");
}

int main(int argc, char **argv)
{
	log_init("kvworker", LOG_INFO); /* serve names itself again; --log-level sets the level */
	if (argc < 2) {
		usage(stderr);
		return CMD_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return CMD_OK;
	}
	if (!strcmp(argv[1], "--version")) {
		fkv_version_print(stdout, "kvworker");
#ifdef FREEKV_HAVE_CUDA
		printf("CUDA devices: %d\n", backend_cuda_devices());
#endif
		return CMD_OK;
	}
	for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "kvworker: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return CMD_USAGE;
}
