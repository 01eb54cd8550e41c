/* bench_decode_gpu — decode step latency on the CUDA backend with Llama-3.1-8B geometry (32
 * layers, dim 4096, GQA 32/8, head dim 128, FFN 14336, vocab 128256, llama3 rope), bf16, as in
 * the FreeKV paper: long-input (32K prompt, 512 generated) and long-generation (600 prompt, 16K
 * generated), batch 1 / 4 / 8, per KV policy, B = 2048, S = W = 512, p = 32.
 *
 * Weights: random, made without a 16 GB file: one bf16 buffer per tensor shape class filled
 * from a fixed-seed generator on the host and shared by every layer's tensor of that shape;
 * weight_load copies each to the device (the numbers are meaningless, the bytes moved are the
 * real model's). Each run prefills every sequence of the batch through the engine, then times
 * every decode step of the batch (engine_decode: projections, RoPE, KV append, attention, MLP,
 * logits, download); it prints per row the mean and median step time, the step's floor (weight
 * bytes + KV bytes read, over the device-to-device copy bandwidth measured here), the recall
 * traffic per step, the fraction of recall time hidden beside the step and the correction
 * rate, the prefill's seconds and whether the decode steps ran through CUDA Graphs, and the
 * ratios freekv / streaming, quest / freekv and full / freekv when those policies ran.
 *
 * The retrieval policies (streaming, quest, freekv) run on cuda like `full`: each sequence gets a
 * host copy in an embedded store sized for the run (the engine page-locks its pool for DMA
 * recall), the budget's slots live on the device and recalls go through recall_units. A run
 * that fails is reported as not run with the engine's reason, and the ratios are printed only
 * for policies that ran.
 *
 * Time budget (--budget S, default 480 s, under bench/gpu/run.sh's 540 s timeout): a run that
 * cannot finish in what is left is stopped — before a sequence's prefill once the budget is
 * spent, or after 8 timed steps when their mean says the rest would overrun — and reported as
 * skipped with the time it needed, so every printed row is complete.
 *
 * usage: bench_decode_gpu [--quick] [--shape long-input|long-gen|both] [--batch LIST]
 *                         [--policies LIST] [--recall LIST] [--gen N] [--ctx N] [--layers N]
 *                         [--ubatch N]
 *                         [--budget S]
 *   --policies  a row each; POLICY:TAU sets tau (default 0.9; freekv:0 corrects every step);
 *   POLICY+nospec, +frag, +single add the Fig. 8 ablations
 *   (bench_ablation.h), and "fig8" is their set (quest+frag+single stands in for ArkVale)
 *   --recall  how the retrieval policies' recalls reach the device, a row each: mapped (the
 *   zero-copy gather kernel; the default, measured faster), dma (batched copies from the
 *   registered pool), staged (host copies first)
 *   defaults: both shapes (long-input: 32768 prompt, 256 generated; long-gen: 600 prompt,
 *   4096 generated), batch 1, policies full,streaming,quest,freekv;
 *   --gen / --ctx replace every chosen shape's generated / prompt length; --ubatch N the
 *   prefill chunk (default the engine's 256: 2048 gives prefill attention 8x the blocks);
 *   --quick  4 layers, vocab 32000, one shape: 2048 prompt, 32 generated, batch 1 and 4 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "clock.h"
#include "backend.h"
#include "dtype.h"
#include "engine.h"
#include "hostkv.h"
#include "model.h"
#include "sampler.h"

#include "../bench_ablation.h"

#define MAX_LIST 8

struct shape {
	const char *name;
	int prompt, gen;
};

static const char *const recall_names[] = { "mapped", "staged", "dma" }; /* enum recall_path */

struct args {
	int layers, vocab;
	double budget_s;
	int recalls[3];		/* enum recall_path values to run the retrieval policies with */
	int n_recalls;
	const char *policies[MAX_LIST];
	int n_policies;
	int batches[MAX_LIST];
	int n_batches;
	struct shape shapes[2];
	int n_shapes;
};

static uint64_t rng = 0x8b8b8b8bULL;
static int ubatch_rows; /* --ubatch: rows per prefill chunk, 0 = the engine's default */

static uint16_t rnd_bf16(float scale)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	float f = ((float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * scale;
	return f32_to_bf16(f);
}

/* A host bf16 buffer of n random values in [-scale, scale). */
static uint16_t *rand_buf(size_t n, float scale)
{
	uint16_t *b = malloc(n * sizeof *b);
	for (size_t i = 0; b && i < n; i++)
		b[i] = rnd_bf16(scale);
	return b;
}

static struct fkv_tensor tensor(const void *data, int64_t rows, int64_t cols)
{
	return (struct fkv_tensor){ .data = data, .dtype = FKV_BF16, .n_dims = cols > 1 ? 2 : 1,
				    .shape = { rows, cols } };
}

/* The model: config of Llama 3.1 8B with `layers` layers and `vocab` tokens; bufs[] holds the
 * shared weight buffers (freed by the caller). Returns 0 or -ENOMEM. */
static int make_model(struct fkv_model *m, int layers, int vocab, uint16_t *bufs[6])
{
	memset(m, 0, sizeof *m);
	struct fkv_model_config *c = &m->cfg;
	snprintf(c->arch, sizeof c->arch, "llama");
	c->n_layers = layers;
	c->dim = 4096;
	c->n_heads = 32;
	c->n_kv_heads = 8;
	c->head_dim = 128;
	c->ffn_dim = 14336;
	c->vocab_size = vocab;
	c->ctx_len = 131072;
	c->norm_eps = 1e-5f;
	c->rope_theta = 500000.0f;
	c->rope_style = FKV_ROPE_HALVES;
	c->rope_scaling_factor = 8.0f;
	c->rope_low_freq_factor = 1.0f;
	c->rope_high_freq_factor = 4.0f;
	c->rope_original_ctx = 8192;
	c->bos_id = c->eos_id = -1;
	c->dtype = FKV_BF16;
	const int64_t D = c->dim, Q = (int64_t)c->n_heads * c->head_dim;
	const int64_t KV = (int64_t)c->n_kv_heads * c->head_dim, F = c->ffn_dim;
	bufs[0] = rand_buf((size_t)(vocab * D), 0.05f);	/* embedding and output */
	bufs[1] = rand_buf((size_t)D, 1.0f);			/* norms: around 1 */
	for (int64_t i = 0; bufs[1] && i < D; i++)
		bufs[1][i] = f32_to_bf16(1.0f + 0.1f * bf16_to_f32(bufs[1][i]));
	bufs[2] = rand_buf((size_t)(Q * D), 0.02f);		/* wq, wo */
	bufs[3] = rand_buf((size_t)(KV * D), 0.02f);		/* wk, wv */
	bufs[4] = rand_buf((size_t)(F * D), 0.02f);		/* gate, up, down */
	bufs[5] = NULL;
	m->layers = calloc((size_t)layers, sizeof *m->layers);
	for (int i = 0; i < 5; i++)
		if (!bufs[i])
			return -ENOMEM;
	if (!m->layers)
		return -ENOMEM;
	m->tok_embd = tensor(bufs[0], vocab, D);
	m->output = tensor(bufs[0], vocab, D);
	m->out_norm = tensor(bufs[1], D, 1);
	for (int l = 0; l < layers; l++) {
		struct fkv_layer_weights *w = &m->layers[l];
		w->attn_norm = w->ffn_norm = tensor(bufs[1], D, 1);
		w->wq = tensor(bufs[2], Q, D);
		w->wo = tensor(bufs[2], D, Q);
		w->wk = w->wv = tensor(bufs[3], KV, D);
		w->w_gate = w->w_up = tensor(bufs[4], F, D);
		w->w_down = tensor(bufs[4], D, F);
	}
	return 0;
}

/* Device-to-device copy bandwidth in bytes/s (read + write counted), from a 1 GiB copy. */
static double hbm_bandwidth(void)
{
	size_t n = (size_t)1 << 30;
	void *a = NULL, *b = NULL;
	if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
		cudaFree(a);
		return 0;
	}
	cudaEvent_t e0, e1;
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
	cudaEventRecord(e0, 0);
	for (int i = 0; i < 5; i++)
		cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
	cudaEventRecord(e1, 0);
	cudaEventSynchronize(e1);
	float ms = 0;
	cudaEventElapsedTime(&ms, e0, e1);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFree(a);
	cudaFree(b);
	return ms > 0 ? 5.0 * 2.0 * (double)n / (ms / 1e3) : 0;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

/* What one run measured. */
struct result {
	double mean, median;	/* step ms */
	double recall_mb;	/* recalled per step, all sequences */
	double hidden;		/* recall time hidden / (hidden + waited); NAN: no recall */
	double corr;		/* corrections / head checks; NAN: no checks */
	double need_s;		/* with -ETIME: the time the run would have needed */
	double prefill_s;	/* the batch's prefill, every sequence */
	double step8_ms;	/* the first 8 timed steps' mean */
	char graphs;		/* decode steps through CUDA Graphs: g, some plain (capture
				 * failed): p, off: - */
};

/* One (shape, policy, batch) run into *r, or a negative errno with err; -ETIME when the run
 * would not finish by deadline (clock_ms_f). The retrieval policies get a host copy per
 * sequence in an embedded store sized for the run. */
static int run(const struct fkv_model *m, struct backend *be, const struct shape *sh,
	       const char *policy, int recall, int batch, double deadline, struct result *r,
	       char *err, size_t errlen)
{
	struct engine *e = NULL;
	struct hostkv *hk = NULL;
	struct hostkv_seq *hs[MAX_LIST * 2] = { 0 };
	struct engine_opts o = { .max_ctx = sh->prompt + sh->gen + 1, .max_seqs = batch,
				 .ubatch = ubatch_rows,
				 .kv = { .page = 32, .budget = 2048, .sink = 512, .window = 512,
					 .full_layers = 1, .tau = 0.9f, .recall_path = recall } };
	char base[32];
	snprintf(base, sizeof base, "%s", policy);
	if (bench_ablations(base, &o.kv)) {
		snprintf(err, errlen, "unknown ablation in '%s' (+nospec, +frag, +single)", policy);
		return -EINVAL;
	}
	char *colon = strchr(base, ':');
	if (colon) { /* POLICY:TAU, as decode_bench takes it */
		char *end;
		o.kv.tau = strtof(colon + 1, &end);
		if (*end || colon[1] == '\0' || !(o.kv.tau >= 0.0f && o.kv.tau <= 1.0f)) {
			snprintf(err, errlen, "bad tau in '%s' (POLICY:TAU, 0 to 1)", policy);
			return -EINVAL;
		}
		*colon = '\0';
	}
	o.policy = base;
	int ret = engine_new(&e, m, be, &o, err, errlen);
	if (ret)
		return ret;
	const int V = m->cfg.vocab_size;
	int seqs[MAX_LIST * 2], opened = 0;
	int32_t *ids = malloc((size_t)sh->prompt * sizeof *ids), tok[MAX_LIST * 2];
	float *lg = malloc((size_t)batch * V * sizeof *lg);
	double *t = malloc((size_t)sh->gen * sizeof *t);
	if (!ids || !lg || !t) {
		ret = -ENOMEM;
		goto out;
	}
	struct kv_geom g;
	engine_kv_geom(e, &g);
	if (strcmp(base, "full")) {
		int64_t pages = (o.max_ctx + g.p - 1) / g.p;
		struct hostkv_opts ho = {
			.worker_name = "bench_decode_gpu",
			.embedded_bytes = (size_t)batch * m->cfg.n_layers * pages *
						  layout_block_bytes(&g) / 4 * 5 + ((size_t)64 << 20),
		};
		ret = hostkv_open(&ho, &hk, err, errlen);
	}
	const double start = clock_ms_f();
	for (int b = 0; b < batch && !ret; b++) {
		if (clock_ms_f() > deadline) {
			r->need_s = b ? (clock_ms_f() - start) / b * batch / 1e3 : 0;
			ret = -ETIME;
			break;
		}
		char name[32];
		snprintf(name, sizeof name, "bench-%d", b);
		for (int i = 0; i < sh->prompt; i++)
			ids[i] = (int32_t)((uint64_t)(i * 7919 + b * 104729) % (uint64_t)V);
		if (hk)
			ret = hostkv_seq_open(hk, name, m->fingerprint, m->cfg.n_layers, &g, true,
					      &hs[b], err, errlen);
		if (!ret)
			ret = engine_seq_open(e, hs[b], &seqs[b], err, errlen);
		if (!ret) {
			opened++;
			ret = engine_prefill(e, seqs[b], ids, sh->prompt, lg + (size_t)b * V, false,
					     err, errlen);
		}
	}
	const double decode_start = clock_ms_f();
	r->prefill_s = (decode_start - start) / 1e3;
	for (int s = 0; s < sh->gen && !ret; s++) {
		for (int b = 0; b < batch; b++)
			tok[b] = sampler_argmax(lg + (size_t)b * V, V);
		double t0 = clock_ms_f();
		ret = engine_decode(e, batch, seqs, tok, lg, err, errlen);
		t[s] = clock_ms_f() - t0;
		/* After 8 steps, whether the rest fits what is left of the budget. */
		if (!ret && s == 7) {
			double per = (clock_ms_f() - decode_start) / 8;
			r->step8_ms = per;
			double end = clock_ms_f() + per * (sh->gen - 8);
			if (end > deadline) {
				r->need_s = (end - start) / 1e3;
				ret = -ETIME;
			}
		}
	}
	if (!ret) {
		double sum = 0;
		for (int s = 0; s < sh->gen; s++)
			sum += t[s];
		r->mean = sum / sh->gen;
		qsort(t, (size_t)sh->gen, sizeof *t, cmp_double);
		r->median = t[sh->gen / 2];
		struct kv_layer_stats a = { 0 };
		for (int b = 0; b < batch; b++) {
			struct kv_stats st;
			if (engine_seq_stats(e, seqs[b], &st))
				continue;
			a.bytes_recalled += st.sum.bytes_recalled;
			a.ns_recall_hidden += st.sum.ns_recall_hidden;
			a.ns_recall_wait += st.sum.ns_recall_wait;
			a.head_checks += st.sum.head_checks;
			a.corrections += st.sum.corrections;
		}
		/* the prefill recalls nothing: every recalled byte is the decode's */
		r->recall_mb = (double)a.bytes_recalled / sh->gen / 1e6;
		double rt = (double)a.ns_recall_hidden + (double)a.ns_recall_wait;
		r->hidden = rt > 0 ? a.ns_recall_hidden / rt : NAN;
		r->corr = a.head_checks ? (double)a.corrections / a.head_checks : NAN;
		struct engine_graph_stats gs;
		engine_graph_stats(e, &gs);
		r->graphs = gs.on ? (gs.plain ? 'p' : gs.launched ? 'g' : '-') : '-';
	}
out:
	free(ids);
	free(lg);
	free(t);
	for (int b = 0; b < opened; b++)
		engine_seq_free(e, seqs[b]);
	engine_free(e);
	for (int b = 0; b < batch; b++)
		if (hs[b])
			hostkv_seq_close(hs[b], true);
	hostkv_close(hk);
	return ret;
}

static int parse_list(const char *s, int *out)
{
	int n = 0;
	for (char *end; *s && n < MAX_LIST; s = *end ? end + 1 : end) {
		long v = strtol(s, &end, 10);
		if (end == s || v <= 0 || v > 64 || (*end && *end != ','))
			return -1;
		out[n++] = (int)v;
	}
	return n;
}

static int parse_len(const char *v, int *out)
{
	char *end;
	long n = strtol(v, &end, 10);
	if (end == v || *end || n <= 0 || n > 131072)
		return -1;
	*out = (int)n;
	return 0;
}

static int parse(int argc, char **argv, struct args *a)
{
	static char pol[256];
	*a = (struct args){ .layers = 32, .vocab = 128256, .budget_s = 480, .n_recalls = 1,
			    .recalls = { 0 }, .n_policies = 4,
			    .policies = { "full", "streaming", "quest", "freekv" },
			    .n_batches = 1, .batches = { 1 }, .n_shapes = 2,
			    .shapes = { { "long-input", 32768, 256 }, { "long-gen", 600, 4096 } } };
	int gen = 0, ctx = 0;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--quick")) {
			a->layers = 4;
			a->vocab = 32000;
			a->n_shapes = 1;
			a->shapes[0] = (struct shape){ "quick", 2048, 32 };
			a->n_batches = 2;
			a->batches[1] = 4;
			continue;
		}
		if (!v)
			return -1;
		i++;
		if (!strcmp(argv[i - 1], "--layers")) {
			a->layers = atoi(v);
			if (a->layers <= 0 || a->layers > 32)
				return -1;
		} else if (!strcmp(argv[i - 1], "--ubatch")) {
			ubatch_rows = atoi(v);
			if (ubatch_rows <= 0 || ubatch_rows > 65536)
				return -1;
		} else if (!strcmp(argv[i - 1], "--batch") || !strcmp(argv[i - 1], "--batches")) {
			if ((a->n_batches = parse_list(v, a->batches)) <= 0)
				return -1;
		} else if (!strcmp(argv[i - 1], "--shape")) {
			const struct shape in = { "long-input", 32768, 256 };
			const struct shape lg = { "long-gen", 600, 4096 };
			if (!strcmp(v, "long-input"))
				a->shapes[0] = in, a->n_shapes = 1;
			else if (!strcmp(v, "long-gen"))
				a->shapes[0] = lg, a->n_shapes = 1;
			else if (!strcmp(v, "both"))
				a->shapes[0] = in, a->shapes[1] = lg, a->n_shapes = 2;
			else
				return -1;
		} else if (!strcmp(argv[i - 1], "--gen")) {
			if (parse_len(v, &gen))
				return -1;
		} else if (!strcmp(argv[i - 1], "--ctx")) {
			if (parse_len(v, &ctx))
				return -1;
		} else if (!strcmp(argv[i - 1], "--budget")) {
			a->budget_s = atof(v);
			if (!(a->budget_s > 0))
				return -1;
		} else if (!strcmp(argv[i - 1], "--recall")) {
			static char rl[64];
			snprintf(rl, sizeof rl, "%s", v);
			a->n_recalls = 0;
			for (char *sv, *p = strtok_r(rl, ",", &sv); p; p = strtok_r(NULL, ",", &sv)) {
				int k = 0;
				while (k < 3 && strcmp(p, recall_names[k]))
					k++;
				if (k == 3 || a->n_recalls == 3)
					return -1;
				a->recalls[a->n_recalls++] = k;
			}
			if (!a->n_recalls)
				return -1;
		} else if (!strcmp(argv[i - 1], "--policies")) {
			snprintf(pol, sizeof pol, "%s", strcmp(v, "fig8") ? v : BENCH_FIG8_ROWS);
			a->n_policies = 0;
			for (char *sv, *p = strtok_r(pol, ",", &sv); p && a->n_policies < MAX_LIST;
			     p = strtok_r(NULL, ",", &sv))
				a->policies[a->n_policies++] = p;
			if (!a->n_policies)
				return -1;
		} else {
			return -1;
		}
	}
	for (int si = 0; si < a->n_shapes; si++) {
		if (gen)
			a->shapes[si].gen = gen;
		if (ctx)
			a->shapes[si].prompt = ctx;
		if (a->shapes[si].gen < 8)
			return -1; /* the budget check needs 8 timed steps */
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct args a;
	if (parse(argc, argv, &a)) {
		fprintf(stderr, "usage: bench_decode_gpu [--quick] [--shape long-input|long-gen|"
				"both] [--batch LIST] [--policies LIST] [--recall mapped,dma,staged] "
				"[--gen N >= 8] [--ctx N] [--layers N] [--ubatch N] [--budget S]\n");
		return 2;
	}
	const double deadline = clock_ms_f() + a.budget_s * 1e3;
	struct backend *be = NULL;
	char err[512];
	if (backend_open("cuda", 0, &be, err, sizeof err)) {
		fprintf(stderr, "bench_decode_gpu: %s\n", err);
		return 1;
	}
	struct cudaDeviceProp prop;
	cudaGetDeviceProperties(&prop, 0);
	double bw = hbm_bandwidth();
	struct fkv_model m;
	uint16_t *bufs[6] = { 0 };
	if (make_model(&m, a.layers, a.vocab, bufs)) {
		fprintf(stderr, "bench_decode_gpu: out of host memory for the weights\n");
		return 1;
	}
	const int64_t D = 4096, QD = 4096, KVD = 1024, F = 14336;
	double wbytes = 2.0 * ((double)a.layers * (2 * QD * D + 2 * KVD * D + 3 * F * D + 2 * D) +
			       (double)a.vocab * D + D);
	printf("device: %s; d2d bandwidth %.0f GB/s; Llama-3.1-8B geometry, %d layers, vocab %d, "
	       "bf16 (%.2f GB of weights); B=2048 S=W=512 p=32\n",
	       prop.name, bw / 1e9, a.layers, a.vocab, wbytes / 1e9);
	printf("%-12s %6s %6s %-10s %-6s %5s %9s %9s %9s %10s %7s %6s %9s %6s\n", "shape", "ctx",
	       "gen", "policy", "recall", "batch", "mean_ms", "median_ms", "floor_ms", "recall_MB",
	       "hidden", "corr", "prefill_s", "graphs");
	int status = 0;
	for (int si = 0; si < a.n_shapes; si++)
		for (int bi = 0; bi < a.n_batches; bi++) {
			const struct shape *sh = &a.shapes[si];
			int batch = a.batches[bi];
			double med[MAX_LIST];
			for (int pi = 0; pi < a.n_policies; pi++) {
				const char *pol = a.policies[pi];
				const bool full = !strcmp(pol, "full");
				med[pi] = NAN;
				for (int ri = 0; ri < (full ? 1 : a.n_recalls); ri++) {
					const int rp = a.recalls[ri];
					const char *rn = full ? "-" : recall_names[rp];
					struct result r = { 0 };
					int ret = run(&m, be, sh, pol, rp, batch, deadline, &r, err,
						      sizeof err);
					if (ret == -ETIME) {
						if (r.need_s > 0)
							printf("%-12s %6d %6d %-10s %-6s %5d skipped: needs "
							       "about %.0f s, past the time budget (prefill "
							       "%.1f s, first 8 steps %.1f ms each)\n",
							       sh->name, sh->prompt, sh->gen, pol, rn, batch,
							       r.need_s, r.prefill_s, r.step8_ms);
						else
							printf("%-12s %6d %6d %-10s %-6s %5d skipped: the "
							       "time budget is spent\n", sh->name,
							       sh->prompt, sh->gen, pol, rn, batch);
						fflush(stdout);
						continue;
					}
					if (ret) {
						printf("%-12s %6d %6d %-10s %-6s %5d not run: %s\n",
						       sh->name, sh->prompt, sh->gen, pol, rn, batch, err);
						if (full)
							status = 1;
						continue;
					}
					/* KV read per step at mid-run: full reads the whole context,
					 * the others the budget. */
					double toks = full ? sh->prompt + sh->gen / 2.0 : 2048;
					double kvb = 2.0 * a.layers * toks * KVD * 2 * batch;
					double floor_ms = bw > 0 ? (wbytes + kvb) / bw * 1e3 : NAN;
					/* the ratios use the first recall path that ran */
					if (isnan(med[pi]))
						med[pi] = r.median;
					printf("%-12s %6d %6d %-10s %-6s %5d %9.3f %9.3f %9.3f %10.3f "
					       "%7.3f %6.3f %9.1f %6c\n", sh->name, sh->prompt, sh->gen,
					       pol, rn, batch, r.mean, r.median, floor_ms, r.recall_mb,
					       r.hidden, r.corr, r.prefill_s, r.graphs);
					fflush(stdout);
				}
			}
			double fk = NAN, st = NAN, qu = NAN, fu = NAN;
			for (int pi = 0; pi < a.n_policies; pi++) {
				if (!strcmp(a.policies[pi], "freekv"))
					fk = med[pi];
				else if (!strcmp(a.policies[pi], "full"))
					fu = med[pi];
				else if (!strcmp(a.policies[pi], "streaming"))
					st = med[pi];
				else if (!strcmp(a.policies[pi], "quest"))
					qu = med[pi];
			}
			if (!isnan(fk) && !isnan(st))
				printf("%-16s batch %d: freekv / streaming = %.3f (target <= 1.10)\n",
				       sh->name, batch, fk / st);
			if (!isnan(fk) && !isnan(qu))
				printf("%-16s batch %d: quest / freekv = %.3f\n", sh->name, batch,
				       qu / fk);
			if (!isnan(fk) && !isnan(fu))
				printf("%-16s batch %d: full / freekv = %.3f\n", sh->name, batch,
				       fu / fk);
		}
	free(m.layers);
	for (int i = 0; i < 6; i++)
		free(bufs[i]);
	backend_free(be);
	return status;
}
