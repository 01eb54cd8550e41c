/* Tests kernels/rope.cu against the CPU backend's rope op: both pairings, with and without
 * llama3 scaling, head dims 8/64/128, arbitrary per-token positions up to 2^17. Bound 1e-6:
 * both sides compute the angle in double and rotate in f32. */
#include "gpu_test.h"

#include "backend.h"
#include "rope.cuh"

struct rope_case {
	const char *name;
	int n, heads, d;
	struct rope_cfg cfg;
};

static void test_rope_matches_cpu(void **state)
{
	(void)state;
	const struct rope_case cases[] = {
		{ "interleaved", 33, 5, 64, { ROPE_PAIR_INTERLEAVED, 10000.0f, 0, 0, 0, 0 } },
		{ "halves", 17, 8, 128, { ROPE_PAIR_HALVES, 10000.0f, 0, 0, 0, 0 } },
		{ "halves llama3", 40, 4, 128,
		  { ROPE_PAIR_HALVES, 500000.0f, 8.0f, 1.0f, 4.0f, 8192 } },
		{ "interleaved llama3", 9, 3, 64,
		  { ROPE_PAIR_INTERLEAVED, 500000.0f, 8.0f, 1.0f, 4.0f, 8192 } },
		{ "tiny head", 12, 8, 8, { ROPE_PAIR_INTERLEAVED, 10000.0f, 0, 0, 0, 0 } },
	};
	uint64_t rng = 4242;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 1), 0);
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		const struct rope_case *rc = &cases[c];
		const size_t m = (size_t)rc->n * rc->heads * rc->d;
		float *x = malloc(m * 4), *ref = malloc(m * 4), *got = malloc(m * 4);
		int32_t *pos = malloc(rc->n * 4);
		gpu_test_fill(x, m, 2.0f, &rng);
		for (int i = 0; i < rc->n; i++)
			pos[i] = (int32_t)(test_rand(&rng) % 131072);
		pos[0] = 0;
		memcpy(ref, x, m * 4);
		struct backend_rope r = {
			.style = rc->cfg.pairing == ROPE_PAIR_HALVES ? FKV_ROPE_HALVES
								       : FKV_ROPE_INTERLEAVED,
			.theta = rc->cfg.theta,
			.scaling_factor = rc->cfg.scaling_factor,
			.low_freq_factor = rc->cfg.low_freq_factor,
			.high_freq_factor = rc->cfg.high_freq_factor,
			.original_ctx = rc->cfg.original_ctx,
		};
		assert_int_equal(cpu->ops->rope(cpu->ctx, ref, rc->n, rc->heads, rc->d, pos, &r), 0);
		float *dx = gpu_test_put(x, m * 4);
		int32_t *dpos = gpu_test_put(pos, rc->n * 4);
		CU(rope_f32(dx, dpos, rc->n, rc->heads, rc->d, rc->cfg, 0));
		gpu_test_get(got, dx, m * 4);
		GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, m), 1e-6, rc->name);
		/* position 0 is the identity */
		for (int i = 0; i < rc->heads * rc->d; i++)
			assert_true(got[i] == x[i]);
		cudaFree(dx);
		cudaFree(dpos);
		free(x);
		free(ref);
		free(got);
		free(pos);
	}
	backend_free(cpu);
}

static void test_rope_rejects_bad_geometry(void **state)
{
	(void)state;
	struct rope_cfg cfg = { ROPE_PAIR_HALVES, 10000.0f, 0, 0, 0, 0 };
	assert_int_equal(rope_f32(NULL, NULL, 1, 1, 7, cfg, 0), cudaErrorInvalidValue);
	cfg.scaling_factor = 8.0f; /* scaling without its band */
	assert_int_equal(rope_f32(NULL, NULL, 1, 1, 8, cfg, 0), cudaErrorInvalidValue);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rope_matches_cpu),
		cmocka_unit_test(test_rope_rejects_bad_geometry),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
