/* gguf — a bounds-checked reader for GGUF v2/v3 files (llama.cpp's model container).
 *
 * gguf_open() maps a file read-only and parses the header, every metadata key/value (all value
 * types, arrays included) and the tensor table; gguf_open_buf() parses a caller's buffer instead
 * (borrowed: it must outlive the context). Every length, count and offset is checked against the
 * mapping, so a truncated or lying file gets -EINVAL (malformed: cut short, impossible counts,
 * offsets outside the file) or -EPROTO (well-formed but unsupported: bad magic, version, type)
 * with a message naming the key or tensor, never an over-read. Tensors of every ggml type whose
 * block size is known (F32, F16, BF16, the Q*, IQ*, TQ* and integer types) are described, sized
 * and bounds-checked, so a quantized file can be inspected; only F32, F16 and BF16 carry an
 * fkv_dtype (has_dtype), and loading the others is the caller's decision. A tensor of an
 * unknown type id is -EPROTO naming the tensor and the id.
 *
 * Ownership: the context owns the mapping and every table; all pointers handed out (key names,
 * strings, array data, tensor names and data, type names) borrow from it (or are static) and
 * stay valid until gguf_close(). Strings
 * from the file (struct gguf_str) are NOT NUL-terminated — use the length; key names, scalar
 * string values (gguf_get_str) and tensor names are NUL-terminated copies. Multi-byte values are
 * little-endian and may be unaligned in the file: read array elements with the gguf_arr_*
 * accessors (or memcpy), not by casting data. The host is assumed little-endian. */
#ifndef FREEKV_GGUF_H
#define FREEKV_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

/* Metadata value types, numbered as in the GGUF specification. */
enum gguf_type {
	GGUF_TYPE_UINT8 = 0,
	GGUF_TYPE_INT8 = 1,
	GGUF_TYPE_UINT16 = 2,
	GGUF_TYPE_INT16 = 3,
	GGUF_TYPE_UINT32 = 4,
	GGUF_TYPE_INT32 = 5,
	GGUF_TYPE_FLOAT32 = 6,
	GGUF_TYPE_BOOL = 7,
	GGUF_TYPE_STRING = 8,
	GGUF_TYPE_ARRAY = 9,
	GGUF_TYPE_UINT64 = 10,
	GGUF_TYPE_INT64 = 11,
	GGUF_TYPE_FLOAT64 = 12,
	GGUF_TYPE_COUNT
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_ctx;

/* A string inside the file: len bytes at s, not NUL-terminated. */
struct gguf_str {
	const char *s;
	uint64_t len;
};

/* An array value. Numeric arrays: n packed little-endian elements of `type` at data (possibly
 * unaligned). String arrays: strs[0..n) (data is NULL). Arrays of arrays are parsed (and
 * bounds-checked) but their contents are not exposed: data and strs are NULL. */
struct gguf_arr {
	enum gguf_type type;
	uint64_t n;
	const void *data;
	const struct gguf_str *strs;
};

struct gguf_tensor_info {
	const char *name;		/* NUL-terminated */
	uint32_t type;			/* ggml type id, as in the file */
	const char *type_name;		/* "F32", "Q4_1", ... (static) */
	bool has_dtype;			/* type is F32, F16 or BF16 */
	enum fkv_dtype dtype;		/* that type when has_dtype; meaningless otherwise */
	int n_dims;			/* 1..GGUF_MAX_DIMS */
	int64_t ne[GGUF_MAX_DIMS];	/* ggml order: ne[0] is the contiguous (innermost) dim */
	uint64_t n_elements;		/* product of ne */
	uint64_t offset;		/* relative to the data section */
	uint64_t size;			/* bytes (whole blocks for the block-quantized types) */
	const void *data;		/* into the mapping, aligned to the file's alignment */
};

/* Opens and parses path. Returns 0 and *out, or a negative errno with a message in err. */
int gguf_open(const char *path, struct gguf_ctx **out, char *err, size_t errlen);
/* Parses a buffer the caller keeps alive until gguf_close() (no copy is made). */
int gguf_open_buf(const void *buf, size_t len, struct gguf_ctx **out, char *err, size_t errlen);
/* Frees the context and unmaps the file. Safe on NULL. */
void gguf_close(struct gguf_ctx *g);
/* Drops this process's resident pages of the file mapping (none for a caller's buffer): the
 * contents stay; a page is read from the page cache again when next touched. */
void gguf_drop_pages(const struct gguf_ctx *g);

uint32_t gguf_version(const struct gguf_ctx *g);
uint32_t gguf_alignment(const struct gguf_ctx *g);
uint64_t gguf_data_offset(const struct gguf_ctx *g); /* file offset of the tensor data section */
const void *gguf_base(const struct gguf_ctx *g);     /* start of the mapping */
size_t gguf_size(const struct gguf_ctx *g);

/* Metadata, by index (0..gguf_n_kv()-1) or by key. gguf_find_key returns -1 when absent. */
int64_t gguf_n_kv(const struct gguf_ctx *g);
int64_t gguf_find_key(const struct gguf_ctx *g, const char *key);
const char *gguf_key(const struct gguf_ctx *g, int64_t i);
enum gguf_type gguf_kv_type(const struct gguf_ctx *g, int64_t i);
const char *gguf_type_name(enum gguf_type t);

/* Typed getters by key. Return 0, -ENOENT when the key is absent, -EINVAL when its type does
 * not convert (u32/i32 accept any integer type whose value fits; f32 accepts f32 and f64; bool
 * accepts bool and integers 0/1). *s from gguf_get_str is NUL-terminated, *len excludes it
 * (len may be NULL). */
int gguf_get_str(const struct gguf_ctx *g, const char *key, const char **s, size_t *len);
int gguf_get_u32(const struct gguf_ctx *g, const char *key, uint32_t *v);
int gguf_get_i32(const struct gguf_ctx *g, const char *key, int32_t *v);
int gguf_get_u64(const struct gguf_ctx *g, const char *key, uint64_t *v);
int gguf_get_f32(const struct gguf_ctx *g, const char *key, float *v);
int gguf_get_bool(const struct gguf_ctx *g, const char *key, bool *v);
/* The array stored at key (0, -ENOENT, or -EINVAL when the value is not an array). */
int gguf_get_arr(const struct gguf_ctx *g, const char *key, struct gguf_arr *out);

/* Element accessors (i < a->n is the caller's contract). gguf_arr_int reads any integer or
 * bool element type; gguf_arr_f32 reads f32/f64 and integers. Return 0 or -EINVAL when the
 * element type does not convert. */
int gguf_arr_int(const struct gguf_arr *a, uint64_t i, int64_t *v);
int gguf_arr_f32(const struct gguf_arr *a, uint64_t i, float *v);

/* Tensors, by index (0..gguf_n_tensors()-1) or by name (-1 when absent). */
int64_t gguf_n_tensors(const struct gguf_ctx *g);
int64_t gguf_find_tensor(const struct gguf_ctx *g, const char *name);
const struct gguf_tensor_info *gguf_tensor(const struct gguf_ctx *g, int64_t i);

#endif
