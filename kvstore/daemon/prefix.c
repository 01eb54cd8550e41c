/* prefix — the prefix index. See prefix.h. */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (prefix_hash_oom = true)
#include <stdbool.h>
static bool prefix_hash_oom;

#include "prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <uthash.h>

struct prefix_entry {
	uint8_t key[PREFIX_KEY_BYTES];
	uint32_t n_layers;
	uint32_t *blocks;	/* (n_layers,) */
	UT_hash_handle hh;
};

struct prefix_rev {
	uint32_t block;
	struct prefix_entry *e;
	UT_hash_handle hh;
};

/* SHA-256 over the pieces. */
static int sha256(const void *const *parts, const size_t *lens, size_t n,
		  uint8_t out[PREFIX_KEY_BYTES])
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	unsigned len = 0;
	int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	for (size_t i = 0; ok && i < n; i++)
		ok = !lens[i] || EVP_DigestUpdate(c, parts[i], lens[i]);
	ok = ok && EVP_DigestFinal_ex(c, out, &len) && len == PREFIX_KEY_BYTES;
	EVP_MD_CTX_free(c);
	return ok ? 0 : -EIO;
}

/* Integers enter the hash little-endian, whatever the host. */
static void le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

int prefix_key0(const uint8_t *fp, size_t fp_len, const struct seq_geometry *g, uint32_t ubatch,
		const char *salt, const uint8_t *variant, size_t variant_len,
		uint8_t out[PREFIX_KEY_BYTES])
{
	static const char tag[] = "freekv-prefix-v1";
	uint8_t salt_hash[PREFIX_KEY_BYTES], nums[4 * 8];
	const void *sp[] = { salt ? salt : "" };
	size_t sl[] = { salt ? strlen(salt) : 0 };
	int ret = sha256(sp, sl, 1, salt_hash);
	if (ret)
		return ret;
	uint32_t v[8] = { g->n_layers, g->n_kv_heads, g->head_dim, g->page_size, g->dtype, ubatch,
			  (uint32_t)fp_len, (uint32_t)variant_len };
	for (int i = 0; i < 8; i++)
		le32(nums + 4 * i, v[i]);
	const void *parts[] = { tag, nums, fp, salt_hash, variant };
	size_t lens[] = { sizeof tag - 1, sizeof nums, fp_len, sizeof salt_hash, variant_len };
	return sha256(parts, lens, 5, out);
}

int prefix_key_next(const uint8_t prev[PREFIX_KEY_BYTES], const uint32_t *ids, size_t n,
		    uint8_t out[PREFIX_KEY_BYTES])
{
	uint8_t buf[4 * 256];
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	unsigned len = 0;
	int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
		 EVP_DigestUpdate(c, prev, PREFIX_KEY_BYTES);
	for (size_t i = 0; ok && i < n;) {
		size_t k = 0;
		for (; k < 256 && i < n; k++, i++)
			le32(buf + 4 * k, ids[i]);
		ok = EVP_DigestUpdate(c, buf, 4 * k);
	}
	ok = ok && EVP_DigestFinal_ex(c, out, &len) && len == PREFIX_KEY_BYTES;
	EVP_MD_CTX_free(c);
	return ok ? 0 : -EIO;
}

static struct prefix_entry *find(const struct prefix_index *x, const uint8_t *key)
{
	struct prefix_entry *e = NULL;
	HASH_FIND(hh, x->by_key, key, PREFIX_KEY_BYTES, e);
	return e;
}

static struct prefix_rev *find_rev(const struct prefix_index *x, uint32_t block)
{
	struct prefix_rev *r = NULL;
	HASH_FIND(hh, x->by_block, &block, sizeof block, r);
	return r;
}

const uint32_t *prefix_find(const struct prefix_index *x, const uint8_t key[PREFIX_KEY_BYTES])
{
	struct prefix_entry *e = find(x, key);
	return e ? e->blocks : NULL;
}

bool prefix_has_block(const struct prefix_index *x, uint32_t block)
{
	return find_rev(x, block) != NULL;
}

static void entry_free(struct prefix_index *x, struct prefix_entry *e, uint32_t n_rev)
{
	for (uint32_t l = 0; l < n_rev; l++) {
		struct prefix_rev *r = find_rev(x, e->blocks[l]);
		if (r && r->e == e) {
			HASH_DEL(x->by_block, r);
			free(r);
		}
	}
	free(e->blocks);
	free(e);
}

int prefix_insert(struct prefix_index *x, const uint8_t key[PREFIX_KEY_BYTES],
		  const uint32_t *blocks, uint32_t n_layers)
{
	if (find(x, key))
		return -EEXIST;
	for (uint32_t l = 0; l < n_layers; l++)
		if (find_rev(x, blocks[l]))
			return -EEXIST;
	struct prefix_entry *e = calloc(1, sizeof *e);
	if (!e || !(e->blocks = malloc(n_layers * sizeof *e->blocks))) {
		free(e);
		return -ENOMEM;
	}
	memcpy(e->key, key, PREFIX_KEY_BYTES);
	memcpy(e->blocks, blocks, n_layers * sizeof *blocks);
	e->n_layers = n_layers;
	uint32_t l = 0;
	prefix_hash_oom = false;
	for (; l < n_layers; l++) {
		struct prefix_rev *r = calloc(1, sizeof *r);
		if (!r)
			break;
		r->block = blocks[l];
		r->e = e;
		HASH_ADD(hh, x->by_block, block, sizeof r->block, r);
		if (prefix_hash_oom) {
			free(r);
			break;
		}
	}
	if (l == n_layers) {
		HASH_ADD(hh, x->by_key, key, PREFIX_KEY_BYTES, e);
		if (!prefix_hash_oom) {
			x->entries++;
			return 0;
		}
	}
	entry_free(x, e, l);
	return -ENOMEM;
}

uint32_t prefix_unindex_block(struct prefix_index *x, uint32_t block, uint32_t *out)
{
	struct prefix_rev *r = find_rev(x, block);
	if (!r)
		return 0;
	struct prefix_entry *e = r->e;
	uint32_t n = e->n_layers;
	if (out)
		memcpy(out, e->blocks, n * sizeof *out);
	HASH_DEL(x->by_key, e);
	x->entries--;
	entry_free(x, e, n);
	return n;
}

void prefix_index_clear(struct prefix_index *x)
{
	struct prefix_entry *e, *tmp;
	HASH_ITER(hh, x->by_key, e, tmp) {
		HASH_DEL(x->by_key, e);
		entry_free(x, e, e->n_layers);
	}
	x->entries = 0;
}
