/* Tests kernels/prefill_attention.cu against the CPU backend's attn_prefill: GQA and MHA,
 * head dims 8 to 256 (256 needs the opt-in shared-memory limit), a whole prompt and a chunk
 * (the last n_q of n_ctx positions), a single query, sliding windows (shorter and longer than
 * the prompt), every KV dtype; bound 2e-5 (f32 in a different order). The tensor-core kernel
 * (prefill_attention_mma.cu) on every case it takes (16-bit K/V, d a multiple of 16), against
 * the same reference: bound 3e-3 for f16 and 2e-2 for bf16 (it rounds Q and the probabilities
 * to the K/V type). Then a 32K-token prompt in one launch of each, checked at its first, a
 * middle and its last 16 query rows against the CPU on just those rows; bound 1e-4 there for
 * the CUDA-core tiles (sums over up to 32K keys), 2e-2 for the tensor cores. */
#include "gpu_test.h"

#include "backend.h"
#include "prefill_attention.cuh"
#include "prefill_attention_mma.cuh"

struct pf_case {
	int n_heads, n_kv, d, n_ctx, n_q, window;
};

static void check_case(struct backend *cpu, const struct pf_case *c, enum fkv_dtype dt,
		       uint64_t *rng)
{
	const size_t q_elems = (size_t)c->n_q * c->n_heads * c->d;
	const size_t kv_elems = (size_t)c->n_ctx * c->n_kv * c->d, es = dtype_size(dt);
	float *q = malloc(q_elems * 4), *k = malloc(kv_elems * 4), *v = malloc(kv_elems * 4);
	float *ref = malloc(q_elems * 4), *got = malloc(q_elems * 4);
	gpu_test_fill(q, q_elems, 2.0f, rng);
	gpu_test_fill(k, kv_elems, 2.0f, rng);
	gpu_test_fill(v, kv_elems, 2.0f, rng);
	void *hk = gpu_test_to_dtype(k, dt, kv_elems), *hv = gpu_test_to_dtype(v, dt, kv_elems);
	const struct backend_attn a = { .n_heads = c->n_heads, .n_kv_heads = c->n_kv,
					.head_dim = c->d, .kv_dtype = dt,
					.scale = 1.0f / sqrtf((float)c->d), .window = c->window };
	assert_int_equal(cpu->ops->attn_prefill(cpu->ctx, ref, q, c->n_q, hk, hv, c->n_ctx, &a), 0);
	float *dq = gpu_test_put(q, q_elems * 4), *dout = gpu_test_poisoned(q_elems * 4);
	void *dk = gpu_test_put(hk, kv_elems * es), *dv = gpu_test_put(hv, kv_elems * es);
	CU(prefill_attention(dout, dq, dk, dv, dt, c->n_q, c->n_ctx, c->n_heads, c->n_kv, c->d,
			     a.scale, c->window, 0));
	gpu_test_get(got, dout, q_elems * 4);
	char what[96];
	snprintf(what, sizeof what, "heads %d/%d d %d ctx %d q %d window %d %s", c->n_heads,
		 c->n_kv, c->d, c->n_ctx, c->n_q, c->window, dtype_name(dt));
	GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, q_elems), 2e-5, what);
	if (prefill_attention_mma_takes(dt, c->d)) {
		float *dm = gpu_test_poisoned(q_elems * 4);
		CU(prefill_attention_mma(dm, dq, dk, dv, dt, c->n_q, c->n_ctx, c->n_heads, c->n_kv,
					 c->d, a.scale, c->window, 0));
		gpu_test_get(got, dm, q_elems * 4);
		char mwhat[112];
		snprintf(mwhat, sizeof mwhat, "mma %s", what);
		GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, q_elems), dt == FKV_F16 ? 3e-3 : 2e-2,
				   mwhat);
		cudaFree(dm);
	}
	cudaFree(dq);
	cudaFree(dout);
	cudaFree(dk);
	cudaFree(dv);
	free(q);
	free(k);
	free(v);
	free(ref);
	free(got);
	free(hk);
	free(hv);
}

static void test_prefill_matches_cpu(void **state)
{
	(void)state;
	const struct pf_case cases[] = {
		{ 8, 2, 64, 300, 300, 0 },  { 8, 2, 64, 300, 45, 0 },	 { 4, 4, 128, 100, 100, 0 },
		{ 8, 4, 8, 50, 50, 0 },	    { 4, 2, 256, 40, 40, 0 },	 { 32, 8, 128, 77, 1, 0 },
		{ 8, 2, 64, 300, 300, 37 }, { 8, 2, 64, 300, 45, 64 }, { 4, 2, 32, 50, 50, 500 },
	};
	uint64_t rng = 91;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 0), 0);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		for (int t = 0; t < GPU_TEST_N_DTYPES; t++)
			check_case(cpu, &cases[i], gpu_test_dtypes[t], &rng);
	backend_free(cpu);
}

static void test_prefill_32k_prompt(void **state)
{
	(void)state;
	const int H = 8, KV = 2, d = 128, L = gpu_test_quick() ? 2048 : 32768, R = 16;
	const size_t q_elems = (size_t)L * H * d, kv_elems = (size_t)L * KV * d;
	uint64_t rng = 93;
	float *q = malloc(q_elems * 4), *k = malloc(kv_elems * 4), *v = malloc(kv_elems * 4);
	float *got = malloc(q_elems * 4), *ref = malloc((size_t)R * H * d * 4);
	gpu_test_fill(q, q_elems, 6.0f, &rng); /* peaked attention, not a flat mean */
	gpu_test_fill(k, kv_elems, 1.0f, &rng);
	gpu_test_fill(v, kv_elems, 1.0f, &rng);
	void *hk = gpu_test_to_dtype(k, FKV_BF16, kv_elems);
	void *hv = gpu_test_to_dtype(v, FKV_BF16, kv_elems);
	const struct backend_attn a = { .n_heads = H, .n_kv_heads = KV, .head_dim = d,
					.kv_dtype = FKV_BF16, .scale = 1.0f / sqrtf((float)d) };
	float *dq = gpu_test_put(q, q_elems * 4), *dout = gpu_test_poisoned(q_elems * 4);
	void *dk = gpu_test_put(hk, kv_elems * 2), *dv = gpu_test_put(hv, kv_elems * 2);
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 0), 0);
	for (int mma = 0; mma < 2; mma++) {
		if (mma && !prefill_attention_mma_takes(FKV_BF16, d))
			break;
		CU(mma ? prefill_attention_mma(dout, dq, dk, dv, FKV_BF16, L, L, H, KV, d, a.scale,
					       0, 0)
		       : prefill_attention(dout, dq, dk, dv, FKV_BF16, L, L, H, KV, d, a.scale, 0,
					   0));
		gpu_test_get(got, dout, q_elems * 4);
		const int firsts[3] = { 0, L / 8 * 5, L - R }; /* 20480 of 32K */
		for (int i = 0; i < 3; i++) {
			/* rows [f, f + R) of the prompt: the last R queries of an f + R context */
			const int f = firsts[i];
			const size_t off = (size_t)f * H * d;
			assert_int_equal(cpu->ops->attn_prefill(cpu->ctx, ref, q + off, R, hk, hv,
								f + R, &a),
					 0);
			GPU_TEST_CHECK_ERR(gpu_test_err(got + off, ref, (size_t)R * H * d),
					   mma ? 2e-2 : 1e-4,
					   mma ? "32K prompt rows (mma)" : "32K prompt rows");
		}
		for (size_t i = 0; i < q_elems; i++) /* every row written */
			assert_false(isnan(got[i]));
		CU(cudaMemset(dout, 0xff, q_elems * 4)); /* poisoned again (NaN) */
	}
	backend_free(cpu);
	cudaFree(dq);
	cudaFree(dout);
	cudaFree(dk);
	cudaFree(dv);
	free(q);
	free(k);
	free(v);
	free(got);
	free(ref);
	free(hk);
	free(hv);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prefill_matches_cpu),
		cmocka_unit_test(test_prefill_32k_prompt),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
