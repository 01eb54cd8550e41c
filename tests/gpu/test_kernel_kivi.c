/* Tests kernels/kivi.cu and kernels/attn_probs.cu against their CPU twins (the CPU backend's
 * kivi_quant, kivi_dequant and attn_kivi, worker/backend/backend_cpu_kivi.c), and the CUDA
 * backend's attn_kivi (worker/backend/backend_cuda_kivi.c) against the CPU backend's:
 *   - quantisation: codes, zeros and scales bit for bit (both compute the design's formulas in
 *     double), every KV dtype, 2 and 1 bits, value groups dividing d or not;
 *   - dequantisation: bit for bit (fmaf on both);
 *   - exact rows put over dequantised ones and widening: equality;
 *   - attention over a KIVI copy with exact rows and the last row's probabilities: within a
 *     normalised error of 1e-5 (f32 sums in another order), outputs poisoned first.
 * Skips (77) without a CUDA device. */
#include "gpu_test.h"

#include "backend.h"
#include "kivi.cuh"

static uint64_t rng = 0x4b1f1c0d;

struct copy {
	uint8_t *kc, *vc;
	float *kzs, *vzs;
	size_t cb, kz, vz; /* bytes of codes, key and value (z, s) */
};

static void copy_sizes(struct copy *c, int64_t cap, int n_kv, int d, int p, int bits)
{
	const int gv = p < d ? p : d, nvg = (d + gv - 1) / gv;
	c->cb = (size_t)cap * n_kv * (d * bits / 8);
	c->kz = (size_t)(cap / p) * n_kv * 2 * d * 4;
	c->vz = (size_t)cap * n_kv * 2 * nvg * 4;
}

static void host_copy(struct copy *c)
{
	c->kc = calloc(c->cb, 1);
	c->vc = calloc(c->cb, 1);
	c->kzs = calloc(c->kz, 1);
	c->vzs = calloc(c->vz, 1);
	assert_true(c->kc && c->vc && c->kzs && c->vzs);
}

static void dev_copy(struct copy *c)
{
	c->kc = gpu_test_poisoned(c->cb);
	c->vc = gpu_test_poisoned(c->cb);
	c->kzs = gpu_test_poisoned(c->kz);
	c->vzs = gpu_test_poisoned(c->vz);
}

static struct backend_kivi as_kivi(const struct copy *c, int n_kv, int d, int p, int bits)
{
	return (struct backend_kivi){ .kc = c->kc, .kzs = c->kzs, .vc = c->vc, .vzs = c->vzs,
				      .bits = bits, .p = p, .gv = p < d ? p : d, .n_kv = n_kv,
				      .d = d };
}

static void check_quant(struct backend *cpu, enum fkv_dtype dt, int n_kv, int d, int p, int bits,
			int64_t n)
{
	const size_t rows = (size_t)n * n_kv * d;
	float *kf = malloc(rows * 4), *vf = malloc(rows * 4);
	gpu_test_fill(kf, rows, 3.0f, &rng);
	gpu_test_fill(vf, rows, 0.5f, &rng);
	for (int i = 0; i < p; i++) /* a constant channel: s = 0 */
		kf[(size_t)i * n_kv * d + 1] = 0.25f;
	void *k = gpu_test_to_dtype(kf, dt, rows), *v = gpu_test_to_dtype(vf, dt, rows);
	struct copy want = { 0 }, got, dev;
	copy_sizes(&want, n, n_kv, d, p, bits);
	got = dev = want;
	host_copy(&want);
	host_copy(&got);
	dev_copy(&dev);
	struct backend_kivi wq = as_kivi(&want, n_kv, d, p, bits);
	assert_int_equal(cpu->ops->kivi_quant(cpu->ctx, &wq, 0, k, v, n, dt), 0);
	void *dk = gpu_test_put(k, rows * dtype_size(dt)), *dv = gpu_test_put(v, rows * dtype_size(dt));
	CU(kivi_quant(dev.kc, dev.kzs, dev.vc, dev.vzs, dk, dv, dt, 0, n, n_kv, d, p, bits, 0));
	gpu_test_get(got.kc, dev.kc, got.cb);
	gpu_test_get(got.vc, dev.vc, got.cb);
	gpu_test_get(got.kzs, dev.kzs, got.kz);
	gpu_test_get(got.vzs, dev.vzs, got.vz);
	assert_memory_equal(got.kc, want.kc, got.cb);
	assert_memory_equal(got.vc, want.vc, got.cb);
	assert_memory_equal(got.kzs, want.kzs, got.kz);
	assert_memory_equal(got.vzs, want.vzs, got.vz);
	/* Dequantised: the same bits. */
	float *ck = malloc(rows * 4), *cv = malloc(rows * 4), *gk = malloc(rows * 4);
	float *gv = malloc(rows * 4);
	assert_int_equal(cpu->ops->kivi_dequant(cpu->ctx, ck, cv, &wq, 0, n), 0);
	float *ok = gpu_test_poisoned(rows * 4), *ov = gpu_test_poisoned(rows * 4);
	CU(kivi_dequant(ok, ov, dev.kc, dev.kzs, dev.vc, dev.vzs, 0, n, n_kv, d, p, bits, 0));
	gpu_test_get(gk, ok, rows * 4);
	gpu_test_get(gv, ov, rows * 4);
	assert_memory_equal(gk, ck, rows * 4);
	assert_memory_equal(gv, cv, rows * 4);
	void *devs[] = { dev.kc, dev.vc, dev.kzs, dev.vzs, dk, dv, ok, ov };
	for (size_t i = 0; i < sizeof devs / sizeof *devs; i++)
		cudaFree(devs[i]);
	void *hosts[] = { want.kc, want.vc, want.kzs, want.vzs, got.kc, got.vc, got.kzs, got.vzs,
			  kf, vf, k, v, ck, cv, gk, gv };
	for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++)
		free(hosts[i]);
}

static void test_quant_dequant(void **state)
{
	(void)state;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 2), 0);
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++)
		for (int bits = 1; bits <= 2; bits++) {
			check_quant(cpu, gpu_test_dtypes[di], 8, 128, 32, bits, 256);
			check_quant(cpu, gpu_test_dtypes[di], 4, 8, 8, bits, 64);
			check_quant(cpu, gpu_test_dtypes[di], 3, 16, 12, bits, 48);
		}
	backend_free(cpu);
}

static void test_put_rows_widen(void **state)
{
	(void)state;
	enum { KV = 4, NF = 6, D = 16, POS = 20 };
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++) {
		const enum fkv_dtype dt = gpu_test_dtypes[di];
		float rows[KV * NF * D], dst[POS * KV * D];
		gpu_test_fill(rows, KV * NF * D, 2.0f, &rng);
		gpu_test_round(rows, dt, KV * NF * D);
		gpu_test_fill(dst, POS * KV * D, 2.0f, &rng);
		int32_t pos[KV * NF];
		for (int i = 0; i < KV * NF; i++)
			pos[i] = i % 5 == 4 ? -1 : (int32_t)((i * 7) % POS);
		float want[POS * KV * D];
		memcpy(want, dst, sizeof want);
		for (int h = 0; h < KV; h++)
			for (int i = 0; i < NF; i++)
				if (pos[h * NF + i] >= 0)
					memcpy(want + ((size_t)pos[h * NF + i] * KV + h) * D,
					       rows + ((size_t)h * NF + i) * D, D * 4);
		void *hr = gpu_test_to_dtype(rows, dt, KV * NF * D);
		void *drows = gpu_test_put(hr, KV * NF * D * dtype_size(dt));
		float *ddst = gpu_test_put(dst, sizeof dst);
		int32_t *dpos = gpu_test_put(pos, sizeof pos);
		CU(kivi_put_rows(ddst, drows, dt, dpos, KV, NF, D, 0));
		float got[POS * KV * D];
		gpu_test_get(got, ddst, sizeof got);
		assert_memory_equal(got, want, sizeof got);
		/* Widening: the rows back to f32 exactly. */
		float *wide = gpu_test_poisoned(KV * NF * D * 4);
		CU(kivi_widen(wide, drows, dt, KV * NF * D, 0));
		gpu_test_get(got, wide, KV * NF * D * 4);
		assert_memory_equal(got, rows, KV * NF * D * 4);
		cudaFree(drows);
		cudaFree(ddst);
		cudaFree(dpos);
		cudaFree(wide);
		free(hr);
	}
}

/* attn_kivi on the CUDA backend against the CPU backend: a copy of n_quant positions with n_f
 * exact rows per head (some unused), dense rows, 1 or 2 query rows, probabilities of the last. */
static void check_attn(struct backend *cpu, struct backend *gpu, enum fkv_dtype dt, int H, int KV,
		       int d, int p, int bits, int64_t nq, int64_t nd, int n_q, int n_f)
{
	const size_t row = (size_t)KV * d, es = dtype_size(dt);
	const int64_t n_ctx = nq + nd, n_prob = nq + 1 <= n_ctx ? nq + 1 : nq;
	float *kf = malloc((size_t)n_ctx * row * 4), *vf = malloc((size_t)n_ctx * row * 4);
	float *ff = malloc((size_t)2 * KV * n_f * d * 4 + 4), *qf = malloc((size_t)n_q * H * d * 4);
	gpu_test_fill(kf, (size_t)n_ctx * row, 2.0f, &rng);
	gpu_test_fill(vf, (size_t)n_ctx * row, 1.0f, &rng);
	gpu_test_fill(ff, (size_t)2 * KV * n_f * d, 2.0f, &rng);
	gpu_test_fill(qf, (size_t)n_q * H * d, 2.0f, &rng);
	void *k = gpu_test_to_dtype(kf, dt, (size_t)n_ctx * row);
	void *v = gpu_test_to_dtype(vf, dt, (size_t)n_ctx * row);
	void *f = gpu_test_to_dtype(ff, dt, (size_t)2 * KV * n_f * d);
	int32_t *pos = malloc((size_t)KV * n_f * 4 + 4);
	for (int h = 0; h < KV; h++)
		for (int i = 0; i < n_f; i++)
			pos[h * n_f + i] = i == 1 ? -1 : (int32_t)((i * 5 + h) % nq);
	float *outs[2], *probs[2];
	struct backend *bes[2] = { cpu, gpu };
	for (int b = 0; b < 2; b++) {
		struct backend *be = bes[b];
		const struct backend_ops *o = be->ops;
		struct copy c = { 0 };
		copy_sizes(&c, nq, KV, d, p, bits);
		void *bufs[] = { c.kc = o->buf_alloc(be->ctx, c.cb), c.vc = o->buf_alloc(be->ctx, c.cb),
				 c.kzs = o->buf_alloc(be->ctx, c.kz),
				 c.vzs = o->buf_alloc(be->ctx, c.vz) };
		struct backend_kivi kq = as_kivi(&c, KV, d, p, bits);
		void *bk = o->buf_alloc(be->ctx, (size_t)n_ctx * row * es);
		void *bv = o->buf_alloc(be->ctx, (size_t)n_ctx * row * es);
		void *bf = o->buf_alloc(be->ctx, (size_t)2 * KV * n_f * d * es + 4);
		int32_t *bp = o->buf_alloc(be->ctx, (size_t)KV * n_f * 4 + 4);
		float *bq = o->buf_alloc(be->ctx, (size_t)n_q * H * d * 4);
		float *bo = o->buf_alloc(be->ctx, (size_t)n_q * H * d * 4);
		float *bpr = o->buf_alloc(be->ctx, (size_t)KV * n_prob * 4 + 4);
		assert_int_equal(o->upload(be->ctx, bk, k, (size_t)n_ctx * row * es), 0);
		assert_int_equal(o->upload(be->ctx, bv, v, (size_t)n_ctx * row * es), 0);
		assert_int_equal(o->upload(be->ctx, bf, f, (size_t)2 * KV * n_f * d * es), 0);
		assert_int_equal(o->upload(be->ctx, bp, pos, (size_t)KV * n_f * 4), 0);
		assert_int_equal(o->upload(be->ctx, bq, qf, (size_t)n_q * H * d * 4), 0);
		assert_int_equal(o->kivi_quant(be->ctx, &kq, 0, bk, bv, nq, dt), 0);
		const size_t half = (size_t)KV * n_f * d * es;
		struct backend_kivi_attn ka = {
			.q = &kq, .n_quant = nq, .fk = bf, .fv = (char *)bf + half, .fpos = bp,
			.n_f = n_f, .k = (char *)bk + (size_t)nq * row * es,
			.v = (char *)bv + (size_t)nq * row * es, .n_dense = nd, .probs = bpr,
			.n_prob = n_prob,
		};
		struct backend_attn a = { H, KV, d, dt, 1.0f / sqrtf((float)d), 0 };
		assert_int_equal(o->attn_kivi(be->ctx, bo, bq, n_q, &ka, &a), 0);
		outs[b] = malloc((size_t)n_q * H * d * 4);
		probs[b] = malloc((size_t)KV * n_prob * 4 + 4);
		assert_int_equal(o->download(be->ctx, outs[b], bo, (size_t)n_q * H * d * 4), 0);
		assert_int_equal(o->download(be->ctx, probs[b], bpr, (size_t)KV * n_prob * 4), 0);
		void *more[] = { bk, bv, bf, bp, bq, bo, bpr };
		for (size_t i = 0; i < 4; i++)
			o->buf_free(be->ctx, bufs[i]);
		for (size_t i = 0; i < sizeof more / sizeof *more; i++)
			o->buf_free(be->ctx, more[i]);
	}
	char what[96];
	snprintf(what, sizeof what, "attn_kivi %s bits %d quant %lld dense %lld rows %d",
		 dtype_name(dt), bits, (long long)nq, (long long)nd, n_q);
	GPU_TEST_CHECK_ERR(gpu_test_err(outs[1], outs[0], (size_t)n_q * H * d), 1e-5, what);
	GPU_TEST_CHECK_ERR(gpu_test_err(probs[1], probs[0], (size_t)KV * n_prob), 1e-5, what);
	for (int b = 0; b < 2; b++) {
		free(outs[b]);
		free(probs[b]);
	}
	void *hosts[] = { kf, vf, ff, qf, k, v, f, pos };
	for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++)
		free(hosts[i]);
}

static void test_attn_kivi(void **state)
{
	(void)state;
	struct backend *cpu, *gpu;
	assert_int_equal(backend_cpu_new(&cpu, 2), 0);
	assert_int_equal(backend_cuda_new(&gpu, 0), 0);
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++)
		for (int n_q = 1; n_q <= 2; n_q++) {
			check_attn(cpu, gpu, gpu_test_dtypes[di], 8, 4, 8, 8, 2, 48, 19, n_q, 5);
			check_attn(cpu, gpu, gpu_test_dtypes[di], 32, 8, 128, 32, 1, 2048, 530, n_q,
				   64);
		}
	backend_free(gpu);
	backend_free(cpu);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quant_dequant),
		cmocka_unit_test(test_put_rows_widen),
		cmocka_unit_test(test_attn_kivi),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
