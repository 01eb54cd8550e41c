/* workers — see workers.h. */
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
	if (!r->v)
		return -ENOMEM;
	r->max = max_workers;
	r->next_id = 1;
	return 0;
}

void wk_shutdown(struct wk_registry *r)
{
	for (size_t i = 0; i < r->max; i++)
		if (r->v[i].id && r->v[i].pidfd >= 0)
			close(r->v[i].pidfd);
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
	struct wk_worker *w = NULL;
	for (size_t i = 0; i < r->max && !w; i++)
		if (!r->v[i].id)
			w = &r->v[i];
	if (!w)
		return -ENOSPC;
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
	r->n++;
	*out = w;
	return 0;
}

struct wk_worker *wk_find(struct wk_registry *r, uint32_t id)
{
	if (!id)
		return NULL;
	for (size_t i = 0; i < r->max; i++)
		if (r->v[i].id == id)
			return &r->v[i];
	return NULL;
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
	for (size_t i = 0; i < r->max; i++) {
		struct wk_worker *w = &r->v[i];
		if (w->id && !w->dead && w->ident_len == ident_len && !memcmp(w->ident, ident, ident_len))
			return w;
	}
	return NULL;
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
	memset(w, 0, sizeof *w);
	w->pidfd = -1;
	r->n--;
}
