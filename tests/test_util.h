/* Shared helpers for the cmocka tests: includes in the order cmocka needs, a deterministic
 * RNG, the skip convention (exit 77), where the test models and the build live, and reading or
 * writing a whole file. */
#ifndef FREEKV_TEST_UTIL_H
#define FREEKV_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define TEST_SKIP_EXIT 77

/* xorshift64*: reproducible across runs and platforms. */
static inline uint64_t test_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/* Uniform float in [-1, 1). */
static inline float test_randf(uint64_t *s)
{
	return (float)((double)(test_rand(s) >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* Path of a file under the shared models directory, or NULL (and a note on stderr) when the
 * file is absent so the caller can skip. Returns a static buffer. */
static inline const char *test_model_path(const char *rel)
{
	static char buf[4096];
	const char *dir = getenv("FREEKV_MODELS_DIR");
	if (!dir)
		dir = FREEKV_MODELS_DIR;
	snprintf(buf, sizeof buf, "%s/%s", dir, rel);
	if (access(buf, R_OK) != 0) {
		fprintf(stderr, "skip: %s not found\n", buf);
		return NULL;
	}
	return buf;
}

/* Path of a file under the build directory: env FREEKV_BUILD_DIR when set (a build packed and
 * run elsewhere, bench/gpu/run.sh --pack), else the directory the test was built in. Returns a
 * static buffer. */
static inline const char *test_build_path(const char *rel)
{
	static char buf[4096];
	const char *dir = getenv("FREEKV_BUILD_DIR");
	if (!dir)
		dir = FREEKV_BUILD_DIR;
	snprintf(buf, sizeof buf, "%s/%s", dir, rel);
	return buf;
}

/* The whole of a file in a malloc'ed buffer (length in *len, plus a NUL after the last byte);
 * fails the test when unreadable. */
static inline uint8_t *test_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *p = malloc(*len + 1);
	assert_non_null(p);
	assert_int_equal(fread(p, 1, *len, f), *len);
	p[*len] = 0;
	fclose(f);
	return p;
}

/* Writes len bytes at p to dir/name (created or truncated); fails the test on any error. */
static inline void test_write_file(const char *dir, const char *name, const void *p, size_t len)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(p, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

#endif
