/* A minimal GGUF v3 writer for tests: header and metadata, no tensors, built in memory
 * (gb_begin, gb_kv_*, gb_end; the caller frees buf.p). Header-only; used by
 * test_tokenizer_bytelevel.c and test_pretok.c. */
#ifndef FREEKV_TEST_GGUF_WRITER_H
#define FREEKV_TEST_GGUF_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"
#include "test_buf.h"

/* A GGUF image being written; n_kv is patched into the header by gb_end. */
struct gbuf {
	struct test_buf buf;
	uint64_t n_kv;
};

static inline void gb_put(struct gbuf *b, const void *s, size_t n)
{
	test_buf_put(&b->buf, s, n);
}

static inline void gb_u32(struct gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
static inline void gb_u64(struct gbuf *b, uint64_t v) { gb_put(b, &v, 8); }

static inline void gb_str(struct gbuf *b, const char *s)
{
	gb_u64(b, strlen(s));
	gb_put(b, s, strlen(s));
}

static inline void gb_begin(struct gbuf *b)
{
	memset(b, 0, sizeof *b);
	gb_put(b, "GGUF", 4);
	gb_u32(b, 3);
	gb_u64(b, 0);
	gb_u64(b, 0); /* n_kv, patched by gb_end */
}

static inline void gb_key(struct gbuf *b, const char *key, uint32_t type)
{
	gb_str(b, key);
	gb_u32(b, type);
	b->n_kv++;
}

static inline void gb_kv_str(struct gbuf *b, const char *key, const char *v)
{
	gb_key(b, key, GGUF_TYPE_STRING);
	gb_str(b, v);
}

static inline void gb_kv_u32(struct gbuf *b, const char *key, uint32_t v)
{
	gb_key(b, key, GGUF_TYPE_UINT32);
	gb_u32(b, v);
}

static inline void gb_kv_bool(struct gbuf *b, const char *key, bool v)
{
	gb_key(b, key, GGUF_TYPE_BOOL);
	uint8_t x = v;
	gb_put(b, &x, 1);
}

static inline void gb_kv_strs(struct gbuf *b, const char *key, const char **v, int n)
{
	gb_key(b, key, GGUF_TYPE_ARRAY);
	gb_u32(b, GGUF_TYPE_STRING);
	gb_u64(b, (uint64_t)n);
	for (int i = 0; i < n; i++)
		gb_str(b, v[i]);
}

static inline void gb_kv_arr32(struct gbuf *b, const char *key, enum gguf_type type, const void *v, int n)
{
	gb_key(b, key, GGUF_TYPE_ARRAY);
	gb_u32(b, type);
	gb_u64(b, (uint64_t)n);
	gb_put(b, v, (size_t)n * 4);
}

static inline void gb_end(struct gbuf *b)
{
	memcpy(b->buf.p + 16, &b->n_kv, 8);
	while (b->buf.n % GGUF_DEFAULT_ALIGNMENT)
		gb_put(b, "", 1);
}

#endif
