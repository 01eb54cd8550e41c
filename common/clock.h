/* clock — the project's one monotonic clock (CLOCK_MONOTONIC: never steps with wall time, so
 * timeouts, heartbeats and step timings are immune to NTP and date changes). Header-only: each
 * reader is one clock_gettime call. */
#ifndef FREEKV_CLOCK_H
#define FREEKV_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds since an arbitrary fixed point. */
static inline uint64_t clock_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whole milliseconds (deadlines and heartbeats). */
static inline uint64_t clock_ms(void)
{
	return clock_ns() / 1000000u;
}

/* Milliseconds with their fraction (timings printed to users). */
static inline double clock_ms_f(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#endif
