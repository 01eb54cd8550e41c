/* bench_decode_cpu — prefill and decode throughput of the engine on the CPU backend, for each
 * model at 1 and 2 threads, printed as a table with the speedup over 1 thread (the baseline run
 * in the same process).
 *
 * Models: stories260K (GGUF) from the models directory, and a synthetic model with
 * Llama-3.1-8B attention and MLP geometry written to a temporary folder with synth_write (2
 * layers, bf16, a small vocabulary so the classifier does not dominate). Each measurement
 * prefills a random prompt of -p tokens into a fresh sequence, then decodes -n tokens greedily;
 * one untimed warm-up run precedes it, and the best of -r runs is reported (the machine may be
 * shared: the best run is the one least disturbed).
 *
 * usage: bench_decode_cpu [-p PROMPT_TOKENS] [-n DECODE_TOKENS] [-r RUNS] [-m MODEL]...
 *                         [--no-synth] [--synth-layers N] [--synth-vocab N] [--threads a,b,...] */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "backend.h"
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "synth.h"

#ifndef FREEKV_MODELS_DIR
#define FREEKV_MODELS_DIR "tests/data/models"
#endif

struct measure {
	double prefill_tok_s, decode_tok_s;
};

/* The 1-minute load average, to judge whether a run had the cores to itself; -1 if unknown. */
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

/* Prefill n_prompt random tokens, then n_gen greedy decode steps. */
static int run_once(struct engine *e, int n_prompt, int n_gen, struct measure *out)
{
	char err[512];
	int V = engine_vocab(e), seq;
	int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
	float *lg = malloc((size_t)V * sizeof *lg);
	if (!ids || !lg) {
		free(ids);
		free(lg);
		return -ENOMEM;
	}
	uint64_t s = 12345;
	for (int i = 0; i < n_prompt; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
	}
	int ret = engine_seq_new(e, &seq, err, sizeof err);
	double t0 = clock_ms_f(), t1 = t0, t2 = t0;
	if (!ret)
		ret = engine_prefill(e, seq, ids, n_prompt, lg, false, err, sizeof err);
	t1 = clock_ms_f();
	for (int i = 0; i < n_gen && !ret; i++) {
		int32_t t = sampler_argmax(lg, V);
		ret = engine_decode(e, 1, &seq, &t, lg, err, sizeof err);
	}
	t2 = clock_ms_f();
	if (ret)
		fprintf(stderr, "bench: %s\n", err);
	engine_seq_free(e, seq);
	out->prefill_tok_s = n_prompt / ((t1 - t0) / 1e3);
	out->decode_tok_s = n_gen / ((t2 - t1) / 1e3);
	free(ids);
	free(lg);
	return ret;
}

static int bench_model(const char *label, const char *path, int n_prompt, int n_gen, int runs,
		       const int *threads, int n_threads)
{
	struct fkv_model m;
	char err[1024];
	int ret = model_load(path, &m, err, sizeof err);
	if (ret) {
		fprintf(stderr, "bench: cannot load %s: %s\n", path, err);
		return ret;
	}
	struct measure base = { 0 };
	for (int i = 0; i < n_threads && !ret; i++) {
		struct backend *be;
		struct engine *e;
		struct engine_opts o = { .max_ctx = n_prompt + n_gen + 8, .max_seqs = 1 };
		if ((ret = backend_cpu_new(&be, threads[i])))
			break;
		if ((ret = engine_new(&e, &m, be, &o, err, sizeof err))) {
			fprintf(stderr, "bench: %s\n", err);
			backend_free(be);
			break;
		}
		struct measure w, r = { 0 }, one;
		ret = run_once(e, n_prompt < 16 ? n_prompt : 16, 2, &w);
		for (int k = 0; k < runs && !ret; k++) {
			ret = run_once(e, n_prompt, n_gen, &one);
			if (one.prefill_tok_s > r.prefill_tok_s)
				r.prefill_tok_s = one.prefill_tok_s;
			if (one.decode_tok_s > r.decode_tok_s)
				r.decode_tok_s = one.decode_tok_s;
		}
		if (!ret) {
			if (i == 0)
				base = r;
			printf("| %-38s | %7d | %13.1f | %12.2f | %9.2fx | %8.2fx |\n", label,
			       threads[i], r.prefill_tok_s, r.decode_tok_s,
			       r.prefill_tok_s / base.prefill_tok_s,
			       r.decode_tok_s / base.decode_tok_s);
			fflush(stdout);
		}
		engine_free(e);
		backend_free(be);
	}
	model_free(&m);
	return ret;
}

int main(int argc, char **argv)
{
	int n_prompt = 64, n_gen = 16, runs = 3, synth = 1, synth_layers = 2, synth_vocab = 4096;
	int threads[8] = { 1, 2 }, n_threads = 2;
	const char *models[8];
	int n_models = 0;
	static const struct option opts[] = {
		{ "no-synth", no_argument, NULL, 'S' },
		{ "synth-layers", required_argument, NULL, 'L' },
		{ "synth-vocab", required_argument, NULL, 'V' },
		{ "threads", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "p:n:r:m:t:", opts, NULL)) != -1) {
		switch (c) {
		case 'p': n_prompt = atoi(optarg); break;
		case 'n': n_gen = atoi(optarg); break;
		case 'r': runs = atoi(optarg); break;
		case 'm':
			if (n_models < 8)
				models[n_models++] = optarg;
			break;
		case 'S': synth = 0; break;
		case 'L': synth_layers = atoi(optarg); break;
		case 'V': synth_vocab = atoi(optarg); break;
		case 't':
			n_threads = 0;
			for (char *p = strtok(optarg, ","); p && n_threads < 8; p = strtok(NULL, ","))
				threads[n_threads++] = atoi(p);
			break;
		default:
			fprintf(stderr, "usage: %s [-p N] [-n N] [-r N] [-m MODEL]... [--no-synth] "
				"[--synth-layers N] [--synth-vocab N] [--threads a,b]\n", argv[0]);
			return 2;
		}
	}
	if (n_prompt < 1 || n_gen < 1 || runs < 1 || n_threads < 1 || synth_layers < 1) {
		fprintf(stderr, "bench: -p, -n, -r, --threads and --synth-layers must be positive\n");
		return 2;
	}
	char stories[4096], dir[] = "/tmp/freekv-bench-XXXXXX", label[128];
	snprintf(stories, sizeof stories, "%s/stories260K/stories260K.gguf",
		 getenv("FREEKV_MODELS_DIR") ? getenv("FREEKV_MODELS_DIR") : FREEKV_MODELS_DIR);
	if (!n_models && access(stories, R_OK) == 0)
		models[n_models++] = stories;
	printf("prefill %d tokens, then decode %d tokens, best of %d runs; speedups against the "
	       "first thread count; %ld cores, load average %.2f at start\n\n", n_prompt, n_gen, runs,
	       sysconf(_SC_NPROCESSORS_ONLN), loadavg());
	printf("| %-38s | threads | prefill tok/s | decode tok/s | prefill vs | decode vs |\n",
	       "model");
	printf("|----------------------------------------|---------|---------------|--------------|"
	       "------------|-----------|\n");
	int ret = 0;
	for (int i = 0; i < n_models && !ret; i++) {
		const char *b = strrchr(models[i], '/');
		ret = bench_model(b ? b + 1 : models[i], models[i], n_prompt, n_gen, runs, threads,
				  n_threads);
	}
	if (synth && !ret) {
		char err[512];
		if (!mkdtemp(dir)) {
			perror("bench: mkdtemp");
			return 1;
		}
		ret = synth_write("llama-3.1-8b", synth_layers, FKV_BF16, dir, 1, synth_vocab, err,
				  sizeof err);
		if (ret)
			fprintf(stderr, "bench: synth_write: %s\n", err);
		snprintf(label, sizeof label, "llama-3.1-8b geometry, %dL, V=%d bf16", synth_layers,
			 synth_vocab);
		if (!ret)
			ret = bench_model(label, dir, n_prompt, n_gen, runs, threads, n_threads);
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
		if (system(cmd))
			fprintf(stderr, "bench: could not remove %s\n", dir);
	}
	printf("\nload average %.2f at end\n", loadavg());
	return ret ? 1 : 0;
}
