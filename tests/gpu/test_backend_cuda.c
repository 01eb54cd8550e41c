/* test_backend_cuda — the CUDA backend (worker/backend/backend_cuda.c) against the CPU backend, the
 * reference: every op of the table on fresh random inputs, per op and dtype within a normalised
 * error bound, outputs poisoned (NaN) before each run so an unwritten element fails; then end to
 * end through the engine: stories260K greedy tokens on cuda (f32) equal the CPU backend's, and a
 * synthetic Llama-3.1-8B-geometry model (1 layer, small vocab, bf16) gives logits within
 * tolerance for a short prefill + decode run. Skips (77) without a CUDA device. */
#include "gpu_test.h"

#include <errno.h>
#include <string.h>

#include "backend.h"
#include "gpu_backend_test.h"
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "synth.h"
#include "gpu_model_test.h"
#include "stories_test.h"

static uint64_t rng = 0xc0dab1e5;

/* A weight tensor (rows, cols) in dtype dt with random values; data is malloc'd. */
static struct fkv_tensor rand_tensor(int64_t rows, int64_t cols, enum fkv_dtype dt, float scale)
{
	float *f = rand_f32((size_t)(rows * cols), scale);
	struct fkv_tensor t = { .data = gpu_test_to_dtype(f, dt, (size_t)(rows * cols)),
				.dtype = dt, .n_dims = cols > 1 ? 2 : 1, .shape = { rows, cols } };
	free(f);
	return t;
}

static const char *dt_name(enum fkv_dtype dt)
{
	return dtype_name(dt);
}

/* Bound on the normalised error of a GEMM-backed result by weight dtype: f32 exact up to
 * summation order; 16-bit weights also round the activations to the weight dtype. */
static double mm_bound(enum fkv_dtype dt)
{
	return dt == FKV_F32 ? 1e-5 : dt == FKV_F16 ? 2e-3 : 1e-2;
}

/* ---- per-op comparisons ---- */

static void test_matmul(void **state)
{
	(void)state;
	const int64_t shapes[][3] = { { 1, 96, 160 }, { 7, 256, 72 }, { 33, 40, 512 } };
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++)
		for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
			enum fkv_dtype dt = gpu_test_dtypes[di];
			int64_t n = shapes[si][0], rows = shapes[si][1], cols = shapes[si][2];
			struct fkv_tensor t = rand_tensor(rows, cols, dt, 1.0f);
			float *x = rand_f32((size_t)(n * cols), 1.0f);
			float *ref = malloc((size_t)(n * rows) * 4), *got = malloc((size_t)(n * rows) * 4);
			struct backend *bes[2] = { cpu, gpu };
			float *outs[2] = { ref, got };
			for (int b = 0; b < 2; b++) {
				struct backend *be = bes[b];
				struct backend_mat w;
				assert_int_equal(be->ops->weight_load(be->ctx, &t, &w), 0);
				void *dx = put(be, x, (size_t)(n * cols) * 4);
				void *dy = poisoned(be, (size_t)(n * rows) * 4);
				assert_int_equal(be->ops->matmul(be->ctx, dy, dx, &w, n), 0);
				get(be, outs[b], dy, (size_t)(n * rows) * 4);
				be->ops->weight_release(be->ctx, &w);
				drop(be, dx);
				drop(be, dy);
			}
			char what[96];
			snprintf(what, sizeof what, "matmul %s n=%lld %lldx%lld", dt_name(dt),
				 (long long)n, (long long)rows, (long long)cols);
			GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, (size_t)(n * rows)), mm_bound(dt), what);
			free((void *)t.data);
			free(x);
			free(ref);
			free(got);
		}
}

static void test_rmsnorm(void **state)
{
	(void)state;
	const int64_t n = 5, dim = 320;
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++) {
		enum fkv_dtype dt = gpu_test_dtypes[di];
		struct fkv_tensor t = rand_tensor(dim, 1, dt, 1.0f);
		float *x = rand_f32((size_t)(n * dim), 3.0f);
		float out[2][5 * 320];
		struct backend *bes[2] = { cpu, gpu };
		for (int b = 0; b < 2; b++) {
			struct backend *be = bes[b];
			struct backend_mat w;
			assert_int_equal(be->ops->weight_load(be->ctx, &t, &w), 0);
			void *dx = put(be, x, sizeof out[0]);
			void *dy = poisoned(be, sizeof out[0]);
			assert_int_equal(be->ops->rmsnorm(be->ctx, dy, dx, &w, n, dim, 1e-5f), 0);
			get(be, out[b], dy, sizeof out[0]);
			/* In place (y == x) gives the same. */
			assert_int_equal(be->ops->rmsnorm(be->ctx, dx, dx, &w, n, dim, 1e-5f), 0);
			float inplace[5 * 320];
			get(be, inplace, dx, sizeof inplace);
			assert_memory_equal(inplace, out[b], sizeof inplace);
			be->ops->weight_release(be->ctx, &w);
			drop(be, dx);
			drop(be, dy);
		}
		GPU_TEST_CHECK_ERR(gpu_test_err(out[1], out[0], (size_t)(n * dim)), 1e-6, "rmsnorm");
		free((void *)t.data);
		free(x);
	}
}

static void test_rope(void **state)
{
	(void)state;
	const int n = 6, H = 4, d = 64;
	int32_t pos[6] = { 0, 1, 17, 999, 8191, 131000 };
	const struct backend_rope ropes[] = {
		{ FKV_ROPE_INTERLEAVED, 10000.0f, 0, 0, 0, 0 },
		{ FKV_ROPE_HALVES, 500000.0f, 0, 0, 0, 0 },
		{ FKV_ROPE_HALVES, 500000.0f, 8.0f, 1.0f, 4.0f, 8192 },
	};
	for (size_t ri = 0; ri < sizeof ropes / sizeof *ropes; ri++) {
		float *x = rand_f32((size_t)n * H * d, 1.0f);
		float out[2][6 * 4 * 64];
		struct backend *bes[2] = { cpu, gpu };
		for (int b = 0; b < 2; b++) {
			struct backend *be = bes[b];
			void *dx = put(be, x, sizeof out[0]);
			void *dp = put(be, pos, sizeof pos);
			assert_int_equal(be->ops->rope(be->ctx, dx, n, H, d, dp, &ropes[ri]), 0);
			get(be, out[b], dx, sizeof out[0]);
			drop(be, dx);
			drop(be, dp);
		}
		GPU_TEST_CHECK_ERR(gpu_test_err(out[1], out[0], (size_t)n * H * d), 1e-6, "rope");
		free(x);
	}
}

/* silu_mul, add, add_bias, softmax, convert, gather_rows, copy, split_cols: small element-wise
 * ops. */
static void test_elementwise(void **state)
{
	(void)state;
	const int64_t rows = 9, cols = 1000, n = rows * cols;
	float *a = rand_f32((size_t)n, 4.0f), *b = rand_f32((size_t)n, 4.0f);
	float *o[2];
	struct backend *bes[2] = { cpu, gpu };
	/* silu_mul, add, softmax */
	for (int op = 0; op < 3; op++) {
		for (int k = 0; k < 2; k++) {
			struct backend *be = bes[k];
			o[k] = malloc((size_t)n * 4);
			void *da = put(be, a, (size_t)n * 4), *db = put(be, b, (size_t)n * 4);
			void *dy = op == 0 ? poisoned(be, (size_t)n * 4) : da;
			int r = op == 0 ? be->ops->silu_mul(be->ctx, dy, da, db, n) :
				op == 1 ? be->ops->add(be->ctx, da, db, n) :
					  be->ops->softmax(be->ctx, da, rows, cols);
			assert_int_equal(r, 0);
			get(be, o[k], dy, (size_t)n * 4);
			if (dy != da)
				drop(be, dy);
			drop(be, da);
			drop(be, db);
		}
		const char *names[] = { "silu_mul", "add", "softmax" };
		GPU_TEST_CHECK_ERR(gpu_test_err(o[1], o[0], (size_t)n), 1e-6, names[op]);
		free(o[0]);
		free(o[1]);
	}
	/* add_bias and convert per dtype */
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++) {
		enum fkv_dtype dt = gpu_test_dtypes[di];
		struct fkv_tensor t = rand_tensor(cols, 1, dt, 1.0f);
		size_t es = dtype_size(dt);
		uint8_t *cv[2];
		for (int k = 0; k < 2; k++) {
			struct backend *be = bes[k];
			o[k] = malloc((size_t)n * 4);
			cv[k] = malloc((size_t)n * es);
			struct backend_mat w;
			assert_int_equal(be->ops->weight_load(be->ctx, &t, &w), 0);
			void *dy = put(be, a, (size_t)n * 4);
			assert_int_equal(be->ops->add_bias(be->ctx, dy, &w, rows), 0);
			get(be, o[k], dy, (size_t)n * 4);
			void *dc = poisoned(be, (size_t)n * es);
			assert_int_equal(be->ops->convert(be->ctx, dc, dt, dy, n), 0);
			get(be, cv[k], dc, (size_t)n * es);
			be->ops->weight_release(be->ctx, &w);
			drop(be, dy);
			drop(be, dc);
		}
		GPU_TEST_CHECK_ERR(gpu_test_err(o[1], o[0], (size_t)n), 1e-7, "add_bias");
		/* Round to nearest even on both sides: identical bytes. */
		if (gpu_test_err(o[1], o[0], (size_t)n) == 0)
			assert_memory_equal(cv[0], cv[1], (size_t)n * es);
		free((void *)t.data);
		free(o[0]);
		free(o[1]);
		free(cv[0]);
		free(cv[1]);
	}
	/* gather_rows and copy are exact */
	int32_t idx[5] = { 8, 0, 3, 3, 7 };
	for (int k = 0; k < 2; k++) {
		struct backend *be = bes[k];
		o[k] = malloc(5 * (size_t)cols * 4);
		void *da = put(be, a, (size_t)n * 4), *di = put(be, idx, sizeof idx);
		void *dy = poisoned(be, 5 * (size_t)cols * 4), *dz = poisoned(be, 5 * (size_t)cols * 4);
		assert_int_equal(be->ops->gather_rows(be->ctx, dy, da, cols, di, 5), 0);
		assert_int_equal(be->ops->copy(be->ctx, dz, dy, 5 * (size_t)cols * 4), 0);
		get(be, o[k], dz, 5 * (size_t)cols * 4);
		drop(be, da);
		drop(be, di);
		drop(be, dy);
		drop(be, dz);
	}
	assert_memory_equal(o[0], o[1], 5 * (size_t)cols * 4);
	assert_memory_equal(o[1] + 2 * cols, a + 3 * cols, (size_t)cols * 4);
	free(o[0]);
	free(o[1]);
	/* split_cols is exact: a (rows, 1000) as parts of 600, 200, 200 columns */
	const int64_t parts[3] = { 600, 200, 200 };
	for (int k = 0; k < 2; k++) {
		struct backend *be = bes[k];
		o[k] = malloc((size_t)n * 4);
		void *da = put(be, a, (size_t)n * 4), *dy = poisoned(be, (size_t)n * 4);
		float *d0 = dy;
		float *const dst[3] = { d0, d0 + rows * parts[0], d0 + rows * (parts[0] + parts[1]) };
		assert_int_equal(be->ops->split_cols(be->ctx, dst, parts, 3, da, rows), 0);
		get(be, o[k], dy, (size_t)n * 4);
		drop(be, da);
		drop(be, dy);
	}
	assert_memory_equal(o[0], o[1], (size_t)n * 4);
	for (int64_t r = 0; r < rows; r++)
		assert_memory_equal(o[1] + rows * parts[0] + r * parts[1], a + r * cols + parts[0],
				    (size_t)parts[1] * 4);
	free(o[0]);
	free(o[1]);
	free(a);
	free(b);
}

static void test_embed(void **state)
{
	(void)state;
	const int64_t vocab = 300, dim = 96;
	int32_t ids[7] = { 0, 299, 5, 5, 128, 1, 77 };
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++) {
		struct fkv_tensor t = rand_tensor(vocab, dim, gpu_test_dtypes[di], 1.0f);
		float out[2][7 * 96];
		struct backend *bes[2] = { cpu, gpu };
		for (int b = 0; b < 2; b++) {
			struct backend *be = bes[b];
			struct backend_mat w;
			assert_int_equal(be->ops->weight_load(be->ctx, &t, &w), 0);
			void *di_ = put(be, ids, sizeof ids), *dy = poisoned(be, sizeof out[0]);
			assert_int_equal(be->ops->embed(be->ctx, dy, &w, di_, 7), 0);
			get(be, out[b], dy, sizeof out[0]);
			be->ops->weight_release(be->ctx, &w);
			drop(be, di_);
			drop(be, dy);
		}
		assert_memory_equal(out[0], out[1], sizeof out[0]);
		free((void *)t.data);
	}
}

/* Attention bound by KV dtype: the inputs are the same rounded values on both sides, so only
 * the summation order differs. */
#define ATTN_BOUND 2e-5

/* attn_prefill over 16-bit K/V runs on tensor cores (kernels/prefill_attention_mma) unless
 * FREEKV_CUDA_PREFILL_MMA=0: they take Q and the softmax probabilities P rounded to the K/V
 * type (unit roundoff u = 2^-11 for f16, 2^-8 for bf16) where the CPU keeps them f32. Each
 * output is sum_j P_j V_j / l with every P_j off by at most u relative, and each score off by
 * about u |q||k| scale through Q: random-sign errors over the row, so the normalised error
 * stays a small multiple of u — bounds 2u (1e-3) for f16 and 2u (8e-3) for bf16. f32 K/V, and
 * the CUDA-core tiles, see the same rounded inputs as the CPU: ATTN_BOUND. */
static double prefill_bound(enum fkv_dtype dt)
{
	const char *mma = getenv("FREEKV_CUDA_PREFILL_MMA");
	if (dt == FKV_F32 || (mma && !strcmp(mma, "0")))
		return ATTN_BOUND;
	return dt == FKV_F16 ? 1e-3 : 8e-3;
}

static void test_attn_prefill(void **state)
{
	(void)state;
	const struct { int n_q, n_ctx, H, KV, d; int64_t window; } cases[] = {
		{ 1, 1, 4, 2, 16, 0 }, { 13, 13, 8, 2, 64, 0 }, { 5, 300, 4, 4, 128, 0 },
		{ 40, 200, 8, 1, 32, 64 },
	};
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++)
		for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
			enum fkv_dtype dt = gpu_test_dtypes[di];
			int n_q = cases[ci].n_q, n_ctx = cases[ci].n_ctx, H = cases[ci].H;
			int KV = cases[ci].KV, d = cases[ci].d;
			struct backend_attn a = { H, KV, d, dt, 1.0f / sqrtf((float)d), cases[ci].window };
			size_t nkv = (size_t)n_ctx * KV * d, nq = (size_t)n_q * H * d;
			float *q = rand_f32(nq, 1.0f), *kf = rand_f32(nkv, 2.0f), *vf = rand_f32(nkv, 1.0f);
			void *k = gpu_test_to_dtype(kf, dt, nkv), *v = gpu_test_to_dtype(vf, dt, nkv);
			float *out[2] = { malloc(nq * 4), malloc(nq * 4) };
			struct backend *bes[2] = { cpu, gpu };
			for (int b = 0; b < 2; b++) {
				struct backend *be = bes[b];
				void *dq = put(be, q, nq * 4), *dk = put(be, k, nkv * dtype_size(dt));
				void *dv = put(be, v, nkv * dtype_size(dt)), *dy = poisoned(be, nq * 4);
				assert_int_equal(be->ops->attn_prefill(be->ctx, dy, dq, n_q, dk, dv,
								      n_ctx, &a), 0);
				get(be, out[b], dy, nq * 4);
				drop(be, dq);
				drop(be, dk);
				drop(be, dv);
				drop(be, dy);
			}
			char what[96];
			snprintf(what, sizeof what, "attn_prefill %s case %zu", dt_name(dt), ci);
			GPU_TEST_CHECK_ERR(gpu_test_err(out[1], out[0], nq), prefill_bound(dt), what);
			free(q);
			free(kf);
			free(vf);
			free(k);
			free(v);
			free(out[0]);
			free(out[1]);
		}
}

/* attn_decode over several spans of one strided cache, and attn_decode_heads with different
 * spans per KV head (one head reading an empty span list entry among others). */
static void test_attn_decode(void **state)
{
	(void)state;
	const int H = 8, KV = 2, d = 128, rows = 700, stride_rows = 3; /* cache holds 3 row groups */
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++) {
		enum fkv_dtype dt = gpu_test_dtypes[di];
		size_t es = dtype_size(dt), row = (size_t)stride_rows * KV * d;
		size_t nkv = (size_t)rows * row;
		float *kf = rand_f32(nkv, 2.0f), *vf = rand_f32(nkv, 1.0f), *q = rand_f32((size_t)H * d, 1.0f);
		void *k = gpu_test_to_dtype(kf, dt, nkv), *v = gpu_test_to_dtype(vf, dt, nkv);
		struct backend_attn a = { H, KV, d, dt, 1.0f / sqrtf((float)d), 0 };
		float out[2][2][8 * 128];
		struct backend *bes[2] = { cpu, gpu };
		for (int b = 0; b < 2; b++) {
			struct backend *be = bes[b];
			char *dk = put(be, k, nkv * es), *dv = put(be, v, nkv * es);
			void *dq = put(be, q, (size_t)H * d * 4);
			void *dy = poisoned(be, sizeof out[0][0]);
			/* Spans: rows [0, 300), [310, 311), [400, 700) at row group 1. */
			const int64_t sp[][2] = { { 0, 300 }, { 310, 1 }, { 400, 300 } };
			struct backend_kv_span spans[5];
			for (int s = 0; s < 3; s++) {
				size_t off = ((size_t)sp[s][0] * row + (size_t)KV * d) * es;
				spans[s] = (struct backend_kv_span){ dk + off, dv + off, sp[s][1],
								     (int64_t)row };
			}
			assert_int_equal(be->ops->attn_decode(be->ctx, dy, dq, spans, 3, &a), 0);
			get(be, out[b][0], dy, sizeof out[0][0]);
			/* Per head: head 0 reads spans 0..2, head 1 reads spans 3..4 (other rows). */
			spans[3] = (struct backend_kv_span){ dk + 5 * row * es, dv + 5 * row * es, 129,
							     (int64_t)row };
			spans[4] = (struct backend_kv_span){ dk + 600 * row * es, dv + 600 * row * es, 2,
							     (int64_t)row };
			int first[3] = { 0, 3, 5 };
			void *dz = poisoned(be, sizeof out[0][0]);
			assert_int_equal(be->ops->attn_decode_heads(be->ctx, dz, dq, spans, first, &a), 0);
			get(be, out[b][1], dz, sizeof out[0][0]);
			drop(be, dk);
			drop(be, dv);
			drop(be, dq);
			drop(be, dy);
			drop(be, dz);
		}
		GPU_TEST_CHECK_ERR(gpu_test_err(out[1][0], out[0][0], (size_t)H * d), ATTN_BOUND,
				   "attn_decode");
		GPU_TEST_CHECK_ERR(gpu_test_err(out[1][1], out[0][1], (size_t)H * d), ATTN_BOUND,
				   "attn_decode_heads");
		free(kf);
		free(vf);
		free(q);
		free(k);
		free(v);
	}
}

/* A KV head with no keys is refused by both backends, and nothing is queued. */
static void test_attn_decode_rejects_empty(void **state)
{
	(void)state;
	struct backend_attn a = { 4, 2, 16, FKV_F32, 0.25f, 0 };
	float *dq = gpu->ops->buf_alloc(gpu->ctx, 4 * 16 * 4);
	float *dy = gpu->ops->buf_alloc(gpu->ctx, 4 * 16 * 4);
	struct backend_kv_span span = { dq, dq, 2, 32 };
	int first[3] = { 0, 1, 1 };
	assert_int_equal(gpu->ops->attn_decode_heads(gpu->ctx, dy, dq, &span, first, &a), -EINVAL);
	assert_int_equal(gpu->ops->attn_decode(gpu->ctx, dy, dq, &span, 0, &a), -EINVAL);
	assert_int_equal(gpu->ops->sync(gpu->ctx), 0);
	drop(gpu, dq);
	drop(gpu, dy);
}

/* host_register page-locks a range (an upload from it is complete when upload returns);
 * registering it twice is -EEXIST with a message; unregister forgets it. */
static void test_host_register(void **state)
{
	(void)state;
	size_t bytes = 3u << 20;
	void *p = NULL;
	assert_int_equal(posix_memalign(&p, 4096, bytes), 0);
	char err[512] = "";
	assert_int_equal(gpu->ops->host_register(gpu->ctx, p, bytes, err, sizeof err), 0);
	/* A registered range can be the source of an upload. */
	memset(p, 0x3c, bytes);
	void *d = gpu->ops->buf_alloc(gpu->ctx, bytes);
	assert_int_equal(gpu->ops->upload(gpu->ctx, d, p, bytes), 0);
	memset(p, 0x11, bytes); /* after upload returned: must not reach the device */
	uint8_t back[64];
	get(gpu, back, (char *)d + bytes - 64, 64);
	assert_int_equal(back[63], 0x3c);
	assert_int_equal(gpu->ops->host_register(gpu->ctx, p, bytes, err, sizeof err), -EEXIST);
	assert_non_null(strstr(err, "already page-locked"));
	assert_int_equal(gpu->ops->host_unregister(gpu->ctx, p), 0);
	assert_int_equal(gpu->ops->host_unregister(gpu->ctx, p), -ENOENT);
	drop(gpu, d);
	free(p);
}

/* ---- end to end through the engine ---- */

static struct engine *engine_on(struct backend *be, const struct fkv_model *m)
{
	struct engine *e;
	char err[256];
	struct engine_opts o = { .max_ctx = 256, .kv_dtype = FKV_F32, .kv_dtype_set = true };
	if (engine_new(&e, m, be, &o, err, sizeof err))
		fail_msg("engine_new on %s: %s", be->ops->name, err);
	return e;
}

/* Greedy: prefill prompt, then n decode steps; tokens to out, every step's logits to lg
 * ((n + 1) rows of V). */
static void greedy(struct backend *be, const struct fkv_model *m, const int32_t *prompt,
		   int n_prompt, int n, int32_t *out, float *lg)
{
	struct engine *e = engine_on(be, m);
	int V = m->cfg.vocab_size, s;
	char err[256];
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	if (engine_prefill(e, s, prompt, n_prompt, lg, false, err, sizeof err))
		fail_msg("prefill on %s: %s", be->ops->name, err);
	for (int i = 0; i < n; i++) {
		out[i] = sampler_argmax(lg + (size_t)i * V, V);
		if (engine_decode(e, 1, &s, &out[i], lg + (size_t)(i + 1) * V, err, sizeof err))
			fail_msg("decode on %s: %s", be->ops->name, err);
	}
	engine_free(e);
}

static void test_stories_greedy(void **state)
{
	(void)state;
	const char *path = test_model_path("stories260K/stories260K.gguf");
	if (!path)
		skip();
	struct fkv_model m;
	char err[256];
	if (model_load(path, &m, err, sizeof err))
		fail_msg("model_load: %s", err);
	int32_t prompt[9] = { 1, 403, 407, 261, 378, 280, 270, 385, 289 };
	enum { N = 48 };
	int V = m.cfg.vocab_size;
	int32_t tc[N], tg[N];
	float *lc = malloc((size_t)(N + 1) * V * 4), *lgpu = malloc((size_t)(N + 1) * V * 4);
	greedy(cpu, &m, prompt, 9, N, tc, lc);
	greedy(gpu, &m, prompt, 9, N, tg, lgpu);
	assert_memory_equal(tc, tg, sizeof tc);
	double e = gpu_test_err(lgpu, lc, (size_t)(N + 1) * V);
	fprintf(stderr, "stories260K: %d greedy tokens equal, logits error %.3g\n", N, e);
	GPU_TEST_CHECK_ERR(e, 1e-4, "stories260K logits");
	free(lc);
	free(lgpu);
	model_free(&m);
}

/* llama-3.1-8b geometry (dim 4096, GQA 32/8, d 128, ffn 14336, llama3 rope), 1 layer, vocab
 * 512, bf16 weights: prefill 12 tokens, decode 4, every step's logits close to the CPU's. */
static void test_llama8b_geometry(void **state)
{
	(void)state;
	char dir[] = "/tmp/freekv-test-cuda-XXXXXX";
	struct fkv_model m;
	gpu_test_synth_8b(dir, 1, 11, &m);
	int32_t prompt[12];
	for (int i = 0; i < 12; i++)
		prompt[i] = (int32_t)(test_rand(&rng) % (uint64_t)m.cfg.vocab_size);
	enum { N = 4 };
	int V = m.cfg.vocab_size;
	int32_t tc[N], tg[N];
	float *lc = malloc((size_t)(N + 1) * V * 4), *lgpu = malloc((size_t)(N + 1) * V * 4);
	greedy(cpu, &m, prompt, 12, N, tc, lc);
	greedy(gpu, &m, prompt, 12, N, tg, lgpu);
	/* The GPU rounds activations to bf16 before each GEMM (kernels/gemm.cuh). */
	double e = gpu_test_err(lgpu, lc, (size_t)(N + 1) * V);
	fprintf(stderr, "llama-3.1-8b geometry (1 layer, bf16): logits error %.3g\n", e);
	GPU_TEST_CHECK_ERR(e, 2e-2, "llama-3.1-8b logits");
	model_free(&m);
	free(lc);
	free(lgpu);
	gpu_test_rm_dir(dir);
}

/* Greedy decode of n steps after prompt on the GPU, with graphs (FREEKV_CUDA_GRAPHS unset) or
 * without (=0); logits (n + 1, V), the engine's graph counts to gs. */
static void greedy_graphs(const struct fkv_model *m, bool graphs, const int32_t *prompt,
			  int n_prompt, int n, float *lg, struct engine_graph_stats *gs)
{
	if (!graphs)
		setenv("FREEKV_CUDA_GRAPHS", "0", 1);
	struct engine *e = engine_on(gpu, m);
	unsetenv("FREEKV_CUDA_GRAPHS");
	int V = m->cfg.vocab_size, s;
	char err[256];
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	if (engine_prefill(e, s, prompt, n_prompt, lg, false, err, sizeof err))
		fail_msg("prefill: %s", err);
	for (int i = 0; i < n; i++) {
		int32_t t = sampler_argmax(lg + (size_t)i * V, V);
		if (engine_decode(e, 1, &s, &t, lg + (size_t)(i + 1) * V, err, sizeof err))
			fail_msg("decode: %s", err);
	}
	engine_graph_stats(e, gs);
	engine_free(e);
}

/* Decode steps through CUDA Graphs (engine.h): on stories260K (f32) and the llama-3.1-8b
 * geometry (bf16, 2 layers), 24 greedy steps with graphs give the logits of the same steps as
 * plain launches bit for bit (the same kernels on the same arguments), every segment of the
 * 23 steps after the first ran as a graph (recorded once), none fell back to plain ops. */
static void test_decode_graphs(void **state)
{
	(void)state;
	char dir[] = "/tmp/freekv-test-graphs-XXXXXX";
	struct fkv_model ms, m8;
	test_load_stories(&ms);
	gpu_test_synth_8b(dir, 2, 17, &m8);
	const struct fkv_model *models[2] = { &ms, &m8 };
	enum { N = 24 };
	for (int i = 0; i < 2; i++) {
		const struct fkv_model *m = models[i];
		int V = m->cfg.vocab_size;
		int32_t prompt[10] = { 1 };
		for (int j = 1; j < 10; j++)
			prompt[j] = 3 + (int32_t)(test_rand(&rng) % (uint64_t)(V - 3));
		float *plain = malloc((size_t)(N + 1) * V * 4), *graph = malloc((size_t)(N + 1) * V * 4);
		struct engine_graph_stats gp, gg;
		greedy_graphs(m, false, prompt, 10, N, plain, &gp);
		greedy_graphs(m, true, prompt, 10, N, graph, &gg);
		const int64_t S = m->cfg.n_layers + 1;
		fprintf(stderr, "%s: graphs launched %lld, recorded %lld, plain %lld; logits error "
			"%.3g\n", i ? "llama-3.1-8b" : "stories260K", (long long)gg.launched,
			(long long)gg.recorded, (long long)gg.plain,
			gpu_test_err(graph, plain, (size_t)(N + 1) * V));
		assert_false(gp.on);
		assert_true(gg.on);
		assert_int_equal(gg.launched, (N - 1) * S);
		assert_int_equal(gg.recorded, S);
		assert_int_equal(gg.plain, 0);
		assert_memory_equal(graph, plain, (size_t)(N + 1) * V * 4);
		free(plain);
		free(graph);
	}
	model_free(&ms);
	model_free(&m8);
	gpu_test_rm_dir(dir);
}

/* backend_open: unknown names are refused with a message. */
static void test_backend_open(void **state)
{
	(void)state;
	struct backend *be = NULL;
	char err[256] = "";
	assert_int_equal(backend_open("tpu", 1, &be, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "tpu"));
	assert_int_equal(backend_open("auto", 1, &be, err, sizeof err), 0);
	assert_string_equal(be->ops->name, "cuda");
	backend_free(be);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_elementwise),
		cmocka_unit_test(test_embed),
		cmocka_unit_test(test_attn_prefill),
		cmocka_unit_test(test_attn_decode),
		cmocka_unit_test(test_attn_decode_rejects_empty),
		cmocka_unit_test(test_host_register),
		cmocka_unit_test(test_backend_open),
		cmocka_unit_test(test_stories_greedy),
		cmocka_unit_test(test_llama8b_geometry),
		cmocka_unit_test(test_decode_graphs),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
