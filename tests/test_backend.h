/* Shared by the tests that run kernels or the engine on the CPU backend (test_backend_cpu.c,
 * test_engine.c): one 2-thread CPU backend per test group, made by the cmocka group setup and
 * freed by its teardown, and the normalised error against a double-precision reference.
 * Header-only; include after test_util.h. */
#ifndef FREEKV_TEST_BACKEND_H
#define FREEKV_TEST_BACKEND_H

#include <math.h>

#include "backend.h"

static struct backend *be;

static int setup(void **state)
{
	(void)state;
	return backend_cpu_new(&be, 2);
}

static int teardown(void **state)
{
	(void)state;
	backend_free(be);
	return 0;
}

/* max |got - want| / max |want|: the normalised error. A NaN in got fails the test. */
static double nerr(const float *got, const double *want, int64_t n)
{
	double e = 0.0, m = 1e-12;
	for (int64_t i = 0; i < n; i++) {
		assert_false(isnan(got[i]));
		e = fmax(e, fabs(got[i] - want[i]));
		m = fmax(m, fabs(want[i]));
	}
	return e / m;
}

#endif
