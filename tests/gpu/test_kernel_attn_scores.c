/* Tests kernels/attn_scores.cu, attn_accum.cu and gather_heads.cu (refreshkv's full step,
 * docs/design.md §5) against the CPU backend's ops of the same names on random inputs: per-head
 * span lists of random lengths at random rows of a dense (rows, n_kv, d) cache, every KV dtype,
 * Llama-3.1-8B heads (32/8/128) and a small geometry; scores, then the CPU softmax of them, then
 * the weighted sum in two chained calls. Bound 2e-6 for the scores and 2e-5 for the sums: both
 * sides read the same converted values and differ only in f32 summation order. gather_heads
 * moves exact copies. */
#include "gpu_test.h"

#include "attn_accum.cuh"
#include "attn_scores.cuh"
#include "backend.h"
#include "gather_heads.cuh"

struct sc_case {
	const char *name;
	int n_q, n_kv, d, rows, spans;
};

static void check_case(struct backend *cpu, const struct sc_case *c, enum fkv_dtype dt,
		       uint64_t *rng)
{
	const size_t hd = (size_t)c->n_kv * c->d, es = dtype_size(dt);
	float *kf = malloc((size_t)c->rows * hd * 4), *vf = malloc((size_t)c->rows * hd * 4);
	float *q = malloc((size_t)c->n_q * c->d * 4);
	gpu_test_fill(kf, (size_t)c->rows * hd, 1.0f, rng);
	gpu_test_fill(vf, (size_t)c->rows * hd, 1.0f, rng);
	gpu_test_fill(q, (size_t)c->n_q * c->d, 1.0f, rng);
	uint8_t *hk = gpu_test_to_dtype(kf, dt, (size_t)c->rows * hd);
	uint8_t *hv = gpu_test_to_dtype(vf, dt, (size_t)c->rows * hd);
	void *dk = gpu_test_put(hk, (size_t)c->rows * hd * es);
	void *dv = gpu_test_put(hv, (size_t)c->rows * hd * es);
	/* The same span lengths for every head (so every row has n keys), own offsets. */
	const int S = c->spans;
	int64_t len[64], n = 0, n0 = 0;
	for (int i = 0; i < S; i++) {
		len[i] = 1 + (int64_t)(test_rand(rng) % 40);
		n += len[i];
		n0 += i < S / 2 ? len[i] : 0;
	}
	struct backend_kv_span *hs = malloc((size_t)c->n_kv * S * sizeof *hs);
	struct span_desc *ds = malloc((size_t)c->n_kv * S * sizeof *ds);
	struct span_desc *ds2 = malloc((size_t)c->n_kv * S * sizeof *ds2);
	int *first = malloc((size_t)(c->n_kv + 1) * sizeof *first);
	int32_t *f32 = malloc((size_t)(c->n_kv + 1) * 4), *fa = malloc((size_t)(c->n_kv + 1) * 4);
	int32_t *fb = malloc((size_t)(c->n_kv + 1) * 4);
	for (int h = 0; h < c->n_kv; h++) {
		first[h] = f32[h] = h * S;
		fa[h] = h * (S / 2);
		fb[h] = h * (S - S / 2);
		for (int i = 0; i < S; i++) {
			int64_t r0 = (int64_t)(test_rand(rng) % (uint64_t)(c->rows - len[i]));
			hs[h * S + i] = (struct backend_kv_span){ hk + (size_t)r0 * hd * es,
								  hv + (size_t)r0 * hd * es, len[i],
								  (int64_t)hd };
			ds[h * S + i] = (struct span_desc){ (char *)dk + (size_t)r0 * hd * es,
							    (char *)dv + (size_t)r0 * hd * es,
							    len[i], (long long)hd };
		}
		memcpy(ds2 + fa[h], ds + h * S, (size_t)(S / 2) * sizeof *ds2);
		memcpy(ds2 + (size_t)c->n_kv * (S / 2) + fb[h], ds + h * S + S / 2,
		       (size_t)(S - S / 2) * sizeof *ds2);
	}
	first[c->n_kv] = f32[c->n_kv] = c->n_kv * S;
	fa[c->n_kv] = c->n_kv * (S / 2);
	fb[c->n_kv] = c->n_kv * (S - S / 2);
	const struct backend_attn a = { c->n_q, c->n_kv, c->d, dt, 1.0f / sqrtf((float)c->d), 0 };
	float *ref = malloc((size_t)c->n_q * n * 4), *got = malloc((size_t)c->n_q * n * 4);
	assert_int_equal(cpu->ops->attn_scores(cpu->ctx, ref, n, q, hs, first, &a), 0);
	float *dq = gpu_test_put(q, (size_t)c->n_q * c->d * 4);
	float *dsc = gpu_test_poisoned((size_t)c->n_q * n * 4);
	void *dspans = gpu_test_put(ds, (size_t)c->n_kv * S * sizeof *ds);
	void *dfirst = gpu_test_put(f32, (size_t)(c->n_kv + 1) * 4);
	CU(attn_scores(dsc, n, dq, dspans, dfirst, n, dt, c->n_q, c->n_kv, c->d, a.scale, 0));
	gpu_test_get(got, dsc, (size_t)c->n_q * n * 4);
	char what[96];
	snprintf(what, sizeof what, "attn_scores %s %s", c->name, dtype_name(dt));
	GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, (size_t)c->n_q * n), 2e-6, what);
	/* Probabilities from the CPU, on both sides; the sum in two chained calls. */
	assert_int_equal(cpu->ops->softmax(cpu->ctx, ref, c->n_q, n), 0);
	float *o_ref = malloc((size_t)c->n_q * c->d * 4), *o_got = malloc((size_t)c->n_q * c->d * 4);
	assert_int_equal(cpu->ops->attn_decode_heads(cpu->ctx, o_ref, q, hs, first, &a), 0);
	float *dp = gpu_test_put(ref, (size_t)c->n_q * n * 4);
	float *dout = gpu_test_poisoned((size_t)c->n_q * c->d * 4);
	void *dsa = gpu_test_put(ds2, (size_t)c->n_kv * (S / 2) * sizeof *ds2);
	void *dsb = gpu_test_put(ds2 + (size_t)c->n_kv * (S / 2),
				 (size_t)c->n_kv * (S - S / 2) * sizeof *ds2);
	void *dfa = gpu_test_put(fa, (size_t)(c->n_kv + 1) * 4);
	void *dfb = gpu_test_put(fb, (size_t)(c->n_kv + 1) * 4);
	CU(attn_accum(dout, dp, n, dsa, dfa, 0, dt, c->n_q, c->n_kv, c->d, 0));
	CU(attn_accum(dout, dp + n0, n, dsb, dfb, 1, dt, c->n_q, c->n_kv, c->d, 0));
	gpu_test_get(o_got, dout, (size_t)c->n_q * c->d * 4);
	snprintf(what, sizeof what, "attn_accum %s %s", c->name, dtype_name(dt));
	GPU_TEST_CHECK_ERR(gpu_test_err(o_got, o_ref, (size_t)c->n_q * c->d), 2e-5, what);
	cudaFree(dq);
	cudaFree(dsc);
	cudaFree(dspans);
	cudaFree(dfirst);
	cudaFree(dp);
	cudaFree(dout);
	cudaFree(dsa);
	cudaFree(dsb);
	cudaFree(dfa);
	cudaFree(dfb);
	cudaFree(dk);
	cudaFree(dv);
	free(kf);
	free(vf);
	free(q);
	free(hk);
	free(hv);
	free(hs);
	free(ds);
	free(ds2);
	free(first);
	free(f32);
	free(fa);
	free(fb);
	free(ref);
	free(got);
	free(o_ref);
	free(o_got);
}

static void test_scores_and_accum(void **state)
{
	(void)state;
	if (gpu_test_no_device())
		skip();
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 0), 0);
	static const struct sc_case cases[] = {
		{ "llama-3.1-8b heads", 32, 8, 128, 4096, 40 },
		{ "small", 8, 4, 8, 300, 7 },
	};
	uint64_t rng = 17;
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
		for (int t = 0; t < GPU_TEST_N_DTYPES; t++)
			check_case(cpu, &cases[i], gpu_test_dtypes[t], &rng);
	backend_free(cpu);
}

static void test_gather_heads(void **state)
{
	(void)state;
	if (gpu_test_no_device())
		skip();
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 0), 0);
	enum { ROWS = 64, KV = 8, D = 128, N = 100 };
	uint64_t rng = 5;
	float *src = malloc(ROWS * KV * D * 4), *want = malloc(ROWS * KV * D * 4);
	float *got = malloc(ROWS * KV * D * 4);
	gpu_test_fill(src, ROWS * KV * D, 1.0f, &rng);
	int32_t map[3 * N];
	bool taken[ROWS][KV] = { { false } };
	for (int i = 0; i < N; i++) {
		int r, h;
		do {
			r = (int)(test_rand(&rng) % ROWS);
			h = (int)(test_rand(&rng) % KV);
		} while (taken[r][h]);
		taken[r][h] = true;
		map[3 * i] = r;
		map[3 * i + 1] = (int32_t)(test_rand(&rng) % ROWS);
		map[3 * i + 2] = h;
	}
	for (int i = 0; i < ROWS * KV * D; i++)
		want[i] = -7.0f;
	assert_int_equal(cpu->ops->gather_heads(cpu->ctx, want, src, map, N, KV, D), 0);
	for (int i = 0; i < ROWS * KV * D; i++)
		got[i] = -7.0f;
	float *dsrc = gpu_test_put(src, ROWS * KV * D * 4), *ddst = gpu_test_put(got, ROWS * KV * D * 4);
	int32_t *dmap = gpu_test_put(map, sizeof map);
	CU(gather_heads(ddst, dsrc, dmap, N, KV, D, 0));
	gpu_test_get(got, ddst, ROWS * KV * D * 4);
	assert_memory_equal(got, want, ROWS * KV * D * 4);
	cudaFree(ddst);
	cudaFree(dsrc);
	cudaFree(dmap);
	free(src);
	free(want);
	free(got);
	backend_free(cpu);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scores_and_accum),
		cmocka_unit_test(test_gather_heads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
