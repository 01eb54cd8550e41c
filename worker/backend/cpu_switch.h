/* cpu_switch — the on/off switch of an optional CPU kernel path (cpu_dot16, cpu_qdot8, cpu_gemm,
 * cpu_q4k): decided at first use from an environment variable ("0" turns the path off, anything
 * else or nothing leaves it on), or set for the whole process by the path's _enable() (tests and
 * benchmarks compare both sides in one run). */
#ifndef FREEKV_CPU_SWITCH_H
#define FREEKV_CPU_SWITCH_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* *state: -1 until decided, then 0 or 1. */
static inline bool cpu_switch_on(int *state, const char *env)
{
	if (*state < 0) {
		const char *e = getenv(env);
		*state = !(e && !strcmp(e, "0"));
	}
	return *state;
}

#endif
