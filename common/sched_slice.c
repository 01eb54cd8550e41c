/* sched_slice — EEVDF slice requests. See sched_slice.h. glibc has no wrapper for
 * sched_setattr/sched_getattr, so they are raw system calls on the kernel's struct. */
#include "sched_slice.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "errmsg.h"

/* The kernel's struct sched_attr, first version (48 bytes), as <linux/sched/types.h> has it. */
struct slice_attr {
	uint32_t size;
	uint32_t sched_policy;
	uint64_t sched_flags;
	int32_t sched_nice;
	uint32_t sched_priority;
	uint64_t sched_runtime;
	uint64_t sched_deadline;
	uint64_t sched_period;
};

/* The fair policies, the only ones a slice request applies to. */
#define SLICE_POLICY_OTHER 0u		/* SCHED_OTHER */
#define SLICE_POLICY_BATCH 3u		/* SCHED_BATCH */
#define SLICE_RESET_ON_FORK 0x01u	/* SCHED_FLAG_RESET_ON_FORK, kept as the thread has it */

static int slice_get(pid_t tid, struct slice_attr *a)
{
	memset(a, 0, sizeof *a);
	if (syscall(SYS_sched_getattr, tid, a, (unsigned)sizeof *a, 0u))
		return -errno;
	return 0;
}

static int slice_fair(const struct slice_attr *a)
{
	return a->sched_policy == SLICE_POLICY_OTHER || a->sched_policy == SLICE_POLICY_BATCH;
}

long sched_slice_current(pid_t tid)
{
	struct slice_attr a;
	int ret = slice_get(tid, &a);
	if (ret)
		return ret;
	return slice_fair(&a) ? (long)(a.sched_runtime / 1000u) : 0;
}

int sched_slice_request(pid_t tid, unsigned us, char *err, size_t errlen)
{
	if (!sched_slice_valid(us))
		return errmsg(err, errlen, -EINVAL, "a slice of %u us is outside the kernel's %u to %u",
			      us, SCHED_SLICE_MIN_US, SCHED_SLICE_MAX_US);
	if (!us)
		return 0;
	/* The call sets the policy, the nice value and reset-on-fork too: passed back as they are. */
	struct slice_attr a;
	int ret = slice_get(tid, &a);
	if (ret)
		return errmsg(err, errlen, ret, "sched_getattr: %s", strerror(-ret));
	if (!slice_fair(&a))
		return errmsg(err, errlen, -EINVAL, "the thread runs under scheduling policy %u; a "
			      "slice request needs SCHED_OTHER or SCHED_BATCH", a.sched_policy);
	a.size = sizeof a;
	a.sched_flags &= SLICE_RESET_ON_FORK;
	a.sched_runtime = (uint64_t)us * 1000u;
	if (syscall(SYS_sched_setattr, tid, &a, 0u)) {
		int e = errno;
		return errmsg(err, errlen, -e, "sched_setattr for a %u us slice: %s", us, strerror(e));
	}
	long got = sched_slice_current(tid);
	if (got < 0)
		return errmsg(err, errlen, (int)got, "sched_getattr: %s", strerror((int)-got));
	if (got != (long)us)
		return errmsg(err, errlen, -EOPNOTSUPP, "this kernel keeps no slice requests (it took "
			      "%u us and reports %ld; they came with Linux 6.12)", us, got);
	return 0;
}

int sched_slice_request_process(unsigned us, char *err, size_t errlen)
{
	int ret = sched_slice_request(0, us, err, errlen);
	if (ret || !us)
		return ret;
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return errmsg(err, errlen, -errno, "/proc/self/task: %s", strerror(errno));
	pid_t self = (pid_t)syscall(SYS_gettid);
	for (struct dirent *e; !ret && (e = readdir(d));) {
		pid_t tid = (pid_t)atoi(e->d_name);
		if (tid <= 0 || tid == self)
			continue;
		ret = sched_slice_request(tid, us, err, errlen);
		if (ret == -ESRCH)
			ret = 0; /* it ended meanwhile */
	}
	closedir(d);
	return ret;
}
