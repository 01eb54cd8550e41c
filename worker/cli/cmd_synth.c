/* cmd_synth — `kvworker synth`: writes a random-weight Hugging Face folder with a real model's
 * geometry (synth.h) for benchmarks and tests at scale. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"
#include "synth.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker synth --preset NAME --out DIR [options]\n"
		"  --preset NAME        model geometry (--list shows them)\n"
		"  --out DIR            output folder (created when missing)\n"
		"  --layers N           override the number of layers\n"
		"  --dtype T            bf16 (default), f16 or f32\n"
		"  --vocab N            override the vocabulary size (at least %d)\n"
		"  --seed S             weight seed (default 1)\n"
		"  --list               list the presets\n"
		"  -h, --help           this text\n",
		synth_min_vocab());
}

enum { OPT_PRESET = 256, OPT_OUT, OPT_LAYERS, OPT_DTYPE, OPT_VOCAB, OPT_SEED, OPT_LIST };

static const struct option opts[] = {
	{ "preset", required_argument, NULL, OPT_PRESET },
	{ "out", required_argument, NULL, OPT_OUT },
	{ "layers", required_argument, NULL, OPT_LAYERS },
	{ "dtype", required_argument, NULL, OPT_DTYPE },
	{ "vocab", required_argument, NULL, OPT_VOCAB },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "list", no_argument, NULL, OPT_LIST },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static int bad(const char *flag, const char *val)
{
	fprintf(stderr, "kvworker synth: invalid value '%s' for %s\n", val, flag);
	usage(stderr);
	return CMD_USAGE;
}

int cmd_synth(int argc, char **argv)
{
	const char *preset = NULL, *out = NULL;
	long layers = 0, vocab = 0;
	uint64_t seed = 1;
	enum fkv_dtype dt = FKV_BF16;
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case OPT_PRESET: preset = optarg; break;
		case OPT_OUT: out = optarg; break;
		case OPT_LAYERS:
			if (cmd_parse_long(optarg, 1, FKV_MAX_LAYERS, &layers))
				return bad("--layers", optarg);
			break;
		case OPT_DTYPE:
			if (dtype_parse(optarg, &dt))
				return bad("--dtype", optarg);
			break;
		case OPT_VOCAB:
			if (cmd_parse_long(optarg, synth_min_vocab(), 1L << 24, &vocab))
				return bad("--vocab", optarg);
			break;
		case OPT_SEED:
			if (cmd_parse_u64(optarg, &seed))
				return bad("--seed", optarg);
			break;
		case OPT_LIST:
			for (int i = 0; i < synth_n_presets(); i++)
				printf("%-14s %s\n", synth_preset_name(i), synth_preset_desc(i));
			return CMD_OK;
		case 'h': usage(stdout); return CMD_OK;
		default: usage(stderr); return CMD_USAGE;
		}
	}
	if (optind < argc || !preset || !out) {
		fprintf(stderr, "kvworker synth: need --preset and --out\n");
		usage(stderr);
		return CMD_USAGE;
	}
	int known = 0;
	for (int i = 0; i < synth_n_presets(); i++)
		known |= !strcmp(preset, synth_preset_name(i));
	if (!known) {
		fprintf(stderr, "kvworker synth: unknown preset '%s'; known:", preset);
		for (int i = 0; i < synth_n_presets(); i++)
			fprintf(stderr, " %s", synth_preset_name(i));
		fprintf(stderr, "\n");
		return CMD_USAGE;
	}
	char err[512];
	if (synth_write(preset, (int)layers, dt, out, seed, (int)vocab, err, sizeof err)) {
		fprintf(stderr, "kvworker synth: %s\n", err);
		return CMD_FAIL;
	}
	fprintf(stderr, "kvworker synth: wrote %s to %s\n", preset, out);
	return CMD_OK;
}
