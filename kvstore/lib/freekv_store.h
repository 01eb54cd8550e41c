/* freekv_store — the client library of kvstored, used by kvworker and kvctl.
 *
 * A struct kvs is one connection: a ZeroMQ DEALER socket to the daemon's endpoint and, after a
 * worker Hello, the mapped DRAM pool (read-write: the worker writes KV there and reads it back)
 * and the worker's ring (ALLOC / COMMIT / RECALL / RELEASE, see ring.h for the entry layouts).
 * Every control request is a function that returns 0 or a negative errno; on failure
 * kvs_error() gives the daemon's error text (or the local reason). Replies that carry data are
 * handed back as the decoded protobuf-c Freekv__Reply (proto/kvstore.proto), which the caller
 * frees with kvs_reply_free(). Timeouts: every control request waits at most the timeout given
 * to kvs_connect; an unreachable daemon gives -ETIMEDOUT (kvctl exits 3 on it).
 * After the daemon announces its shutdown every call returns -ESHUTDOWN.
 *
 * Ownership: kvs_connect allocates the handle, its ZeroMQ context and socket; kvs_close says
 * Goodbye (a worker's attached sequences become detached, its leases and uncommitted blocks are
 * dropped), unmaps the pool and ring and frees everything. kvs_pool_base() points into the mapping and is valid
 * until kvs_close. Strings passed in are borrowed for the duration of the call. A handle is used
 * by one thread at a time; the ring helpers below are synchronous (submit one entry, wait for
 * its completion) and must not be mixed with kvs_ring_submit() calls still outstanding. */
#ifndef FREEKV_STORE_H
#define FREEKV_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/kvstore.pb-c.h"
#include "ring.h"

#define KVS_DEFAULT_ENDPOINT "ipc:///run/freekv/kvstored.sock"

enum kvs_role { KVS_ROLE_WORKER = 1, KVS_ROLE_CONTROL = 2 };

/* Values of dtype match freekv.DType (1 f32, 2 f16, 3 bf16). */
struct kvs_geometry {
	uint32_t n_layers, n_kv_heads, head_dim, page_size, dtype;
};

struct kvs;

/* Prepares a ZeroMQ socket for endpoint and writes the address to bind or connect to into out:
 * tcp://localhost:P becomes tcp://127.0.0.1:P (ZeroMQ reads a bind host as an interface name)
 * and a bracketed IPv6 host turns ZMQ_IPV6 on. Other endpoints are copied. 0 or -ENAMETOOLONG. */
int kvs_endpoint_prepare(void *sock, const char *endpoint, char *out, size_t outlen);

/* Connects (lazily, as ZeroMQ does) to endpoint; timeout_ms bounds every later request. The
 * token of $FREEKV_TOKEN_FILE, when set, goes into Hello (tcp endpoints). Every request but Hello
 * and Stats needs a Welcome: a client that has not said Hello says it, as a control session,
 * before its first such request. */
int kvs_connect(const char *endpoint, int timeout_ms, struct kvs **out);
void kvs_close(struct kvs *k);
const char *kvs_error(const struct kvs *k);

/* Hello/Welcome. A worker also maps the pool and its ring. name is shown by `kvctl workers`. */
int kvs_hello(struct kvs *k, enum kvs_role role, const char *name);
/* Reads the token a tcp endpoint needs (first line of path) for the next Hello. */
int kvs_set_token_file(struct kvs *k, const char *path);
uint32_t kvs_worker_id(const struct kvs *k);
void *kvs_pool_base(const struct kvs *k);	/* NULL before a worker Hello */
uint64_t kvs_pool_bytes(const struct kvs *k);
uint32_t kvs_heartbeat_ms(const struct kvs *k);
/* After a worker Hello on k to a restarted daemon: when k mapped the very segment old maps
 * (same file, same size), k keeps old's mapping instead of its own, so that pointers into the
 * pool (and a DMA registration of it) stay valid; old no longer owns it. -ESTALE when the
 * segments differ (the daemon made a new pool: what the old one held is gone), -EINVAL when
 * either is not a mapped worker. */
int kvs_pool_take(struct kvs *k, struct kvs *old);
/* Closes k without a Goodbye: for a connection to a daemon that is gone (a Goodbye would reach
 * its successor, which does not know this connection). */
void kvs_abandon(struct kvs *k);

/* Any request, built by the caller: version, id and worker_id are filled in. The reply (status
 * 0 only) is returned in *out when out is not NULL. */
int kvs_call(struct kvs *k, Freekv__Request *req, Freekv__Reply **out);
void kvs_reply_free(Freekv__Reply *r);

/* Liveness: a worker must send a request at least every kvs_heartbeat_ms() (any control request
 * counts; ring traffic does not). A worker that goes silent for heartbeat_timeout_ms, or whose
 * process exits, is dropped: its leases and uncommitted blocks go, its sequences are orphaned. */
int kvs_heartbeat(struct kvs *k);
int kvs_open_sequence(struct kvs *k, const char *name, const void *fp, size_t fp_len,
		      const struct kvs_geometry *g, const uint32_t *tokens, size_t n_tokens, bool create,
		      uint64_t *seq_id);
/* Prefix sharing and forks at open (docs/design.md §4). ubatch > 0 asks to share: the tokens
 * are the prompt, and the new sequence attaches the leading pages published under the same
 * model, geometry, ubatch, salt and variant. fork_from names a sequence to fork instead. */
struct kvs_prefix_req {
	uint32_t ubatch;
	const char *salt;	/* NULL or "": the default namespace */
	const void *variant;	/* what else decides a page's bits (backend, policy) */
	size_t variant_len;
	const char *fork_from;	/* NULL: no fork */
};
/* kvs_open_sequence with px (NULL: none); *covered (optional) gets the committed length the
 * sequence starts with (the tokens found in the pool, or a fork's source's). */
int kvs_open_sequence_px(struct kvs *k, const char *name, const void *fp, size_t fp_len,
			 const struct kvs_geometry *g, const uint32_t *tokens, size_t n_tokens,
			 bool create, const struct kvs_prefix_req *px, uint64_t *seq_id,
			 uint64_t *covered);
/* Attach; *out (optional) gets the SequenceInfo reply with the token ids kept so far. */
int kvs_attach(struct kvs *k, uint64_t seq_id, Freekv__Reply **out);
int kvs_detach(struct kvs *k, uint64_t seq_id);
int kvs_close_sequence(struct kvs *k, uint64_t seq_id, bool drop);
int kvs_commit_tokens(struct kvs *k, uint64_t seq_id, uint64_t committed_tokens, uint64_t first,
		      const uint32_t *tokens, size_t n);
/* kvs_commit_tokens for n sequences at once: every request is sent before any reply is read,
 * so one round trip's wait covers them all (a decode step of a batch keeps each sequence's
 * sampled id). rets[i] is request i's result; returns 0 or the first error, whose message
 * kvs_error then gives. */
struct kvs_commit {
	uint64_t seq_id, committed_tokens, first;
	const uint32_t *tokens;
	size_t n;
};
int kvs_commit_tokens_many(struct kvs *k, const struct kvs_commit *c, int n, int *rets);
int kvs_list_sequences(struct kvs *k, Freekv__Reply **out);
/* By seq_id when nonzero, else by name. */
int kvs_show_sequence(struct kvs *k, uint64_t seq_id, const char *name, bool tokens, Freekv__Reply **out);
int kvs_list_workers(struct kvs *k, Freekv__Reply **out);
int kvs_evict(struct kvs *k, Freekv__EvictTarget target, uint64_t seq_id, const char *name,
	      uint32_t worker_id, bool demote, Freekv__Reply **out);
int kvs_demote(struct kvs *k, uint64_t seq_id, const char *name, Freekv__Reply **out);
/* remote: the sequence's NVMe-resident blocks go on to the remote tier (docs/design.md §8). */
int kvs_demote_to(struct kvs *k, uint64_t seq_id, const char *name, bool remote,
		  Freekv__Reply **out);
int kvs_stats(struct kvs *k, Freekv__Reply **out);
/* Writes a detached sequence to kvstored's remote tier for another host to adopt (docs/design.md
 * §8); the reply is an EvictReply counting the blocks written. By seq_id when nonzero. */
int kvs_publish(struct kvs *k, uint64_t seq_id, const char *name, Freekv__Reply **out);
/* key NULL: every key. */
int kvs_config_get(struct kvs *k, const char *key, Freekv__Reply **out);
int kvs_config_set(struct kvs *k, const char *key, const char *value, Freekv__Reply **out);

/* Ring, asynchronous: push up to n entries (returns how many fit), and wait up to timeout_ms for
 * completions (returns how many were copied out, 0 on timeout). */
int kvs_ring_submit(struct kvs *k, const struct ring_entry *e, unsigned n);
int kvs_ring_complete(struct kvs *k, struct ring_entry *out, unsigned max, int timeout_ms);

/* Ring, synchronous. offsets are pool offsets (add to kvs_pool_base()). */
int kvs_alloc(struct kvs *k, uint64_t seq_id, uint32_t layer, uint32_t first_page, uint32_t n,
	      uint64_t *offsets);
int kvs_commit(struct kvs *k, uint64_t seq_id, uint64_t committed_tokens, const uint64_t *offsets,
	       uint32_t n);
/* pages[i] with head masks[i]; offsets[i] and leases[i] come back. */
int kvs_recall(struct kvs *k, uint64_t seq_id, uint32_t layer, const uint32_t *pages,
	       const uint64_t *masks, uint32_t n, uint64_t *offsets, uint64_t *leases);
int kvs_release(struct kvs *k, const uint64_t *leases, uint32_t n);

/* Where the last synchronous ring op's round trip went, in nanoseconds of the host's monotonic
 * clock (ring.h "Timing"): queued + served + woken = round_trip. All 0 before the first op. */
struct kvs_ring_timing {
	uint64_t round_trip_ns;	/* this side's push to its pop of the completion */
	uint64_t queued_ns;	/* the push to the daemon's pop of the submission */
	uint64_t served_ns;	/* the daemon's pop to its post of the completion */
	uint64_t woken_ns;	/* the post to this side's pop */
};
void kvs_ring_last_timing(const struct kvs *k, struct kvs_ring_timing *t);

#endif
