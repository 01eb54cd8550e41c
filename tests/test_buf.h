/* A growable byte buffer for tests that build binary files (GGUF images) in memory: append
 * bytes, the caller frees p. Header-only; used by test_gguf.c and test_tokenizer.c. */
#ifndef FREEKV_TEST_BUF_H
#define FREEKV_TEST_BUF_H

#include "test_util.h"

struct test_buf {
	uint8_t *p;
	size_t n, cap;
};

/* Appends n bytes from src, growing p; fails the test when out of memory. */
static inline void test_buf_put(struct test_buf *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->n, src, n);
	b->n += n;
}

#endif
