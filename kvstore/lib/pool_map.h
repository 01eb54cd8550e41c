/* pool_map — named shared-memory segments, the form of both kvstored's DRAM pool and the
 * per-worker ring segments.
 *
 * Creator side (kvstored): pool_segment_create makes a segment (POSIX shm under /dev/shm, or a
 * file in a hugetlbfs directory), mode 0660 with an optional group, reserves its memory
 * (fallocate, so a too-small /dev/shm is an error now and not a SIGBUS later) and maps it.
 *
 * Mapper side (kvstore client, kvworker): pool_map opens an existing pool segment by name
 * read-write, checks its size, maps it; pool_unmap unmaps (never unlinks).
 *
 * Functions that take char *err write a one-line human message there on failure (err may be
 * NULL). */
#ifndef FREEKV_POOL_MAP_H
#define FREEKV_POOL_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define POOL_ERR_LEN 256u

/* ---------------------------------------------------------------- shared-memory segments */

struct pool_segment_config {
	const char *name;          /* "/freekv-pool" style: one leading '/', no other '/' */
	const char *hugetlbfs_dir; /* NULL or "": POSIX shm; else a file <dir>/<name> */
	uint64_t bytes;
	mode_t mode;               /* 0 means 0660 */
	const char *group;         /* NULL or "": keep the creator's group */
	bool unlink_existing;      /* replace a stale segment of that name instead of -EEXIST */
};

/* Creates, sizes (fallocate), chmods/chowns and maps a segment read-write. On success *base and
 * *fd are the mapping and an open descriptor (caller closes/unmaps via pool_segment_unmap).
 * -EEXIST when the name exists and !unlink_existing; -ENOSPC when the backing file system
 * cannot hold bytes; -EINVAL for a bad name. On failure nothing is left behind. */
int pool_segment_create(const struct pool_segment_config *cfg, void **base, int *fd, char *err,
			size_t err_len);

/* Opens an existing segment read-write and maps it. expected_bytes 0 accepts any size (the size
 * is returned in *bytes); otherwise a different size is -EMSGSIZE. -ENOENT when absent. */
int pool_segment_map(const char *name, const char *hugetlbfs_dir, uint64_t expected_bytes,
		     void **base, uint64_t *bytes, int *fd, char *err, size_t err_len);
void pool_segment_unmap(void *base, uint64_t bytes, int fd);
/* Removes the name (shm_unlink, or unlink in the hugetlbfs dir). 0 or -errno. */
int pool_segment_unlink(const char *name, const char *hugetlbfs_dir);

/* ---------------------------------------------------------------- mapper side */

struct pool_map {
	void *base;
	uint64_t bytes;
	int fd;
};

/* Maps an existing pool read-write (expected_bytes 0: any size). -ENOENT no such pool,
 * -EMSGSIZE size mismatch, -EACCES not in the pool's group. */
int pool_map(const char *shm_name, const char *hugetlbfs_dir, uint64_t expected_bytes,
	     struct pool_map *m, char *err, size_t err_len);
void pool_unmap(struct pool_map *m);

#endif
