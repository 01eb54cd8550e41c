/* seq — the sequence table. See seq.h. */
/* uthash must not exit() on allocation failure: a full heap is an error to the caller. */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (seq_hash_oom = true)
#include <stdbool.h>
static bool seq_hash_oom;

#include "seq.h"

#include "errmsg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int seq_table_init(struct seq_table *t, size_t max_sequences)
{
	memset(t, 0, sizeof *t);
	t->max = max_sequences;
	t->next_id = 1;
	return 0;
}

static void seq_free(struct seq *s)
{
	free(s->tokens);
	free(s->blocks);
	free(s->keys);
	free(s);
}

void seq_table_shutdown(struct seq_table *t)
{
	HASH_CLEAR(hh_id, t->by_id);
	HASH_CLEAR(hh_name, t->by_name);
	for (size_t i = 0; i < t->n; i++)
		seq_free(t->v[i]);
	free(t->v);
	memset(t, 0, sizeof *t);
}

static uint32_t dtype_bytes(uint32_t dtype)
{
	switch (dtype) {
	case SEQ_DTYPE_F32: return 4;
	case SEQ_DTYPE_F16:
	case SEQ_DTYPE_BF16: return 2;
	default: return 0;
	}
}

uint64_t seq_block_bytes(const struct seq_geometry *g)
{
	return (uint64_t)g->n_kv_heads * 2 * g->page_size * g->head_dim * dtype_bytes(g->dtype);
}

int seq_check_geometry(const struct seq_geometry *g, char *err, size_t errlen)
{
	static const struct {
		const char *name;
		size_t off;
		uint32_t max;
	} f[] = {
		{ "n_layers", offsetof(struct seq_geometry, n_layers), SEQ_MAX_LAYERS },
		{ "n_kv_heads", offsetof(struct seq_geometry, n_kv_heads), 1024 },
		{ "head_dim", offsetof(struct seq_geometry, head_dim), 4096 },
		{ "page_size", offsetof(struct seq_geometry, page_size), 4096 },
	};
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
		uint32_t v = *(const uint32_t *)((const char *)g + f[i].off);
		if (v == 0 || v > f[i].max) {
			errmsg_set(err, errlen, "geometry: %s %u outside [1, %u]", f[i].name, v, f[i].max);
			return -EINVAL;
		}
	}
	if (!dtype_bytes(g->dtype)) {
		errmsg_set(err, errlen, "geometry: unknown dtype %u", g->dtype);
		return -EINVAL;
	}
	if (seq_block_bytes(g) > SEQ_MAX_BLOCK_BYTES) {
		errmsg_set(err, errlen, "geometry: block of %" PRIu64 " bytes exceeds %u", seq_block_bytes(g),
		       SEQ_MAX_BLOCK_BYTES);
		return -EINVAL;
	}
	return 0;
}

static const char *dtype_name(uint32_t d)
{
	return d == SEQ_DTYPE_F32 ? "f32" : d == SEQ_DTYPE_F16 ? "f16" : d == SEQ_DTYPE_BF16 ? "bf16" : "?";
}

static bool geometry_equal(const struct seq_geometry *a, const struct seq_geometry *b)
{
	return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
	       a->page_size == b->page_size && a->dtype == b->dtype;
}

struct seq *seq_find(const struct seq_table *t, uint64_t id)
{
	struct seq *s = NULL;
	HASH_FIND(hh_id, t->by_id, &id, sizeof id, s);
	return s;
}

struct seq *seq_find_name(const struct seq_table *t, const char *name)
{
	struct seq *s = NULL;
	HASH_FIND(hh_name, t->by_name, name, strlen(name), s);
	return s;
}

static int reserve_tokens(struct seq *s, size_t n)
{
	if (n <= s->cap_tokens)
		return 0;
	size_t cap = s->cap_tokens ? s->cap_tokens : 256;
	while (cap < n)
		cap *= 2;
	uint32_t *v = realloc(s->tokens, cap * sizeof *v);
	if (!v)
		return -ENOMEM;
	s->tokens = v;
	s->cap_tokens = cap;
	return 0;
}

static int seq_new(struct seq_table *t, uint64_t id, const char *name, const uint8_t *fp,
		   size_t fp_len, const struct seq_geometry *g, const uint32_t *tokens,
		   size_t n_tokens, struct seq **out, char *err, size_t errlen);

int seq_open(struct seq_table *t, const char *name, const uint8_t *fp, size_t fp_len,
	     const struct seq_geometry *g, const uint32_t *tokens, size_t n_tokens, size_t max_tokens,
	     bool create, struct seq **out, bool *created, char *err, size_t errlen)
{
	size_t nlen = name ? strlen(name) : 0;
	if (nlen == 0 || nlen >= SEQ_NAME_MAX) {
		errmsg_set(err, errlen, "sequence name must have 1 to %d bytes", SEQ_NAME_MAX - 1);
		return -EINVAL;
	}
	if (fp_len == 0 || fp_len > SEQ_FP_MAX) {
		errmsg_set(err, errlen, "model fingerprint must have 1 to %d bytes", SEQ_FP_MAX);
		return -EINVAL;
	}
	if (n_tokens > max_tokens) {
		errmsg_set(err, errlen, "%zu token ids exceed max_tokens %zu", n_tokens, max_tokens);
		return -E2BIG;
	}
	int ret = seq_check_geometry(g, err, errlen);
	if (ret)
		return ret;

	struct seq *s = seq_find_name(t, name);
	if (s) {
		if (s->fp_len != fp_len || memcmp(s->fp, fp, fp_len) != 0) {
			errmsg_set(err, errlen, "sequence '%s' exists with a different model fingerprint", name);
			return -EEXIST;
		}
		if (!geometry_equal(&s->geo, g)) {
			const struct seq_geometry *k = &s->geo;
			errmsg_set(err, errlen, "sequence '%s' exists with a different geometry: kept "
				   "%u layers, %u KV heads, head dim %u, page %u, %s; asked %u, %u, %u, "
				   "page %u, %s", name, k->n_layers, k->n_kv_heads, k->head_dim,
				   k->page_size, dtype_name(k->dtype), g->n_layers, g->n_kv_heads,
				   g->head_dim, g->page_size, dtype_name(g->dtype));
			return -EEXIST;
		}
		size_t common = n_tokens < s->n_tokens ? n_tokens : s->n_tokens;
		if (common && memcmp(tokens, s->tokens, common * sizeof *tokens) != 0) {
			errmsg_set(err, errlen, "sequence '%s': token ids disagree with the ones kept", name);
			return -EINVAL;
		}
		if (n_tokens > s->n_tokens) {
			if (reserve_tokens(s, n_tokens))
				return -ENOMEM;
			memcpy(s->tokens + s->n_tokens, tokens + s->n_tokens, (n_tokens - s->n_tokens) * sizeof *tokens);
			s->n_tokens = n_tokens;
		}
		*out = s;
		*created = false;
		return 0;
	}
	if (!create) {
		errmsg_set(err, errlen, "no sequence '%s'", name);
		return -ENOENT;
	}
	ret = seq_new(t, t->next_id, name, fp, fp_len, g, tokens, n_tokens, out, err, errlen);
	if (ret)
		return ret;
	*created = true;
	return 0;
}

static int seq_new(struct seq_table *t, uint64_t id, const char *name, const uint8_t *fp,
		   size_t fp_len, const struct seq_geometry *g, const uint32_t *tokens,
		   size_t n_tokens, struct seq **out, char *err, size_t errlen)
{
	size_t nlen = strlen(name);
	struct seq *s;
	if (t->n >= t->max) {
		errmsg_set(err, errlen, "max_sequences (%zu) reached", t->max);
		return -ENOSPC;
	}
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		struct seq **v = realloc(t->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		t->v = v;
		t->cap = cap;
	}
	s = calloc(1, sizeof *s);
	if (!s || reserve_tokens(s, n_tokens)) {
		free(s);
		return -ENOMEM;
	}
	s->id = id;
	if (id >= t->next_id)
		t->next_id = id + 1;
	memcpy(s->name, name, nlen + 1);
	memcpy(s->fp, fp, fp_len);
	s->fp_len = fp_len;
	s->geo = *g;
	s->block_bytes = seq_block_bytes(g);
	s->state = SEQ_DETACHED;
	if (n_tokens)
		memcpy(s->tokens, tokens, n_tokens * sizeof *tokens);
	s->n_tokens = n_tokens;
	/* On a failed add uthash leaves the item out of that index: undo only the other one. */
	seq_hash_oom = false;
	HASH_ADD(hh_id, t->by_id, id, sizeof s->id, s);
	if (seq_hash_oom) {
		seq_free(s);
		return -ENOMEM;
	}
	HASH_ADD_KEYPTR(hh_name, t->by_name, s->name, strlen(s->name), s);
	if (seq_hash_oom) {
		HASH_DELETE(hh_id, t->by_id, s);
		seq_free(s);
		return -ENOMEM;
	}
	s->slot = t->n;
	t->v[t->n++] = s;
	*out = s;
	return 0;
}

int seq_restore(struct seq_table *t, uint64_t id, const char *name, const uint8_t *fp,
		size_t fp_len, const struct seq_geometry *g, struct seq **out, char *err,
		size_t errlen)
{
	size_t nlen = strnlen(name, SEQ_NAME_MAX);
	if (nlen == 0 || nlen >= SEQ_NAME_MAX || fp_len == 0 || fp_len > SEQ_FP_MAX || id == 0) {
		errmsg_set(err, errlen, "sequence %" PRIu64 ": bad name or fingerprint", id);
		return -EINVAL;
	}
	int ret = seq_check_geometry(g, err, errlen);
	if (ret)
		return ret;
	if (seq_find(t, id) || seq_find_name(t, name)) {
		errmsg_set(err, errlen, "sequence %" PRIu64 " ('%s') restored twice", id, name);
		return -EEXIST;
	}
	return seq_new(t, id, name, fp, fp_len, g, NULL, 0, out, err, errlen);
}

int seq_attach(struct seq *s, uint32_t wid, char *err, size_t errlen)
{
	if (s->state == SEQ_ATTACHED && s->worker_id != wid) {
		errmsg_set(err, errlen, "sequence '%s' is attached to worker %u", s->name, s->worker_id);
		return -EBUSY;
	}
	s->state = SEQ_ATTACHED;
	s->worker_id = wid;
	return 0;
}

int seq_detach(struct seq *s, uint32_t wid, char *err, size_t errlen)
{
	if (s->state != SEQ_ATTACHED || s->worker_id != wid) {
		errmsg_set(err, errlen, "sequence '%s' is not attached to worker %u", s->name, wid);
		return -EPERM;
	}
	s->state = SEQ_DETACHED;
	return 0;
}

size_t seq_orphan_worker(struct seq_table *t, uint32_t wid)
{
	size_t n = 0;
	for (size_t i = 0; i < t->n; i++) {
		struct seq *s = t->v[i];
		if (s->state == SEQ_ATTACHED && s->worker_id == wid) {
			s->state = SEQ_ORPHANED;
			n++;
		}
	}
	return n;
}

int seq_commit(struct seq *s, uint64_t committed_tokens, uint64_t first, const uint32_t *tokens,
	       size_t n, size_t max_tokens, char *err, size_t errlen)
{
	if (n) {
		if (first > s->n_tokens) {
			errmsg_set(err, errlen, "token ids from %" PRIu64 " leave a gap after %zu", first, s->n_tokens);
			return -EINVAL;
		}
		if (first + n > max_tokens) {
			errmsg_set(err, errlen, "token ids up to %" PRIu64 " exceed max_tokens %zu", first + n, max_tokens);
			return -E2BIG;
		}
		size_t overlap = s->n_tokens - first < n ? s->n_tokens - first : n;
		if (overlap && memcmp(s->tokens + first, tokens, overlap * sizeof *tokens) != 0) {
			errmsg_set(err, errlen, "token ids from %" PRIu64 " disagree with the ones kept", first);
			return -EINVAL;
		}
		if (reserve_tokens(s, first + n))
			return -ENOMEM;
		if (n > overlap)
			memcpy(s->tokens + s->n_tokens, tokens + overlap, (n - overlap) * sizeof *tokens);
		s->n_tokens = first + n > s->n_tokens ? first + n : s->n_tokens;
	}
	s->committed_tokens = committed_tokens;
	return 0;
}

uint32_t seq_block(const struct seq *s, uint32_t layer, uint32_t page)
{
	if (layer >= s->geo.n_layers || page >= s->pages_cap)
		return SEQ_NO_BLOCK;
	return s->blocks[(size_t)layer * s->pages_cap + page];
}

static int grow_pages(struct seq *s, uint32_t need)
{
	uint32_t cap = s->pages_cap ? s->pages_cap : 16;
	while (cap < need)
		cap *= 2;
	uint32_t *b = malloc((size_t)s->geo.n_layers * cap * sizeof *b);
	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < (size_t)s->geo.n_layers * cap; i++)
		b[i] = SEQ_NO_BLOCK;
	for (uint32_t l = 0; l < s->geo.n_layers && s->pages_cap; l++)
		memcpy(b + (size_t)l * cap, s->blocks + (size_t)l * s->pages_cap, s->pages_cap * sizeof *b);
	free(s->blocks);
	s->blocks = b;
	s->pages_cap = cap;
	return 0;
}

int seq_set_block(struct seq *s, uint32_t layer, uint32_t page, uint32_t block)
{
	if (layer >= s->geo.n_layers || page == UINT32_MAX)
		return -EINVAL;
	if (page >= s->pages_cap) {
		if (block == SEQ_NO_BLOCK)
			return 0;
		int ret = grow_pages(s, page + 1);
		if (ret)
			return ret;
	}
	s->blocks[(size_t)layer * s->pages_cap + page] = block;
	if (block != SEQ_NO_BLOCK && page >= s->n_pages)
		s->n_pages = page + 1;
	return 0;
}

void seq_remove(struct seq_table *t, struct seq *s)
{
	if (s->slot >= t->n || t->v[s->slot] != s)
		return; /* not this table's */
	HASH_DELETE(hh_id, t->by_id, s);
	HASH_DELETE(hh_name, t->by_name, s);
	t->v[s->slot] = t->v[--t->n];
	t->v[s->slot]->slot = s->slot;
	seq_free(s);
}

const char *seq_state_name(enum seq_state st)
{
	switch (st) {
	case SEQ_ATTACHED: return "attached";
	case SEQ_DETACHED: return "detached";
	case SEQ_ORPHANED: return "orphaned";
	}
	return "unknown";
}
