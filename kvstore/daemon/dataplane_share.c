/* dataplane_share — prefix sharing in the data plane (docs/design.md §4 "Prefix sharing"): a
 * new sequence attaches the leading pages that others published under the same content keys,
 * a fork shares every full page of its source, and a block that several sequences reference
 * is read-only and freed only with its last reference. Shares dataplane_priv.h with
 * dataplane.c; the index itself is prefix.c. */
#include "dataplane.h"
#include "dataplane_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "persist.h"
#include "pool.h"
#include "prefix.h"
#include "tier.h"

bool dp_seq_holds(const struct seq *s, const struct pool_block *b, uint32_t id)
{
	return s && b && seq_block(s, b->layer, b->page) == id;
}

bool dp_block_readonly(struct dp *dp, uint32_t id)
{
	const struct pool_block *b = pool_block_get(dp->pool, id);
	return b && (b->refs > 1 || b->indexed);
}

/* Sequences that map b: its references less the index's. */
static uint32_t holders(const struct pool_block *b)
{
	return b->refs - (b->indexed ? 1 : 0);
}

void dp_each_holder(struct dp *dp, uint32_t id, void (*fn)(struct dp *, struct seq *, uint32_t))
{
	struct pool_block *b = pool_block_get(dp->pool, id);
	if (!b || !holders(b))
		return;
	if (holders(b) == 1 && b->seq_id) {
		struct seq *s = seq_find(dp->seqs, b->seq_id);
		if (dp_seq_holds(s, b, id))
			fn(dp, s, id);
		return;
	}
	for (size_t i = 0; i < dp->seqs->n; i++)
		if (dp_seq_holds(dp->seqs->v[i], b, id))
			fn(dp, dp->seqs->v[i], id);
}

/* The last reference went: free the block, or doom it while its I/O runs. */
static void free_or_doom(struct dp *dp, uint32_t id, struct pool_block *b)
{
	if (b->tier != POOL_TIER_DRAM && b->tier != POOL_TIER_NVME && b->tier != POOL_TIER_REMOTE) {
		b->doomed = true; /* freed when its I/O ends (dp_free_if_doomed) */
		b->seq_id = 0;
		return;
	}
	dp_block_drop_storage(dp, id, b);
}

void dp_block_unref(struct dp *dp, struct seq *s, uint32_t layer, uint32_t page)
{
	uint32_t id = seq_block(s, layer, page);
	struct pool_block *b = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
	seq_set_block(s, layer, page, SEQ_NO_BLOCK);
	if (!b)
		return;
	if (--b->refs == 0) {
		free_or_doom(dp, id, b);
		return;
	}
	if (b->seq_id == s->id) { /* b->seq_id names one holder: another one now, or none */
		b->seq_id = 0;
		for (size_t i = 0; holders(b) && i < dp->seqs->n; i++)
			if (dp_seq_holds(dp->seqs->v[i], b, id))
				b->seq_id = dp->seqs->v[i]->id;
	}
}

void dp_unindex(struct dp *dp, uint32_t id)
{
	uint32_t blocks[SEQ_MAX_LAYERS];
	uint32_t n = prefix_unindex_block(&dp->px, id, blocks);
	for (uint32_t l = 0; l < n; l++) {
		struct pool_block *b = pool_block_get(dp->pool, blocks[l]);
		if (!b || !b->indexed)
			continue;
		b->indexed = false;
		if (--b->refs == 0)
			free_or_doom(dp, blocks[l], b);
	}
}

int dp_block_copy_new(struct dp *dp, unsigned cls, const void *bytes, uint32_t len,
		      uint64_t seq_id, uint32_t layer, uint32_t page, uint32_t *id)
{
	int ret = pool_block_alloc(dp->pool, cls, id);
	if (ret == -ENOSPC && dp_prefix_evict(dp, 1))
		ret = pool_block_alloc(dp->pool, cls, id);
	if (ret)
		return ret;
	memcpy(pool_block_data(dp->pool, *id), bytes, len);
	struct pool_block *b = pool_block_get(dp->pool, *id);
	b->seq_id = seq_id;
	b->layer = layer;
	b->page = page;
	b->refs = 1;
	pool_block_set_committed(dp->pool, *id, true);
	return 0;
}

static int grow_keys(struct seq *s, uint32_t need)
{
	if (need <= s->keys_cap)
		return 0;
	uint32_t cap = s->keys_cap ? s->keys_cap : 16;
	while (cap < need)
		cap *= 2;
	uint8_t (*k)[32] = realloc(s->keys, (size_t)cap * sizeof *k);
	if (!k)
		return -ENOMEM;
	s->keys = k;
	s->keys_cap = cap;
	return 0;
}

/* The key of page p of s, from the one before it (or key0). */
static int page_key(const struct seq *s, uint32_t p, const uint8_t *prev, uint8_t *out)
{
	uint32_t P = s->geo.page_size;
	return prefix_key_next(prev, s->tokens + (size_t)p * P, P, out);
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* Takes a reference on block id for s at (layer, page). */
static int share_block(struct dp *dp, struct seq *s, uint32_t layer, uint32_t page, uint32_t id)
{
	int ret = seq_set_block(s, layer, page, id);
	if (!ret)
		pool_block_get(dp->pool, id)->refs++;
	return ret;
}

/* Journals every block s maps below page `pages`, then its committed length. */
static void log_shared(struct dp *dp, struct seq *s, uint32_t pages)
{
	for (uint32_t p = 0; p < pages; p++)
		for (uint32_t l = 0; l < s->geo.n_layers; l++)
			persist_block(dp->ps, dp->pool, s, seq_block(s, l, p));
	persist_seq_committed(dp->ps, s);
}

int dp_prefix_open(struct dp *dp, struct seq *s, uint32_t ubatch, const char *salt,
		   const uint8_t *variant, size_t variant_len, size_t n_prompt, char *err,
		   size_t errlen)
{
	uint32_t P = s->geo.page_size, L = s->geo.n_layers;
	if (!ubatch || !n_prompt || s->n_pages || s->committed_tokens)
		return 0;
	int ret = prefix_key0(s->fp, s->fp_len, &s->geo, ubatch, salt, variant, variant_len, s->key0);
	if (ret)
		return errmsg(err, errlen, ret, "prefix key: SHA-256 failed (OpenSSL)");
	s->prefix_ubatch = ubatch;
	dp->pxs.lookups++;
	/* Covered: whole pages and whole ubatches, below the prompt (its last token always runs,
	 * for the logits). */
	uint64_t unit = (uint64_t)ubatch / gcd64(ubatch, P) * P;
	uint64_t max_cover = n_prompt > s->n_tokens ? 0 : (n_prompt - 1) / unit * unit;
	uint32_t max_pages = (uint32_t)(max_cover / P), found = 0;
	if ((ret = grow_keys(s, max_pages)))
		return errmsg(err, errlen, ret, "out of memory");
	const uint8_t *prev = s->key0;
	for (; found < max_pages; found++) {
		if (page_key(s, found, prev, s->keys[found]))
			break;
		const uint32_t *blocks = prefix_find(&dp->px, s->keys[found]);
		if (!blocks)
			break;
		prev = s->keys[found];
	}
	uint64_t cover = (uint64_t)found * P / unit * unit;
	uint32_t pages = (uint32_t)(cover / P);
	for (uint32_t p = 0; p < pages; p++) {
		const uint32_t *blocks = prefix_find(&dp->px, s->keys[p]);
		for (uint32_t l = 0; l < L; l++) {
			if ((ret = share_block(dp, s, l, p, blocks[l]))) {
				for (uint32_t q = 0; q <= p; q++)
					for (uint32_t m = 0; m < L; m++)
						dp_block_unref(dp, s, m, q);
				return errmsg(err, errlen, ret, "out of memory");
			}
		}
	}
	s->n_keys = pages;
	s->covered_tokens = cover;
	s->committed_tokens = cover;
	/* Its own prefill runs in whole ubatches from the covered length. */
	s->publish_limit = cover + (n_prompt - cover) / ubatch * ubatch;
	persist_seq_prefix(dp->ps, s);
	if (pages) {
		dp->pxs.hits++;
		dp->pxs.pages_attached += pages;
		dp->pxs.tokens_saved += cover;
		log_shared(dp, s, pages);
	} else {
		dp->pxs.misses++;
	}
	return 0;
}

void dp_prefix_publish(struct dp *dp, struct seq *s)
{
	uint32_t P = s->geo.page_size, L = s->geo.n_layers;
	if (!s->prefix_ubatch)
		return;
	/* A length cut below keyed pages: those pages are no longer what their keys say. */
	while ((uint64_t)s->n_keys * P > s->committed_tokens) {
		s->n_keys--;
		for (uint32_t l = 0; l < L; l++) {
			uint32_t id = seq_block(s, l, s->n_keys);
			if (id != SEQ_NO_BLOCK)
				dp_unindex(dp, id);
		}
	}
	uint64_t lim = s->committed_tokens < s->n_tokens ? s->committed_tokens : s->n_tokens;
	lim = lim < s->publish_limit ? lim : s->publish_limit;
	uint32_t blocks[SEQ_MAX_LAYERS];
	while ((uint64_t)(s->n_keys + 1) * P <= lim) {
		uint32_t p = s->n_keys;
		for (uint32_t l = 0; l < L; l++) {
			blocks[l] = seq_block(s, l, p);
			const struct pool_block *b =
				blocks[l] == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, blocks[l]);
			if (!b || !b->committed || b->doomed)
				return; /* a layer's COMMIT is still to come */
		}
		if (grow_keys(s, p + 1) ||
		    page_key(s, p, p ? s->keys[p - 1] : s->key0, s->keys[p]))
			return;
		s->n_keys++;
		/* The first publisher of a key keeps it; the same page from another sequence (two
		 * cold runs at once) is simply not indexed. */
		if (prefix_find(&dp->px, s->keys[p]) || prefix_insert(&dp->px, s->keys[p], blocks, L))
			continue;
		/* The index holds a reference: the page outlives the sequences that use it, as a
		 * cache that gives way under pressure (dp_prefix_evict). */
		for (uint32_t l = 0; l < L; l++) {
			struct pool_block *b = pool_block_get(dp->pool, blocks[l]);
			b->indexed = true;
			b->refs++;
		}
		dp_prefix_remote_put(dp, s->keys[p], blocks, L);
	}
}

/* The unit the covered length is a multiple of: whole pages and whole ubatches. */
static uint64_t cover_unit(const struct seq *s)
{
	uint32_t P = s->geo.page_size, ub = s->prefix_ubatch;
	return (uint64_t)ub / gcd64(ub, P) * P;
}

uint32_t dp_prefix_ahead(struct dp *dp, struct seq *s, size_t n_prompt)
{
	(void)dp;
	if (!s->prefix_ubatch || n_prompt > s->n_tokens || !n_prompt)
		return 0;
	uint64_t unit = cover_unit(s);
	uint32_t max_pages = (uint32_t)((n_prompt - 1) / unit * unit / s->geo.page_size);
	if (max_pages <= s->n_keys || grow_keys(s, max_pages))
		return 0;
	for (uint32_t p = s->n_keys; p < max_pages; p++)
		if (page_key(s, p, p ? s->keys[p - 1] : s->key0, s->keys[p]))
			return p;
	return max_pages;
}

int dp_prefix_attach_remote(struct dp *dp, struct seq *s, size_t n_prompt, uint32_t got,
			    const struct remote_block *b, char *err, size_t errlen)
{
	uint32_t P = s->geo.page_size, L = s->geo.n_layers, first = s->n_keys;
	uint64_t unit = cover_unit(s), old = s->covered_tokens;
	uint64_t cover = (uint64_t)(first + got) * P / unit * unit;
	uint32_t pages = (uint32_t)(cover / P);
	if (pages <= first)
		return 0;
	unsigned cls;
	int ret = pool_class(dp->pool, s->block_bytes, &cls);
	if (ret)
		return errmsg(err, errlen, ret, "no slab class for the page size");
	uint32_t p = first;
	for (; p < pages && !ret; p++) {
		const uint32_t *local = prefix_find(&dp->px, s->keys[p]);
		uint32_t ids[SEQ_MAX_LAYERS];
		uint32_t l = 0;
		for (; l < L && !ret; l++) {
			if (local) {
				ret = share_block(dp, s, l, p, local[l]);
				continue;
			}
			const struct remote_block *x = &b[(size_t)(p - first) * L + l];
			ret = dp_block_copy_new(dp, cls, x->data, x->len, s->id, l, p, &ids[l]);
			if (!ret && (ret = seq_set_block(s, l, p, ids[l])))
				pool_block_free(dp->pool, ids[l]);
		}
		if (!ret && !local && !prefix_insert(&dp->px, s->keys[p], ids, L)) {
			for (l = 0; l < L; l++) {
				struct pool_block *pb = pool_block_get(dp->pool, ids[l]);
				pb->indexed = true;
				pb->refs++;
			}
		}
	}
	if (ret) {
		for (uint32_t q = first; q < p; q++)
			for (uint32_t l = 0; l < L; l++)
				dp_block_unref(dp, s, l, q);
		return errmsg(err, errlen, ret, "no room in the pool for the pages found in Redis");
	}
	s->n_keys = pages;
	s->covered_tokens = cover;
	s->committed_tokens = cover;
	s->publish_limit = cover + (n_prompt - cover) / s->prefix_ubatch * s->prefix_ubatch;
	if (!old) { /* counted a miss at open: a hit now */
		dp->pxs.misses--;
		dp->pxs.hits++;
	}
	dp->pxs.pages_attached += pages - first;
	dp->pxs.tokens_saved += cover - old;
	dp->pxs.remote_pages += pages - first;
	persist_seq_prefix(dp->ps, s);
	log_shared(dp, s, pages);
	return 0;
}

int dp_fork(struct dp *dp, struct seq *src, struct seq *dst, char *err, size_t errlen)
{
	uint32_t P = src->geo.page_size, L = src->geo.n_layers;
	if (dst->n_pages || dst->committed_tokens)
		return errmsg(err, errlen, -EEXIST, "sequence '%s' exists already", dst->name);
	uint64_t committed = src->committed_tokens;
	uint32_t full = (uint32_t)(committed / P), tail = committed % P ? 1 : 0;
	for (uint32_t p = 0; p < src->n_pages; p++)
		for (uint32_t l = 0; l < L; l++) {
			uint32_t id = seq_block(src, l, p);
			const struct pool_block *b =
				id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (b && b->remote_published) /* its key is src's publication's */
				return errmsg(err, errlen, -EBUSY, "sequence '%s' was adopted and "
					      "some of its blocks are still in Redis: resume it once, "
					      "then fork", src->name);
		}
	/* The tail page's copy first: it is the part that can fail. */
	uint32_t copy[SEQ_MAX_LAYERS];
	unsigned cls;
	int ret = pool_class(dp->pool, src->block_bytes, &cls);
	if (ret)
		return errmsg(err, errlen, ret, "no slab class for the page size");
	uint32_t made = 0;
	for (; tail && made < L; made++) {
		uint32_t from = seq_block(src, made, full);
		const struct pool_block *fb = from == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, from);
		if (!fb || !fb->committed) {
			ret = errmsg(err, errlen, -EIO, "sequence '%s': layer %u of its tail page %u "
				     "has no committed block", src->name, made, full);
			break;
		}
		if (fb->tier != POOL_TIER_DRAM) {
			ret = errmsg(err, errlen, -EBUSY, "sequence '%s': its tail page is not in DRAM "
				     "(demoted or moving); attach it once, then fork", src->name);
			break;
		}
		if ((ret = dp_block_copy_new(dp, cls, pool_block_data(dp->pool, from),
					     (uint32_t)src->block_bytes, dst->id, made, full,
					     &copy[made]))) {
			ret = errmsg(err, errlen, -EBUSY, "no room in the pool for the tail page's copy");
			break;
		}
	}
	if (ret) {
		while (made--)
			pool_block_free(dp->pool, copy[made]);
		return ret;
	}
	for (uint32_t l = 0; l < L && tail; l++) {
		if ((ret = seq_set_block(dst, l, full, copy[l]))) {
			for (uint32_t m = l; m < L; m++) /* not in dst's map: the undo cannot see them */
				pool_block_free(dp->pool, copy[m]);
			goto undo;
		}
	}
	for (uint32_t p = 0; p < full; p++)
		for (uint32_t l = 0; l < L; l++)
			if ((ret = share_block(dp, dst, l, p, seq_block(src, l, p))))
				goto undo;
	if ((ret = seq_commit(dst, committed, 0, src->tokens, src->n_tokens, SIZE_MAX, err, errlen)))
		goto undo;
	/* It continues src's namespace: its keyed pages are src's; it publishes nothing new. */
	uint32_t keyed = src->n_keys < full ? src->n_keys : full;
	if (src->prefix_ubatch && !grow_keys(dst, keyed)) {
		memcpy(dst->key0, src->key0, sizeof dst->key0);
		if (keyed)
			memcpy(dst->keys, src->keys, (size_t)keyed * sizeof *dst->keys);
		dst->n_keys = keyed;
		dst->prefix_ubatch = src->prefix_ubatch;
		dst->publish_limit = (uint64_t)keyed * P;
	}
	dst->covered_tokens = committed;
	persist_seq_tokens(dp->ps, dst, 0, dst->tokens, dst->n_tokens);
	persist_seq_prefix(dp->ps, dst);
	dp->pxs.forks++;
	dp->pxs.pages_attached += full;
	log_shared(dp, dst, full + tail);
	return 0;
undo:
	for (uint32_t p = 0; p < full + tail; p++)
		for (uint32_t l = 0; l < L; l++)
			dp_block_unref(dp, dst, l, p);
	return errmsg(err, errlen, ret, "out of memory");
}

static int count_shared(void *ctx, uint32_t id, struct pool_block *b)
{
	(void)id;
	struct dp_prefix_stats *st = ctx;
	st->shared_blocks += holders(b) > 1;
	st->cached_blocks += b->indexed && !holders(b);
	return 0;
}

void dp_prefix_stats(struct dp *dp, struct dp_prefix_stats *st)
{
	*st = dp->pxs;
	st->indexed_pages = dp->px.entries;
	st->shared_blocks = st->cached_blocks = 0;
	pool_each(dp->pool, count_shared, st);
}

struct cached {
	uint32_t id;
	uint64_t lru;
};

struct cached_scan {
	struct cached *v;
	size_t n, cap;
};

static int collect_cached(void *ctx, uint32_t id, struct pool_block *b)
{
	struct cached_scan *c = ctx;
	if (!b->indexed || holders(b) || b->leases ||
	    (b->tier != POOL_TIER_DRAM && b->tier != POOL_TIER_NVME && b->tier != POOL_TIER_REMOTE))
		return 0;
	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 256;
		struct cached *v = realloc(c->v, cap * sizeof *v);
		if (!v)
			return 1;
		c->v = v;
		c->cap = cap;
	}
	c->v[c->n++] = (struct cached){ id, b->lru };
	return 0;
}

static int by_lru(const void *a, const void *b)
{
	const struct cached *x = a, *y = b;
	return x->lru < y->lru ? -1 : x->lru > y->lru;
}

uint64_t dp_prefix_evict(struct dp *dp, uint64_t want)
{
	struct cached_scan c = { 0 };
	struct pool_usage u0, u;
	if (!dp->px.entries)
		return 0; /* nothing indexed, nothing cached: no scan of the pool (a full ALLOC
			   * retries this every pass while it waits) */
	pool_each(dp->pool, collect_cached, &c);
	if (c.n)
		qsort(c.v, c.n, sizeof *c.v, by_lru);
	pool_usage(dp->pool, &u0);
	u = u0;
	for (size_t i = 0; i < c.n && u0.blocks - u.blocks < want; i++) {
		const struct pool_block *b = pool_block_get(dp->pool, c.v[i].id);
		if (!b || !b->indexed || holders(b))
			continue; /* went with an entry let go before */
		dp_unindex(dp, c.v[i].id);
		dp->pxs.evicted_pages++;
		pool_usage(dp->pool, &u);
	}
	free(c.v);
	return u0.blocks - u.blocks;
}
