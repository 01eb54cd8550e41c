/* remote_seq — sequences across hosts. See remote_seq.h. */
#include "remote_seq.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "dataplane.h"
#include "errmsg.h"
#include "log.h"
#include "persist.h"

int remote_seq_init(struct remote_seq *x, const struct cfg *cfg, struct dp *dp,
		    struct seq_table *seqs, struct persist *ps, char *err, size_t errlen)
{
	memset(x, 0, sizeof *x);
	x->dp = dp;
	x->seqs = seqs;
	x->ps = ps;
	x->lease_ms = (uint32_t)cfg->remote_lease_ms;
	if (!cfg->remote_url[0])
		return 0;
	if (cfg->remote_prefix && !cfg->remote_tier)
		return errmsg(err, errlen, -EINVAL, "remote_prefix needs remote_tier (its writes go "
			      "through the tier's I/O thread)");
	x->prefix = cfg->remote_prefix;
	x->prefix_ttl_s = (uint32_t)cfg->remote_prefix_ttl_s;
	char id[CFG_STR_MAX + 80];
	remote_default_host_id(cfg->remote_host_id, cfg->shm_name, id, sizeof id);
	struct remote_config rc = { .url = cfg->remote_url, .ns = cfg->remote_namespace,
				    .host_id = id, .timeout_ms = (uint32_t)cfg->remote_timeout_ms,
				    .lease_ms = (uint32_t)cfg->remote_lease_ms };
	return remote_open(&rc, &x->r, err, errlen);
}

void remote_seq_close(struct remote_seq *x)
{
	remote_close(x->r);
	x->r = NULL;
}

static int no_remote(char *err, size_t errlen)
{
	return errmsg(err, errlen, -ENODEV, "no remote tier configured (remote_url is empty)");
}

/* Reads a publish's blocks that are in Redis (pipelined, each checked). A tier block that left
 * the tier meanwhile (recalled by a sharer, or dropped) fails the publish with -EAGAIN: nothing
 * was written yet, and a second try finds it in DRAM. A block adopted on demand whose
 * publisher's copy is gone (another host published the name again) fails it with -ESTALE. */
static int fetch_tier_blocks(struct remote *r, const char *name, struct remote_tier_op *ops,
			     size_t n, char *err, size_t errlen)
{
	remote_tier_batch(r, ops, n);
	for (size_t i = 0; i < n; i++) {
		if (ops[i].status == -ENOENT && ops[i].key[0])
			return errmsg(err, errlen, -ESTALE, "sequence '%s': the copy this host "
				      "adopted is no longer in Redis (%s): another host published "
				      "it since", name, ops[i].err);
		if (ops[i].status == -ENOENT)
			return errmsg(err, errlen, -EAGAIN, "sequence '%s': a block left the remote "
				      "tier while it was read for the publish (%s); try again",
				      name, ops[i].err);
		if (ops[i].status)
			return errmsg(err, errlen, ops[i].status, "sequence '%s': %s", name,
				      ops[i].err);
	}
	return 0;
}

int remote_seq_publish(struct remote_seq *x, struct seq *s, uint64_t *blocks, uint64_t *bytes,
		       char *err, size_t errlen)
{
	if (!x->r)
		return no_remote(err, errlen);
	struct remote_block *b = NULL;
	struct remote_tier_op *fetch = NULL;
	size_t n = 0, n_fetch = 0;
	int ret = dp_seq_export(x->dp, s, &b, &n, &fetch, &n_fetch, err, errlen);
	if (ret)
		return ret;
	struct remote_meta m = { .geo = s->geo, .fp_len = s->fp_len, .committed = s->committed_tokens,
				 .n_tokens = s->n_tokens };
	memcpy(m.fp, s->fp, s->fp_len);
	snprintf(m.host, sizeof m.host, "%s", remote_host_id(x->r));
	m.tokens = malloc(s->n_tokens * sizeof *m.tokens + 1);
	if (!m.tokens) {
		dp_blocks_free(b, n);
		free(fetch);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	if (s->n_tokens)
		memcpy(m.tokens, s->tokens, s->n_tokens * sizeof *m.tokens);
	char name[SEQ_NAME_MAX];
	snprintf(name, sizeof name, "%s", s->name);
	uint32_t layers = s->geo.n_layers;

	dp_unlock(x->dp); /* Redis I/O: the data plane goes on */
	struct remote_meta old;
	uint64_t old_gen = 0;
	bool had = false;
	/* This host must be allowed to own the name: nobody else holds its lease. */
	ret = remote_lease(x->r, name, err, errlen);
	bool leased = !ret;
	if (!ret) {
		ret = remote_get_meta(x->r, name, &old, err, errlen);
		if (!ret) {
			had = true;
			old_gen = old.gen;
			free(old.tokens);
		} else if (ret == -ENOENT) {
			ret = 0;
		}
	}
	m.gen = old_gen + 1;
	if (!ret && n_fetch) /* blocks in the tier below NVMe: read back and checked first */
		ret = fetch_tier_blocks(x->r, name, fetch, n_fetch, err, errlen);
	if (!ret)
		ret = remote_put_blocks(x->r, name, m.gen, b, n, err, errlen);
	if (!ret)
		ret = remote_put_meta(x->r, name, &m, err, errlen);
	if (!ret && had)
		remote_drop_blocks(x->r, name, old_gen, layers, (uint32_t)(old.committed + old.geo.page_size - 1) /
				   (old.geo.page_size ? old.geo.page_size : 1));
	if (!ret)
		ret = remote_unlease(x->r, name, err, errlen); /* handed over */
	else if (leased && s->remote != SEQ_REMOTE_OWNED)
		remote_unlease(x->r, name, NULL, 0); /* taken above for this try only */
	dp_lock(x->dp);

	if (!ret) {
		s->remote = SEQ_REMOTE_PUBLISHED;
		s->remote_gen = m.gen;
		persist_seq_remote(x->ps, s);
		x->published++;
		*blocks = n;
		*bytes = (uint64_t)n * s->block_bytes;
		log_info("sequence '%s' published to %s: generation %" PRIu64 ", %zu blocks, %" PRIu64
			 " tokens", name, remote_url(x->r), m.gen, n, m.committed);
	}
	free(m.tokens);
	dp_blocks_free(b, n);
	free(fetch);
	return ret;
}

static const char *dtype_name(uint32_t d)
{
	return d == SEQ_DTYPE_F32 ? "f32" : d == SEQ_DTYPE_F16 ? "f16" : d == SEQ_DTYPE_BF16 ? "bf16"
										     : "?";
}

int remote_seq_adopt(struct remote_seq *x, const char *name, const uint8_t *fp, size_t fp_len,
		     const struct seq_geometry *g, bool has_owner, uint32_t owner_uid,
		     struct seq **out, char *err, size_t errlen)
{
	if (!x->r)
		return errmsg(err, errlen, -ENOENT, "no sequence '%s'", name);
	struct remote_meta m;
	struct remote_block *b = NULL;
	size_t n = 0;
	dp_unlock(x->dp);
	int ret = remote_get_meta(x->r, name, &m, err, errlen);
	if (ret == -ENOENT)
		ret = errmsg(err, errlen, -ENOENT, "no sequence '%s' (here or in %s)", name,
			     remote_url(x->r));
	if (!ret && (m.fp_len != fp_len || memcmp(m.fp, fp, fp_len)))
		ret = errmsg(err, errlen, -EEXIST, "sequence '%s' in %s has a different model "
			     "fingerprint", name, remote_url(x->r));
	if (!ret && memcmp(&m.geo, g, sizeof *g))
		ret = errmsg(err, errlen, -EEXIST, "sequence '%s' in %s has another geometry: %u "
			     "layers, %u KV heads, head dim %u, page %u, %s", name, remote_url(x->r),
			     m.geo.n_layers, m.geo.n_kv_heads, m.geo.head_dim, m.geo.page_size,
			     dtype_name(m.geo.dtype));
	if (!ret && seq_check_geometry(&m.geo, err, errlen))
		ret = -EBADMSG;
	if (!ret && m.committed > (uint64_t)m.n_tokens)
		ret = errmsg(err, errlen, -EBADMSG, "sequence '%s' in %s: %" PRIu64 " committed "
			     "tokens but %zu ids", name, remote_url(x->r), m.committed, m.n_tokens);
	bool leased = false;
	if (!ret && !(ret = remote_lease(x->r, name, err, errlen)))
		leased = true;
	uint64_t bb = seq_block_bytes(&m.geo);
	uint32_t pages = ret ? 0 : (uint32_t)((m.committed + m.geo.page_size - 1) / m.geo.page_size);
	/* With a tier below NVMe the blocks stay in Redis until a RECALL reads them. */
	bool lazy = dp_has_remote_tier(x->dp);
	if (!ret && !lazy) {
		n = (size_t)m.geo.n_layers * pages;
		b = calloc(n ? n : 1, sizeof *b);
		if (!b)
			ret = errmsg(err, errlen, -ENOMEM, "out of memory");
		for (size_t i = 0; !ret && i < n; i++) {
			b[i] = (struct remote_block){ (uint32_t)(i % m.geo.n_layers),
						      (uint32_t)(i / m.geo.n_layers), malloc(bb),
						      (uint32_t)bb };
			if (!b[i].data)
				ret = errmsg(err, errlen, -ENOMEM, "out of memory");
		}
	}
	if (!ret && !lazy)
		ret = remote_get_blocks(x->r, name, m.gen, b, n, err, errlen);
	if (ret && leased)
		remote_unlease(x->r, name, NULL, 0);
	dp_lock(x->dp);

	struct seq *s = NULL;
	if (!ret) {
		bool created;
		ret = seq_open(x->seqs, name, m.fp, m.fp_len, &m.geo, m.tokens, m.n_tokens, SIZE_MAX,
			       true, &s, &created, err, errlen);
		if (!ret && !created) /* opened here meanwhile: cannot be, the control plane is one */
			ret = errmsg(err, errlen, -EEXIST, "sequence '%s' exists", name);
	}
	if (!ret) {
		s->has_owner = has_owner;
		s->owner_uid = owner_uid;
		s->committed_tokens = m.committed;
		s->remote_gen = m.gen;
		persist_seq_open(x->ps, s);
		ret = lazy ? dp_seq_import_published(x->dp, s, pages, err, errlen)
			   : dp_seq_import(x->dp, s, b, n, err, errlen);
		if (ret) {
			s->committed_tokens = 0;
			persist_seq_remove(x->ps, s);
			seq_remove(x->seqs, s);
			s = NULL;
		}
	}
	if (!ret) {
		s->remote = SEQ_REMOTE_OWNED;
		s->remote_gen = m.gen;
		persist_seq_remote(x->ps, s);
		x->adopted++;
		log_info("sequence '%s' adopted from %s (published by %s, generation %" PRIu64 "): %"
			 PRIu64 " tokens, %u pages%s", name, remote_url(x->r), m.host, m.gen,
			 m.committed, pages, lazy ? ", read from Redis as they are recalled" : "");
		*out = s;
	} else if (leased && s == NULL) {
		dp_unlock(x->dp);
		remote_unlease(x->r, name, NULL, 0);
		dp_lock(x->dp);
	}
	dp_blocks_free(b, n);
	free(m.tokens);
	return ret;
}

void remote_seq_prefix_extend(struct remote_seq *x, struct seq *s, size_t n_prompt)
{
	if (!x->r || !x->prefix)
		return;
	uint32_t first = s->n_keys, max = dp_prefix_ahead(x->dp, s, n_prompt);
	if (max <= first)
		return;
	uint32_t L = s->geo.n_layers;
	size_t n = (size_t)(max - first) * L;
	struct remote_tier_op *ops = calloc(n, sizeof *ops);
	struct remote_block *b = calloc(n, sizeof *b);
	bool ok = ops && b;
	for (size_t i = 0; ok && i < n; i++) {
		uint32_t p = first + (uint32_t)(i / L), l = (uint32_t)(i % L);
		ops[i].kind = REMOTE_TIER_GET;
		ops[i].ttl_s = x->prefix_ttl_s; /* a page found lives on */
		ops[i].len = (uint32_t)s->block_bytes;
		ops[i].buf = malloc(s->block_bytes);
		ok = ops[i].buf != NULL;
		remote_prefix_key(x->r, s->keys[p], l, ops[i].key, sizeof ops[i].key);
		b[i] = (struct remote_block){ l, p, ops[i].buf, ops[i].len };
	}
	uint64_t id = s->id;
	if (ok) {
		dp_unlock(x->dp);
		remote_tier_batch(x->r, ops, n);
		dp_lock(x->dp);
	}
	/* Leading pages every layer of which came back. */
	uint32_t got = 0;
	while (ok && got < max - first) {
		bool page = true;
		for (uint32_t l = 0; l < L; l++)
			page &= ops[(size_t)got * L + l].status == 0;
		if (!page)
			break;
		got++;
	}
	char err[256];
	if (ok && got && (s = seq_find(x->seqs, id)) &&
	    dp_prefix_attach_remote(x->dp, s, n_prompt, got, b, err, sizeof err))
		log_warn("sequence '%s': pages found in Redis not attached: %s", s->name, err);
	for (size_t i = 0; ok && i < n; i++)
		if (ops[i].status && ops[i].status != -ENOENT) {
			log_warn("remote prefix lookup: %s", ops[i].err);
			break;
		}
	for (size_t i = 0; ops && i < n; i++)
		free(ops[i].buf);
	free(ops);
	free(b);
}

int remote_seq_claim(struct remote_seq *x, struct seq *s, char *err, size_t errlen)
{
	/* Published: the lease is taken back. Owned: it is checked (it may have lapsed while this
	 * daemon was down, and another host may have published since). */
	if (s->remote == SEQ_REMOTE_NONE)
		return 0;
	if (!x->r)
		return no_remote(err, errlen);
	char name[SEQ_NAME_MAX];
	snprintf(name, sizeof name, "%s", s->name);
	struct remote_meta m;
	dp_unlock(x->dp);
	int ret = remote_lease(x->r, name, err, errlen);
	if (!ret) {
		ret = remote_get_meta(x->r, name, &m, err, errlen);
		if (!ret) {
			free(m.tokens);
			if (m.gen != s->remote_gen)
				ret = errmsg(err, errlen, -ESTALE, "sequence '%s' was published again "
					     "by %s (generation %" PRIu64 ", this copy is %" PRIu64
					     "): evict it here and resume to adopt that copy", name,
					     m.host, m.gen, s->remote_gen);
		} else if (ret == -ENOENT) {
			ret = 0; /* removed from Redis: this copy is the one */
		}
		if (ret)
			remote_unlease(x->r, name, NULL, 0);
	}
	dp_lock(x->dp);
	if (!ret) {
		s->remote = SEQ_REMOTE_OWNED;
		persist_seq_remote(x->ps, s);
	}
	return ret;
}

void remote_seq_release(struct remote_seq *x, struct seq *s)
{
	if (!x->r || s->remote != SEQ_REMOTE_OWNED)
		return;
	char name[SEQ_NAME_MAX], err[256];
	snprintf(name, sizeof name, "%s", s->name);
	s->remote = SEQ_REMOTE_NONE;
	dp_unlock(x->dp);
	if (remote_unlease(x->r, name, err, sizeof err))
		log_warn("giving back the lease on '%s': %s (it expires by itself)", name, err);
	dp_lock(x->dp);
}

void remote_seq_tick(struct remote_seq *x)
{
	uint64_t now = clock_ms();
	if (!x->r || now - x->last_renew_ms < x->lease_ms / 3)
		return;
	x->last_renew_ms = now;
	size_t n = 0;
	for (size_t i = 0; i < x->seqs->n; i++)
		n += x->seqs->v[i]->remote == SEQ_REMOTE_OWNED;
	if (!n)
		return;
	char (*names)[SEQ_NAME_MAX] = malloc(n * sizeof *names);
	const char **v = malloc(n * sizeof *v);
	if (!names || !v) {
		free(names);
		free(v);
		return;
	}
	size_t k = 0;
	for (size_t i = 0; i < x->seqs->n && k < n; i++)
		if (x->seqs->v[i]->remote == SEQ_REMOTE_OWNED) {
			snprintf(names[k], SEQ_NAME_MAX, "%s", x->seqs->v[i]->name);
			v[k] = names[k];
			k++;
		}
	dp_unlock(x->dp);
	size_t renewed = remote_renew(x->r, v, k);
	dp_lock(x->dp);
	if (renewed < k)
		log_warn("renewed %zu of %zu leases in %s", renewed, k, remote_url(x->r));
	free(names);
	free(v);
}

void remote_seq_stats(const struct remote_seq *x, struct remote_seq_stats *st)
{
	memset(st, 0, sizeof *st);
	if (x->r)
		remote_stats(x->r, &st->io);
	st->published = x->published;
	st->adopted = x->adopted;
	for (size_t i = 0; i < x->seqs->n; i++)
		st->owned += x->seqs->v[i]->remote == SEQ_REMOTE_OWNED;
}
