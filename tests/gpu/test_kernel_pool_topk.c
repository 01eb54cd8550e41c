/* Tests kernels/pool_topk.cu against refresh_topk() (worker/kvcache/refresh_select.c):
 * group max, max-pool kernel 7 and top-B with ties to the lower position are exact in f32, so
 * positions and pooled scores must be equal bit for bit — on softmax rows of random scores
 * (Llama-3.1-8B heads, T 20000, B 2048), on rows of few distinct values (ties everywhere, every
 * B from 1 to T on a short row), and on a row shorter than the pooling window. */
#include "gpu_test.h"

#include "refresh_select.h"
#include "pool_topk.cuh"

static void check(const float *probs, int n_q, int n_kv, int T, int B, const char *what)
{
	int32_t *pos = malloc((size_t)n_kv * B * 4), *gpos = malloc((size_t)n_kv * B * 4);
	float *uv = malloc((size_t)n_kv * B * 4), *guv = malloc((size_t)n_kv * B * 4);
	float *scr = malloc(refresh_scratch_floats(T) * 4);
	refresh_topk(probs, T, n_q, n_kv, T, B, pos, uv, scr);
	float *dp = gpu_test_put(probs, (size_t)n_q * T * 4);
	float *du = gpu_test_poisoned((size_t)n_kv * T * 4);
	int32_t *dpos = gpu_test_poisoned((size_t)n_kv * B * 4);
	float *duv = gpu_test_poisoned((size_t)n_kv * B * 4);
	CU(pool_topk(dpos, duv, du, dp, T, n_q, n_kv, T, B, 0));
	gpu_test_get(gpos, dpos, (size_t)n_kv * B * 4);
	gpu_test_get(guv, duv, (size_t)n_kv * B * 4);
	if (memcmp(pos, gpos, (size_t)n_kv * B * 4) || memcmp(uv, guv, (size_t)n_kv * B * 4))
		fail_msg("%s: T %d B %d: positions or scores differ from refresh_topk()", what, T, B);
	cudaFree(dp);
	cudaFree(du);
	cudaFree(dpos);
	cudaFree(duv);
	free(pos);
	free(gpos);
	free(uv);
	free(guv);
	free(scr);
}

/* Row-wise softmax of random scores: what a full step pools. */
static void softmax_rows(float *x, int rows, int T)
{
	for (int r = 0; r < rows; r++) {
		float *row = x + (size_t)r * T, mx = -INFINITY;
		double sum = 0.0;
		for (int j = 0; j < T; j++)
			mx = row[j] > mx ? row[j] : mx;
		for (int j = 0; j < T; j++)
			sum += row[j] = expf(row[j] - mx);
		for (int j = 0; j < T; j++)
			row[j] = (float)(row[j] / sum);
	}
}

static void test_softmax_rows(void **state)
{
	(void)state;
	if (gpu_test_no_device())
		skip();
	enum { NQ = 32, KV = 8, T = 20000 };
	uint64_t rng = 29;
	float *p = malloc((size_t)NQ * T * 4);
	gpu_test_fill(p, (size_t)NQ * T, 8.0f, &rng);
	softmax_rows(p, NQ, T);
	check(p, NQ, KV, T, 2048, "softmax rows");
	check(p, NQ, KV, T, 1, "softmax rows");
	free(p);
}

static void test_ties(void **state)
{
	(void)state;
	if (gpu_test_no_device())
		skip();
	enum { NQ = 6, KV = 2, T = 300 };
	uint64_t rng = 31;
	float *p = malloc((size_t)NQ * T * 4);
	for (int trial = 0; trial < 3; trial++) {
		for (int i = 0; i < NQ * T; i++)
			p[i] = (float)(test_rand(&rng) % (trial ? 5 : 2)) / 8.0f;
		for (int B = 1; B <= T; B += trial ? 37 : 1)
			check(p, NQ, KV, T, B, "few values");
	}
	check(p, NQ, KV, 5, 3, "row shorter than the window");
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_softmax_rows),
		cmocka_unit_test(test_ties),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
