/* safetensors — a bounds-checked reader for Hugging Face .safetensors files, single or sharded.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
 * data_offsets: [begin, end]}, "__metadata__": {...}}), then the data; offsets are relative to
 * the data. st_open() takes a .safetensors file or a folder: a folder is read through
 * model.safetensors.index.json ("weight_map": tensor -> shard file) when present, else
 * model.safetensors. Every file is mapped read-only. Tensors must be F32, F16 or BF16 (any other
 * dtype is -EPROTO naming the tensor), their byte size must match dtype x shape, and their
 * ranges must lie inside the data and not overlap (-EINVAL naming the tensor). Tensor names are
 * unique across shards, and every tensor the index names must be in the shard it names.
 *
 * Ownership: the context owns the mappings, the parsed table and the names; struct st_tensor
 * pointers and their data borrow from it until st_close(). Tensor data is NOT guaranteed to be
 * aligned to its element size (the format does not require it). */
#ifndef FREEKV_SAFETENSORS_H
#define FREEKV_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define ST_MAX_DIMS 8
/* Header JSON larger than this is refused (the reference implementation's limit). */
#define ST_MAX_HEADER (100u << 20)

struct st_ctx;

struct st_tensor {
	const char *name;	 /* NUL-terminated */
	enum fkv_dtype dtype;
	int n_dims;		 /* 0..ST_MAX_DIMS (0 = scalar) */
	int64_t shape[ST_MAX_DIMS]; /* row-major: shape[n_dims-1] is contiguous */
	uint64_t size;		 /* bytes */
	const void *data;
	int file;		 /* index of the shard holding it */
};

/* Opens a .safetensors file, or a folder (sharded index or model.safetensors). Returns 0 and
 * *out, or a negative errno with a message naming the file and tensor in err. */
int st_open(const char *path, struct st_ctx **out, char *err, size_t errlen);
/* Parses one file image held by the caller (borrowed until st_close(); no copy). */
int st_open_buf(const void *buf, size_t len, struct st_ctx **out, char *err, size_t errlen);
/* Safe on NULL. */
void st_close(struct st_ctx *s);
/* gguf_drop_pages for every mapped shard. */
void st_drop_pages(const struct st_ctx *s);

int st_n_tensors(const struct st_ctx *s);
/* Tensors sorted by name: st_tensor(s, i) for i in 0..st_n_tensors()-1. */
const struct st_tensor *st_tensor(const struct st_ctx *s, int i);
/* By name; NULL when absent. */
const struct st_tensor *st_find(const struct st_ctx *s, const char *name);
int st_n_files(const struct st_ctx *s);

#endif
