/* prefix — kvstored's prefix index (docs/design.md §4 "Prefix sharing"): content keys of
 * committed full pages, and the map from a key to the blocks (one per layer) that hold that
 * page.
 *
 * Keys chain: K0 = SHA-256("freekv-prefix-v1" ‖ fingerprint ‖ geometry ‖ ubatch ‖ SHA-256(salt)
 * ‖ variant), and the key of page p is SHA-256(key of page p-1, or K0 ‖ the page's token ids).
 * SHA-256 (OpenSSL) rather than a short hash, so that nobody can forge another tenant's key;
 * the salt keeps namespaces apart.
 *
 * The index only names blocks: the pool owns them and the data plane keeps the index honest
 * (an entry is removed before any of its blocks is freed, prefix_unindex_block). Every entry's
 * blocks are also found from the block (a reverse map), so that a block that goes, or fails
 * its checksum, takes its page out of the index in O(1). Ownership: the index owns its entries;
 * prefix_index_clear frees them. Not thread-safe: the data-plane lock covers it. */
#ifndef FREEKV_PREFIX_H
#define FREEKV_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seq.h"

#define PREFIX_KEY_BYTES 32
#define PREFIX_MAX_UBATCH (1u << 20)
#define PREFIX_MAX_SALT 256	/* bytes of cache_salt, and of prefix_variant */

struct prefix_entry;
struct prefix_rev;

struct prefix_index {
	struct prefix_entry *by_key;	/* uthash head */
	struct prefix_rev *by_block;	/* uthash head: block id -> its entry */
	uint64_t entries;
};

/* The chain's start for a sequence of this model, geometry, ubatch, namespace and variant.
 * 0, or -EIO when OpenSSL fails. */
int prefix_key0(const uint8_t *fp, size_t fp_len, const struct seq_geometry *g, uint32_t ubatch,
		const char *salt, const uint8_t *variant, size_t variant_len,
		uint8_t out[PREFIX_KEY_BYTES]);
/* The key of the next page: SHA-256(prev ‖ ids). 0, or -EIO. */
int prefix_key_next(const uint8_t prev[PREFIX_KEY_BYTES], const uint32_t *ids, size_t n,
		    uint8_t out[PREFIX_KEY_BYTES]);

/* The blocks (n_layers) of the page with this key, or NULL. Borrowed until the entry goes. */
const uint32_t *prefix_find(const struct prefix_index *x, const uint8_t key[PREFIX_KEY_BYTES]);
/* Adds key -> blocks[0..n_layers). -EEXIST when the key or one of the blocks is indexed
 * already, -ENOMEM. */
int prefix_insert(struct prefix_index *x, const uint8_t key[PREFIX_KEY_BYTES],
		  const uint32_t *blocks, uint32_t n_layers);
/* Whether block is one of an entry's. */
bool prefix_has_block(const struct prefix_index *x, uint32_t block);
/* Removes the entry that holds block, if any (all its layers), copying its blocks to out
 * (SEQ_MAX_LAYERS entries) when out is not NULL. Returns how many blocks it had (0: none). */
uint32_t prefix_unindex_block(struct prefix_index *x, uint32_t block, uint32_t *out);
void prefix_index_clear(struct prefix_index *x);

#endif
