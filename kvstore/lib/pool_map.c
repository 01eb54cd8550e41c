/* pool_map — named shared-memory segments: creating, mapping and unlinking them. See pool_map.h. */
#include "pool_map.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"

/* ---------------------------------------------------------------- segments */

/* A POSIX shm name: "/x" with no other '/', at most NAME_MAX bytes after the slash. */
static int check_name(const char *name)
{
	if (!name || name[0] != '/' || name[1] == '\0')
		return -EINVAL;
	if (strchr(name + 1, '/') || strlen(name + 1) > NAME_MAX - 1)
		return -EINVAL;
	if (strcmp(name + 1, ".") == 0 || strcmp(name + 1, "..") == 0)
		return -EINVAL;
	return 0;
}

static bool use_huge(const char *dir)
{
	return dir && dir[0] != '\0';
}

static int huge_path(char *buf, size_t len, const char *dir, const char *name)
{
	int n = snprintf(buf, len, "%s/%s", dir, name + 1);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int seg_open(const char *name, const char *dir, int flags, mode_t mode)
{
	if (use_huge(dir)) {
		char path[PATH_MAX];
		int ret = huge_path(path, sizeof path, dir, name);
		if (ret < 0)
			return ret;
		int fd = open(path, flags | O_CLOEXEC, mode);
		return fd < 0 ? -errno : fd;
	}
	int fd = shm_open(name, flags, mode);
	return fd < 0 ? -errno : fd;
}

int pool_segment_unlink(const char *name, const char *dir)
{
	if (check_name(name) < 0)
		return -EINVAL;
	if (use_huge(dir)) {
		char path[PATH_MAX];
		int ret = huge_path(path, sizeof path, dir, name);
		if (ret < 0)
			return ret;
		return unlink(path) < 0 ? -errno : 0;
	}
	return shm_unlink(name) < 0 ? -errno : 0;
}

static int set_group(int fd, const char *group, char *err, size_t err_len)
{
	struct group gr, *res = NULL;
	char buf[4096];
	int ret = getgrnam_r(group, &gr, buf, sizeof buf, &res);
	if (ret != 0 || !res) {
		errmsg_set(err, err_len, "group '%s' not found", group);
		return -EINVAL;
	}
	if (fchown(fd, (uid_t)-1, gr.gr_gid) < 0) {
		ret = -errno;
		errmsg_set(err, err_len, "chown to group '%s' failed: %s", group, strerror(-ret));
		return ret;
	}
	return 0;
}

int pool_segment_create(const struct pool_segment_config *cfg, void **base, int *fd_out,
			char *err, size_t err_len)
{
	*base = NULL;
	*fd_out = -1;
	if (check_name(cfg->name) < 0) {
		errmsg_set(err, err_len, "bad shared-memory name '%s' (want \"/name\", no other '/')",
			cfg->name ? cfg->name : "(null)");
		return -EINVAL;
	}
	if (cfg->bytes == 0 || cfg->bytes > (uint64_t)SSIZE_MAX) {
		errmsg_set(err, err_len, "bad segment size %llu", (unsigned long long)cfg->bytes);
		return -EINVAL;
	}
	mode_t mode = cfg->mode ? cfg->mode : 0660;
	int fd = seg_open(cfg->name, cfg->hugetlbfs_dir, O_RDWR | O_CREAT | O_EXCL, mode);
	if (fd == -EEXIST && cfg->unlink_existing) {
		pool_segment_unlink(cfg->name, cfg->hugetlbfs_dir);
		fd = seg_open(cfg->name, cfg->hugetlbfs_dir, O_RDWR | O_CREAT | O_EXCL, mode);
	}
	if (fd < 0) {
		if (fd == -EEXIST)
			errmsg_set(err, err_len,
				"shared memory '%s' exists (another kvstored, or a stale segment: "
				"remove it or set unlink_existing)", cfg->name);
		else
			errmsg_set(err, err_len, "cannot create shared memory '%s'%s%s: %s", cfg->name,
				use_huge(cfg->hugetlbfs_dir) ? " in " : "",
				use_huge(cfg->hugetlbfs_dir) ? cfg->hugetlbfs_dir : "", strerror(-fd));
		return fd;
	}
	int ret = 0;
	if (fchmod(fd, mode) < 0) { /* the umask may have masked group bits */
		ret = -errno;
		errmsg_set(err, err_len, "chmod of '%s' failed: %s", cfg->name, strerror(-ret));
		goto fail;
	}
	if (cfg->group && cfg->group[0] && (ret = set_group(fd, cfg->group, err, err_len)) < 0)
		goto fail;
	/* Reserve the memory now: a sparse segment on a too-small /dev/shm would SIGBUS later. */
	if (fallocate(fd, 0, 0, (off_t)cfg->bytes) < 0) {
		ret = -errno;
		if (ret == -EOPNOTSUPP && ftruncate(fd, (off_t)cfg->bytes) == 0) {
			ret = 0;
		} else {
			errmsg_set(err, err_len, "cannot reserve %llu bytes for '%s': %s",
				(unsigned long long)cfg->bytes, cfg->name, strerror(-ret));
			goto fail;
		}
	}
	void *m = mmap(NULL, cfg->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		ret = -errno;
		errmsg_set(err, err_len, "mmap of '%s' failed: %s", cfg->name, strerror(-ret));
		goto fail;
	}
	*base = m;
	*fd_out = fd;
	return 0;
fail:
	close(fd);
	pool_segment_unlink(cfg->name, cfg->hugetlbfs_dir);
	return ret;
}

int pool_segment_map(const char *name, const char *dir, uint64_t expected_bytes, void **base,
		     uint64_t *bytes, int *fd_out, char *err, size_t err_len)
{
	*base = NULL;
	*fd_out = -1;
	if (check_name(name) < 0) {
		errmsg_set(err, err_len, "bad shared-memory name '%s'", name ? name : "(null)");
		return -EINVAL;
	}
	int fd = seg_open(name, dir, O_RDWR, 0);
	if (fd < 0) {
		errmsg_set(err, err_len, "cannot open shared memory '%s': %s", name, strerror(-fd));
		return fd;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int ret = -errno;
		close(fd);
		errmsg_set(err, err_len, "fstat of '%s' failed: %s", name, strerror(-ret));
		return ret;
	}
	uint64_t size = (uint64_t)st.st_size;
	if (size == 0 || (expected_bytes && size != expected_bytes)) {
		close(fd);
		errmsg_set(err, err_len, "shared memory '%s' is %llu bytes, expected %llu", name,
			(unsigned long long)size, (unsigned long long)expected_bytes);
		return -EMSGSIZE;
	}
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		int ret = -errno;
		close(fd);
		errmsg_set(err, err_len, "mmap of '%s' failed: %s", name, strerror(-ret));
		return ret;
	}
	*base = m;
	*bytes = size;
	*fd_out = fd;
	return 0;
}

void pool_segment_unmap(void *base, uint64_t bytes, int fd)
{
	if (base)
		munmap(base, bytes);
	if (fd >= 0)
		close(fd);
}

/* ---------------------------------------------------------------- mapper side */

int pool_map(const char *shm_name, const char *hugetlbfs_dir, uint64_t expected_bytes,
	     struct pool_map *m, char *err, size_t err_len)
{
	memset(m, 0, sizeof *m);
	m->fd = -1;
	return pool_segment_map(shm_name, hugetlbfs_dir, expected_bytes, &m->base, &m->bytes,
				&m->fd, err, err_len);
}

void pool_unmap(struct pool_map *m)
{
	pool_segment_unmap(m->base, m->bytes, m->fd);
	m->base = NULL;
	m->bytes = 0;
	m->fd = -1;
}
