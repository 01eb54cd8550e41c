/* workers — see workers.h. */
/* uthash must not exit() on allocation failure: a full heap is an error to the caller. */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (wk_hash_oom = true)
#include <stdbool.h>
static bool wk_hash_oom;

#include "workers.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

int wk_init(struct wk_registry *r, size_t max_workers)
{
	memset(r, 0, sizeof *r);
	r->v = calloc(max_workers, sizeof *r->v);
	r->free_slots = calloc(max_workers, sizeof *r->free_slots);
	if (!r->v || !r->free_slots) {
		free(r->v);
		free(r->free_slots);
		return -ENOMEM;
	}
	r->max = max_workers;
	r->next_id = 1;
	for (size_t i = 0; i < max_workers; i++)
		r->free_slots[r->n_free++] = (uint32_t)(max_workers - 1 - i);
	return 0;
}

void wk_shutdown(struct wk_registry *r)
{
	for (size_t i = 0; i < r->max; i++)
		if (r->v[i].id && r->v[i].pidfd >= 0)
			close(r->v[i].pidfd);
	HASH_CLEAR(hh_id, r->by_id);
	HASH_CLEAR(hh_ident, r->by_ident);
	free(r->free_slots);
	free(r->v);
	memset(r, 0, sizeof *r);
}

int wk_add(struct wk_registry *r, uint32_t pid, enum wk_role role, const char *name,
	   const void *ident, size_t ident_len, uint64_t now_ms, struct wk_worker **out)
{
	if (ident_len == 0 || ident_len > WK_IDENT_MAX)
		return -EINVAL;
	if (pid == 0 || pid > (uint32_t)INT32_MAX)
		return -ESRCH;
	if (!r->n_free)
		return -ENOSPC;
	struct wk_worker *w = &r->v[r->free_slots[r->n_free - 1]];
	int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
	if (fd < 0 && errno != ENOSYS)
		return -errno;
	memset(w, 0, sizeof *w);
	w->pidfd = fd;
	w->id = r->next_id++;
	if (r->next_id == 0)
		r->next_id = 1;
	w->pid = pid;
	w->role = role;
	if (name)
		snprintf(w->name, sizeof w->name, "%s", name);
	memcpy(w->ident, ident, ident_len);
	w->ident_len = ident_len;
	w->last_heartbeat_ms = now_ms;
	/* An older registration from this identity is dead (Hello refuses a live one): it keeps
	 * its id until reaped but no longer answers for the identity. */
	struct wk_worker *old = NULL;
	HASH_FIND(hh_ident, r->by_ident, w->ident, ident_len, old);
	if (old) {
		HASH_DELETE(hh_ident, r->by_ident, old);
		old->in_ident = false;
	}
	wk_hash_oom = false;
	HASH_ADD(hh_id, r->by_id, id, sizeof w->id, w);
	if (wk_hash_oom) {
		if (fd >= 0)
			close(fd);
		memset(w, 0, sizeof *w);
		return -ENOMEM;
	}
	HASH_ADD(hh_ident, r->by_ident, ident, ident_len, w);
	if (wk_hash_oom) {
		HASH_DELETE(hh_id, r->by_id, w);
		if (fd >= 0)
			close(fd);
		memset(w, 0, sizeof *w);
		return -ENOMEM;
	}
	w->in_ident = true;
	r->n_free--;
	r->n++;
	*out = w;
	return 0;
}

struct wk_worker *wk_find(struct wk_registry *r, uint32_t id)
{
	struct wk_worker *w = NULL;
	if (id)
		HASH_FIND(hh_id, r->by_id, &id, sizeof id, w);
	return w;
}

struct wk_worker *wk_check(struct wk_registry *r, uint32_t id, const void *ident, size_t ident_len)
{
	struct wk_worker *w = wk_find(r, id);
	if (!w || w->dead || w->ident_len != ident_len || memcmp(w->ident, ident, ident_len) != 0)
		return NULL;
	return w;
}

struct wk_worker *wk_find_ident(struct wk_registry *r, const void *ident, size_t ident_len)
{
	struct wk_worker *w = NULL;
	if (ident_len && ident_len <= WK_IDENT_MAX)
		HASH_FIND(hh_ident, r->by_ident, ident, ident_len, w);
	return w && !w->dead ? w : NULL;
}

void wk_heartbeat(struct wk_worker *w, uint64_t now_ms)
{
	w->last_heartbeat_ms = now_ms;
}

size_t wk_pidfds(const struct wk_registry *r, int *fds, uint32_t *ids, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < r->max && n < max; i++) {
		if (r->v[i].id && r->v[i].pidfd >= 0 && !r->v[i].dead) {
			fds[n] = r->v[i].pidfd;
			ids[n++] = r->v[i].id;
		}
	}
	return n;
}

static bool exited(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };
	return pidfd >= 0 && poll(&p, 1, 0) > 0;
}

bool wk_exited(const struct wk_worker *w)
{
	return exited(w->pidfd);
}

size_t wk_reap(struct wk_registry *r, uint64_t now_ms, uint64_t timeout_ms, uint32_t *ids, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < r->max; i++) {
		struct wk_worker *w = &r->v[i];
		if (!w->id)
			continue;
		/* A control session (kvctl) holds no leases: while its pid is watched and alive it
		 * need not heartbeat, so an idle operator tool is not dropped between commands. */
		bool silent = now_ms - w->last_heartbeat_ms > timeout_ms &&
			      !(w->role == WK_ROLE_CONTROL && w->pidfd >= 0);
		if (!w->dead && (exited(w->pidfd) || silent))
			w->dead = true;
		if (w->dead && n < max)
			ids[n++] = w->id;
	}
	return n;
}

void wk_remove(struct wk_registry *r, uint32_t id)
{
	struct wk_worker *w = wk_find(r, id);
	if (!w)
		return;
	if (w->pidfd >= 0)
		close(w->pidfd);
	HASH_DELETE(hh_id, r->by_id, w);
	if (w->in_ident)
		HASH_DELETE(hh_ident, r->by_ident, w);
	memset(w, 0, sizeof *w);
	w->pidfd = -1;
	r->free_slots[r->n_free++] = (uint32_t)(w - r->v);
	r->n--;
}
