/* remote — kvstored's link to a Redis server (docs/design.md §8 "Beyond one host"), on hiredis:
 * sequences published by one host and adopted by another, and the lease that lets one host at a
 * time own a sequence's name.
 *
 * Keys, under the namespace `ns`, each with the sequence's name as its hash tag (so that in a
 * Redis Cluster all of a sequence's keys live in one slot, and one pipeline reaches them):
 *   <ns>:{<name>}:seq        hash: the sequence's metadata (remote_meta below)
 *   <ns>:{<name>}:blk:<gen>:<layer>:<page>
 *                            string: the block's crc32c (4 bytes, little-endian), then its bytes
 *   <ns>:{<name>}:owner      string: the owning host's id, with an expiry (the lease)
 * A publish writes the blocks of a new generation first, then the hash that names it, then
 * deletes the previous generation's blocks: a reader never finds a hash whose blocks are missing.
 *
 * Requests are pipelined in windows of at most REMOTE_WINDOW commands; every call has the
 * configured timeout. A connection that fails is dropped and made again at the next call, so a
 * Redis that was down is used again as soon as it is back; until then each call fails with the
 * reason (-ECONNREFUSED, -ETIMEDOUT, ...) in err. remote_url names one server or seeds of a
 * Redis Cluster (redis://HOST:PORT[,HOST:PORT...]); the first call asks CLUSTER SLOTS and, on a
 * cluster, sends each call to the master serving its slot, mapping the slots again after a
 * MOVED or ASK.
 *
 * Ownership: remote_open allocates struct remote (and connects lazily); remote_close frees it.
 * Not thread-safe: the control plane calls it, with the data-plane lock released during I/O. */
#ifndef FREEKV_REMOTE_H
#define FREEKV_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seq.h"

#define REMOTE_WINDOW 64u

struct remote_config {
	const char *url;	/* redis://HOST:PORT */
	const char *ns;		/* key namespace */
	const char *host_id;	/* this daemon's id in leases */
	uint32_t timeout_ms;
	uint32_t lease_ms;
};

/* A sequence's metadata as published. tokens is owned by the caller (remote_get_meta
 * mallocs it; free it). */
struct remote_meta {
	struct seq_geometry geo;
	uint8_t fp[SEQ_FP_MAX];
	size_t fp_len;
	uint64_t committed;
	uint32_t *tokens;
	size_t n_tokens;
	uint64_t gen;		/* publish generation: its blocks' keys carry it */
	char host[128];		/* the host that published it */
};

/* One block to put or get: (layer, page) of the sequence, len bytes at data. */
struct remote_block {
	uint32_t layer, page;
	void *data;
	uint32_t len;
};

struct remote_stats {
	uint64_t ops, errors, bytes_put, bytes_got, total_us, crc_errors, reconnects;
};

struct remote;

/* remote_host_id when set, else <hostname>:<shm_name>. */
void remote_default_host_id(const char *configured, const char *shm_name, char *out, size_t len);
/* -EINVAL for a URL that is not redis://HOST:PORT; nothing is connected yet. */
int remote_open(const struct remote_config *c, struct remote **out, char *err, size_t errlen);
void remote_close(struct remote *r);
const char *remote_url(const struct remote *r);
const char *remote_host_id(const struct remote *r);
/* Whether the server turned out to be a Redis Cluster (known after the first call). */
bool remote_is_cluster(const struct remote *r);

/* Writes blocks b[0..n) of generation gen of sequence name. */
int remote_put_blocks(struct remote *r, const char *name, uint64_t gen,
		      const struct remote_block *b, size_t n, char *err, size_t errlen);
/* Reads them into b[i].data (b[i].len bytes each): -ENOENT when one is missing, -EBADMSG when
 * its bytes do not match its crc32c or its length differs (err names the block). */
int remote_get_blocks(struct remote *r, const char *name, uint64_t gen, struct remote_block *b,
		      size_t n, char *err, size_t errlen);
/* Deletes the blocks of generation gen (pages [0, pages) of every layer); errors are ignored
 * but counted. */
void remote_drop_blocks(struct remote *r, const char *name, uint64_t gen, uint32_t n_layers,
			uint32_t pages);
int remote_put_meta(struct remote *r, const char *name, const struct remote_meta *m, char *err,
		    size_t errlen);
/* -ENOENT when name was never published (or was removed). */
int remote_get_meta(struct remote *r, const char *name, struct remote_meta *m, char *err,
		    size_t errlen);

/* The lease on name: taken (or renewed, when this host holds it) for lease_ms; -EBUSY with the
 * owner's id in err when another host holds it. */
int remote_lease(struct remote *r, const char *name, char *err, size_t errlen);
/* Renews the leases this host holds on names[0..n), pipelined; a lease found taken by another
 * host is left alone (returns how many were renewed). */
size_t remote_renew(struct remote *r, const char *const *names, size_t n);
/* Gives the lease on name back, when this host holds it. */
int remote_unlease(struct remote *r, const char *name, char *err, size_t errlen);

/* The remote tier below NVMe (docs/design.md §8): blocks kept in Redis under this host's id,
 *   <ns>:{tier:<host_id>}:<id>   string: crc32c (4 bytes, little-endian), then the bytes
 * (one hash slot per host: a batch reaches one node). Each op gets its own status: PUT writes
 * buf; GET fills buf (len bytes) after checking both the stored and the expected crc32c
 * (-EBADMSG), -ENOENT when missing; DEL removes. A transport failure fails every op of the
 * batch with it. */
enum remote_tier_kind { REMOTE_TIER_PUT = 1, REMOTE_TIER_GET, REMOTE_TIER_DEL };
struct remote_tier_op {
	uint8_t kind;		/* enum remote_tier_kind */
	uint64_t id;
	char key[256];		/* when set, the key (a published block: remote_published_key) and
				 * a GET checks the value against its own stored crc32c only */
	void *buf;
	uint32_t len, crc;
	uint32_t ttl_s;		/* > 0: a PUT sets this expiry (SET ... EX), a GET renews it
				 * (GETEX ... EX): prefix pages across hosts */
	int status;		/* out */
	char err[160];		/* out, when status != 0 */
};
void remote_tier_batch(struct remote *r, struct remote_tier_op *ops, size_t n);
/* Prefix pages across hosts (remote_prefix): the key of one layer's block of the page whose
 * content key is key (prefix.h): <ns>:{pfx:<hex key>}:<layer>. */
void remote_prefix_key(const struct remote *r, const uint8_t key[32], uint32_t layer, char *out,
		       size_t len);
/* The key of block (layer, page) of generation gen of published sequence name. */
void remote_published_key(const struct remote *r, const char *name, uint64_t gen,
			  uint32_t layer, uint32_t page, char *key, size_t len);

void remote_stats(const struct remote *r, struct remote_stats *st);

#endif
