/* Tests kernels/rmsnorm.cu against a CPU twin on random inputs (output poisoned first), and
 * that cuBLAS links and initialises. Skips (exit 77) on a machine without a CUDA device. */
#include "test_util.h"

#include <math.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

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
		for (int i = 0; i < rows * n; i++)
			x[i] = test_randf(&rng) * 3.0f;
		for (int i = 0; i < n; i++)
			w[i] = test_randf(&rng);
		rmsnorm_ref(ref, x, w, rows, n, 1e-5f);
		float *dx, *dy, *dw;
		assert_int_equal(cudaMalloc((void **)&dx, bytes), cudaSuccess);
		assert_int_equal(cudaMalloc((void **)&dy, bytes), cudaSuccess);
		assert_int_equal(cudaMalloc((void **)&dw, n * 4), cudaSuccess);
		assert_int_equal(cudaMemset(dy, 0xff, bytes), cudaSuccess); /* poison: NaN */
		cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice);
		cudaMemcpy(dw, w, n * 4, cudaMemcpyHostToDevice);
		assert_int_equal(rmsnorm_f32(dy, dx, dw, rows, n, 1e-5f, 0), cudaSuccess);
		assert_int_equal(cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
		double num = 0, den = 0;
		for (int i = 0; i < rows * n; i++) {
			assert_false(isnan(y[i]));
			num += (double)(y[i] - ref[i]) * (y[i] - ref[i]);
			den += (double)ref[i] * ref[i];
		}
		assert_true(sqrt(num / den) < 1e-6);
		cudaFree(dx);
		cudaFree(dy);
		cudaFree(dw);
		free(x);
		free(y);
		free(ref);
		free(w);
	}
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
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		fprintf(stderr, "skip: no CUDA device\n");
		return TEST_SKIP_EXIT;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rmsnorm_matches_cpu),
		cmocka_unit_test(test_cublas_links),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
