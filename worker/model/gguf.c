/* gguf — GGUF v2/v3 reader. See gguf.h. Every read goes through struct rd, which checks the
 * remaining length before touching a byte; counts are bounded by the bytes left before
 * anything is allocated for them. */
#include "gguf.h"

#include "errmsg.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_ARRAY_DEPTH 4
#define GGUF_MAX_NAME 65535 /* GGUF limits key and tensor names far lower; this bounds allocation */

/* The names arena and the string-array table grow (and move) while the file is parsed, so a
 * key/value keeps offsets and indices into them, never pointers: accessors resolve them on
 * each call. Only the tensor names, which callers read as plain pointers, are resolved, once,
 * after the last append (ctx->sealed). */
struct gguf_kv {
	size_t key_off;		/* NUL-terminated key in ctx->names */
	enum gguf_type type;
	const uint8_t *val;	/* scalar value bytes in the buffer (which never moves) */
	size_t str_off;		/* string values: NUL-terminated copy in ctx->names */
	uint64_t str_len;
	struct gguf_arr arr;	/* strs is NULL here; see arr_str_first */
	size_t arr_str_first;	/* string arrays: index of the first element in ctx->strs */
};

struct gguf_ctx {
	const uint8_t *base;
	size_t size;
	bool mapped;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_off;
	int64_t n_kv, n_tensors;
	struct gguf_kv *kv;
	struct gguf_tensor_info *ti;
	size_t *ti_name_off;
	char *names;		/* keys, string values, tensor names (NUL-terminated) */
	size_t names_len, names_cap;
	struct gguf_str *strs;	/* elements of every string array */
	size_t strs_len, strs_cap;
	bool sealed;		/* names and strs are final: pointers into them may be handed out */
};

struct rd {
	const uint8_t *p;
	size_t size;
	size_t off;
};

/* Bytes per element of each scalar type (0 for string/array). */
static const size_t type_size[GGUF_TYPE_COUNT] = {
	[GGUF_TYPE_UINT8] = 1,	 [GGUF_TYPE_INT8] = 1,	  [GGUF_TYPE_UINT16] = 2,
	[GGUF_TYPE_INT16] = 2,	 [GGUF_TYPE_UINT32] = 4,  [GGUF_TYPE_INT32] = 4,
	[GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,	  [GGUF_TYPE_STRING] = 0,
	[GGUF_TYPE_ARRAY] = 0,	 [GGUF_TYPE_UINT64] = 8,  [GGUF_TYPE_INT64] = 8,
	[GGUF_TYPE_FLOAT64] = 8,
};

static const char *const type_names[GGUF_TYPE_COUNT] = {
	[GGUF_TYPE_UINT8] = "u8",	[GGUF_TYPE_INT8] = "i8",	 [GGUF_TYPE_UINT16] = "u16",
	[GGUF_TYPE_INT16] = "i16",	[GGUF_TYPE_UINT32] = "u32",	 [GGUF_TYPE_INT32] = "i32",
	[GGUF_TYPE_FLOAT32] = "f32",	[GGUF_TYPE_BOOL] = "bool",	 [GGUF_TYPE_STRING] = "string",
	[GGUF_TYPE_ARRAY] = "array",	[GGUF_TYPE_UINT64] = "u64",	 [GGUF_TYPE_INT64] = "i64",
	[GGUF_TYPE_FLOAT64] = "f64",
};

/* ggml tensor types: id, name, elements per block and bytes per block (ggml's type traits), and
 * the freekv dtype for the three the backends compute on (-1 for the rest). Ids missing here
 * (31-33 and 36-38 were retired by ggml) are refused: their sizes are unknown. */
static const struct gguf_ttype {
	uint32_t id;
	const char *name;
	uint32_t blck, bytes;
	int dtype;
} tensor_types[] = {
	{ 0, "F32", 1, 4, FKV_F32 },	    { 1, "F16", 1, 2, FKV_F16 },
	{ 30, "BF16", 1, 2, FKV_BF16 },	    { 2, "Q4_0", 32, 18, -1 },
	{ 3, "Q4_1", 32, 20, -1 },	    { 6, "Q5_0", 32, 22, -1 },
	{ 7, "Q5_1", 32, 24, -1 },	    { 8, "Q8_0", 32, 34, -1 },
	{ 9, "Q8_1", 32, 36, -1 },	    { 10, "Q2_K", 256, 84, -1 },
	{ 11, "Q3_K", 256, 110, -1 },	    { 12, "Q4_K", 256, 144, -1 },
	{ 13, "Q5_K", 256, 176, -1 },	    { 14, "Q6_K", 256, 210, -1 },
	{ 15, "Q8_K", 256, 292, -1 },	    { 16, "IQ2_XXS", 256, 66, -1 },
	{ 17, "IQ2_XS", 256, 74, -1 },	    { 18, "IQ3_XXS", 256, 98, -1 },
	{ 19, "IQ1_S", 256, 50, -1 },	    { 20, "IQ4_NL", 32, 18, -1 },
	{ 21, "IQ3_S", 256, 110, -1 },	    { 22, "IQ2_S", 256, 82, -1 },
	{ 23, "IQ4_XS", 256, 136, -1 },	    { 24, "I8", 1, 1, -1 },
	{ 25, "I16", 1, 2, -1 },	    { 26, "I32", 1, 4, -1 },
	{ 27, "I64", 1, 8, -1 },	    { 28, "F64", 1, 8, -1 },
	{ 29, "IQ1_M", 256, 56, -1 },	    { 34, "TQ1_0", 256, 54, -1 },
	{ 35, "TQ2_0", 256, 66, -1 },	    { 39, "MXFP4", 32, 17, -1 },
};

static bool rd_left(const struct rd *r, size_t n)
{
	return r->size - r->off >= n;
}

static bool rd_u32(struct rd *r, uint32_t *v)
{
	if (!rd_left(r, 4))
		return false;
	memcpy(v, r->p + r->off, 4);
	r->off += 4;
	return true;
}

static bool rd_u64(struct rd *r, uint64_t *v)
{
	if (!rd_left(r, 8))
		return false;
	memcpy(v, r->p + r->off, 8);
	r->off += 8;
	return true;
}

/* A length-prefixed string; s points into the buffer. */
static bool rd_str(struct rd *r, struct gguf_str *s)
{
	uint64_t len;
	if (!rd_u64(r, &len) || !rd_left(r, len))
		return false;
	s->s = (const char *)r->p + r->off;
	s->len = len;
	r->off += len;
	return true;
}

/* Appends a NUL-terminated copy of s to the names arena; returns its offset or SIZE_MAX.
 * The arena may move: keep the offset, not a pointer. */
static size_t names_add(struct gguf_ctx *g, const char *s, size_t len)
{
	assert(!g->sealed);
	if (g->names_len + len + 1 > g->names_cap) {
		size_t cap = g->names_cap ? g->names_cap : 4096;
		while (cap < g->names_len + len + 1)
			cap *= 2;
		char *n = realloc(g->names, cap);
		if (!n)
			return SIZE_MAX;
		g->names = n;
		g->names_cap = cap;
	}
	size_t off = g->names_len;
	memcpy(g->names + off, s, len);
	g->names[off + len] = '\0';
	g->names_len += len + 1;
	return off;
}

static int strs_reserve(struct gguf_ctx *g, uint64_t n)
{
	assert(!g->sealed);
	if (g->strs_len + n <= g->strs_cap)
		return 0;
	size_t cap = g->strs_cap ? g->strs_cap : 256;
	while (cap < g->strs_len + n)
		cap *= 2;
	struct gguf_str *s = realloc(g->strs, cap * sizeof *s);
	if (!s)
		return -ENOMEM;
	g->strs = s;
	g->strs_cap = cap;
	return 0;
}

/* Skips (and checks) an array of arrays without exposing it. */
static int skip_array(struct rd *r, int depth)
{
	uint32_t et;
	uint64_t n;
	if (depth > GGUF_MAX_ARRAY_DEPTH)
		return -EPROTO;
	if (!rd_u32(r, &et) || !rd_u64(r, &n))
		return -EINVAL;
	if (et >= GGUF_TYPE_COUNT)
		return -EPROTO;
	if (et == GGUF_TYPE_STRING) {
		for (uint64_t i = 0; i < n; i++) {
			struct gguf_str s;
			if (!rd_str(r, &s))
				return -EINVAL;
		}
		return 0;
	}
	if (et == GGUF_TYPE_ARRAY) {
		if (n > (r->size - r->off) / 12)
			return -EINVAL;
		for (uint64_t i = 0; i < n; i++) {
			int ret = skip_array(r, depth + 1);
			if (ret)
				return ret;
		}
		return 0;
	}
	if (n > (r->size - r->off) / type_size[et])
		return -EINVAL;
	r->off += n * type_size[et];
	return 0;
}

/* Error messages name keys and tensors from the file buffer (%.*s): it never moves, while a
 * copy in the names arena may be moved by the next append. */
#define NAME_FMT "%.*s"
#define NAME_ARG(str) (int)((str).len < 200 ? (str).len : 200), (str).s

static int parse_kv(struct gguf_ctx *g, struct rd *r, int64_t i, char *err, size_t errlen)
{
	struct gguf_kv *kv = &g->kv[i];
	struct gguf_str key;
	uint32_t t;
	if (!rd_str(r, &key))
		return errmsg(err, errlen, -EINVAL, "gguf: truncated key name of metadata entry %" PRId64, i);
	if (key.len == 0 || key.len > GGUF_MAX_NAME || memchr(key.s, '\0', key.len))
		return errmsg(err, errlen, -EINVAL, "gguf: invalid key name of metadata entry %" PRId64, i);
	kv->key_off = names_add(g, key.s, key.len);
	if (kv->key_off == SIZE_MAX)
		return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
	if (!rd_u32(r, &t))
		return errmsg(err, errlen, -EINVAL, "gguf: truncated type of key '" NAME_FMT "'", NAME_ARG(key));
	if (t >= GGUF_TYPE_COUNT)
		return errmsg(err, errlen, -EPROTO, "gguf: key '" NAME_FMT "' has unknown value type %u",
			    NAME_ARG(key), t);
	kv->type = t;
	kv->str_off = SIZE_MAX;
	if (t == GGUF_TYPE_STRING) {
		struct gguf_str s;
		if (!rd_str(r, &s))
			return errmsg(err, errlen, -EINVAL, "gguf: truncated string value of key '" NAME_FMT "'",
				    NAME_ARG(key));
		kv->str_len = s.len;
		kv->str_off = names_add(g, s.s, s.len);
		if (kv->str_off == SIZE_MAX)
			return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
		return 0;
	}
	if (t != GGUF_TYPE_ARRAY) {
		if (!rd_left(r, type_size[t]))
			return errmsg(err, errlen, -EINVAL, "gguf: truncated value of key '" NAME_FMT "'", NAME_ARG(key));
		kv->val = r->p + r->off;
		r->off += type_size[t];
		return 0;
	}
	uint32_t et;
	uint64_t n;
	if (!rd_u32(r, &et) || !rd_u64(r, &n))
		return errmsg(err, errlen, -EINVAL, "gguf: truncated array header of key '" NAME_FMT "'",
			    NAME_ARG(key));
	if (et >= GGUF_TYPE_COUNT)
		return errmsg(err, errlen, -EPROTO, "gguf: array '" NAME_FMT "' has unknown element type %u",
			    NAME_ARG(key), et);
	kv->arr.type = et;
	kv->arr.n = n;
	if (et == GGUF_TYPE_STRING) {
		/* each element takes at least its 8-byte length */
		if (n > (r->size - r->off) / 8)
			return errmsg(err, errlen, -EINVAL,
				    "gguf: string array '" NAME_FMT "' claims %" PRIu64
				    " elements, more than the file holds", NAME_ARG(key), n);
		if (strs_reserve(g, n))
			return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
		kv->arr_str_first = g->strs_len;
		for (uint64_t j = 0; j < n; j++) {
			if (!rd_str(r, &g->strs[g->strs_len + j]))
				return errmsg(err, errlen, -EINVAL,
					    "gguf: truncated element %" PRIu64 " of string array '" NAME_FMT "'", j,
					    NAME_ARG(key));
		}
		g->strs_len += n;
		return 0;
	}
	if (et == GGUF_TYPE_ARRAY) {
		if (n > (r->size - r->off) / 12)
			return errmsg(err, errlen, -EINVAL,
				    "gguf: array '" NAME_FMT "' claims %" PRIu64 " nested arrays, more than the file holds",
				    NAME_ARG(key), n);
		for (uint64_t j = 0; j < n; j++) {
			int ret = skip_array(r, 1);
			if (ret)
				return errmsg(err, errlen, ret, "gguf: bad nested array %" PRIu64 " of key '" NAME_FMT "'",
					    j, NAME_ARG(key));
		}
		return 0;
	}
	if (n > (r->size - r->off) / type_size[et])
		return errmsg(err, errlen, -EINVAL,
			    "gguf: array '" NAME_FMT "' claims %" PRIu64 " elements of %s, more than the file holds",
			    NAME_ARG(key), n, type_names[et]);
	kv->arr.data = r->p + r->off;
	r->off += n * type_size[et];
	return 0;
}

static const struct gguf_ttype *tensor_type(uint32_t id)
{
	for (size_t i = 0; i < sizeof tensor_types / sizeof tensor_types[0]; i++) {
		if (tensor_types[i].id == id)
			return &tensor_types[i];
	}
	return NULL;
}

static int parse_tensor(struct gguf_ctx *g, struct rd *r, int64_t i, char *err, size_t errlen)
{
	struct gguf_tensor_info *ti = &g->ti[i];
	struct gguf_str name;
	uint32_t nd, type;
	if (!rd_str(r, &name))
		return errmsg(err, errlen, -EINVAL, "gguf: truncated name of tensor %" PRId64, i);
	if (name.len == 0 || name.len > GGUF_MAX_NAME || memchr(name.s, '\0', name.len))
		return errmsg(err, errlen, -EINVAL, "gguf: invalid name of tensor %" PRId64, i);
	g->ti_name_off[i] = names_add(g, name.s, name.len);
	if (g->ti_name_off[i] == SIZE_MAX)
		return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
	if (!rd_u32(r, &nd))
		return errmsg(err, errlen, -EINVAL, "gguf: truncated info of tensor '" NAME_FMT "'", NAME_ARG(name));
	if (nd < 1 || nd > GGUF_MAX_DIMS)
		return errmsg(err, errlen, -EINVAL, "gguf: tensor '" NAME_FMT "' has %u dimensions (1..%d allowed)",
			    NAME_ARG(name), nd, GGUF_MAX_DIMS);
	ti->n_dims = (int)nd;
	uint64_t nel = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
		ti->ne[d] = 1;
	for (uint32_t d = 0; d < nd; d++) {
		uint64_t ne;
		if (!rd_u64(r, &ne))
			return errmsg(err, errlen, -EINVAL, "gguf: truncated shape of tensor '" NAME_FMT "'",
				    NAME_ARG(name));
		/* 2^40 elements per dim and 2^50 in all are far past any real model */
		if (ne == 0 || ne > (1ull << 40) || nel > (1ull << 50) / ne)
			return errmsg(err, errlen, -EINVAL,
				    "gguf: tensor '" NAME_FMT "' has an impossible shape (dim %u = %" PRIu64 ")",
				    NAME_ARG(name), d, ne);
		ti->ne[d] = (int64_t)ne;
		nel *= ne;
	}
	if (!rd_u32(r, &type) || !rd_u64(r, &ti->offset))
		return errmsg(err, errlen, -EINVAL, "gguf: truncated info of tensor '" NAME_FMT "'", NAME_ARG(name));
	const struct gguf_ttype *tt = tensor_type(type);
	if (!tt)
		return errmsg(err, errlen, -EPROTO, "gguf: tensor '" NAME_FMT "' has unknown type %u",
			    NAME_ARG(name), type);
	/* a block never straddles rows */
	if ((uint64_t)ti->ne[0] % tt->blck)
		return errmsg(err, errlen, -EINVAL,
			    "gguf: tensor '" NAME_FMT "' of type %s has rows of %" PRId64
			    " elements, not a multiple of its block of %u",
			    NAME_ARG(name), tt->name, ti->ne[0], tt->blck);
	ti->type = type;
	ti->type_name = tt->name;
	ti->has_dtype = tt->dtype >= 0;
	ti->dtype = ti->has_dtype ? (enum fkv_dtype)tt->dtype : FKV_F32;
	ti->n_elements = nel;
	ti->size = nel / tt->blck * tt->bytes;
	return 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const struct gguf_tensor_info *x = *(const struct gguf_tensor_info *const *)a;
	const struct gguf_tensor_info *y = *(const struct gguf_tensor_info *const *)b;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts names in place and returns one that occurs twice, or NULL. */
static const char *first_dup(const char **names, size_t n)
{
	qsort(names, n, sizeof *names, cmp_name);
	for (size_t i = 1; i < n; i++) {
		if (!strcmp(names[i - 1], names[i]))
			return names[i];
	}
	return NULL;
}

/* Places every tensor in the data section: aligned, inside the file, no two overlapping. */
static int check_tensors(struct gguf_ctx *g, char *err, size_t errlen)
{
	if (g->n_tensors == 0)
		return 0;
	if (g->data_off > g->size)
		return errmsg(err, errlen, -EINVAL, "gguf: tensor data section starts past the end of the file");
	uint64_t avail = g->size - g->data_off;
	const struct gguf_tensor_info **order = malloc((size_t)g->n_tensors * sizeof *order);
	if (!order)
		return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
	int ret = 0;
	for (int64_t i = 0; i < g->n_tensors && !ret; i++) {
		struct gguf_tensor_info *ti = &g->ti[i];
		order[i] = ti;
		if (ti->offset % g->alignment)
			ret = errmsg(err, errlen, -EINVAL, "gguf: tensor '%s' offset %" PRIu64 " is not aligned to %u",
				   ti->name, ti->offset, g->alignment);
		else if (ti->offset > avail || ti->size > avail - ti->offset)
			ret = errmsg(err, errlen, -EINVAL,
				   "gguf: tensor '%s' (%" PRIu64 " bytes at data offset %" PRIu64
				   ") runs past the end of the file (%" PRIu64 " data bytes)",
				   ti->name, ti->size, ti->offset, avail);
		else
			ti->data = g->base + g->data_off + ti->offset;
	}
	if (!ret) {
		qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_offset);
		for (int64_t i = 1; i < g->n_tensors && !ret; i++) {
			if (order[i - 1]->offset + order[i - 1]->size > order[i]->offset)
				ret = errmsg(err, errlen, -EINVAL, "gguf: tensors '%s' and '%s' overlap", order[i - 1]->name,
					   order[i]->name);
		}
	}
	const char **names = ret ? NULL : malloc((size_t)g->n_tensors * sizeof *names);
	if (!ret && !names)
		ret = errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
	if (!ret) {
		for (int64_t i = 0; i < g->n_tensors; i++)
			names[i] = g->ti[i].name;
		const char *dup = first_dup(names, (size_t)g->n_tensors);
		if (dup)
			ret = errmsg(err, errlen, -EINVAL, "gguf: tensor '%s' appears twice", dup);
	}
	free(names);
	free(order);
	return ret;
}

static int parse(struct gguf_ctx *g, char *err, size_t errlen)
{
	struct rd r = { .p = g->base, .size = g->size };
	uint32_t magic;
	uint64_t nt, nkv;
	if (!rd_u32(&r, &magic))
		return errmsg(err, errlen, -EINVAL, "gguf: file too short for a header (%zu bytes)", g->size);
	if (magic != GGUF_MAGIC)
		return errmsg(err, errlen, -EPROTO, "gguf: bad magic 0x%08x (not a GGUF file)", magic);
	if (!rd_u32(&r, &g->version) || !rd_u64(&r, &nt) || !rd_u64(&r, &nkv))
		return errmsg(err, errlen, -EINVAL, "gguf: file too short for a header (%zu bytes)", g->size);
	if (g->version == 0x02000000u || g->version == 0x03000000u)
		return errmsg(err, errlen, -EPROTO, "gguf: big-endian GGUF files are not supported");
	if (g->version != 2 && g->version != 3)
		return errmsg(err, errlen, -EPROTO, "gguf: unsupported version %u (2 and 3 are)", g->version);
	/* a key/value takes at least 8 + 1 + 4 + 1 bytes, a tensor info at least 8 + 1 + 4 + 8 + 4 + 8 */
	if (nkv > (r.size - r.off) / 14)
		return errmsg(err, errlen, -EINVAL, "gguf: header claims %" PRIu64 " metadata entries, more than the file holds", nkv);
	if (nt > (r.size - r.off) / 33)
		return errmsg(err, errlen, -EINVAL, "gguf: header claims %" PRIu64 " tensors, more than the file holds", nt);
	g->n_kv = (int64_t)nkv;
	g->n_tensors = (int64_t)nt;
	g->kv = calloc(nkv ? nkv : 1, sizeof *g->kv);
	g->ti = calloc(nt ? nt : 1, sizeof *g->ti);
	g->ti_name_off = calloc(nt ? nt : 1, sizeof *g->ti_name_off);
	if (!g->kv || !g->ti || !g->ti_name_off)
		return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
	int ret;
	for (int64_t i = 0; i < g->n_kv; i++) {
		if ((ret = parse_kv(g, &r, i, err, errlen)))
			return ret;
	}
	const char **keys = malloc((size_t)(g->n_kv ? g->n_kv : 1) * sizeof *keys);
	if (!keys)
		return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
	for (int64_t i = 0; i < g->n_kv; i++)
		keys[i] = gguf_key(g, i); /* used and freed before the next append */
	const char *dup = first_dup(keys, (size_t)g->n_kv);
	ret = dup ? errmsg(err, errlen, -EINVAL, "gguf: key '%s' appears twice", dup) : 0;
	free(keys);
	if (ret)
		return ret;
	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	int64_t ai = gguf_find_key(g, "general.alignment");
	if (ai >= 0) {
		uint32_t a;
		if (gguf_get_u32(g, "general.alignment", &a) || a == 0 || (a & (a - 1)))
			return errmsg(err, errlen, -EINVAL, "gguf: key 'general.alignment' must be a power of two");
		g->alignment = a;
	}
	for (int64_t i = 0; i < g->n_tensors; i++) {
		if ((ret = parse_tensor(g, &r, i, err, errlen)))
			return ret;
	}
	/* the last append is done: pointers into the arena stay valid from here on */
	g->sealed = true;
	for (int64_t i = 0; i < g->n_tensors; i++)
		g->ti[i].name = g->names + g->ti_name_off[i];
	g->data_off = (r.off + g->alignment - 1) / g->alignment * g->alignment;
	return check_tensors(g, err, errlen);
}

int gguf_open_buf(const void *buf, size_t len, struct gguf_ctx **out, char *err, size_t errlen)
{
	*out = NULL;
	struct gguf_ctx *g = calloc(1, sizeof *g);
	if (!g)
		return errmsg(err, errlen, -ENOMEM, "gguf: out of memory");
	g->base = buf;
	g->size = len;
	int ret = parse(g, err, errlen);
	if (ret) {
		gguf_close(g);
		return ret;
	}
	*out = g;
	return 0;
}

int gguf_open(const char *path, struct gguf_ctx **out, char *err, size_t errlen)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "gguf: cannot open %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return errmsg(err, errlen, -e, "gguf: cannot stat %s: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode) || st.st_size == 0) {
		close(fd);
		return errmsg(err, errlen, -EINVAL, "gguf: %s is %s", path,
			    S_ISREG(st.st_mode) ? "empty" : "not a regular file");
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED)
		return errmsg(err, errlen, -e, "gguf: cannot map %s: %s", path, strerror(e));
	int ret = gguf_open_buf(p, (size_t)st.st_size, out, err, errlen);
	if (ret) {
		munmap(p, (size_t)st.st_size);
		return ret;
	}
	(*out)->mapped = true;
	return 0;
}

void gguf_drop_pages(const struct gguf_ctx *g)
{
	/* A private read-only file mapping: MADV_DONTNEED unmaps its pages, never their data. */
	if (g && g->mapped)
		(void)madvise((void *)g->base, g->size, MADV_DONTNEED);
}

void gguf_close(struct gguf_ctx *g)
{
	if (!g)
		return;
	if (g->mapped)
		munmap((void *)g->base, g->size);
	free(g->kv);
	free(g->ti);
	free(g->ti_name_off);
	free(g->names);
	free(g->strs);
	free(g);
}

uint32_t gguf_version(const struct gguf_ctx *g) { return g->version; }
uint32_t gguf_alignment(const struct gguf_ctx *g) { return g->alignment; }
uint64_t gguf_data_offset(const struct gguf_ctx *g) { return g->data_off; }
const void *gguf_base(const struct gguf_ctx *g) { return g->base; }
size_t gguf_size(const struct gguf_ctx *g) { return g->size; }
int64_t gguf_n_kv(const struct gguf_ctx *g) { return g->n_kv; }
int64_t gguf_n_tensors(const struct gguf_ctx *g) { return g->n_tensors; }

int64_t gguf_find_key(const struct gguf_ctx *g, const char *key)
{
	for (int64_t i = 0; i < g->n_kv; i++) {
		if (!strcmp(g->names + g->kv[i].key_off, key))
			return i;
	}
	return -1;
}

const char *gguf_key(const struct gguf_ctx *g, int64_t i)
{
	return (i >= 0 && i < g->n_kv) ? g->names + g->kv[i].key_off : NULL;
}

enum gguf_type gguf_kv_type(const struct gguf_ctx *g, int64_t i)
{
	return (i >= 0 && i < g->n_kv) ? g->kv[i].type : GGUF_TYPE_COUNT;
}

const char *gguf_type_name(enum gguf_type t)
{
	return (unsigned)t < GGUF_TYPE_COUNT ? type_names[t] : "invalid";
}

/* Reads one scalar of type t at p as a signed 64-bit integer (u64 above INT64_MAX fails). */
static bool scalar_int(enum gguf_type t, const uint8_t *p, int64_t *v)
{
	switch (t) {
	case GGUF_TYPE_UINT8: *v = p[0]; return true;
	case GGUF_TYPE_INT8: *v = (int8_t)p[0]; return true;
	case GGUF_TYPE_BOOL: *v = p[0] != 0; return true;
	case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); *v = x; return true; }
	case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); *v = x; return true; }
	case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); *v = x; return true; }
	case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); *v = x; return true; }
	case GGUF_TYPE_UINT64: {
		uint64_t x;
		memcpy(&x, p, 8);
		if (x > INT64_MAX)
			return false;
		*v = (int64_t)x;
		return true;
	}
	case GGUF_TYPE_INT64: { int64_t x; memcpy(&x, p, 8); *v = x; return true; }
	default: return false;
	}
}

static bool scalar_f32(enum gguf_type t, const uint8_t *p, float *v)
{
	if (t == GGUF_TYPE_FLOAT32) {
		memcpy(v, p, 4);
		return true;
	}
	if (t == GGUF_TYPE_FLOAT64) {
		double d;
		memcpy(&d, p, 8);
		*v = (float)d;
		return true;
	}
	int64_t i;
	if (t == GGUF_TYPE_BOOL || !scalar_int(t, p, &i))
		return false;
	*v = (float)i;
	return true;
}

static const struct gguf_kv *find(const struct gguf_ctx *g, const char *key)
{
	int64_t i = gguf_find_key(g, key);
	return i < 0 ? NULL : &g->kv[i];
}

int gguf_get_str(const struct gguf_ctx *g, const char *key, const char **s, size_t *len)
{
	const struct gguf_kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_TYPE_STRING)
		return -EINVAL;
	*s = g->names + kv->str_off;
	if (len)
		*len = kv->str_len;
	return 0;
}

static int get_int(const struct gguf_ctx *g, const char *key, int64_t lo, int64_t hi, int64_t *v)
{
	const struct gguf_kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_TYPE_BOOL || kv->type == GGUF_TYPE_STRING || kv->type == GGUF_TYPE_ARRAY ||
	    !scalar_int(kv->type, kv->val, v) || *v < lo || *v > hi)
		return -EINVAL;
	return 0;
}

int gguf_get_u32(const struct gguf_ctx *g, const char *key, uint32_t *v)
{
	int64_t x;
	int ret = get_int(g, key, 0, UINT32_MAX, &x);
	if (!ret)
		*v = (uint32_t)x;
	return ret;
}

int gguf_get_i32(const struct gguf_ctx *g, const char *key, int32_t *v)
{
	int64_t x;
	int ret = get_int(g, key, INT32_MIN, INT32_MAX, &x);
	if (!ret)
		*v = (int32_t)x;
	return ret;
}

int gguf_get_u64(const struct gguf_ctx *g, const char *key, uint64_t *v)
{
	const struct gguf_kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_TYPE_UINT64) {
		memcpy(v, kv->val, 8);
		return 0;
	}
	int64_t x;
	int ret = get_int(g, key, 0, INT64_MAX, &x);
	if (!ret)
		*v = (uint64_t)x;
	return ret;
}

int gguf_get_f32(const struct gguf_ctx *g, const char *key, float *v)
{
	const struct gguf_kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64)
		return -EINVAL;
	return scalar_f32(kv->type, kv->val, v) ? 0 : -EINVAL;
}

int gguf_get_bool(const struct gguf_ctx *g, const char *key, bool *v)
{
	const struct gguf_kv *kv = find(g, key);
	int64_t x;
	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_TYPE_STRING || kv->type == GGUF_TYPE_ARRAY ||
	    !scalar_int(kv->type, kv->val, &x) || x < 0 || x > 1)
		return -EINVAL;
	*v = x != 0;
	return 0;
}

int gguf_get_arr(const struct gguf_ctx *g, const char *key, struct gguf_arr *out)
{
	const struct gguf_kv *kv = find(g, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_TYPE_ARRAY)
		return -EINVAL;
	*out = kv->arr;
	if (kv->arr.type == GGUF_TYPE_STRING && kv->arr.n)
		out->strs = g->strs + kv->arr_str_first;
	return 0;
}

int gguf_arr_int(const struct gguf_arr *a, uint64_t i, int64_t *v)
{
	if (!a->data || i >= a->n || (unsigned)a->type >= GGUF_TYPE_COUNT || !type_size[a->type])
		return -EINVAL;
	return scalar_int(a->type, (const uint8_t *)a->data + i * type_size[a->type], v) ? 0 : -EINVAL;
}

int gguf_arr_f32(const struct gguf_arr *a, uint64_t i, float *v)
{
	if (!a->data || i >= a->n || (unsigned)a->type >= GGUF_TYPE_COUNT || !type_size[a->type])
		return -EINVAL;
	return scalar_f32(a->type, (const uint8_t *)a->data + i * type_size[a->type], v) ? 0 : -EINVAL;
}

int64_t gguf_find_tensor(const struct gguf_ctx *g, const char *name)
{
	for (int64_t i = 0; i < g->n_tensors; i++) {
		if (!strcmp(g->ti[i].name, name))
			return i;
	}
	return -1;
}

const struct gguf_tensor_info *gguf_tensor(const struct gguf_ctx *g, int64_t i)
{
	return (i >= 0 && i < g->n_tensors) ? &g->ti[i] : NULL;
}
