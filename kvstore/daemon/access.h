/* access — who may do what to kvstored (docs/design.md §4 "Access"). Two rights: a worker uses
 * its own sequences and leases; an admin may also evict, demote, set configuration and touch any
 * sequence. Rights are decided once, at Hello, from what the transport proves:
 *
 *   ipc  the connection's SO_PEERCRED: root, the daemon's own user and members of admin_group are
 *        admins; members of worker_group (primary or supplementary group) are workers; anyone
 *        else is refused at Hello.
 *   tcp  no credentials exist, so the client must send the token of auth_token_file in Hello
 *        (it makes the client an admin); with tcp_insecure = true every client is an admin.
 *
 * An in-process caller (no transport: the tests of rpc.c) is the daemon itself: admin.
 * Ownership: struct access is a plain value filled by access_init (the token is copied in). */
#ifndef FREEKV_ACCESS_H
#define FREEKV_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "config.h"

enum access_right { ACCESS_NONE = 0, ACCESS_WORKER = 1, ACCESS_ADMIN = 2 };

#define ACCESS_TOKEN_MAX 256

struct access {
	uid_t daemon_uid;
	bool has_admin_gid, has_worker_gid;
	gid_t admin_gid, worker_gid;
	char admin_group[CFG_STR_MAX], worker_group[CFG_STR_MAX];
	bool has_token, tcp_insecure;
	char token[ACCESS_TOKEN_MAX];
};

/* Resolves the groups (an admin_group that does not exist is an error; a worker_group that does
 * not exist grants nothing, and says so) and reads the token file: a regular file of mode 0600
 * or stricter, one non-empty line. -errno with a message naming the key. */
int access_init(struct access *a, const struct cfg *cfg, char *err, size_t errlen);

/* What a client may do, from its transport facts (ipc: has_cred, uid, gid) and the token its
 * Hello carried (NULL: none). ACCESS_NONE comes with the reason in why. */
enum access_right access_of(const struct access *a, bool ipc, bool has_cred, uid_t uid, gid_t gid,
			    const char *token, char *why, size_t whylen);

/* The sentence a refused admin verb ends with: which group grants the right. */
const char *access_admin_hint(const struct access *a, char *buf, size_t len);

const char *access_name(enum access_right r);

#endif
