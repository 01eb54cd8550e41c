/* Tests kernels/rmsnorm.cu against a CPU twin on random inputs (output poisoned first): the f32
 * launcher against a double-precision reference, rmsnorm_rows with f16/bf16 weights (and in
 * place) against the CPU backend's rmsnorm; bound 1e-6 (f32 arithmetic, different order).
 * Also checks that cuBLAS links and initialises. Skips (exit 77) without a CUDA device. */
#include "gpu_test.h"

#include <cublas_v2.h>

#include "backend.h"
#include "rmsnorm.cuh"

static void rmsnorm_ref(float *y, const float *x, const float *w, int rows, int n, float eps)
{
	for (int r = 0; r < rows; r++) {
		double ss = 0;
		for (int i = 0; i < n; i++)
			ss += (double)x[r * n + i] * x[r * n + i];
		double scale = 1.0 / sqrt(ss / n + eps);
		for (int i = 0; i < n; i++)
			y[r * n + i] = (float)(x[r * n + i] * scale * w[i]);
	}
}

static void test_rmsnorm_matches_cpu(void **state)
{
	(void)state;
	const int shapes[][2] = {{1, 64}, {3, 4096}, {7, 100}, {2, 5120}};
	uint64_t rng = 1234;
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int rows = shapes[s][0], n = shapes[s][1];
		size_t bytes = (size_t)rows * n * sizeof(float);
		float *x = malloc(bytes), *y = malloc(bytes), *ref = malloc(bytes), *w = malloc(n * 4);
		gpu_test_fill(x, (size_t)rows * n, 3.0f, &rng);
		gpu_test_fill(w, n, 1.0f, &rng);
		rmsnorm_ref(ref, x, w, rows, n, 1e-5f);
		float *dx = gpu_test_put(x, bytes), *dw = gpu_test_put(w, n * 4);
		float *dy = gpu_test_poisoned(bytes);
		CU(rmsnorm_f32(dy, dx, dw, rows, n, 1e-5f, 0));
		gpu_test_get(y, dy, bytes);
		GPU_TEST_CHECK_ERR(gpu_test_err(y, ref, (size_t)rows * n), 1e-6, "rmsnorm_f32");
		cudaFree(dx);
		cudaFree(dy);
		cudaFree(dw);
		free(x);
		free(y);
		free(ref);
		free(w);
	}
}

static void test_rmsnorm_weight_dtypes(void **state)
{
	(void)state;
	const int rows = 5, n = 2048;
	const size_t bytes = (size_t)rows * n * 4;
	uint64_t rng = 99;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 1), 0);
	float *x = malloc(bytes), *y = malloc(bytes), *ref = malloc(bytes), *w = malloc(n * 4);
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++) {
		enum fkv_dtype dt = gpu_test_dtypes[t];
		gpu_test_fill(x, (size_t)rows * n, 4.0f, &rng);
		gpu_test_fill(w, n, 1.5f, &rng);
		void *hw = gpu_test_to_dtype(w, dt, n);
		struct backend_mat m = { .data = hw, .dtype = dt, .rows = n, .cols = 1 };
		assert_int_equal(cpu->ops->rmsnorm(cpu->ctx, ref, x, &m, rows, n, 1e-6f), 0);
		float *dx = gpu_test_put(x, bytes);
		void *dw = gpu_test_put(hw, n * dtype_size(dt));
		float *dy = gpu_test_poisoned(bytes);
		CU(rmsnorm_rows(dy, dx, dw, dt, rows, n, 1e-6f, 0));
		gpu_test_get(y, dy, bytes);
		GPU_TEST_CHECK_ERR(gpu_test_err(y, ref, (size_t)rows * n), 1e-6, dtype_name(dt));
		CU(rmsnorm_rows(dx, dx, dw, dt, rows, n, 1e-6f, 0)); /* in place */
		gpu_test_get(y, dx, bytes);
		GPU_TEST_CHECK_ERR(gpu_test_err(y, ref, (size_t)rows * n), 1e-6, "in place");
		cudaFree(dx);
		cudaFree(dw);
		cudaFree(dy);
		free(hw);
	}
	free(x);
	free(y);
	free(ref);
	free(w);
	backend_free(cpu);
}

static void test_cublas_links(void **state)
{
	(void)state;
	cublasHandle_t h;
	assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
	int version = 0;
	assert_int_equal(cublasGetVersion(h, &version), CUBLAS_STATUS_SUCCESS);
	assert_true(version > 0);
	cublasDestroy(h);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rmsnorm_matches_cpu),
		cmocka_unit_test(test_rmsnorm_weight_dtypes),
		cmocka_unit_test(test_cublas_links),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
