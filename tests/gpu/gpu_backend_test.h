/* Shared by the tests that compare the CUDA backend with the CPU backend, the reference
 * (test_backend_cuda.c, test_backend_cuda_slots.c): the two backends, made by the cmocka group
 * setup and freed by its teardown, and buffer helpers that put the same host data on either.
 * Buffers from put()/poisoned() are the test's to drop(); rand_f32() results the test's to
 * free(). The includer defines `static uint64_t rng = SEED;` after including (this header's
 * declaration of it is tentative). Header-only; include after gpu_test.h. */
#ifndef FREEKV_GPU_BACKEND_TEST_H
#define FREEKV_GPU_BACKEND_TEST_H

#include "backend.h"

static struct backend *cpu, *gpu;
static uint64_t rng;

static void *put(struct backend *be, const void *host, size_t bytes)
{
	void *p = be->ops->buf_alloc(be->ctx, bytes);
	assert_non_null(p);
	assert_int_equal(be->ops->upload(be->ctx, p, host, bytes), 0);
	return p;
}

/* A backend buffer of bytes filled with 0xff (NaN for every float type). */
static void *poisoned(struct backend *be, size_t bytes)
{
	void *h = malloc(bytes);
	assert_non_null(h);
	memset(h, 0xff, bytes);
	void *p = put(be, h, bytes);
	free(h);
	return p;
}

static void get(struct backend *be, void *host, const void *buf, size_t bytes)
{
	assert_int_equal(be->ops->download(be->ctx, host, buf, bytes), 0);
}

static void drop(struct backend *be, void *buf)
{
	be->ops->buf_free(be->ctx, buf);
}

static float *rand_f32(size_t n, float scale)
{
	float *x = malloc(n * sizeof *x);
	assert_non_null(x);
	gpu_test_fill(x, n, scale, &rng);
	return x;
}

static int setup(void **state)
{
	(void)state;
	if (backend_cpu_new(&cpu, 2))
		return -1;
	return backend_cuda_new(&gpu, 0);
}

static int teardown(void **state)
{
	(void)state;
	backend_free(cpu);
	backend_free(gpu);
	return 0;
}

#endif
