/* owner — one kvstored per pool name and per NVMe tier (docs/design.md §4 "Ownership of the pool
 * name"). Before it creates or unlinks anything, a daemon takes an exclusive flock on a lock file
 * per resource — /dev/shm/<shm_name>.lock (or <hugetlbfs_path>/<shm_name>.lock) and
 * <nvme_path>.lock — and writes its pid there. A second daemon configured with the same name or
 * path finds the lock held and refuses, naming the owner's pid; it touches nothing.
 *
 * Holding the lock also proves that whatever carries the name now was left by a dead owner: the
 * pool segment and the `<shm_name>-ring-<id>` segments of a previous daemon are then removed
 * before the new ones are made, and each removal is logged.
 *
 * The lock files are unlinked on release. A waiter that locked a file just unlinked by its owner
 * sees that its descriptor no longer matches the path and retries, so two daemons can never both
 * believe they own one name. Ownership: owner_take fills struct owner; owner_release undoes it. */
#ifndef FREEKV_OWNER_H
#define FREEKV_OWNER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "config.h"

struct owner {
	int pool_fd, nvme_fd;		   /* -1 when not held */
	char pool_lock[2 * CFG_STR_MAX + 16];
	char nvme_lock[CFG_STR_MAX + 16];
};

/* Takes both locks (the NVMe one only when cfg has an nvme_path). -EBUSY when another live
 * daemon holds one (err names the resource and its pid); other -errno when a lock file cannot be
 * made. On failure nothing is held. */
int owner_take(struct owner *o, const struct cfg *cfg, char *err, size_t errlen);

/* With the locks held: removes the pool segment (unless keep_pool: a persistent daemon adopts
 * it, docs/design.md §4 "Restart without loss") and ring segments a dead owner left under cfg's
 * shm_name, logging each to stderr. Returns how many were removed. */
int owner_clean_stale(const struct owner *o, const struct cfg *cfg, bool keep_pool);

void owner_release(struct owner *o);

#endif
