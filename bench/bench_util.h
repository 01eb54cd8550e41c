/* Helpers the benchmarks share: the monotonic clock in seconds, sizes with a k/M/G suffix on
 * the command line, and the median-with-spread summary every report gives over its passes.
 * Header-only; used by bench_pool.c, bench_tier.c, bench_journal.c and bench_fsync.c. */
#ifndef FREEKV_BENCH_UTIL_H
#define FREEKV_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A byte count with an optional k/K, m/M or g/G suffix (powers of 1024). */
static inline uint64_t bench_parse_size(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 10);
	switch (*end) {
	case 'k': case 'K': return v << 10;
	case 'm': case 'M': return v << 20;
	case 'g': case 'G': return v << 30;
	default: return v;
	}
}

static inline int bench_cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median and spread over passes. */
struct bench_summary {
	double med, lo, hi;
};

/* Summary of v[0..n), n >= 1 (sorts v). */
static inline struct bench_summary bench_summarize(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
	return (struct bench_summary){ v[n / 2], v[0], v[n - 1] };
}

#endif
