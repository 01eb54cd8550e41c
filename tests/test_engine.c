/* Tests for worker/engine/engine.c (with policy_full.c and the CPU backend): logits of the engine
 * against an independent float64 forward pass written here (its own embedding, RMSNorm, RoPE,
 * attention and MLP loops; it reads tensors only through model.h and dtype.h), on models built
 * in memory, on stories260K (GGUF and HF) and on synthetic models of each preset geometry;
 * GGUF vs HF agreement; batching; chunking; context limit and bad input; decode through the
 * fused QKV and gate/up GEMMs (weight_concat) with exactly the logits of separate GEMMs.
 *
 * `test_engine --presets` runs only the full-width preset geometries (registered as a slow
 * test); the tiny presets run with the rest. */
#include "test_util.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "test_backend.h"
#include "test_ref_model.h"
#include "stories_test.h"
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "synth.h"

static uint64_t seed = 0xe11e;

/* ---- reference forward pass (float64; its layers in test_ref_model.h) ---- */

/* logits (n, vocab) for tokens ids[0..n) of a fresh sequence. */
static void ref_forward(const struct fkv_model *m, const int32_t *ids, int n, double *logits)
{
	const struct fkv_model_config *c = &m->cfg;
	int D = c->dim, H = c->n_heads, KV = c->n_kv_heads, d = c->head_dim, F = c->ffn_dim;
	int qd = H * d, kvd = KV * d;
	double *x = calloc(D, 8), *xb = calloc(D, 8), *q = calloc(qd, 8), *att = calloc(qd, 8);
	double *h1 = calloc(F, 8), *h2 = calloc(F, 8), *o = calloc(D, 8), *s = calloc(n, 8);
	double *K = calloc((size_t)c->n_layers * n * kvd, 8);
	double *Vc = calloc((size_t)c->n_layers * n * kvd, 8);
	for (int t = 0; t < n; t++) {
		for (int i = 0; i < D; i++)
			x[i] = ref_el(&m->tok_embd, (int64_t)ids[t] * D + i);
		for (int l = 0; l < c->n_layers; l++) {
			const struct fkv_layer_weights *w = &m->layers[l];
			double *kl = K + ((size_t)l * n + t) * kvd, *vl = Vc + ((size_t)l * n + t) * kvd;
			ref_norm(xb, x, &w->attn_norm, D, c->norm_eps);
			ref_linear(q, &w->wq, xb);
			ref_linear(kl, &w->wk, xb);
			ref_linear(vl, &w->wv, xb);
			if (w->bq.data)
				for (int i = 0; i < qd; i++)
					q[i] += ref_el(&w->bq, i);
			if (w->bk.data)
				for (int i = 0; i < kvd; i++) {
					kl[i] += ref_el(&w->bk, i);
					vl[i] += ref_el(&w->bv, i);
				}
			ref_rotate(q, H, c, t);
			ref_rotate(kl, KV, c, t);
			for (int h = 0; h < H; h++) {
				int g = h / (H / KV);
				double mx = -INFINITY, z = 0;
				int j0 = c->sliding_window > 0 && t + 1 > c->sliding_window ?
					 t + 1 - c->sliding_window : 0;
				for (int j = j0; j <= t; j++) {
					const double *kj = K + ((size_t)l * n + j) * kvd + g * d;
					s[j] = 0;
					for (int i = 0; i < d; i++)
						s[j] += q[h * d + i] * kj[i];
					s[j] /= sqrt((double)d);
					mx = fmax(mx, s[j]);
				}
				for (int j = j0; j <= t; j++)
					z += (s[j] = exp(s[j] - mx));
				for (int i = 0; i < d; i++) {
					double a = 0;
					for (int j = j0; j <= t; j++)
						a += s[j] / z * Vc[((size_t)l * n + j) * kvd + g * d + i];
					att[h * d + i] = a;
				}
			}
			ref_linear(o, &w->wo, att);
			for (int i = 0; i < D; i++)
				x[i] += o[i];
			ref_norm(xb, x, &w->ffn_norm, D, c->norm_eps);
			ref_linear(h1, &w->w_gate, xb);
			ref_linear(h2, &w->w_up, xb);
			for (int i = 0; i < F; i++)
				h1[i] = h1[i] / (1 + exp(-h1[i])) * h2[i];
			ref_linear(o, &w->w_down, h1);
			for (int i = 0; i < D; i++)
				x[i] += o[i];
		}
		ref_norm(xb, x, &m->out_norm, D, c->norm_eps);
		ref_linear(logits + (size_t)t * c->vocab_size, &m->output, xb);
	}
	free(x); free(xb); free(q); free(att); free(h1); free(h2); free(o); free(s); free(K);
	free(Vc);
}

/* ---- models built in memory ---- */

struct geo {
	int L, D, H, KV, d, F, V;
	enum fkv_dtype dt;
	enum fkv_rope_style rs;
	bool bias, tied, llama3;
	int window; /* sliding window, 0 = none */
};

static struct fkv_tensor rand_tensor(enum fkv_dtype t, int64_t rows, int64_t cols, float scale,
				     float offset)
{
	int64_t n = rows * cols;
	float *f = malloc((size_t)n * 4);
	void *d = malloc((size_t)n * dtype_size(t));
	assert_true(f && d);
	for (int64_t i = 0; i < n; i++)
		f[i] = offset + test_randf(&seed) * scale;
	dtype_from_f32(d, f, t, (size_t)n);
	free(f);
	return (struct fkv_tensor){ .data = d, .dtype = t, .n_dims = cols > 1 ? 2 : 1, .shape = { rows, cols } };
}

static void mem_model(struct fkv_model *m, const struct geo *g)
{
	memset(m, 0, sizeof *m);
	struct fkv_model_config *c = &m->cfg;
	*c = (struct fkv_model_config){
		.arch = "llama", .n_layers = g->L, .dim = g->D, .n_heads = g->H,
		.n_kv_heads = g->KV, .head_dim = g->d, .ffn_dim = g->F, .vocab_size = g->V,
		.ctx_len = 64, .norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_style = g->rs,
		.tied_embeddings = g->tied, .qkv_bias = g->bias, .bos_id = 1, .eos_id = 2,
		.dtype = g->dt, .sliding_window = g->window,
	};
	if (g->llama3) {
		c->rope_theta = 500000.0f;
		c->rope_scaling_factor = 8.0f;
		c->rope_low_freq_factor = 1.0f;
		c->rope_high_freq_factor = 4.0f;
		c->rope_original_ctx = 16; /* small so the short test positions cross the bands */
	}
	float sD = sqrtf(3.0f / g->D), sQ = sqrtf(3.0f / (g->H * g->d)), sF = sqrtf(3.0f / g->F);
	m->tok_embd = rand_tensor(g->dt, g->V, g->D, 1.0f, 0);
	m->out_norm = rand_tensor(g->dt, g->D, 1, 0.1f, 1.0f);
	m->output = g->tied ? m->tok_embd : rand_tensor(g->dt, g->V, g->D, sD, 0);
	m->layers = calloc(g->L, sizeof *m->layers);
	for (int l = 0; l < g->L; l++) {
		struct fkv_layer_weights *w = &m->layers[l];
		w->attn_norm = rand_tensor(g->dt, g->D, 1, 0.1f, 1.0f);
		w->ffn_norm = rand_tensor(g->dt, g->D, 1, 0.1f, 1.0f);
		w->wq = rand_tensor(g->dt, g->H * g->d, g->D, sD * 2, 0);
		w->wk = rand_tensor(g->dt, g->KV * g->d, g->D, sD * 2, 0);
		w->wv = rand_tensor(g->dt, g->KV * g->d, g->D, sD, 0);
		w->wo = rand_tensor(g->dt, g->D, g->H * g->d, sQ, 0);
		w->w_gate = rand_tensor(g->dt, g->F, g->D, sD, 0);
		w->w_up = rand_tensor(g->dt, g->F, g->D, sD, 0);
		w->w_down = rand_tensor(g->dt, g->D, g->F, sF, 0);
		if (g->bias) {
			w->bq = rand_tensor(g->dt, g->H * g->d, 1, 0.3f, 0);
			w->bk = rand_tensor(g->dt, g->KV * g->d, 1, 0.3f, 0);
			w->bv = rand_tensor(g->dt, g->KV * g->d, 1, 0.3f, 0);
		}
	}
}

static void mem_model_free(struct fkv_model *m)
{
	for (int l = 0; l < m->cfg.n_layers; l++) {
		struct fkv_layer_weights *w = &m->layers[l];
		const void *p[] = { w->attn_norm.data, w->ffn_norm.data, w->wq.data, w->wk.data,
				    w->wv.data, w->wo.data, w->w_gate.data, w->w_up.data,
				    w->w_down.data, w->bq.data, w->bk.data, w->bv.data };
		for (size_t i = 0; i < sizeof p / sizeof *p; i++)
			free((void *)p[i]);
	}
	free(m->layers);
	if (m->output.data != m->tok_embd.data)
		free((void *)m->output.data);
	free((void *)m->tok_embd.data);
	free((void *)m->out_norm.data);
}

/* ---- helpers ---- */

static struct engine *new_engine(const struct fkv_model *m, int ubatch, bool kv_f32)
{
	struct engine *e;
	char err[256];
	struct engine_opts o = { .ubatch = ubatch, .kv_dtype = FKV_F32, .kv_dtype_set = kv_f32 };
	int ret = engine_new(&e, m, be, &o, err, sizeof err);
	if (ret)
		fail_msg("engine_new: %s", err);
	return e;
}

static void rand_ids(int32_t *ids, int n, int vocab)
{
	for (int i = 0; i < n; i++)
		ids[i] = (int32_t)(test_rand(&seed) % (uint64_t)vocab);
}

/* Engine logits for ids: the first n_pre by (chunked) prefill with all logits, the rest by
 * decode steps; compared with the reference over all n positions. Returns the error. */
static double engine_vs_ref(const struct fkv_model *m, const int32_t *ids, int n, int n_pre,
			    int ubatch, bool kv_f32)
{
	int V = m->cfg.vocab_size;
	double *ref = malloc((size_t)n * V * 8);
	float *lg = malloc((size_t)n * V * 4);
	ref_forward(m, ids, n, ref);
	struct engine *e = new_engine(m, ubatch, kv_f32);
	char err[256];
	int s;
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	if (engine_prefill(e, s, ids, n_pre, lg, true, err, sizeof err))
		fail_msg("prefill: %s", err);
	for (int t = n_pre; t < n; t++)
		if (engine_decode(e, 1, &s, ids + t, lg + (size_t)t * V, err, sizeof err))
			fail_msg("decode: %s", err);
	assert_int_equal(engine_seq_len(e, s), n);
	double worst = 0;
	for (int t = 0; t < n; t++)
		worst = fmax(worst, nerr(lg + (size_t)t * V, ref + (size_t)t * V, V));
	engine_free(e);
	free(ref);
	free(lg);
	return worst;
}

/* ---- tests on models built in memory ---- */

static void test_mem_models_vs_reference(void **state)
{
	(void)state;
	static const struct geo geos[] = {
		{ 2, 48, 4, 2, 12, 80, 61, FKV_F32, FKV_ROPE_INTERLEAVED, false, true, false, 0 },
		{ 2, 48, 4, 2, 12, 80, 61, FKV_F16, FKV_ROPE_HALVES, false, false, false, 0 },
		{ 2, 64, 8, 2, 8, 96, 70, FKV_BF16, FKV_ROPE_HALVES, true, false, true, 0 },
		{ 1, 32, 4, 4, 8, 40, 33, FKV_BF16, FKV_ROPE_INTERLEAVED, true, true, true, 0 },
		/* Mistral v0.1-style sliding window, shorter than the sequence. */
		{ 2, 48, 4, 2, 12, 80, 61, FKV_F16, FKV_ROPE_HALVES, false, false, false, 5 },
	};
	int32_t ids[20];
	for (size_t i = 0; i < sizeof geos / sizeof *geos; i++) {
		struct fkv_model m;
		mem_model(&m, &geos[i]);
		rand_ids(ids, 20, geos[i].V);
		/* One-shot prefill, chunked prefill crossing ubatches, prefill + decode. */
		double e1 = engine_vs_ref(&m, ids, 20, 20, 256, true);
		double e2 = engine_vs_ref(&m, ids, 20, 20, 6, true);
		double e3 = engine_vs_ref(&m, ids, 20, 7, 4, true);
		/* KV kept in the model's dtype: the rounding of K and V is the only difference. */
		double e4 = engine_vs_ref(&m, ids, 20, 9, 5, false);
		fprintf(stderr, "geometry %zu (%s): errors %.3g %.3g %.3g, KV in model dtype %.3g\n",
			i, dtype_name(geos[i].dt), e1, e2, e3, e4);
		if (e1 > 1e-4 || e2 > 1e-4 || e3 > 1e-4)
			fail_msg("geometry %zu: errors %g %g %g", i, e1, e2, e3);
		if (e4 > (geos[i].dt == FKV_F32 ? 1e-4 : 3e-2))
			fail_msg("geometry %zu, KV in %s: error %g", i, dtype_name(geos[i].dt), e4);
		mem_model_free(&m);
	}
}

/* The full policy grows its cache by doubling from 256 tokens: a sequence that crosses 256 and
 * 512 during prefill chunks and decode steps must keep every earlier key and value. */
static void test_cache_growth(void **state)
{
	(void)state;
	struct geo g = { 1, 32, 4, 2, 8, 40, 33, FKV_F16, FKV_ROPE_HALVES, false, true, false, 0 };
	struct fkv_model m;
	mem_model(&m, &g);
	m.cfg.ctx_len = 600;
	enum { N = 530 };
	int32_t *ids = malloc(N * sizeof *ids);
	rand_ids(ids, N, g.V);
	double e = engine_vs_ref(&m, ids, N, 250, 100, true);
	fprintf(stderr, "cache growth to %d tokens: error %.3g\n", N, e);
	assert_true(e < 1e-4);
	free(ids);
	mem_model_free(&m);
}

/* The policy seam directly: lookup, refusals that change nothing, stats. */
static void test_policy_full_direct(void **state)
{
	(void)state;
	assert_ptr_equal(kvcache_policy("full"), &kv_policy_full);
	assert_null(kvcache_policy("nope"));
	assert_non_null(strstr(kvcache_policy_names(), "full"));
	const struct kv_policy_ops *P = &kv_policy_full;
	struct kv_seq_params p = { be, 2, { 4, 2, 8, FKV_BF16, 0.35f, 0 }, 300, { 0 }, NULL };
	void *st;
	assert_int_equal(P->create(&p, &st), 0);
	assert_int_equal(P->step_begin(st, 0), -EINVAL);
	assert_int_equal(P->step_begin(st, 301), -ENOSPC);
	float k[3 * 16], v[3 * 16], q[3 * 32], out[3 * 32];
	for (int i = 0; i < 3 * 16; i++)
		k[i] = v[i] = test_randf(&seed);
	for (int i = 0; i < 3 * 32; i++)
		q[i] = test_randf(&seed);
	assert_int_equal(P->step_begin(st, 3), 0);
	assert_int_equal(P->append(st, 0, k, v, 2), -EINVAL); /* not the step's count */
	assert_int_equal(P->append(st, 2, k, v, 3), -EINVAL); /* no such layer */
	for (int l = 0; l < 2; l++) {
		assert_int_equal(P->append(st, l, k, v, 3), 0);
		assert_int_equal(P->attend(st, l, out, q, 3), 0);
	}
	assert_int_equal(P->length(st), 0); /* nothing committed before step_end */
	P->step_end(st);
	assert_int_equal(P->length(st), 3);
	/* The first query sees only itself: its output is its own V row (bf16-rounded). */
	for (int i = 0; i < 8; i++)
		assert_true(fabsf(out[i] - v[i]) < 1e-2f);
	struct kv_stats s;
	P->stats(st, &s);
	assert_int_equal(s.tokens, 3);
	assert_int_equal(s.capacity, 256);
	assert_int_equal(s.device_bytes, 2 * 2 * 256 * 16 * 2);
	assert_int_equal(s.attended, 6);
	P->destroy(st);
}

/* A wrong reference would also be caught: a model whose rope style is flipped after building
 * must disagree with the reference computed for the original. */
static void test_reference_detects_rope_mismatch(void **state)
{
	(void)state;
	struct geo g = { 1, 32, 4, 2, 8, 40, 33, FKV_F32, FKV_ROPE_INTERLEAVED, false, true, false, 0 };
	struct fkv_model m;
	mem_model(&m, &g);
	int32_t ids[12];
	rand_ids(ids, 12, g.V);
	double *ref = malloc(12 * 33 * 8);
	float *lg = malloc(12 * 33 * 4);
	ref_forward(&m, ids, 12, ref);
	m.cfg.rope_style = FKV_ROPE_HALVES;
	struct engine *e = new_engine(&m, 0, true);
	char err[256];
	int s;
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, s, ids, 12, lg, true, err, sizeof err), 0);
	assert_true(nerr(lg, ref, 12 * 33) > 1e-3);
	engine_free(e);
	free(ref);
	free(lg);
	mem_model_free(&m);
}

/* Greedy continuation of n tokens after prompt, sequence by sequence. */
static void greedy_alone(const struct fkv_model *m, const int32_t *prompt, int n_prompt, int n,
			 int32_t *out)
{
	struct engine *e = new_engine(m, 0, false);
	int V = m->cfg.vocab_size, s;
	float *lg = malloc((size_t)V * 4);
	char err[256];
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, s, prompt, n_prompt, lg, false, err, sizeof err), 0);
	for (int i = 0; i < n; i++) {
		out[i] = sampler_argmax(lg, V);
		assert_int_equal(engine_decode(e, 1, &s, &out[i], lg, err, sizeof err), 0);
	}
	free(lg);
	engine_free(e);
}

static void check_batch(const struct fkv_model *m)
{
	enum { NS = 4, GEN = 6 };
	static const int lens[NS] = { 3, 11, 1, 7 };
	int V = m->cfg.vocab_size;
	int32_t prompts[NS][11], alone[NS][GEN], batch[NS][GEN];
	const int32_t *pp[NS];
	for (int i = 0; i < NS; i++) {
		rand_ids(prompts[i], lens[i], V);
		pp[i] = prompts[i];
		greedy_alone(m, prompts[i], lens[i], GEN, alone[i]);
	}
	/* ubatch 5: the batched prefill splits sequences across chunks. */
	struct engine *e = new_engine(m, 5, false);
	char err[256];
	int seqs[NS];
	float *lg = malloc((size_t)NS * V * 4);
	for (int i = 0; i < NS; i++)
		assert_int_equal(engine_seq_new(e, &seqs[i], err, sizeof err), 0);
	if (engine_forward(e, NS, seqs, pp, lens, lg, false, err, sizeof err))
		fail_msg("batched prefill: %s", err);
	for (int t = 0; t < GEN; t++) {
		int32_t next[NS];
		for (int i = 0; i < NS; i++)
			next[i] = batch[i][t] = sampler_argmax(lg + (size_t)i * V, V);
		assert_int_equal(engine_decode(e, NS, seqs, next, lg, err, sizeof err), 0);
	}
	for (int i = 0; i < NS; i++) {
		assert_memory_equal(alone[i], batch[i], sizeof alone[i]);
		assert_int_equal(engine_seq_len(e, seqs[i]), lens[i] + GEN);
	}
	free(lg);
	engine_free(e);
}

static void test_batch_matches_alone(void **state)
{
	(void)state;
	struct geo g = { 2, 64, 8, 2, 8, 96, 70, FKV_BF16, FKV_ROPE_HALVES, true, false, false, 0 };
	struct fkv_model m;
	mem_model(&m, &g);
	check_batch(&m);
	mem_model_free(&m);
}

static void test_limits_and_bad_input(void **state)
{
	(void)state;
	struct geo g = { 1, 32, 4, 2, 8, 40, 33, FKV_F32, FKV_ROPE_INTERLEAVED, false, true, false, 0 };
	struct fkv_model m;
	mem_model(&m, &g);
	struct engine *e;
	char err[256];
	struct engine_opts o = { .max_ctx = 10, .max_seqs = 2 };
	assert_int_equal(engine_new(&e, &m, be, &o, err, sizeof err), 0);
	int s, s2, s3;
	int32_t ids[12] = { 0 };
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, s, ids, 8, NULL, false, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, s, ids, 3, NULL, false, err, sizeof err), -ENOSPC);
	assert_non_null(strstr(err, "context limit"));
	assert_int_equal(engine_seq_len(e, s), 8); /* refused call changed nothing */
	ids[1] = 33;
	assert_int_equal(engine_prefill(e, s, ids, 2, NULL, false, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "out of range"));
	ids[1] = -1;
	assert_int_equal(engine_prefill(e, s, ids, 2, NULL, false, err, sizeof err), -EINVAL);
	assert_int_equal(engine_seq_len(e, s), 8);
	ids[1] = 0;
	assert_int_equal(engine_prefill(e, s, ids, 2, NULL, false, err, sizeof err), 0);
	assert_int_equal(engine_seq_len(e, s), 10);
	assert_int_equal(engine_prefill(e, 7, ids, 1, NULL, false, err, sizeof err), -EINVAL);
	assert_int_equal(engine_seq_new(e, &s2, err, sizeof err), 0);
	assert_int_equal(engine_seq_new(e, &s3, err, sizeof err), -ENOSPC);
	int dup[2] = { s2, s2 };
	int32_t tok[2] = { 0, 0 };
	assert_int_equal(engine_decode(e, 2, dup, tok, NULL, err, sizeof err), -EINVAL);
	engine_seq_free(e, s);
	assert_int_equal(engine_seq_len(e, s), -EINVAL);
	assert_int_equal(engine_seq_new(e, &s3, err, sizeof err), 0);
	struct kv_stats st;
	memset(&st, 0x5a, sizeof st); /* what the stats leave unwritten shows */
	assert_int_equal(engine_prefill(e, s3, ids, 4, NULL, false, err, sizeof err), 0);
	assert_int_equal(engine_seq_stats(e, s3, &st), 0);
	assert_int_equal(st.tokens, 4);
	assert_int_equal(st.sum.pages_recalled, 0); /* `full` counts no retrieval */
	assert_int_equal(st.sum.steps, 0);
	engine_free(e);
	/* Bad geometry and unknown policy are refused with a message. */
	o = (struct engine_opts){ .policy = "nope" };
	assert_int_equal(engine_new(&e, &m, be, &o, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "nope"));
	m.cfg.n_kv_heads = 3;
	assert_int_equal(engine_new(&e, &m, be, NULL, err, sizeof err), -EINVAL);
	m.cfg.n_kv_heads = 2;
	m.layers[0].wk.shape[0] = 8;
	assert_int_equal(engine_new(&e, &m, be, NULL, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "wk"));
	m.layers[0].wk.shape[0] = 16;
	mem_model_free(&m);
}

/* ---- stories260K ---- */

static int load_or_skip(const char *rel, struct fkv_model *m)
{
	const char *p = test_model_path(rel);
	if (!p)
		return -ENOENT;
	char err[512];
	int ret = model_load(p, m, err, sizeof err);
	if (ret)
		fail_msg("model_load %s: %s", p, err);
	return 0;
}

static void test_stories_vs_reference(void **state)
{
	(void)state;
	const char *rels[] = { "stories260K/stories260K.gguf", "stories260K/hf" };
	int32_t ids[40] = { 1 };
	rand_ids(ids + 1, 39, 512);
	for (int i = 0; i < 2; i++) {
		struct fkv_model m;
		if (load_or_skip(rels[i], &m)) {
			skip();
			return;
		}
		double e = engine_vs_ref(&m, ids, 40, 25, 16, false);
		fprintf(stderr, "%s: error %.3g\n", rels[i], e);
		if (e > 1e-4)
			fail_msg("%s: error %g", rels[i], e);
		if (i == 0)
			check_batch(&m);
		model_free(&m);
	}
}

static void test_stories_gguf_vs_hf(void **state)
{
	(void)state;
	struct fkv_model g, h;
	if (load_or_skip("stories260K/stories260K.gguf", &g) ||
	    load_or_skip("stories260K/hf", &h)) {
		skip();
		return;
	}
	assert_int_equal(g.cfg.rope_style, FKV_ROPE_INTERLEAVED);
	assert_int_equal(h.cfg.rope_style, FKV_ROPE_HALVES);
	enum { P = 9, N = 40 };
	int32_t seq_g[P + N] = { 1, 403, 407, 261, 378, 297, 429, 400, 343 };
	int32_t seq_h[P + N];
	memcpy(seq_h, seq_g, sizeof(int32_t) * P);
	float *lg = malloc(512 * 4), *lh = malloc(512 * 4);
	struct engine *eg = new_engine(&g, 0, false), *eh = new_engine(&h, 0, false);
	char err[256];
	int sg, sh;
	assert_int_equal(engine_seq_new(eg, &sg, err, sizeof err), 0);
	assert_int_equal(engine_seq_new(eh, &sh, err, sizeof err), 0);
	assert_int_equal(engine_prefill(eg, sg, seq_g, P, lg, false, err, sizeof err), 0);
	assert_int_equal(engine_prefill(eh, sh, seq_h, P, lh, false, err, sizeof err), 0);
	double worst = 0;
	for (int t = 0; t < N; t++) {
		for (int v = 0; v < 512; v++)
			worst = fmax(worst, fabs(lg[v] - lh[v]));
		seq_g[P + t] = sampler_argmax(lg, 512);
		seq_h[P + t] = sampler_argmax(lh, 512);
		assert_int_equal(seq_g[P + t], seq_h[P + t]);
		assert_int_equal(engine_decode(eg, 1, &sg, &seq_g[P + t], lg, err, sizeof err), 0);
		assert_int_equal(engine_decode(eh, 1, &sh, &seq_h[P + t], lh, err, sizeof err), 0);
	}
	fprintf(stderr, "GGUF vs HF: max logit difference %.3g over %d steps\n", worst, N);
	if (worst > 1e-5)
		fail_msg("GGUF vs HF logits differ by %g", worst);
	/* A trained model continues a story: its greedy tokens are not all one id. */
	int distinct = 0;
	for (int t = 1; t < N; t++)
		distinct += seq_g[P + t] != seq_g[P + t - 1];
	assert_true(distinct > 5);
	engine_free(eg);
	engine_free(eh);
	free(lg);
	free(lh);
	model_free(&g);
	model_free(&h);
}

/* ---- synthetic models of each preset geometry ---- */

/* Every preset whose size class matches *state (true: the full-width 7-8B geometries, 1 layer,
 * slow; false: the tiny test presets, 2 layers), written with synth_write, loaded with
 * model_load and compared with the reference over 6 tokens (4 prefilled, 2 decoded). */
static void test_presets_vs_reference(void **state)
{
	const bool big = *(bool *)*state;
	char dir[] = "/tmp/freekv-test-engine-XXXXXX";
	assert_non_null(mkdtemp(dir));
	int done = 0;
	for (int i = 0; i < synth_n_presets(); i++) {
		const char *name = synth_preset_name(i);
		if (big == !strncmp(name, "tiny", 4))
			continue;
		char err[512];
		int vocab = synth_min_vocab() > 512 ? synth_min_vocab() : 512;
		int ret = synth_write(name, big ? 1 : 2, FKV_BF16, dir, 7 + i, vocab, err, sizeof err);
		if (ret)
			fail_msg("synth_write %s: %s", name, err);
		struct fkv_model m;
		if (model_load(dir, &m, err, sizeof err))
			fail_msg("model_load %s: %s", name, err);
		int32_t ids[6];
		rand_ids(ids, 6, m.cfg.vocab_size);
		double e = engine_vs_ref(&m, ids, 6, 4, 256, true);
		fprintf(stderr, "preset %s (%d layers, dim %d, vocab %d): error %.3g\n", name,
			m.cfg.n_layers, m.cfg.dim, m.cfg.vocab_size, e);
		if (e > 1e-4)
			fail_msg("preset %s: error %g", name, e);
		model_free(&m);
		done++;
	}
	char cmd[256];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
	assert_true(done >= (big ? 3 : 1));
}

/* ---- fused QKV and gate/up ---- */
static const struct backend_ops *fz_real;
static int64_t fz_matmuls;

static int fz_matmul(void *c, float *y, const float *x, const struct backend_mat *w, int64_t n)
{
	fz_matmuls++;
	return fz_real->matmul(c, y, x, w, n);
}

/* Prefill 8 ids, then 12 greedy decode steps on be; logits (13, V); *prefill the matmuls of
 * the prefill, *per_step those of the last decode step. */
static void fz_run(struct fkv_model *m, struct backend *be, float *logits, int64_t *prefill,
		   int64_t *per_step)
{
	const int64_t V = m->cfg.vocab_size;
	struct engine_opts o = { .max_ctx = 64, .policy = "full" };
	struct engine *e;
	char err[256];
	if (engine_new(&e, m, be, &o, err, sizeof err))
		fail_msg("engine_new: %s", err);
	int seq;
	assert_int_equal(engine_seq_open(e, NULL, &seq, err, sizeof err), 0);
	int32_t ids[8] = { 1 };
	uint64_t sd = 99;
	for (int i = 1; i < 8; i++)
		ids[i] = 3 + (int32_t)(test_rand(&sd) % (uint64_t)(V - 3));
	int64_t before = fz_matmuls;
	assert_int_equal(engine_prefill(e, seq, ids, 8, logits, false, err, sizeof err), 0);
	*prefill = fz_matmuls - before;
	for (int t = 0; t < 12; t++) {
		const float *lg = logits + (size_t)t * V;
		int32_t next = 0;
		for (int64_t i = 1; i < V; i++)
			next = lg[i] > lg[next] ? (int32_t)i : next;
		before = fz_matmuls;
		assert_int_equal(engine_decode(e, 1, &seq, &next, logits + (size_t)(t + 1) * V, err,
					       sizeof err), 0);
		*per_step = fz_matmuls - before;
	}
	engine_seq_free(e, seq);
	engine_free(e);
}

/* Decode and prefill run one GEMM for q, k, v and one for gate, up per layer (weights
 * concatenated at load, weight_concat; several rows de-interleaved by split_cols) where the
 * backend can, with the logits of separate GEMMs (exactly on the CPU backend: each output row
 * is the same dot product either way), on an f32 model (stories260K) and a bf16 one (the tiny
 * preset); without weight_concat, the separate GEMMs; without split_cols, fused decode and
 * separate prefill GEMMs over views of the fused weights. */
static void test_fused_projections(void **state)
{
	(void)state;
	char dir[] = "/tmp/freekv-test-fused-XXXXXX", err[512];
	assert_non_null(mkdtemp(dir));
	assert_int_equal(synth_write("tiny", 2, FKV_BF16, dir, 11, synth_min_vocab() > 512 ?
				     synth_min_vocab() : 512, err, sizeof err), 0);
	const char *paths[] = { test_model_path("stories260K/stories260K.gguf"), dir };
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 2), 0);
	fz_real = cpu->ops;
	struct backend_ops fused = *cpu->ops, split = *cpu->ops, views = *cpu->ops;
	fused.matmul = split.matmul = views.matmul = fz_matmul;
	split.weight_concat = NULL;
	views.split_cols = NULL;
	struct backend bf = { &fused, cpu->ctx }, bs = { &split, cpu->ctx };
	struct backend bv = { &views, cpu->ctx };
	int done = 0;
	for (int i = 0; i < 2; i++) {
		struct fkv_model m;
		if (!paths[i] || model_load(paths[i], &m, err, sizeof err))
			continue;
		const size_t n = (size_t)13 * m.cfg.vocab_size;
		float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
		float *v = malloc(n * sizeof *v);
		assert_true(a && b && v);
		int64_t pre_fused, pre_split, pre_views, steps_fused, steps_split, steps_views;
		fz_run(&m, &bf, a, &pre_fused, &steps_fused);
		fz_run(&m, &bs, b, &pre_split, &steps_split);
		fz_run(&m, &bv, v, &pre_views, &steps_views);
		const int64_t L = m.cfg.n_layers;
		/* qkv, wo, gate/up, down; output */
		assert_int_equal(pre_fused, 4 * L + 1);
		assert_int_equal(steps_fused, 4 * L + 1);
		assert_int_equal(pre_split, 7 * L + 1);
		assert_int_equal(steps_split, 7 * L + 1);
		/* the last layer's FFN runs on the one row whose logits are wanted: fused */
		assert_int_equal(pre_views, 7 * L);
		assert_int_equal(steps_views, 4 * L + 1);
		if (memcmp(a, b, n * sizeof *a))
			fail_msg("%s: fused projections change the logits", paths[i]);
		if (memcmp(v, b, n * sizeof *v))
			fail_msg("%s: fused decode beside split prefill changes the logits",
				 paths[i]);
		free(a);
		free(b);
		free(v);
		model_free(&m);
		done++;
	}
	backend_free(cpu);
	snprintf(err, sizeof err, "rm -rf '%s'", dir);
	assert_int_equal(system(err), 0);
	assert_true(done >= 1);
}

/* A CPU backend with graph_run: "recording" runs fn and keeps a marker, "launching" runs fn
 * again (what a replay does: the same ops on the same buffers); while fn runs, an upload,
 * download or sync fails the test (a graph cannot hold them). gr_plain: every graph_run
 * runs fn as plain ops instead, as when recording fails. */
static const struct backend_ops *gr_real;
static int gr_inside, gr_plain;
static int64_t gr_calls, gr_host_ops;

static int gr_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
	gr_host_ops += gr_inside;
	return gr_real->upload(ctx, dst, src, bytes);
}

static int gr_download(void *ctx, void *dst, const void *src, size_t bytes)
{
	gr_host_ops += gr_inside;
	return gr_real->download(ctx, dst, src, bytes);
}

static int gr_sync(void *ctx)
{
	gr_host_ops += gr_inside;
	return gr_real->sync ? gr_real->sync(ctx) : 0;
}

static int gr_run(void *ctx, struct backend_graph **g, int (*fn)(void *arg), void *arg)
{
	(void)ctx;
	gr_calls++;
	gr_inside = 1;
	int ret = fn(arg);
	gr_inside = 0;
	if (ret || gr_plain)
		return ret ? ret : 1;
	if (*g)
		return 0;
	*g = malloc(1);
	return 2;
}

static void gr_free(void *ctx, struct backend_graph *g)
{
	(void)ctx;
	free(g);
}

/* Prefill 8 ids into each of n sequences, then `steps` greedy decode steps of all n at once;
 * logits (steps + 1, n, V) */
static void gr_gen(struct fkv_model *m, struct backend *be, int n, int steps, float *logits,
		   struct engine_graph_stats *gs)
{
	const int64_t V = m->cfg.vocab_size;
	struct engine_opts o = { .max_ctx = 64, .policy = "full", .max_seqs = 4 };
	struct engine *e;
	char err[256];
	if (engine_new(&e, m, be, &o, err, sizeof err))
		fail_msg("engine_new: %s", err);
	int seq[4];
	int32_t tok[4];
	for (int b = 0; b < n; b++) {
		assert_int_equal(engine_seq_open(e, NULL, &seq[b], err, sizeof err), 0);
		int32_t ids[8] = { 1 };
		uint64_t sd = 7 + (uint64_t)b;
		for (int i = 1; i < 8; i++)
			ids[i] = 3 + (int32_t)(test_rand(&sd) % (uint64_t)(V - 3));
		assert_int_equal(engine_prefill(e, seq[b], ids, 8, logits + (size_t)b * V, false,
						err, sizeof err), 0);
	}
	assert_int_equal(gr_calls, 0); /* prefill runs plain */
	for (int t = 0; t < steps; t++) {
		float *lg = logits + (size_t)t * n * V;
		for (int b = 0; b < n; b++) {
			tok[b] = 0;
			for (int64_t i = 1; i < V; i++)
				tok[b] = lg[b * V + i] > lg[b * V + tok[b]] ? (int32_t)i : tok[b];
		}
		assert_int_equal(engine_decode(e, n, seq, tok, lg + (size_t)n * V, err, sizeof err),
				 0);
	}
	engine_graph_stats(e, gs);
	for (int b = 0; b < n; b++)
		engine_seq_free(e, seq[b]);
	engine_free(e);
}

/* Decode steps through graphs (engine.h): n_layers + 1 segments a step, the first step of a
 * shape plain, the next recorded, then launched; none of a segment's ops touches the host; the
 * logits equal plain steps' bit for bit, for one sequence and a batch of two; a backend whose
 * recording fails runs them plain (counted); FREEKV_CUDA_GRAPHS=0 turns them off. */
static void test_decode_graphs(void **state)
{
	(void)state;
	struct fkv_model m;
	test_load_stories(&m);
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 2), 0);
	gr_real = cpu->ops;
	struct backend_ops go = *cpu->ops;
	go.upload = gr_upload;
	go.download = gr_download;
	go.sync = gr_sync;
	go.graph_run = gr_run;
	go.graph_free = gr_free;
	struct backend gb = { &go, cpu->ctx };
	const int64_t V = m.cfg.vocab_size, S = m.cfg.n_layers + 1, STEPS = 12;
	for (int n = 1; n <= 2; n++) {
		const size_t len = (size_t)(STEPS + 1) * n * V;
		float *ref = malloc(len * sizeof *ref), *got = malloc(len * sizeof *got);
		assert_true(ref && got);
		struct engine_graph_stats gs;
		gr_calls = gr_host_ops = 0;
		gr_gen(&m, cpu, n, STEPS, ref, &gs);
		assert_false(gs.on); /* the CPU backend records no graphs */
		gr_gen(&m, &gb, n, STEPS, got, &gs);
		assert_true(gs.on);
		assert_int_equal(gr_calls, (STEPS - 1) * S);
		assert_int_equal(gs.launched, (STEPS - 1) * S);
		assert_int_equal(gs.recorded, S);
		assert_int_equal(gs.plain, 0);
		assert_int_equal(gr_host_ops, 0);
		if (memcmp(got, ref, len * sizeof *got))
			fail_msg("batch %d: decode through graphs changes the logits", n);
		/* recording fails: plain ops, the same logits */
		gr_calls = 0;
		gr_plain = 1;
		gr_gen(&m, &gb, n, STEPS, got, &gs);
		gr_plain = 0;
		assert_int_equal(gs.plain, (STEPS - 1) * S);
		assert_int_equal(gs.launched, 0);
		if (memcmp(got, ref, len * sizeof *got))
			fail_msg("batch %d: plain fallback changes the logits", n);
		free(ref);
		free(got);
	}
	setenv("FREEKV_CUDA_GRAPHS", "0", 1);
	gr_calls = 0;
	float *lg = malloc((size_t)(STEPS + 1) * V * sizeof *lg);
	struct engine_graph_stats gs;
	gr_gen(&m, &gb, 1, STEPS, lg, &gs);
	unsetenv("FREEKV_CUDA_GRAPHS");
	assert_false(gs.on);
	assert_int_equal(gr_calls, 0);
	free(lg);
	backend_free(cpu);
	model_free(&m);
}

int main(int argc, char **argv)
{
	static bool small = false, big = true;
	const struct CMUnitTest fast[] = {
		cmocka_unit_test(test_mem_models_vs_reference),
		cmocka_unit_test(test_reference_detects_rope_mismatch),
		cmocka_unit_test(test_cache_growth),
		cmocka_unit_test(test_policy_full_direct),
		cmocka_unit_test(test_batch_matches_alone),
		cmocka_unit_test(test_fused_projections),
		cmocka_unit_test(test_decode_graphs),
		cmocka_unit_test(test_limits_and_bad_input),
		cmocka_unit_test(test_stories_vs_reference),
		cmocka_unit_test(test_stories_gguf_vs_hf),
		cmocka_unit_test_prestate(test_presets_vs_reference, &small),
	};
	const struct CMUnitTest slow[] = {
		cmocka_unit_test_prestate(test_presets_vs_reference, &big),
	};
	if (argc > 1 && !strcmp(argv[1], "--presets"))
		return cmocka_run_group_tests(slow, setup, teardown);
	return cmocka_run_group_tests(fast, setup, teardown);
}
