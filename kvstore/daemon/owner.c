/* owner — the pool-name and NVMe-tier locks of one kvstored. See owner.h. */
#include "owner.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"
#include "pool_map.h"
#include "log.h"

#define SHM_DIR "/dev/shm"
#define LOCK_TRIES 8

/* The pid a lock file records (0 when unreadable). */
static long lock_pid(int fd)
{
	char buf[32] = "";
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	return n > 0 ? strtol(buf, NULL, 10) : 0;
}

/* Opens path and takes an exclusive, non-blocking flock on it; retries when the file it locked
 * was unlinked (released) in between. *fd on success; -EBUSY with *holder the owner's pid. */
static int lock_file(const char *path, int *fd, long *holder)
{
	for (int i = 0; i < LOCK_TRIES; i++) {
		int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
		if (f < 0)
			return -errno;
		if (flock(f, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;
			*holder = lock_pid(f);
			close(f);
			return e == EWOULDBLOCK ? -EBUSY : -e;
		}
		struct stat a, b;
		if (fstat(f, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
		    a.st_dev == b.st_dev) {
			char pid[32];
			int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
			if (ftruncate(f, 0) < 0 || pwrite(f, pid, (size_t)n, 0) != n) {
				int e = errno ? errno : EIO;
				close(f);
				return -e;
			}
			*fd = f;
			return 0;
		}
		close(f); /* released and unlinked while we waited: lock the new file */
	}
	return -EAGAIN;
}

static int take_one(const char *path, const char *what, const char *value, int *fd, char *err,
		    size_t errlen)
{
	long holder = 0;
	int ret = lock_file(path, fd, &holder);
	if (ret == -EBUSY)
		return errmsg(err, errlen, ret,
			      "%s %s is owned by kvstored pid %ld (lock %s): stop that daemon or "
			      "configure another %s", what, value, holder, path, what);
	if (ret)
		return errmsg(err, errlen, ret, "cannot lock %s for %s %s: %s", path, what, value,
			      strerror(-ret));
	return 0;
}

int owner_take(struct owner *o, const struct cfg *cfg, char *err, size_t errlen)
{
	memset(o, 0, sizeof *o);
	o->pool_fd = o->nvme_fd = -1;
	const char *dir = cfg->hugetlbfs_path[0] ? cfg->hugetlbfs_path : SHM_DIR;
	/* shm_name is "/name": the lock sits beside the segment, in the same namespace. */
	snprintf(o->pool_lock, sizeof o->pool_lock, "%s%s.lock", dir, cfg->shm_name);
	int ret = take_one(o->pool_lock, "shm_name", cfg->shm_name, &o->pool_fd, err, errlen);
	if (ret)
		return ret;
	if (cfg->nvme_path[0]) {
		snprintf(o->nvme_lock, sizeof o->nvme_lock, "%s.lock", cfg->nvme_path);
		ret = take_one(o->nvme_lock, "nvme_path", cfg->nvme_path, &o->nvme_fd, err, errlen);
		if (ret) {
			owner_release(o);
			return ret;
		}
	}
	return 0;
}

int owner_clean_stale(const struct owner *o, const struct cfg *cfg, bool keep_pool)
{
	(void)o; /* the caller holds the locks: that is what makes these leftovers */
	int removed = 0;
	const char *hdir = cfg->hugetlbfs_path[0] ? cfg->hugetlbfs_path : NULL;
	if (!keep_pool && pool_segment_unlink(cfg->shm_name, hdir) == 0) {
		log_warn("removed the stale pool segment %s left by a previous "
			"kvstored", cfg->shm_name);
		removed++;
	}
	/* Ring segments are always POSIX shm: "<shm_name>-ring-<worker id>". */
	char prefix[CFG_STR_MAX + 8];
	snprintf(prefix, sizeof prefix, "%s-ring-", cfg->shm_name + 1);
	DIR *d = opendir(SHM_DIR);
	if (!d)
		return removed;
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *tail = e->d_name + strlen(prefix);
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || !*tail ||
		    strspn(tail, "0123456789") != strlen(tail))
			continue;
		char name[NAME_MAX + 2];
		snprintf(name, sizeof name, "/%s", e->d_name);
		if (pool_segment_unlink(name, NULL) == 0) {
			log_warn("removed the stale ring segment %s left by a previous "
				"kvstored", name);
			removed++;
		}
	}
	closedir(d);
	return removed;
}

static void release_one(int *fd, const char *path)
{
	if (*fd < 0)
		return;
	/* Unlink while still holding the lock: a waiter re-checks the path and retries. */
	unlink(path);
	close(*fd);
	*fd = -1;
}

void owner_release(struct owner *o)
{
	release_one(&o->nvme_fd, o->nvme_lock);
	release_one(&o->pool_fd, o->pool_lock);
}
