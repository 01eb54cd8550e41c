/* sched_slice — ask the kernel's fair scheduler for short time slices (EEVDF slice requests,
 * Linux 6.12 and later: sched_attr.sched_runtime of a SCHED_OTHER thread).
 *
 * A thread that mostly sleeps until a peer wakes it (a worker waiting on kvstored's completion
 * ring) and shares few cores with CPU-bound threads waits for a core each time it is woken: the
 * running thread keeps it until its slice ends (1.4 ms on a 2-core host). A thread whose
 * requested slice is shorter than the running one's preempts it on wake-up instead. Its share
 * of the CPU is unchanged (that is the nice value's job); only its latency is. A request is a
 * thread's, inherited by the threads and processes it creates afterwards.
 * docs/design.md §4 "Wake-ups on a busy host" says where freekv uses it. */
#ifndef FREEKV_SCHED_SLICE_H
#define FREEKV_SCHED_SLICE_H

#include <stddef.h>
#include <sys/types.h>

/* The kernel's bounds on a requested slice, in microseconds. */
#define SCHED_SLICE_MIN_US 100u
#define SCHED_SLICE_MAX_US 100000u

/* Whether us is a value the calls below take: 0 (none) or within the kernel's bounds. */
static inline int sched_slice_valid(unsigned long long us)
{
	return !us || (us >= SCHED_SLICE_MIN_US && us <= SCHED_SLICE_MAX_US);
}

/* Requests us-microsecond slices for thread tid (0: the calling thread); 0 us does nothing.
 * Returns 0, -EINVAL (outside SCHED_SLICE_MIN_US..SCHED_SLICE_MAX_US, or a thread under a
 * real-time policy), -EOPNOTSUPP (the kernel took the call but keeps no slice request: older
 * than 6.12) or the -errno of sched_setattr, with the reason in err. */
int sched_slice_request(pid_t tid, unsigned us, char *err, size_t errlen);

/* The same for every thread of the calling process (/proc/self/task), those that libraries
 * started before main included (OpenBLAS starts its pool at load). */
int sched_slice_request_process(unsigned us, char *err, size_t errlen);

/* Thread tid's (0: the caller's) slice in microseconds as the kernel reports it: the one asked
 * for, else the scheduler's base slice (0 from a kernel that keeps no slice requests, and for a
 * real-time thread), or -errno. */
long sched_slice_current(pid_t tid);

#endif
