/* Tests kernels/silu_mul.cu against the CPU backend's silu_mul on random inputs (and in place);
 * bound 1e-6 (expf and the division may differ by an ulp or two). */
#include "gpu_test.h"

#include "backend.h"
#include "silu_mul.cuh"

static void test_silu_mul_matches_cpu(void **state)
{
	(void)state;
	const long long sizes[] = { 1, 31, 100003, 1 << 20 };
	uint64_t rng = 3;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 1), 0);
	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		const long long n = sizes[s];
		float *g = malloc(n * 4), *u = malloc(n * 4), *ref = malloc(n * 4), *got = malloc(n * 4);
		gpu_test_fill(g, n, 8.0f, &rng);
		gpu_test_fill(u, n, 2.0f, &rng);
		assert_int_equal(cpu->ops->silu_mul(cpu->ctx, ref, g, u, n), 0);
		float *dg = gpu_test_put(g, n * 4), *du = gpu_test_put(u, n * 4);
		float *dout = gpu_test_poisoned(n * 4);
		CU(silu_mul_f32(dout, dg, du, n, 0));
		gpu_test_get(got, dout, n * 4);
		GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, n), 1e-6, "silu_mul");
		CU(silu_mul_f32(dg, dg, du, n, 0)); /* out == gate */
		gpu_test_get(got, dg, n * 4);
		GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, n), 1e-6, "silu_mul in place");
		cudaFree(dg);
		cudaFree(du);
		cudaFree(dout);
		free(g);
		free(u);
		free(ref);
		free(got);
	}
	backend_free(cpu);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_silu_mul_matches_cpu),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
