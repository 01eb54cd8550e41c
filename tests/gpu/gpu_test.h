/* Shared helpers for the GPU kernel tests (tests/gpu/test_kernel_*.c): the skip rule, device
 * buffers (uploaded, or poisoned with 0xff bytes — NaN in every float type — so an element the
 * kernel forgets to write fails the comparison), random fills, dtype copies of host data and the
 * normalised error ||got - ref|| / ||ref||. Device buffers are the test's to cudaFree; host
 * buffers from gpu_test_to_dtype() are the test's to free(). */
#ifndef FREEKV_GPU_TEST_H
#define FREEKV_GPU_TEST_H

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "dtype.h"

#define CU(stmt) assert_int_equal((stmt), cudaSuccess)

static const enum fkv_dtype gpu_test_dtypes[] = { FKV_F32, FKV_F16, FKV_BF16 };
#define GPU_TEST_N_DTYPES 3

/* 1 when the tests must skip: no driver, no device. */
/* FREEKV_GPU_TEST_QUICK=1 (bench/gpu/run.sh sets it for the compute-sanitizer runs, which
 * slow kernels down a hundredfold): the tests' largest sizes shrink to ones that still cover
 * every tile and split path. */
static inline int gpu_test_quick(void)
{
	const char *v = getenv("FREEKV_GPU_TEST_QUICK");
	return v && *v && strcmp(v, "0") != 0;
}

static inline int gpu_test_no_device(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		fprintf(stderr, "skip: no CUDA device\n");
		return 1;
	}
	return 0;
}

static inline void *gpu_test_put(const void *host, size_t bytes)
{
	void *d = NULL;
	CU(cudaMalloc(&d, bytes ? bytes : 1));
	if (bytes)
		CU(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
	return d;
}

static inline void *gpu_test_poisoned(size_t bytes)
{
	void *d = NULL;
	CU(cudaMalloc(&d, bytes ? bytes : 1));
	CU(cudaMemset(d, 0xff, bytes));
	return d;
}

/* Waits for the device, then copies back (so a kernel fault is reported here). */
static inline void gpu_test_get(void *host, const void *dev, size_t bytes)
{
	CU(cudaDeviceSynchronize());
	CU(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

static inline void gpu_test_fill(float *x, size_t n, float scale, uint64_t *rng)
{
	for (size_t i = 0; i < n; i++)
		x[i] = test_randf(rng) * scale;
}

/* A malloc'd copy of src (n f32) in dtype dt. */
static inline void *gpu_test_to_dtype(const float *src, enum fkv_dtype dt, size_t n)
{
	void *p = malloc(n * dtype_size(dt) + 1);
	assert_non_null(p);
	dtype_from_f32(p, src, dt, n);
	return p;
}

/* Rounds x (n f32) in place to the values dtype dt can hold. */
static inline void gpu_test_round(float *x, enum fkv_dtype dt, size_t n)
{
	void *p = gpu_test_to_dtype(x, dt, n);
	dtype_to_f32(x, p, dt, n);
	free(p);
}

/* ||got - ref|| / ||ref||, or INFINITY when got holds a NaN or Inf (an unwritten element). */
static inline double gpu_test_err(const float *got, const float *ref, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i]))
			return INFINITY;
		num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
		den += (double)ref[i] * ref[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Fails the test with the figures when err exceeds bound. */
#define GPU_TEST_CHECK_ERR(err, bound, what)                                                  \
	do {                                                                                  \
		double e_ = (err);                                                            \
		if (!(e_ <= (bound)))                                                         \
			fail_msg("%s: normalised error %.3g exceeds %.3g", (what), e_,       \
				 (double)(bound));                                            \
	} while (0)

#endif
