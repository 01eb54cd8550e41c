/* workers — the registry of clients that said Hello, and their liveness.
 *
 * A worker is registered by its Hello: the daemon gives it an id, remembers the ZeroMQ routing
 * identity it spoke from (later requests that name the id from another identity are refused) and
 * opens a pidfd on the pid it announced. A worker is dead when its pidfd becomes readable (the
 * process exited, noticed at once through zmq_poll) or when it has not heartbeaten for
 * heartbeat_timeout_ms; wk_reap() lists the dead ones so that the caller can drop their leases,
 * free their uncommitted blocks and orphan their sequences before wk_remove(). The registry owns
 * its array and the pidfds; it never touches sequences or blocks. Single-threaded. */
#ifndef FREEKV_WORKERS_H
#define FREEKV_WORKERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uthash.h>

#define WK_IDENT_MAX 256
#define WK_NAME_MAX 64

/* Values match freekv.ClientRole. */
enum wk_role { WK_ROLE_WORKER = 1, WK_ROLE_CONTROL = 2 };

#define WK_MAX_LAYER_STATS 256

struct wk_stats {
	bool has;
	double decode_tok_s, correction_rate;
	uint64_t tokens_decoded, pages_recalled, bytes_recalled;
	bool has_refresh; /* refreshkv's counters, as a worker last reported them */
	double full_step_rate, full_step_ms;
	uint64_t tokens_fetched;
	size_t n_layer_rate;
	double layer_rate[WK_MAX_LAYER_STATS];
};

struct wk_worker {
	uint32_t id;			/* 0: free slot */
	uint32_t pid;
	int pidfd;			/* -1 when pidfd_open is unavailable (heartbeat only) */
	enum wk_role role;
	uint8_t rights;			/* enum access_right, decided at Hello */
	uint32_t uid;			/* the connection's uid (ipc), 0 when unknown */
	char name[WK_NAME_MAX];
	uint8_t ident[WK_IDENT_MAX];	/* ZeroMQ routing identity */
	size_t ident_len;
	uint64_t last_heartbeat_ms;
	bool dead;
	bool pid_verified;		/* pid checked against the ipc peer's credentials */
	bool fenced;			/* SIGKILL sent; its blocks wait for the exit */
	struct wk_stats stats;
	bool in_ident;			/* indexed by ident (a newer Hello from it replaces it) */
	UT_hash_handle hh_id, hh_ident;	/* the registry's indexes */
};

/* Fixed slots plus hash indexes by id and by routing identity and a stack of free slots: every
 * lookup, registration and removal is O(1) at max_workers. */
struct wk_registry {
	struct wk_worker *v;	/* (max,) owned; slots with id 0 are free */
	size_t max, n;
	uint32_t next_id;
	struct wk_worker *by_id, *by_ident;	/* uthash heads */
	uint32_t *free_slots;	/* (max,) stack of free slot indexes */
	size_t n_free;
};

int wk_init(struct wk_registry *r, size_t max_workers);
void wk_shutdown(struct wk_registry *r);

/* Register a client. -ENOSPC when max_workers are registered, -ESRCH when pid does not exist,
 * -EINVAL on an empty or oversized identity. */
int wk_add(struct wk_registry *r, uint32_t pid, enum wk_role role, const char *name,
	   const void *ident, size_t ident_len, uint64_t now_ms, struct wk_worker **out);

struct wk_worker *wk_find(struct wk_registry *r, uint32_t id);

/* The worker `id` if it exists and `ident` is the identity it registered from, else NULL. */
struct wk_worker *wk_check(struct wk_registry *r, uint32_t id, const void *ident, size_t ident_len);

/* The live worker registered from `ident`, or NULL. */
struct wk_worker *wk_find_ident(struct wk_registry *r, const void *ident, size_t ident_len);

void wk_heartbeat(struct wk_worker *w, uint64_t now_ms);

/* Whether the worker's process has exited (its pidfd is readable); false without a pidfd. */
bool wk_exited(const struct wk_worker *w);

/* Fill up to `max` pollable pidfds into fds[] (with the matching worker ids in ids[]); returns
 * how many. */
size_t wk_pidfds(const struct wk_registry *r, int *fds, uint32_t *ids, size_t max);

/* Mark dead every worker whose process exited or whose heartbeat is older than timeout_ms, and
 * write up to `max` ids of dead, not yet removed workers into ids[]; returns how many. */
size_t wk_reap(struct wk_registry *r, uint64_t now_ms, uint64_t timeout_ms, uint32_t *ids, size_t max);

/* Forget a worker (closes its pidfd). */
void wk_remove(struct wk_registry *r, uint32_t id);

#endif
