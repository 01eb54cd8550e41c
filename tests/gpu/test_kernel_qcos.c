/* Tests kernels/qcos.cu against select_group_cosine() (worker/backend/select.c) per sequence of a batch:
 * random drifts of q_{t-1}, plus the zero-vector rules (cos(0, 0) = 1, cos(0, x) = 0). Both sides
 * accumulate in double; bound 1e-6 absolute per KV head. */
#include "gpu_test.h"

#include "qcos.cuh"
#include "select.h"

static void test_qcos_matches_select(void **state)
{
	(void)state;
	const int batch = 3, n_q = 32, n_kv = 8, d = 128;
	const struct select_geom g = { n_q, n_kv, d, 32, 512, 512, 2048 };
	const size_t per = (size_t)n_q * d;
	uint64_t rng = 61;
	float *qt = malloc(batch * per * 4), *qp = malloc(batch * per * 4);
	gpu_test_fill(qt, batch * per, 2.0f, &rng);
	for (size_t i = 0; i < batch * per; i++) /* drift grows with the KV head (G * d apart) */
		qp[i] = qt[i] + test_randf(&rng) * (float)((i % per) / (d * 4) + 1) * 0.3f;
	/* sequence 1, KV head 0: its whole group zero at both steps; sequence 2, KV head 1: the
	 * group zero only at step t; sequence 0, query head 9 zero only at t-1 */
	memset(qt + per, 0, 4 * d * 4);
	memset(qp + per, 0, 4 * d * 4);
	memset(qt + 2 * per + 4 * d, 0, 4 * d * 4);
	memset(qp + 9 * d, 0, d * 4);
	float ref[3 * 8], got[3 * 8];
	for (int b = 0; b < batch; b++)
		select_group_cosine(&g, qt + b * per, qp + b * per, ref + b * n_kv);
	float *dqt = gpu_test_put(qt, batch * per * 4), *dqp = gpu_test_put(qp, batch * per * 4);
	float *dout = gpu_test_poisoned(sizeof got);
	CU(qcos_group(dout, dqt, dqp, batch, n_q, n_kv, d, 0));
	gpu_test_get(got, dout, sizeof got);
	for (int i = 0; i < batch * n_kv; i++)
		assert_true(fabsf(got[i] - ref[i]) <= 1e-6f);
	assert_true(ref[n_kv] == 1.0f && got[n_kv] == 1.0f);
	assert_true(ref[2 * n_kv + 1] == 0.0f && got[2 * n_kv + 1] == 0.0f);
	cudaFree(dqt);
	cudaFree(dqp);
	cudaFree(dout);
	free(qt);
	free(qp);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qcos_matches_select),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
