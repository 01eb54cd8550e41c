/* safetensors — reader for single and sharded .safetensors files. See safetensors.h.
 * Each shard is mapped and its header parsed with json-c; the tensors of all shards go into one
 * table sorted by name (binary search for lookups, adjacent names reveal duplicates). */
#include "safetensors.h"

#include "errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

struct st_file {
	const uint8_t *base;
	size_t size;
	bool mapped;
	char name[256];	/* shard file name, for messages and the index check */
};

struct st_ctx {
	struct st_file *files;
	int n_files;
	struct st_tensor *t;
	int n, cap;
	char **names;	/* one allocation per tensor name (the table is sorted after all shards) */
};

static const struct {
	const char *name;
	int dtype; /* enum fkv_dtype or -1 */
} st_dtypes[] = {
	{ "F32", FKV_F32 }, { "F16", FKV_F16 }, { "BF16", FKV_BF16 }, { "F64", -1 },
	{ "I64", -1 },	    { "I32", -1 },	{ "I16", -1 },	      { "I8", -1 },
	{ "U8", -1 },	    { "BOOL", -1 },	{ "F8_E4M3", -1 },    { "F8_E5M2", -1 },
};

static int parse_json(const char *s, size_t len, struct json_object **out, const char *what,
		      char *err, size_t errlen)
{
	if (len > INT_MAX)
		return errmsg(err, errlen, -EINVAL, "%s: JSON too large", what);
	struct json_tokener *tok = json_tokener_new();
	if (!tok)
		return errmsg(err, errlen, -ENOMEM, "%s: out of memory", what);
	struct json_object *o = json_tokener_parse_ex(tok, s, (int)len);
	enum json_tokener_error je = json_tokener_get_error(tok);
	size_t end = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (!o || je != json_tokener_success) {
		json_object_put(o);
		return errmsg(err, errlen, -EINVAL, "%s: invalid JSON (%s)", what,
			    je == json_tokener_continue ? "unexpected end" : json_tokener_error_desc(je));
	}
	for (; end < len; end++) {
		/* writers pad the header with spaces to align the data */
		if (s[end] != ' ' && s[end] != '\n' && s[end] != '\t' && s[end] != '\r' && s[end] != '\0') {
			json_object_put(o);
			return errmsg(err, errlen, -EINVAL, "%s: trailing bytes after the JSON header", what);
		}
	}
	*out = o;
	return 0;
}

static bool json_u64(struct json_object *o, uint64_t *v)
{
	if (!o || !json_object_is_type(o, json_type_int))
		return false;
	errno = 0;
	int64_t x = json_object_get_int64(o);
	if (x < 0 || errno)
		return false;
	*v = (uint64_t)x;
	return true;
}

static int add_tensor(struct st_ctx *s, const char *fname, const struct st_file *f, int file_idx,
		      const char *name, struct json_object *desc, uint64_t data_len, char *err, size_t errlen)
{
	struct json_object *jd, *js, *jo;
	if (!json_object_is_type(desc, json_type_object) ||
	    !json_object_object_get_ex(desc, "dtype", &jd) || !json_object_is_type(jd, json_type_string) ||
	    !json_object_object_get_ex(desc, "shape", &js) || !json_object_is_type(js, json_type_array) ||
	    !json_object_object_get_ex(desc, "data_offsets", &jo) || !json_object_is_type(jo, json_type_array))
		return errmsg(err, errlen, -EINVAL,
			    "safetensors %s: tensor '%s' needs dtype (string), shape and data_offsets (arrays)",
			    fname, name);
	if (s->n == s->cap) {
		int cap = s->cap ? s->cap * 2 : 64;
		struct st_tensor *t = realloc(s->t, (size_t)cap * sizeof *t);
		char **nm = realloc(s->names, (size_t)cap * sizeof *nm);
		if (t)
			s->t = t;
		if (nm)
			s->names = nm;
		if (!t || !nm)
			return errmsg(err, errlen, -ENOMEM, "safetensors: out of memory");
		s->cap = cap;
	}
	struct st_tensor *t = &s->t[s->n];
	memset(t, 0, sizeof *t);
	const char *dt = json_object_get_string(jd);
	int dtype = -2;
	for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
		if (!strcmp(dt, st_dtypes[i].name))
			dtype = st_dtypes[i].dtype;
	}
	if (dtype < 0)
		return errmsg(err, errlen, -EPROTO,
			    "safetensors %s: tensor '%s' has %s dtype %s; only F32, F16 and BF16 are supported",
			    fname, name, dtype == -1 ? "unsupported" : "unknown", dt);
	t->dtype = (enum fkv_dtype)dtype;
	size_t nd = json_object_array_length(js);
	if (nd > ST_MAX_DIMS)
		return errmsg(err, errlen, -EINVAL, "safetensors %s: tensor '%s' has %zu dimensions (at most %d)",
			    fname, name, nd, ST_MAX_DIMS);
	t->n_dims = (int)nd;
	uint64_t nel = 1;
	for (size_t i = 0; i < nd; i++) {
		uint64_t d;
		/* 2^40 per dim and 2^50 in all: far past any model, and no overflow */
		if (!json_u64(json_object_array_get_idx(js, i), &d) || d > (1ull << 40) ||
		    (d && nel > (1ull << 50) / d))
			return errmsg(err, errlen, -EINVAL, "safetensors %s: tensor '%s' has an invalid shape", fname, name);
		t->shape[i] = (int64_t)d;
		nel *= d;
	}
	uint64_t b, e;
	if (json_object_array_length(jo) != 2 || !json_u64(json_object_array_get_idx(jo, 0), &b) ||
	    !json_u64(json_object_array_get_idx(jo, 1), &e) || e < b)
		return errmsg(err, errlen, -EINVAL, "safetensors %s: tensor '%s' has invalid data_offsets", fname, name);
	t->size = nel * dtype_size(t->dtype);
	if (e - b != t->size)
		return errmsg(err, errlen, -EINVAL,
			    "safetensors %s: tensor '%s' spans %" PRIu64 " bytes but %s x shape needs %" PRIu64,
			    fname, name, e - b, dt, t->size);
	if (e > data_len)
		return errmsg(err, errlen, -EINVAL,
			    "safetensors %s: tensor '%s' ends at data offset %" PRIu64 ", past the %" PRIu64
			    " data bytes in the file",
			    fname, name, e, data_len);
	t->data = f->base + (f->size - data_len) + b;
	t->file = file_idx;
	s->names[s->n] = strdup(name);
	if (!s->names[s->n])
		return errmsg(err, errlen, -ENOMEM, "safetensors: out of memory");
	t->name = s->names[s->n];
	s->n++;
	return 0;
}

static int cmp_data(const void *a, const void *b)
{
	const struct st_tensor *x = *(const struct st_tensor *const *)a;
	const struct st_tensor *y = *(const struct st_tensor *const *)b;
	uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
	return (px > py) - (px < py);
}

/* Tensors [first, s->n) all come from one file: reject overlapping ranges. */
static int check_overlap(struct st_ctx *s, int first, const char *fname, char *err, size_t errlen)
{
	int n = s->n - first;
	if (n < 2)
		return 0;
	const struct st_tensor **v = malloc((size_t)n * sizeof *v);
	if (!v)
		return errmsg(err, errlen, -ENOMEM, "safetensors: out of memory");
	for (int i = 0; i < n; i++)
		v[i] = &s->t[first + i];
	qsort(v, (size_t)n, sizeof *v, cmp_data);
	int ret = 0;
	for (int i = 1; i < n && !ret; i++) {
		if ((const uint8_t *)v[i - 1]->data + v[i - 1]->size > (const uint8_t *)v[i]->data)
			ret = errmsg(err, errlen, -EINVAL, "safetensors %s: tensors '%s' and '%s' overlap", fname,
				   v[i - 1]->name, v[i]->name);
	}
	free(v);
	return ret;
}

/* Parses the header of s->files[idx] and appends its tensors. */
static int parse_file(struct st_ctx *s, int idx, char *err, size_t errlen)
{
	const struct st_file *f = &s->files[idx];
	const char *fname = f->name;
	uint64_t hlen;
	if (f->size < 8)
		return errmsg(err, errlen, -EINVAL, "safetensors %s: file too short (%zu bytes)", fname, f->size);
	memcpy(&hlen, f->base, 8);
	if (hlen > ST_MAX_HEADER)
		return errmsg(err, errlen, -EINVAL, "safetensors %s: header length %" PRIu64 " exceeds %u", fname,
			    hlen, ST_MAX_HEADER);
	if (hlen > f->size - 8)
		return errmsg(err, errlen, -EINVAL,
			    "safetensors %s: header length %" PRIu64 " runs past the end of the file (%zu bytes)",
			    fname, hlen, f->size);
	struct json_object *root;
	char what[300];
	snprintf(what, sizeof what, "safetensors %s", fname);
	int ret = parse_json((const char *)f->base + 8, (size_t)hlen, &root, what, err, errlen);
	if (ret)
		return ret;
	if (!json_object_is_type(root, json_type_object)) {
		json_object_put(root);
		return errmsg(err, errlen, -EINVAL, "safetensors %s: header is not a JSON object", fname);
	}
	uint64_t data_len = f->size - 8 - hlen;
	int first = s->n;
	json_object_object_foreach(root, key, val)
	{
		if (!strcmp(key, "__metadata__"))
			continue;
		if ((ret = add_tensor(s, fname, f, idx, key, val, data_len, err, errlen)))
			break;
	}
	json_object_put(root);
	if (ret)
		return ret;
	return check_overlap(s, first, fname, err, errlen);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int finish(struct st_ctx *s, char *err, size_t errlen)
{
	qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_name);
	for (int i = 1; i < s->n; i++) {
		if (!strcmp(s->t[i - 1].name, s->t[i].name))
			return errmsg(err, errlen, -EINVAL, "safetensors: tensor '%s' appears twice (in %s and %s)",
				    s->t[i].name, s->files[s->t[i - 1].file].name, s->files[s->t[i].file].name);
	}
	return 0;
}

static int map_file(const char *path, struct st_file *f, char *err, size_t errlen)
{
	const char *slash = strrchr(path, '/');
	snprintf(f->name, sizeof f->name, "%s", slash ? slash + 1 : path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "safetensors: cannot open %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 8) {
		close(fd);
		return errmsg(err, errlen, -EINVAL, "safetensors: %s is not a regular file of at least 8 bytes", path);
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED)
		return errmsg(err, errlen, -e, "safetensors: cannot map %s: %s", path, strerror(e));
	f->base = p;
	f->size = (size_t)st.st_size;
	f->mapped = true;
	return 0;
}

static int read_small_file(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return errmsg(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
	char *b = NULL;
	size_t n = 0, cap = 0;
	int ret = 0;
	for (;;) {
		if (n == cap) {
			if (cap >= ST_MAX_HEADER) {
				ret = errmsg(err, errlen, -EFBIG, "%s is larger than %u bytes", path, ST_MAX_HEADER);
				break;
			}
			cap = cap ? cap * 2 : 65536;
			char *nb = realloc(b, cap);
			if (!nb) {
				ret = errmsg(err, errlen, -ENOMEM, "out of memory reading %s", path);
				break;
			}
			b = nb;
		}
		size_t r = fread(b + n, 1, cap - n, fp);
		n += r;
		if (r == 0)
			break;
	}
	if (!ret && ferror(fp))
		ret = errmsg(err, errlen, -EIO, "error reading %s", path);
	fclose(fp);
	if (ret) {
		free(b);
		return ret;
	}
	*buf = b;
	*len = n;
	return 0;
}

static int add_file(struct st_ctx *s, const char *path, char *err, size_t errlen)
{
	struct st_file *nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
	if (!nf)
		return errmsg(err, errlen, -ENOMEM, "safetensors: out of memory");
	s->files = nf;
	memset(&s->files[s->n_files], 0, sizeof *nf);
	int ret = map_file(path, &s->files[s->n_files], err, errlen);
	if (ret)
		return ret;
	s->n_files++;
	return parse_file(s, s->n_files - 1, err, errlen);
}

/* Opens every shard the index names (each once), then checks that each tensor of the weight map
 * is in the shard the map names. */
static int open_index(struct st_ctx *s, const char *dir, const char *index, char *err, size_t errlen)
{
	char *buf = NULL;
	size_t len = 0;
	int ret = read_small_file(index, &buf, &len, err, errlen);
	if (ret)
		return ret;
	struct json_object *root, *wm;
	ret = parse_json(buf, len, &root, "model.safetensors.index.json", err, errlen);
	free(buf);
	if (ret)
		return ret;
	if (!json_object_object_get_ex(root, "weight_map", &wm) || !json_object_is_type(wm, json_type_object)) {
		json_object_put(root);
		return errmsg(err, errlen, -EINVAL, "model.safetensors.index.json: missing object 'weight_map'");
	}
	json_object_object_foreach(wm, tname, jf)
	{
		if (!json_object_is_type(jf, json_type_string)) {
			ret = errmsg(err, errlen, -EINVAL, "model.safetensors.index.json: entry '%s' is not a file name", tname);
			break;
		}
		const char *fn = json_object_get_string(jf);
		if (!*fn || strchr(fn, '/') || strlen(fn) >= sizeof s->files[0].name) {
			ret = errmsg(err, errlen, -EINVAL, "model.safetensors.index.json: tensor '%s' names a bad shard '%s'",
				   tname, fn);
			break;
		}
		bool seen = false;
		for (int i = 0; i < s->n_files && !seen; i++)
			seen = !strcmp(s->files[i].name, fn);
		if (seen)
			continue;
		char path[4096];
		if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, fn) >= sizeof path) {
			ret = errmsg(err, errlen, -ENAMETOOLONG, "safetensors: path too long");
			break;
		}
		if ((ret = add_file(s, path, err, errlen)))
			break;
	}
	if (!ret && (ret = finish(s, err, errlen)) == 0) {
		json_object_object_foreach(wm, tn, jv)
		{
			const struct st_tensor *t = st_find(s, tn);
			const char *fn = json_object_get_string(jv);
			if (!t) {
				ret = errmsg(err, errlen, -EINVAL, "safetensors: tensor '%s' of the index is missing from %s", tn, fn);
				break;
			}
			if (strcmp(s->files[t->file].name, fn)) {
				ret = errmsg(err, errlen, -EINVAL, "safetensors: tensor '%s' is in %s, the index says %s", tn,
					   s->files[t->file].name, fn);
				break;
			}
		}
	}
	json_object_put(root);
	return ret;
}

int st_open(const char *path, struct st_ctx **out, char *err, size_t errlen)
{
	*out = NULL;
	struct stat st;
	if (stat(path, &st) < 0)
		return errmsg(err, errlen, -errno, "safetensors: %s: %s", path, strerror(errno));
	struct st_ctx *s = calloc(1, sizeof *s);
	if (!s)
		return errmsg(err, errlen, -ENOMEM, "safetensors: out of memory");
	int ret;
	if (S_ISDIR(st.st_mode)) {
		char p[4096];
		snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
		if (access(p, F_OK) == 0) {
			ret = open_index(s, path, p, err, errlen);
		} else {
			snprintf(p, sizeof p, "%s/model.safetensors", path);
			ret = add_file(s, p, err, errlen);
			if (!ret)
				ret = finish(s, err, errlen);
		}
	} else {
		ret = add_file(s, path, err, errlen);
		if (!ret)
			ret = finish(s, err, errlen);
	}
	if (ret) {
		st_close(s);
		return ret;
	}
	*out = s;
	return 0;
}

int st_open_buf(const void *buf, size_t len, struct st_ctx **out, char *err, size_t errlen)
{
	*out = NULL;
	struct st_ctx *s = calloc(1, sizeof *s);
	if (!s || !(s->files = calloc(1, sizeof *s->files))) {
		free(s);
		return errmsg(err, errlen, -ENOMEM, "safetensors: out of memory");
	}
	s->files[0].base = buf;
	s->files[0].size = len;
	snprintf(s->files[0].name, sizeof s->files[0].name, "(buffer)");
	s->n_files = 1;
	int ret = len < 8 ? errmsg(err, errlen, -EINVAL, "safetensors: buffer too short (%zu bytes)", len)
			  : parse_file(s, 0, err, errlen);
	if (!ret)
		ret = finish(s, err, errlen);
	if (ret) {
		st_close(s);
		return ret;
	}
	*out = s;
	return 0;
}

void st_drop_pages(const struct st_ctx *s)
{
	for (int i = 0; s && i < s->n_files; i++)
		if (s->files[i].mapped) /* as gguf_drop_pages */
			(void)madvise((void *)s->files[i].base, s->files[i].size, MADV_DONTNEED);
}

void st_close(struct st_ctx *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->n_files; i++) {
		if (s->files[i].mapped)
			munmap((void *)s->files[i].base, s->files[i].size);
	}
	for (int i = 0; i < s->n; i++)
		free(s->names[i]);
	free(s->names);
	free(s->files);
	free(s->t);
	free(s);
}

int st_n_tensors(const struct st_ctx *s) { return s->n; }
int st_n_files(const struct st_ctx *s) { return s->n_files; }

const struct st_tensor *st_tensor(const struct st_ctx *s, int i)
{
	return (i >= 0 && i < s->n) ? &s->t[i] : NULL;
}

const struct st_tensor *st_find(const struct st_ctx *s, const char *name)
{
	struct st_tensor key = { .name = name };
	return bsearch(&key, s->t, (size_t)s->n, sizeof *s->t, cmp_name);
}
