/* rpc — kvstored's control plane: a ZeroMQ ROUTER socket, the protobuf-c codec and the table of
 * request handlers.
 *
 * rpc_process() is the whole request path without the socket: size check, decode, version and
 * body checks, caller identity (a request naming a worker id must come from the ZeroMQ identity
 * that said Hello with it), dispatch through one table row per request type (name, body case,
 * whether a welcomed worker is required, handler, calls/errors/time counters), and encoding of
 * the Reply. Every failure is a Reply with a negative errno status and a message; nothing a
 * client sends can stop the daemon. rpc_serve() drains the socket through rpc_process();
 * rpc_notify_shutdown() tells every registered client that the daemon is stopping.
 *
 * Worker identity: the pid a Hello announces is what liveness watches (pidfd), so on an ipc://
 * endpoint it is checked against the kernel's credentials of the connection. libzmq records
 * SO_PEERCRED when it accepts a Unix-domain connection and attaches it to every message from
 * that connection as the "Peer-Address" property ("host:uid:gid:pid", zmq_msg_gets); unlike the
 * deprecated ZMQ_SRCFD (a descriptor number the I/O thread may already have closed and reused)
 * it cannot name another connection. A Hello whose pid differs, or that arrives over ipc
 * without credentials, is refused with -EPERM naming both pids. tcp:// (loopback only) carries
 * no credentials: the pid is accepted unverified and the daemon logs that it is.
 *
 * Rights (access.h, docs/design.md §4 "Access"): Hello decides a client's rights from its
 * credentials or token; before a Welcome only Hello and Stats are answered; admin verbs and other
 * uids' sequences are refused to workers (-EACCES, counted per verb, logged once per
 * connection). Every string field is checked whole (pbcheck.h) before dispatch.
 *
 * Ownership: struct rpc_ctx holds borrowed pointers to the modules the handlers act on (all
 * owned by kvstored's main). rpc_init opens the socket in the caller's ZeroMQ context;
 * rpc_shutdown closes it (the ipc socket file is removed). Replies returned by rpc_process are
 * malloc'd and freed by the caller. Single-threaded: the event loop owns it. */
#ifndef FREEKV_RPC_H
#define FREEKV_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access.h"
#include "config.h"
#include "dataplane.h"
#include "seq.h"
#include "workers.h"

struct persist;
struct prom_hist;

#define RPC_ERR_MAX 256

struct rpc_ctx {
	struct cfg *cfg;		/* ConfigSet writes run-time keys here */
	struct seq_table *seqs;
	struct wk_registry *workers;
	struct dp *dp;
	const struct access *access;	/* rights; NULL: every caller is trusted (tests) */
	struct persist *ps;		/* durable metadata; NULL: persistence off */
	struct remote_seq *remote;	/* beyond one host; NULL or no remote_url: none */
	uint64_t start_ms;
	uint64_t (*now_ms)(void);
};

/* What the transport says about a request's sender (rpc_serve fills it per message). */
struct rpc_peer {
	bool ipc;			/* came over the ipc:// endpoint */
	bool has_cred;			/* pid/uid/gid are the connection's SO_PEERCRED */
	uint32_t pid, uid, gid;
};

struct rpc_stat {
	uint64_t calls, errors, refused, total_us;
};

#define RPC_REFUSED_PEERS 256	/* connections whose first refusal is logged */

struct held_reply;

struct rpc_server {
	void *sock;
	struct rpc_ctx ctx;
	struct rpc_stat *stats;		/* (rpc_n_commands(),) */
	struct rpc_stat bad;		/* undecodable / malformed frames */
	char ipc_path[CFG_STR_MAX];
	uint64_t hello_refused;		/* Hellos refused for a pid mismatch (logged: the first 10) */
	uint64_t refused_peers[RPC_REFUSED_PEERS]; /* identity hashes already logged */
	size_t n_refused_peers;
	struct prom_hist *latency;	/* (optional, borrowed) seconds per request, for /metrics */
	struct held_reply *held;	/* rpc_serve's replies waiting for the journal sync */
	int held_cap;
};

/* Binds a ROUTER socket at ctx->cfg->endpoint (an ipc socket file gets mode 0660 and the
 * configured group). -errno with a message. */
int rpc_init(struct rpc_server *s, void *zctx, const struct rpc_ctx *ctx, char *err, size_t errlen);
void rpc_shutdown(struct rpc_server *s);

/* Handle up to `budget` waiting messages without blocking; returns how many were handled. */
int rpc_serve(struct rpc_server *s, int budget);

/* Decode, check, dispatch and encode one request; *reply (malloc'd) gets the packed Reply.
 * peer (borrowed, may be NULL: an in-process caller, treated like tcp) is the sender as the
 * transport knows it. */
int rpc_process(struct rpc_server *s, const void *ident, size_t ident_len,
		const struct rpc_peer *peer, const void *data, size_t len, uint8_t **reply,
		size_t *reply_len);

/* Parses libzmq's ipc "Peer-Address" property ("host:uid:gid:pid", three decimal fields at the
 * end) into p's credentials. -EINVAL (p untouched) for NULL or any other form. */
int rpc_peer_parse(const char *peer_address, struct rpc_peer *p);

/* Send a Reply with id 0, status -ESHUTDOWN and a Notice to every registered client. */
void rpc_notify_shutdown(struct rpc_server *s);

size_t rpc_n_commands(void);
const char *rpc_command_name(size_t i);

/* What the daemon has malloc'd and not freed: every arena, mmapped chunks included (glibc
 * mallinfo2). StatsReply.heap_in_use_bytes and /metrics report it. false (nothing known) in an
 * AddressSanitizer build, whose allocator mallinfo2 does not see. */
bool rpc_heap_in_use(uint64_t *bytes);

#endif
