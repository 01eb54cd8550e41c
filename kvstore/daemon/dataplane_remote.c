/* dataplane_remote — the data plane's side of the remote tier (docs/design.md §8): copying a
 * sequence's committed blocks out (to publish them) and installing blocks adopted from another
 * host. Shares dataplane_priv.h with dataplane.c. */
#include "dataplane.h"
#include "dataplane_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "errmsg.h"
#include "persist.h"
#include "pool.h"
#include "remote.h"
#include "remote_io.h"
#include "tier.h"

void dp_blocks_free(struct remote_block *b, size_t n)
{
	for (size_t i = 0; b && i < n; i++)
		free(b[i].data);
	free(b);
}

/* The bytes of an NVMe-resident block, read beside the io_uring traffic (its extent does not
 * move while the caller holds the lock) and checked against its crc32c. */
static int read_nvme(struct dp *dp, const struct pool_block *b, void *out, char *err,
		     size_t errlen)
{
	size_t len = (b->bytes + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
	void *bounce = aligned_alloc(TIER_ALIGN, len);
	if (!bounce)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	ssize_t got = pread(tier_fd(dp->tier), bounce, len, (off_t)b->nvme_off);
	int ret = 0;
	if (got != (ssize_t)len)
		ret = errmsg(err, errlen, got < 0 ? -errno : -EIO, "NVMe read at %" PRIu64 " failed",
			     b->nvme_off);
	else if (b->has_crc && crc32c(0, bounce, b->bytes) != b->crc)
		ret = errmsg(err, errlen, -EBADMSG, "NVMe extent %" PRIu64 " fails its checksum",
			     b->nvme_off);
	else
		memcpy(out, bounce, b->bytes);
	free(bounce);
	return ret;
}

/* A GET of REMOTE block pb into x->data: its tier key, or the publisher's key of a block
 * adopted on demand (as dp_fetch_start reads it). */
static void fetch_op(struct dp *dp, const struct seq *s, const struct pool_block *pb,
		     const struct remote_block *x, struct remote_tier_op *o)
{
	memset(o, 0, sizeof *o);
	o->kind = REMOTE_TIER_GET;
	o->id = pb->remote_id;
	o->crc = pb->crc;
	o->buf = x->data;
	o->len = x->len;
	if (pb->remote_published)
		rio_published_key(dp->rio, s->name, s->remote_gen, pb->layer, pb->page, o->key,
				  sizeof o->key);
}

int dp_seq_export(struct dp *dp, const struct seq *s, struct remote_block **out, size_t *n,
		  struct remote_tier_op **fetch, size_t *n_fetch, char *err, size_t errlen)
{
	uint32_t P = s->geo.page_size, L = s->geo.n_layers;
	uint32_t pages = (uint32_t)((s->committed_tokens + P - 1) / P);
	size_t total = (size_t)L * pages;
	struct remote_block *b = calloc(total ? total : 1, sizeof *b);
	*fetch = NULL;
	*n_fetch = 0;
	if (!b)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	int ret = 0;
	size_t nf = 0;
	for (size_t i = 0; i < total; i++) {
		const struct pool_block *pb = pool_block_get(dp->pool, seq_block(s, (uint32_t)(i % L),
										   (uint32_t)(i / L)));
		nf += pb && pb->tier == POOL_TIER_REMOTE;
	}
	struct remote_tier_op *f = nf ? calloc(nf, sizeof *f) : NULL;
	if (nf && !f) {
		free(b);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	nf = 0;
	for (uint32_t p = 0; p < pages && !ret; p++) {
		for (uint32_t l = 0; l < L && !ret; l++) {
			struct remote_block *x = &b[(size_t)p * L + l];
			uint32_t id = seq_block(s, l, p);
			const struct pool_block *pb = id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (!pb || !pb->committed) {
				ret = errmsg(err, errlen, -EIO, "sequence '%s': (layer %u, page %u) has "
					     "no committed block", s->name, l, p);
				break;
			}
			*x = (struct remote_block){ l, p, malloc(s->block_bytes), (uint32_t)s->block_bytes };
			if (!x->data) {
				ret = errmsg(err, errlen, -ENOMEM, "out of memory");
				break;
			}
			const void *dram = pb->tier == POOL_TIER_DRAM || pb->tier == POOL_TIER_DEMOTING
					   ? pool_block_data(dp->pool, id) : NULL;
			if (dram)
				memcpy(x->data, dram, s->block_bytes);
			else if (dp->tier && pb->nvme_off != POOL_NO_OFFSET &&
				 (pb->tier == POOL_TIER_NVME || pb->tier == POOL_TIER_PROMOTING ||
				  pb->tier == POOL_TIER_OFFLOADING))
				ret = read_nvme(dp, pb, x->data, err, errlen);
			else if (pb->tier == POOL_TIER_REMOTE && dp->rio)
				fetch_op(dp, s, pb, x, &f[nf++]);
			else if (pb->tier == POOL_TIER_REMOTE)
				ret = errmsg(err, errlen, -EIO, "sequence '%s': (layer %u, page %u) is "
					     "in Redis, and this daemon runs without remote_tier", s->name,
					     l, p);
			else
				ret = errmsg(err, errlen, -EBUSY, "sequence '%s': a block is moving; try "
					     "again", s->name);
		}
	}
	if (ret) {
		dp_blocks_free(b, total);
		free(f);
		return ret;
	}
	*out = b;
	*n = total;
	*fetch = f;
	*n_fetch = nf;
	return 0;
}

int dp_seq_import(struct dp *dp, struct seq *s, const struct remote_block *b, size_t n,
		  char *err, size_t errlen)
{
	unsigned cls;
	int ret = pool_class(dp->pool, s->block_bytes, &cls);
	if (ret)
		return errmsg(err, errlen, ret, "no slab class for the page size");
	size_t i = 0;
	for (; i < n; i++) {
		uint32_t id;
		if (b[i].len != s->block_bytes || b[i].layer >= s->geo.n_layers) {
			ret = errmsg(err, errlen, -EINVAL, "block (layer %u, page %u) does not fit the "
				     "geometry", b[i].layer, b[i].page);
			break;
		}
		if ((ret = dp_block_copy_new(dp, cls, b[i].data, b[i].len, s->id, b[i].layer,
					     b[i].page, &id))) {
			ret = errmsg(err, errlen, ret, "no room in the pool for %zu blocks (%zu taken)",
				     n, i);
			break;
		}
		if ((ret = seq_set_block(s, b[i].layer, b[i].page, id))) {
			pool_block_free(dp->pool, id);
			ret = errmsg(err, errlen, ret, "out of memory");
			break;
		}
	}
	if (ret) {
		while (i--)
			dp_block_unref(dp, s, b[i].layer, b[i].page);
		return ret;
	}
	for (i = 0; i < n; i++)
		persist_block(dp->ps, dp->pool, s, seq_block(s, b[i].layer, b[i].page));
	persist_seq_committed(dp->ps, s);
	return 0;
}
