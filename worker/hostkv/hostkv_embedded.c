/* hostkv_embedded — the hostkv store ops over an in-process kvstored (kvstore/daemon/embed.h):
 * one-off runs get the daemon's own sequence table and data plane, with no daemon. Each op is
 * the embed call of the same name. See hostkv_impl.h. */
#include "embed.h"
#include "hostkv_impl.h"

_Static_assert(HOSTKV_RING_BATCH <= KVS_EMBED_RING_MAX, "a ring op batch must fit the embed ring");

static int e_open_seq(void *st, const char *name, const uint8_t *fp, size_t fp_len,
		      const struct kvs_geometry *g, bool create, const struct hostkv_prefix *px,
		      uint64_t *id, char *err, size_t errlen)
{
	(void)px; /* sequences live as long as the handle: nothing to share */
	return kvs_embed_open_seq(st, name, fp, fp_len, g, create, id, err, errlen);
}

static int e_attach(void *st, uint64_t id, uint64_t *committed, uint32_t **ids, size_t *n_ids,
		    char *err, size_t errlen)
{
	return kvs_embed_attach(st, id, committed, ids, n_ids, err, errlen);
}

static int e_commit_tokens(void *st, uint64_t id, uint64_t committed, uint64_t first,
			   const uint32_t *ids, size_t n, char *err, size_t errlen)
{
	return kvs_embed_commit_tokens(st, id, committed, first, ids, n, err, errlen);
}

static int e_close_seq(void *st, uint64_t id, bool drop, char *err, size_t errlen)
{
	return kvs_embed_close_seq(st, id, drop, err, errlen);
}

static int e_ring(void *st, struct ring_entry *e, unsigned n, char *err, size_t errlen)
{
	return kvs_embed_ring(st, e, n, err, errlen);
}

static void e_close(void *st)
{
	kvs_embed_close(st);
}

static const struct hostkv_store_ops embedded_ops = {
	.name = "embedded",
	.open_seq = e_open_seq,
	.attach = e_attach,
	.commit_tokens = e_commit_tokens,
	.close_seq = e_close_seq,
	.ring = e_ring,
	.close = e_close,
};

int hostkv_embedded_open(const struct hostkv_opts *o, const struct hostkv_store_ops **ops,
			 void **st, uint8_t **base, uint64_t *bytes, char *err, size_t errlen)
{
	struct kvs_embed *m;
	int ret = kvs_embed_open(o->embedded_bytes, &m, base, bytes, err, errlen);
	if (ret)
		return ret;
	*ops = &embedded_ops;
	*st = m;
	return 0;
}
