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
 * Ownership: struct rpc_ctx holds borrowed pointers to the modules the handlers act on (all
 * owned by kvstored's main). rpc_init opens the socket in the caller's ZeroMQ context;
 * rpc_shutdown closes it (the ipc socket file is removed). Replies returned by rpc_process are
 * malloc'd and freed by the caller. Single-threaded: the event loop owns it. */
#ifndef FREEKV_RPC_H
#define FREEKV_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "dataplane.h"
#include "seq.h"
#include "workers.h"

#define RPC_ERR_MAX 256

struct rpc_ctx {
	struct cfg *cfg;		/* ConfigSet writes run-time keys here */
	struct seq_table *seqs;
	struct wk_registry *workers;
	struct dp *dp;
	uint64_t start_ms;
	uint64_t (*now_ms)(void);
};

struct rpc_stat {
	uint64_t calls, errors, total_us;
};

struct rpc_server {
	void *sock;
	struct rpc_ctx ctx;
	struct rpc_stat *stats;		/* (rpc_n_commands(),) */
	struct rpc_stat bad;		/* undecodable / malformed frames */
	char ipc_path[CFG_STR_MAX];
};

/* Binds a ROUTER socket at ctx->cfg->endpoint (an ipc socket file gets mode 0660 and the
 * configured group). -errno with a message. */
int rpc_init(struct rpc_server *s, void *zctx, const struct rpc_ctx *ctx, char *err, size_t errlen);
void rpc_shutdown(struct rpc_server *s);

/* Handle up to `budget` waiting messages without blocking; returns how many were handled. */
int rpc_serve(struct rpc_server *s, int budget);

/* Decode, check, dispatch and encode one request; *reply (malloc'd) gets the packed Reply. */
int rpc_process(struct rpc_server *s, const void *ident, size_t ident_len, const void *data,
		size_t len, uint8_t **reply, size_t *reply_len);

/* Send a Reply with id 0, status -ESHUTDOWN and a Notice to every registered client. */
void rpc_notify_shutdown(struct rpc_server *s);

size_t rpc_n_commands(void);
const char *rpc_command_name(size_t i);

#endif
