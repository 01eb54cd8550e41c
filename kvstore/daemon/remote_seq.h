/* remote_seq — whole sequences across hosts (docs/design.md §8 "Beyond one host"): publish a
 * detached sequence to Redis and hand its name over; adopt one that another host published;
 * the lease that keeps two hosts from decoding one name at once.
 *
 * A host owns a name while it holds the name's Redis lease (remote.h), renewed by
 * remote_seq_tick. Publishing writes a new generation of the sequence (blocks, then metadata)
 * and gives the lease back: the name may now be adopted elsewhere. Adopting (an OpenSequence of
 * a name this daemon does not know, with create = false: `kvworker resume`) takes the lease,
 * pulls the metadata and every committed block (checked against its crc32c: -EBADMSG, never
 * wrong KV), and makes a local sequence of them. Attaching a sequence this host published takes
 * the lease back; it fails with -EBUSY while another host holds it and with -ESTALE when
 * another host published a newer generation since. Dropping an owned sequence gives the lease
 * back.
 *
 * Every call is made by the control plane with the data-plane lock held; the Redis I/O runs
 * with it released (the data plane goes on), so a slow or dead Redis delays only the request
 * that needs it, by at most the configured timeout. Ownership: the caller's struct. */
#ifndef FREEKV_REMOTE_SEQ_H
#define FREEKV_REMOTE_SEQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "remote.h"
#include "seq.h"

struct dp;
struct persist;
struct cfg;

struct remote_seq {
	struct remote *r;		/* owned: remote_seq_close frees it */
	struct dp *dp;
	struct seq_table *seqs;
	struct persist *ps;
	uint64_t published, adopted;
	uint64_t last_renew_ms;
	uint32_t lease_ms;
	bool prefix;			/* remote_prefix */
	uint32_t prefix_ttl_s;		/* remote_prefix_ttl_s */
};

/* x->r NULL when cfg has no remote_url (0). -EINVAL for a bad remote_url. */
int remote_seq_init(struct remote_seq *x, const struct cfg *cfg, struct dp *dp,
		    struct seq_table *seqs, struct persist *ps, char *err, size_t errlen);
void remote_seq_close(struct remote_seq *x);

/* s is detached (the caller checks); *blocks, *bytes what was written. */
int remote_seq_publish(struct remote_seq *x, struct seq *s, uint64_t *blocks, uint64_t *bytes,
		       char *err, size_t errlen);
/* name is unknown here: adopt it from Redis if it is there (-ENOENT with the usual message
 * when not), checking fp and geometry against what the opener expects. *out is detached. */
int remote_seq_adopt(struct remote_seq *x, const char *name, const uint8_t *fp, size_t fp_len,
		     const struct seq_geometry *g, bool has_owner, uint32_t owner_uid,
		     struct seq **out, char *err, size_t errlen);
/* remote_prefix: s was just opened with its prompt (n_prompt ids) and attached what the local
 * pool had; the pages that follow are looked for in Redis (pipelined GETs by content key, each
 * checked by its crc32c) and attached as far as they go, cut to whole ubatches. Best effort: a
 * Redis that fails leaves s as it was (logged). */
void remote_seq_prefix_extend(struct remote_seq *x, struct seq *s, size_t n_prompt);
/* Before an attach of s: a published sequence must get its lease back, an owned one must
 * still hold it; either must still be the newest generation (-ESTALE otherwise). */
int remote_seq_claim(struct remote_seq *x, struct seq *s, char *err, size_t errlen);
/* s is dropped here: its lease goes back (best effort). */
void remote_seq_release(struct remote_seq *x, struct seq *s);
/* Renews the leases of owned sequences when a third of the lease time has passed. */
void remote_seq_tick(struct remote_seq *x);

struct remote_seq_stats {
	struct remote_stats io;
	uint64_t published, adopted, owned;
};
void remote_seq_stats(const struct remote_seq *x, struct remote_seq_stats *st);

#endif
