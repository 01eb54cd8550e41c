/* embed — an in-process kvstored for one-off runs. See embed.h. */
#include "embed.h"
#include "errmsg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dataplane.h"
#include "pool.h"
#include "ring.h"
#include "seq.h"

#define EMB_WID 1u
#define EMB_DEFAULT_BYTES (64ull << 20)
#define EMB_MIN_BYTES (4ull << 20)
#define EMB_UNIT (2ull << 20)

struct kvs_embed {
	struct cfg cfg;
	struct seq_table seqs;
	bool seqs_init;
	struct dp *dp;
	struct ring *ring; /* the worker side of the ring dp serves */
	void *base;	   /* the pool, mapped a second time as a worker maps it */
	uint64_t bytes;
	int fd;
};

static struct seq *attached(struct kvs_embed *m, uint64_t id, char *err, size_t errlen)
{
	struct seq *s = seq_find(&m->seqs, id);
	if (!s) {
		errmsg_set(err, errlen, "no sequence %" PRIu64, id);
		return NULL;
	}
	if (s->state != SEQ_ATTACHED || s->worker_id != EMB_WID) {
		errmsg_set(err, errlen, "sequence '%s' is not attached", s->name);
		return NULL;
	}
	return s;
}

int kvs_embed_open_seq(struct kvs_embed *m, const char *name, const uint8_t *fp, size_t fp_len,
		      const struct kvs_geometry *g, bool create, uint64_t *id, char *err,
		      size_t errlen)
{
	struct seq_geometry sg = { g->n_layers, g->n_kv_heads, g->head_dim, g->page_size,
				   g->dtype };
	struct seq *s;
	bool created;
	int ret = seq_open(&m->seqs, name, fp, fp_len, &sg, NULL, 0, m->cfg.max_tokens, create,
			   &s, &created, err, errlen);
	if (ret)
		return ret;
	*id = s->id;
	return 0;
}

int kvs_embed_attach(struct kvs_embed *m, uint64_t id, uint64_t *committed, uint32_t **ids, size_t *n_ids,
		    char *err, size_t errlen)
{
	struct seq *s = seq_find(&m->seqs, id);
	if (!s)
		return errmsg(err, errlen, -ENOENT, "no sequence %" PRIu64, id);
	int ret = seq_attach(s, EMB_WID, err, errlen);
	if (ret)
		return ret;
	*ids = malloc((s->n_tokens ? s->n_tokens : 1) * sizeof **ids);
	if (!*ids) {
		seq_detach(s, EMB_WID, NULL, 0);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	if (s->n_tokens)
		memcpy(*ids, s->tokens, s->n_tokens * sizeof **ids);
	*n_ids = s->n_tokens;
	*committed = s->committed_tokens;
	return 0;
}

/* The checks of kvstored's CommitTokens handler. */
int kvs_embed_commit_tokens(struct kvs_embed *m, uint64_t id, uint64_t committed, uint64_t first,
			   const uint32_t *ids, size_t n, char *err, size_t errlen)
{
	struct seq *s = attached(m, id, err, errlen);
	if (!s)
		return -EPERM;
	if (committed > (uint64_t)s->n_pages * s->geo.page_size)
		return errmsg(err, errlen, -ERANGE,
			      "committed_tokens %" PRIu64 " beyond the %u allocated pages",
			      committed, s->n_pages);
	return seq_commit(s, committed, first, ids, n, m->cfg.max_tokens, err, errlen);
}

/* The CloseSequence handler: detach (the data plane drops our leases and frees blocks never
 * committed), then drop the blocks and the sequence when asked. */
int kvs_embed_close_seq(struct kvs_embed *m, uint64_t id, bool drop, char *err, size_t errlen)
{
	struct seq *s = seq_find(&m->seqs, id);
	uint64_t blocks;
	if (!s)
		return errmsg(err, errlen, -ENOENT, "no sequence %" PRIu64, id);
	if (s->state == SEQ_ATTACHED) {
		dp_worker_detach(m->dp, EMB_WID, s);
		seq_detach(s, EMB_WID, NULL, 0);
	}
	if (!drop)
		return 0;
	int ret = dp_drop_seq(m->dp, s, &blocks, err, errlen);
	if (ret)
		return ret;
	seq_remove(&m->seqs, s);
	return 0;
}

int kvs_embed_ring(struct kvs_embed *m, struct ring_entry *e, unsigned n, char *err, size_t errlen)
{
	if (n > KVS_EMBED_RING_MAX)
		return errmsg(err, errlen, -EINVAL, "embedded ring: %u entries in one call (at most %u)",
			      n, KVS_EMBED_RING_MAX);
	for (unsigned i = 0; i < n; i++)
		e[i].user_data = i;
	int ret = ring_push(m->ring, e, n);
	if (ret < 0 || (unsigned)ret != n)
		return errmsg(err, errlen, ret < 0 ? ret : -EAGAIN,
			      "embedded ring: pushed %d of %u entries", ret, n);
	dp_run(m->dp);
	struct ring_entry c[KVS_EMBED_RING_MAX];
	ret = ring_pop(m->ring, c, n);
	if (ret < 0 || (unsigned)ret != n)
		return errmsg(err, errlen, ret < 0 ? ret : -EPROTO,
			      "embedded ring: %d of %u completions", ret, n);
	for (unsigned i = 0; i < n; i++) {
		if (c[i].user_data >= n)
			return errmsg(err, errlen, -EPROTO,
				      "embedded ring: unexpected completion");
		e[c[i].user_data] = c[i];
	}
	return 0;
}

void kvs_embed_close(struct kvs_embed *m)
{
	if (!m)
		return;
	if (m->base)
		pool_segment_unmap(m->base, m->bytes, m->fd);
	ring_close(m->ring);
	dp_shutdown(m->dp);
	if (m->seqs_init)
		seq_table_shutdown(&m->seqs);
	free(m);
}

int kvs_embed_open(uint64_t pool_bytes, struct kvs_embed **out, uint8_t **base, uint64_t *bytes,
		   char *err, size_t errlen)
{
	static atomic_uint counter;
	*out = NULL;
	struct kvs_embed *m = calloc(1, sizeof *m);
	if (!m)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	m->fd = -1;
	uint64_t want = pool_bytes ? pool_bytes : EMB_DEFAULT_BYTES;
	if (want < EMB_MIN_BYTES)
		want = EMB_MIN_BYTES;
	cfg_defaults(&m->cfg);
	snprintf(m->cfg.shm_name, sizeof m->cfg.shm_name, "/fkv-emb-%d-%u", (int)getpid(),
		 atomic_fetch_add(&counter, 1));
	m->cfg.dram_bytes = (want + EMB_UNIT - 1) / EMB_UNIT * EMB_UNIT;
	m->cfg.lock_memory = false;
	m->cfg.nvme_path[0] = '\0';
	m->cfg.persist = false; /* lives as long as the worker: nothing to restart into */
	m->cfg.group[0] = '\0';
	m->cfg.max_workers = 1;
	m->cfg.ring_entries = 64;
	char ring_name[CFG_STR_MAX + 32] = "";
	int ret = seq_table_init(&m->seqs, m->cfg.max_sequences);
	if (ret) {
		errmsg_set(err, errlen, "embedded store: sequence table: %s", strerror(-ret));
		goto fail;
	}
	m->seqs_init = true;
	char why[256] = "";
	ret = dp_init(&m->dp, &m->cfg, &m->seqs, why, sizeof why);
	if (!ret)
		ret = dp_worker_add(m->dp, EMB_WID, ring_name, sizeof ring_name, why, sizeof why);
	if (!ret)
		ret = ring_open(ring_name, &m->ring, why, sizeof why);
	if (!ret)
		ret = pool_segment_map(dp_pool_name(m->dp), NULL, dp_pool_bytes(m->dp), &m->base,
				       &m->bytes, &m->fd, why, sizeof why);
	if (ret) {
		errmsg_set(err, errlen, "embedded store (%llu MiB pool): %s",
			   (unsigned long long)(m->cfg.dram_bytes >> 20), why[0] ? why : strerror(-ret));
		goto fail;
	}
	/* Both sides are mapped: the names are no longer needed. */
	pool_segment_unlink(dp_pool_name(m->dp), NULL);
	pool_segment_unlink(ring_name, NULL);
	*out = m;
	*base = m->base;
	*bytes = m->bytes;
	return 0;
fail:
	kvs_embed_close(m);
	return ret;
}
