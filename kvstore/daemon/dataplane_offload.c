/* dataplane_offload — the remote tier below NVMe (docs/design.md §8): cold NVMe blocks move to
 * Redis when the NVMe tier passes its high watermark (or on an explicit Demote with remote), and
 * come back into DRAM when a RECALL names them. An offload reads the extent through io_uring
 * (checked against the block's crc32c), hands the bytes to the remote I/O thread
 * (remote_io.h) and, once Redis has them, frees the extent; a fetch reads the value straight into
 * a DRAM slot, checked against the same crc32c. Shares dataplane_priv.h with dataplane.c. */
#include "dataplane.h"
#include "dataplane_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "crc32c.h"
#include "errmsg.h"
#include "log.h"
#include "persist.h"
#include "pool.h"
#include "remote_io.h"
#include "tier.h"

enum { RIO_COOKIE_PUT = 1, RIO_COOKIE_GET = 2, RIO_COOKIE_PFX = 3 };

int dp_remote_start(struct dp *dp, char *err, size_t errlen)
{
	const struct cfg *cfg = dp->cfg;
	if (!cfg->remote_url[0] || !cfg->remote_tier)
		return 0;
	if (!dp->tier)
		return errmsg(err, errlen, -EINVAL, "remote_tier needs an NVMe tier (nvme_path): "
			      "blocks move to Redis from NVMe");
	char id[CFG_STR_MAX + 80];
	remote_default_host_id(cfg->remote_host_id, cfg->shm_name, id, sizeof id);
	struct remote_config rc = { .url = cfg->remote_url, .ns = cfg->remote_namespace,
				    .host_id = id, .timeout_ms = (uint32_t)cfg->remote_timeout_ms,
				    .lease_ms = (uint32_t)cfg->remote_lease_ms };
	return rio_start(&rc, &dp->rio, err, errlen);
}

static struct dp_offload *offload_of(struct dp *dp, uint32_t block)
{
	for (unsigned i = 0; i < DP_OFFLOAD_MAX; i++)
		if (dp->offl[i].buf && dp->offl[i].block == block)
			return &dp->offl[i];
	return NULL;
}

void dp_block_drop_storage(struct dp *dp, uint32_t id, struct pool_block *b)
{
	if (b->tier == POOL_TIER_NVME)
		dp_extent_free(dp, b->nvme_off, b->bytes);
	dp_unkeep(dp, id);
	if (b->remote_id && !b->remote_published && dp->rio &&
	    rio_submit(dp->rio, REMOTE_TIER_DEL, b->remote_id, NULL, 0, NULL, 0, 0, 0))
		log_warn("remote tier busy: block %" PRIu64 " stays in Redis", b->remote_id);
	pool_block_free(dp->pool, id);
}

/* Starts moving NVMe block id to Redis. -EBUSY when every offload slot is taken. */
static int offload_block(struct dp *dp, uint32_t id)
{
	struct pool_block *b = pool_block_get(dp->pool, id);
	struct dp_offload *o = NULL;
	for (unsigned i = 0; i < DP_OFFLOAD_MAX && !o; i++)
		if (!dp->offl[i].buf)
			o = &dp->offl[i];
	if (!o)
		return -EBUSY;
	if (!b || !dp_offload_moves(b))
		return -EINVAL;
	uint32_t len = (b->bytes + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
	void *buf = aligned_alloc(TIER_ALIGN, len);
	if (!buf)
		return -ENOMEM;
	int ret = pool_block_offload_begin(dp->pool, id);
	if (!ret)
		ret = tier_read(dp->tier, buf, b->nvme_off, b->bytes, b->crc,
				(uint64_t)DP_COOKIE_OFFREAD << 32 | id);
	if (ret) {
		if (b->tier == POOL_TIER_OFFLOADING)
			pool_block_offload_end(dp->pool, id, false, 0);
		free(buf);
		return ret;
	}
	*o = (struct dp_offload){ .block = id, .buf = buf };
	dp->offloading++;
	return 0;
}

/* The offload failed at step what: the block stays on NVMe. */
static void offload_failed(struct dp *dp, struct dp_offload *o, const char *what, int status,
			   const char *why)
{
	uint32_t id = o->block;
	if (pool_block_get(dp->pool, id))
		pool_block_offload_end(dp->pool, id, false, 0);
	dp->remote_errors++;
	if (!dp->offload_err_logged)
		log_error("remote tier: moving block %u to Redis failed (%s: %s); it stays on "
			  "NVMe", o->block, what, why && why[0] ? why : strerror(-status));
	dp->offload_err_logged = true;
	/* The watermark's moves pause, longer after each failure: a dead Redis is not hammered. */
	dp->offload_backoff_us = dp->offload_backoff_us ? dp->offload_backoff_us * 2 : 1000000;
	if (dp->offload_backoff_us > 30000000)
		dp->offload_backoff_us = 30000000;
	dp->offload_pause_until_us = dp_now_us() + dp->offload_backoff_us;
	free(o->buf);
	memset(o, 0, sizeof *o);
	dp->offloading--;
	dp_free_if_doomed(dp, id);
}

void dp_offload_read_done(struct dp *dp, const struct tier_result *r)
{
	uint32_t id = (uint32_t)r->cookie;
	struct dp_offload *o = offload_of(dp, id);
	if (!o)
		return;
	if (r->status) {
		if (r->status == -EBADMSG)
			dp->crc_errors++;
		offload_failed(dp, o, "NVMe read", r->status, NULL);
		return;
	}
	struct pool_block *b = pool_block_get(dp->pool, id);
	o->remote_id = ++dp->next_remote_id;
	int ret = rio_submit(dp->rio, REMOTE_TIER_PUT, o->remote_id, NULL, 0, o->buf, b->bytes,
			     b->crc, (uint64_t)RIO_COOKIE_PUT << 32 | id);
	if (ret)
		offload_failed(dp, o, "queue", ret, "the remote tier's queue is full");
}

/* A fetch (RECALL of a block in Redis) finished. */
static void fetch_done(struct dp *dp, uint32_t id, const struct rio_result *res)
{
	struct pool_block *b = pool_block_get(dp->pool, id);
	if (!b || b->tier != POOL_TIER_FETCHING)
		return;
	dp->fetching--;
	if (res->status) {
		pool_block_fetch_end(dp->pool, id, false);
		dp->remote_errors++;
		if (res->status == -EBADMSG) {
			dp->crc_errors++;
			log_error("remote tier: %s", res->err);
		}
		dp_fail_recalls_of(dp, id, res->status);
		if (res->status == -EBADMSG)
			dp_unindex(dp, id);
		dp_free_if_doomed(dp, id);
		return;
	}
	pool_block_fetch_end(dp->pool, id, true);
	uint64_t rid = b->remote_id;
	bool published = b->remote_published;
	b->remote_id = 0;
	b->remote_published = false;
	b->rows = b->rows_crc = 0; /* checksummed afresh from the bytes just read */
	dp_log_block(dp, id);
	dp->fetched++;
	if (!published && rio_submit(dp->rio, REMOTE_TIER_DEL, rid, NULL, 0, NULL, 0, 0, 0))
		log_warn("remote tier busy: block %" PRIu64 " stays in Redis", rid);
	dp_free_if_doomed(dp, id);
}

static void rio_done(void *ctx, const struct rio_result *res)
{
	struct dp *dp = ctx;
	uint32_t id = (uint32_t)res->cookie;
	if (res->cookie >> 32 == RIO_COOKIE_GET) {
		fetch_done(dp, id, res);
		return;
	}
	if (res->cookie >> 32 == RIO_COOKIE_PFX) { /* a prefix page's copy: its buffer is ours */
		free(res->buf);
		if (res->status && !dp->pfx_err_logged)
			log_warn("remote prefix: %s", res->err);
		dp->pfx_err_logged = res->status != 0;
		return;
	}
	if (res->cookie >> 32 != RIO_COOKIE_PUT)
		return; /* a DEL: nothing waits for it */
	struct dp_offload *o = offload_of(dp, id);
	if (!o)
		return;
	if (res->status) {
		offload_failed(dp, o, "Redis write", res->status, res->err);
		return;
	}
	struct pool_block *b = pool_block_get(dp->pool, id);
	uint64_t off = b->nvme_off;
	pool_block_offload_end(dp->pool, id, true, o->remote_id);
	dp_log_block(dp, id);
	dp_extent_free(dp, off, b->bytes); /* reused only after that record is synced */
	dp->offloaded++;
	dp->offload_err_logged = false;
	dp->offload_backoff_us = 0;
	free(o->buf);
	memset(o, 0, sizeof *o);
	dp->offloading--;
	dp_free_if_doomed(dp, id);
}

int dp_fetch_start(struct dp *dp, uint32_t id)
{
	struct pool_block *b = pool_block_get(dp->pool, id);
	if (!dp->rio)
		return -EIO;
	char key[256], *kp = NULL;
	if (b->remote_published) { /* adopted on demand: the publisher's key */
		const struct seq *s = seq_find(dp->seqs, b->seq_id);
		if (!s)
			return -EIO;
		rio_published_key(dp->rio, s->name, s->remote_gen, b->layer, b->page, key,
				  sizeof key);
		kp = key;
	}
	int ret = pool_block_fetch_begin(dp->pool, id);
	if (ret)
		return ret; /* -ENOSPC: the caller makes room */
	ret = rio_submit(dp->rio, REMOTE_TIER_GET, b->remote_id, kp, 0, pool_block_data(dp->pool, id),
			 b->bytes, b->crc, (uint64_t)RIO_COOKIE_GET << 32 | id);
	if (ret) {
		pool_block_fetch_end(dp->pool, id, false);
		return -EBUSY;
	}
	dp->fetching++;
	return 0;
}

void dp_prefix_remote_put(struct dp *dp, const uint8_t key[32], const uint32_t *blocks,
			  uint32_t n_layers)
{
	if (!dp->rio || !dp->cfg->remote_prefix)
		return;
	for (uint32_t l = 0; l < n_layers; l++) {
		const struct pool_block *b = pool_block_get(dp->pool, blocks[l]);
		if (!b || b->tier != POOL_TIER_DRAM)
			return; /* a page all of whose layers can be copied now, or none */
	}
	for (uint32_t l = 0; l < n_layers; l++) {
		const struct pool_block *b = pool_block_get(dp->pool, blocks[l]);
		void *copy = malloc(b->bytes);
		char k[256];
		if (!copy)
			return;
		memcpy(copy, pool_block_data(dp->pool, blocks[l]), b->bytes);
		rio_prefix_key(dp->rio, key, l, k, sizeof k);
		if (rio_submit(dp->rio, REMOTE_TIER_PUT, 0, k,
			       (uint32_t)dp->cfg->remote_prefix_ttl_s, copy, b->bytes,
			       crc32c(0, copy, b->bytes), (uint64_t)RIO_COOKIE_PFX << 32)) {
			free(copy);
			return;
		}
	}
	dp->pxs.remote_published++;
}

bool dp_has_remote_tier(const struct dp *dp)
{
	return dp->rio != NULL;
}

int dp_seq_import_published(struct dp *dp, struct seq *s, uint32_t pages, char *err,
			    size_t errlen)
{
	unsigned cls;
	int ret = pool_class(dp->pool, s->block_bytes, &cls);
	if (ret)
		return errmsg(err, errlen, ret, "no slab class for the page size");
	for (uint32_t p = 0; p < pages && !ret; p++)
		for (uint32_t l = 0; l < s->geo.n_layers && !ret; l++) {
			uint32_t id;
			if ((ret = pool_block_adopt_remote(dp->pool, cls, 0, 0, &id))) {
				ret = errmsg(err, errlen, ret, "out of block descriptors");
				break;
			}
			struct pool_block *b = pool_block_get(dp->pool, id);
			b->has_crc = false; /* the value carries its own, checked when it is read */
			b->remote_published = true;
			b->seq_id = s->id;
			b->layer = l;
			b->page = p;
			b->refs = 1;
			if ((ret = seq_set_block(s, l, p, id))) {
				pool_block_free(dp->pool, id);
				ret = errmsg(err, errlen, ret, "out of memory");
			}
		}
	if (ret) {
		for (uint32_t p = 0; p < pages; p++)
			for (uint32_t l = 0; l < s->geo.n_layers; l++)
				dp_block_unref(dp, s, l, p);
		return ret;
	}
	for (uint32_t p = 0; p < pages; p++)
		for (uint32_t l = 0; l < s->geo.n_layers; l++)
			persist_block(dp->ps, dp->pool, s, seq_block(s, l, p));
	persist_seq_committed(dp->ps, s);
	return 0;
}

int dp_remote_fd(const struct dp *dp)
{
	return dp->rio ? rio_eventfd(dp->rio) : -1;
}

int dp_remote_reap(struct dp *dp)
{
	return dp->rio ? rio_reap(dp->rio, rio_done, dp) : 0;
}

/* NVMe victims for the remote tier: committed, settled on NVMe, ranked as demotion ranks DRAM
 * blocks (a detached sequence's or a cached page first), then least recently used. */
struct nvme_victims {
	struct dp *dp;
	uint32_t ids[DP_OFFLOAD_MAX];
	uint64_t key[DP_OFFLOAD_MAX];	/* rank << 56 | lru: smaller goes first */
	size_t n, max;
};

static int pick_nvme(void *ctx, uint32_t id, struct pool_block *b)
{
	struct nvme_victims *v = ctx;
	if (!dp_offload_moves(b))
		return 0;
	int rank = dp_rank_victim(v->dp, b);
	if (rank < 0)
		return 0;
	uint64_t key = (uint64_t)rank << 56 | (b->lru & ((1ull << 56) - 1));
	size_t at = v->n;
	if (v->n == v->max) {
		if (key >= v->key[v->n - 1])
			return 0;
		at = --v->n;
	}
	while (at > 0 && v->key[at - 1] > key) {
		v->key[at] = v->key[at - 1];
		v->ids[at] = v->ids[at - 1];
		at--;
	}
	v->key[at] = key;
	v->ids[at] = id;
	v->n++;
	return 0;
}

void dp_offload_watermark(struct dp *dp)
{
	if (!dp->rio || dp->offloading >= DP_OFFLOAD_MAX || dp_now_us() < dp->offload_pause_until_us)
		return;
	struct tier_usage tu;
	tier_usage(dp->tier, &tu);
	struct pool_usage u;
	pool_usage(dp->pool, &u);
	/* Kept copies of DRAM blocks are not what fills the tier: they go first when it is full. */
	tu.used_bytes -= u.kept_bytes < tu.used_bytes ? u.kept_bytes : tu.used_bytes;
	if (!tu.bytes || tu.used_bytes * 100 <= tu.bytes * dp->cfg->nvme_high_watermark)
		return;
	uint64_t target = tu.bytes / 100 * dp->cfg->nvme_low_watermark;
	uint64_t per = u.blocks_nvme ? tu.used_bytes / (u.blocks_nvme + dp->offloading) : 0;
	if (!per)
		return;
	uint64_t want = (tu.used_bytes - target) / per + 1;
	struct nvme_victims v = { .dp = dp, .max = DP_OFFLOAD_MAX - dp->offloading };
	if (want < v.max)
		v.max = want;
	pool_each(dp->pool, pick_nvme, &v);
	for (size_t i = 0; i < v.n; i++)
		if (offload_block(dp, v.ids[i]))
			break;
	tier_flush(dp->tier);
}

int dp_offload_seq(struct dp *dp, struct seq *s, uint64_t *blocks, char *err, size_t errlen)
{
	*blocks = 0;
	if (!dp->rio)
		return errmsg(err, errlen, -ENODEV, "no remote tier (remote_url with remote_tier = "
			      "true)");
	bool more = false;
	for (uint32_t l = 0; l < s->geo.n_layers; l++)
		for (uint32_t p = 0; p < s->n_pages; p++) {
			uint32_t id = seq_block(s, l, p);
			const struct pool_block *b =
				id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
			if (!b || !dp_offload_moves(b))
				continue;
			++*blocks;
			if (!more && offload_block(dp, id))
				more = true;
		}
	tier_flush(dp->tier);
	if (more) /* the rest as offload slots come free */
		dp_queue_add(dp->offload_q, &dp->n_offload_q, s->id);
	return 0;
}

void dp_offload_queue_run(struct dp *dp)
{
	size_t keep = 0;
	for (size_t i = 0; i < dp->n_offload_q; i++) {
		struct seq *s = seq_find(dp->seqs, dp->offload_q[i]);
		bool more = false;
		for (uint32_t l = 0; s && l < s->geo.n_layers && !more; l++)
			for (uint32_t p = 0; p < s->n_pages && !more; p++) {
				uint32_t id = seq_block(s, l, p);
				const struct pool_block *b =
					id == SEQ_NO_BLOCK ? NULL : pool_block_get(dp->pool, id);
				if (b && dp_offload_moves(b) && offload_block(dp, id))
					more = true;
			}
		if (more)
			dp->offload_q[keep++] = dp->offload_q[i];
	}
	dp->n_offload_q = keep;
	tier_flush(dp->tier);
}

void dp_remote_stop(struct dp *dp)
{
	if (!dp->rio)
		return;
	rio_drain(dp->rio, 2000, rio_done, dp);
	rio_stop(dp->rio);
	dp->rio = NULL;
	for (unsigned i = 0; i < DP_OFFLOAD_MAX; i++) {
		free(dp->offl[i].buf);
		dp->offl[i].buf = NULL;
	}
}
