/* dataplane_thread — the data-plane thread of kvstored and the lock it shares with the control
 * plane. See dataplane.h ("Threads"). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "dataplane.h"
#include "dataplane_priv.h"
#include "errmsg.h"
#include "log.h"
#include "persist.h"
#include "ring.h"
#include "tier.h"

#define DP_SPIN_NS 50000u		/* the data-plane thread polls idle rings this long, then sleeps */
#define DP_BUSY_NS 200u			/* of which this long without yielding the CPU */
#define DP_SLEEP_MS 100			/* its longest sleep (a safety net: every change kicks it) */
#define DP_SLEEP_MANY_MS 1		/* its sleep when there are more rings than futex_waitv takes */

/* The control plane announces that it waits, so that the data-plane thread, which re-takes
 * the lock in a loop, lets it in (a plain mutex would let the spinning thread win every time). */
void dp_lock(struct dp *dp)
{
	atomic_fetch_add_explicit(&dp->ctl_waiting, 1, memory_order_relaxed);
	pthread_mutex_lock(&dp->lock);
	atomic_fetch_sub_explicit(&dp->ctl_waiting, 1, memory_order_relaxed);
}

void dp_unlock(struct dp *dp)
{
	pthread_mutex_unlock(&dp->lock);
}

/* The data-plane thread's own lock: gives way while the control plane waits for it. */
static void thread_lock(struct dp *dp)
{
	while (atomic_load_explicit(&dp->ctl_waiting, memory_order_relaxed))
		sched_yield();
	pthread_mutex_lock(&dp->lock);
}

static bool rings_ready(const struct dp *dp)
{
	if (dp_scanning(dp) || persist_snapshotting(dp->ps))
		return true; /* a victim scan, or the journal's snapshot, goes on a step per pass */
	if (dp->tier && tier_ready(dp->tier))
		return true; /* tier completions to reap: the thread polls them while awake */
	for (size_t i = 0; i < dp->max_w; i++)
		if (dp->w[i].ring && ring_ready(dp->w[i].ring))
			return true;
	return false;
}

/* Announce sleep on every ring and sleep on all doorbells plus the kick word; returns at once
 * when a ring turns out not to be empty. Called without the lock; takes it to read the rings.
 * quiet: the thread polls tier completions while awake (tier_notify off); for the sleep the
 * tier's eventfd is turned on, and the control loop, which polls it, kicks the thread
 * (dp_poll_done). kicks: the kick word as the caller last served it. Sleeps no longer than
 * waiting ops and retries allow (dp_poll_timeout). */
static void thread_sleep(struct dp *dp, bool quiet, uint32_t kicks)
{
	struct ring_bell bells[RING_BELLS_MAX];
	size_t nb = 0;
	bool ready = false, all = true;
	thread_lock(dp);
	if (quiet) {
		tier_notify(dp->tier, true);
		ready = tier_ready(dp->tier);
	}
	bells[nb++] = (struct ring_bell){ &dp->kick, kicks, true }; /* a kick since: no sleep */
	for (size_t i = 0; i < dp->max_w && !ready; i++) {
		if (!dp->w[i].ring)
			continue;
		if (nb == RING_BELLS_MAX) {
			all = false;
			break;
		}
		int ret = ring_sleep_prepare(dp->w[i].ring, &bells[nb]);
		if (ret == 0)
			nb++;
		else if (ret > 0)
			ready = true;
		else
			all = false; /* a corrupt ring: no doorbell to trust, poll it */
	}
	int timeout = dp_poll_timeout(dp, all ? DP_SLEEP_MS : DP_SLEEP_MANY_MS);
	dp_unlock(dp);
	if (!ready && timeout > 0) {
		int ret = ring_bells_wait(bells, nb, timeout);
		if (ret == -ENOSYS) {
			struct timespec ts = { 0, DP_SLEEP_MANY_MS * 1000000L };
			nanosleep(&ts, NULL); /* no futex_waitv (Linux < 5.16): poll */
		}
	}
	thread_lock(dp);
	for (size_t i = 0; i < dp->max_w; i++)
		if (dp->w[i].ring)
			ring_sleep_end(dp->w[i].ring);
	if (quiet)
		tier_notify(dp->tier, false);
	dp_unlock(dp);
}

static void *thread_main(void *arg)
{
	struct dp *dp = arg;
	uint64_t idle_since = 0;
	thread_lock(dp);
	bool quiet = dp->tier && tier_notify(dp->tier, false);
	dp_unlock(dp);
	uint32_t kicks = 0;
	while (!atomic_load_explicit(&dp->thread_stop, memory_order_acquire)) {
		thread_lock(dp);
		/* A kick means work the control loop queued (tier requests, freed room): one pass. */
		uint32_t k = atomic_load_explicit(&dp->kick, memory_order_acquire);
		bool work = rings_ready(dp) || k != kicks;
		kicks = k;
		if (work)
			dp_run(dp);
		dp_unlock(dp);
		if (work) {
			idle_since = 0;
			continue;
		}
		uint64_t t = clock_ns();
		if (!idle_since)
			idle_since = t;
		if (t - idle_since < DP_SPIN_NS) {
			/* Busy first, then yielding: a worker waiting on this CPU gets it at once. */
			if (t - idle_since < DP_BUSY_NS)
				for (int i = 0; i < 16; i++)
					ring_cpu_relax();
			else
				sched_yield();
			continue;
		}
		thread_sleep(dp, quiet, kicks);
		idle_since = 0;
	}
	if (quiet) {
		thread_lock(dp);
		tier_notify(dp->tier, true); /* the caller reaps through the eventfd again */
		dp_unlock(dp);
	}
	return NULL;
}

int dp_start(struct dp *dp, char *err, size_t errlen)
{
	if (dp->thread_running)
		return -EBUSY;
	atomic_store(&dp->thread_stop, false);
	/* After dp_restore: the extents the journal names are taken before any zeros go out. */
	if (dp->tier && dp->cfg->nvme_prewrite && !dp->tpw && tpw_open(dp->tier, &dp->tpw))
		log_warn("NVMe tier: out of memory for the list of its unwritten ranges: no zeros "
			 "written ahead");
	dp->thread_running = true; /* before the thread: it reads it */
	persist_on_synced(dp->ps, dp_synced, dp);
	int ret = pthread_create(&dp->thread, NULL, thread_main, dp);
	if (ret) {
		persist_on_synced(dp->ps, NULL, NULL);
		dp->thread_running = false;
		errmsg_set(err, errlen, "data-plane thread: %s", strerror(ret));
		return -ret;
	}
	return 0;
}

void dp_poll_done(struct dp *dp, const int *ready, size_t n)
{
	bool run = !dp->thread_running;
	for (size_t i = 0; i < n && !run; i++) {
		if (dp->tier && ready[i] == tier_eventfd(dp->tier)) {
			uint64_t v;
			if (read(ready[i], &v, sizeof v) < 0 && errno != EAGAIN)
				run = true; /* cannot clear it: reap here, as without the thread */
		} else {
			run = true; /* the remote tier's socket: dp_run reads it */
		}
	}
	if (run)
		dp_run(dp);
	if (dp->thread_running)
		ring_kick(&dp->kick);
}

void dp_stop(struct dp *dp)
{
	if (!dp->thread_running)
		return;
	atomic_store(&dp->thread_stop, true);
	ring_kick(&dp->kick);
	pthread_join(dp->thread, NULL);
	persist_on_synced(dp->ps, NULL, NULL); /* dp may be freed before the journal's thread ends */
	dp->thread_running = false;
}
