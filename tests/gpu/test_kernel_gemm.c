/* Tests kernels/gemm.cu (cuBLAS) for f32, f16 and bf16 weights, 1 to 33 activation rows:
 * - against the CPU backend's matmul on the same f32 activations: the contract, bounds f32 1e-5
 *   (no TF32), f16 1e-3 and bf16 5e-3: the activations are rounded to the weight dtype first,
 *   whose rms relative error (about 2e-4 for f16, 1.6e-3 for bf16) carries into the product;
 * - against the CPU backend on activations pre-rounded to the weight dtype: the same products
 *   with f32 accumulation, bound 1e-5 for every dtype;
 * - a short workspace is refused with -EINVAL. */
#include "gpu_test.h"

#include <errno.h>

#include <cublas_v2.h>

#include "backend.h"
#include "gemm.cuh"

static void test_gemm_matches_cpu(void **state)
{
	(void)state;
	const int rows = 1000, cols = 768, ns[] = { 1, 7, 33 };
	const double contract[] = { 1e-5, 1e-3, 5e-3 };
	uint64_t rng = 101;
	cublasHandle_t h;
	assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
	cudaStream_t stream;
	CU(cudaStreamCreate(&stream));
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 0), 0);
	float *w = malloc((size_t)rows * cols * 4), *x = malloc((size_t)33 * cols * 4);
	float *xr = malloc((size_t)33 * cols * 4);
	float *ref = malloc((size_t)33 * rows * 4), *got = malloc((size_t)33 * rows * 4);
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++) {
		enum fkv_dtype dt = gpu_test_dtypes[t];
		gpu_test_fill(w, (size_t)rows * cols, 0.1f, &rng);
		void *hw = gpu_test_to_dtype(w, dt, (size_t)rows * cols);
		struct backend_mat m = { .data = hw, .dtype = dt, .rows = rows, .cols = cols };
		void *dw = gpu_test_put(hw, (size_t)rows * cols * dtype_size(dt));
		for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
			const int n = ns[s];
			gpu_test_fill(x, (size_t)n * cols, 2.0f, &rng);
			float *dx = gpu_test_put(x, (size_t)n * cols * 4);
			float *dy = gpu_test_poisoned((size_t)n * rows * 4);
			size_t ws = gemm_workspace_bytes(dt, n, cols);
			void *dws = ws ? gpu_test_poisoned(ws) : NULL;
			if (ws)
				assert_int_equal(gemm_xwt(h, dy, dx, dw, dt, n, rows, cols, dws, ws - 1,
							  stream),
						 -EINVAL);
			assert_int_equal(gemm_xwt(h, dy, dx, dw, dt, n, rows, cols, dws, ws, stream),
					 0);
			gpu_test_get(got, dy, (size_t)n * rows * 4);
			assert_int_equal(cpu->ops->matmul(cpu->ctx, ref, x, &m, n), 0);
			GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, (size_t)n * rows), contract[t],
					   dtype_name(dt));
			memcpy(xr, x, (size_t)n * cols * 4);
			if (dt != FKV_F32)
				gpu_test_round(xr, dt, (size_t)n * cols);
			assert_int_equal(cpu->ops->matmul(cpu->ctx, ref, xr, &m, n), 0);
			GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, (size_t)n * rows), 1e-5,
					   "pre-rounded activations");
			cudaFree(dx);
			cudaFree(dy);
			cudaFree(dws);
		}
		cudaFree(dw);
		free(hw);
	}
	free(w);
	free(x);
	free(xr);
	free(ref);
	free(got);
	backend_free(cpu);
	cudaStreamDestroy(stream);
	cublasDestroy(h);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gemm_matches_cpu),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
