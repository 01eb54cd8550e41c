/* ring — per-worker shared-memory submission/completion rings with futex doorbells.
 * See ring.h. */
#include "clock.h"
#include "ring.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "pool_map.h"
#include "errmsg.h"

#define RING_HDR_BYTES 4096u
#define RING_SPIN_NS 20000       /* a consumer polls an empty ring this long before sleeping */
#define RING_BUSY_SPINS 4        /* pause-spins before the polling starts to yield the CPU */
#define RING_WATCH_SLEEP_MS 100  /* the watch thread re-checks its stop flag this often */

_Static_assert(sizeof(struct ring_entry) == 576, "ring_entry is part of the shared layout");

/* Indices of one ring; each word the two sides write sits on its own cache line. */
struct ring_idx {
	_Atomic uint32_t head;      /* written by the consumer */
	char pad0[60];
	_Atomic uint32_t tail;      /* written by the producer */
	char pad1[60];
	_Atomic uint32_t bell;      /* futex word, bumped by the producer to wake */
	_Atomic uint32_t sleeping;  /* set by the consumer before FUTEX_WAIT */
	char pad2[56];
};

struct ring_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t entries;
	uint32_t entry_bytes;
	uint64_t seg_bytes;
	char pad[40];
	struct ring_idx sq;
	struct ring_idx cq;
};

_Static_assert(sizeof(struct ring_hdr) <= RING_HDR_BYTES, "ring header fits its page");
_Static_assert(offsetof(struct ring_hdr, sq.head) == RING_OFF_SQ_HEAD, "layout");
_Static_assert(offsetof(struct ring_hdr, sq.tail) == RING_OFF_SQ_TAIL, "layout");
_Static_assert(offsetof(struct ring_hdr, sq.sleeping) == RING_OFF_SQ_SLEEPING, "layout");
_Static_assert(offsetof(struct ring_hdr, cq.head) == RING_OFF_CQ_HEAD, "layout");
_Static_assert(offsetof(struct ring_hdr, cq.tail) == RING_OFF_CQ_TAIL, "layout");
_Static_assert(offsetof(struct ring_hdr, cq.sleeping) == RING_OFF_CQ_SLEEPING, "layout");
_Static_assert(RING_HDR_BYTES == RING_OFF_SLOTS, "layout");

struct ring {
	char name[NAME_MAX + 1];
	void *base;
	uint64_t bytes;
	int fd;
	enum ring_role role;
	uint32_t entries, mask;     /* private copies: never re-read from the segment */
	struct ring_idx *prod, *cons;
	struct ring_entry *prod_slots, *cons_slots;
	uint32_t prod_tail;         /* our own index, the only authoritative copy */
	uint32_t cons_head;
	struct ring_stats st;
	pthread_t watch_thread;
	bool watching;
	_Atomic bool watch_stop;
	int watch_efd;
};

static bool entries_ok(uint32_t n)
{
	return n >= RING_ENTRIES_MIN && n <= RING_ENTRIES_MAX && (n & (n - 1)) == 0;
}

uint64_t ring_segment_bytes(uint32_t entries)
{
	return RING_HDR_BYTES + 2ull * entries * sizeof(struct ring_entry);
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void bind_role(struct ring *r, struct ring_hdr *h)
{
	struct ring_entry *sq = (struct ring_entry *)((char *)r->base + RING_HDR_BYTES);
	struct ring_entry *cq = sq + r->entries;
	if (r->role == RING_ROLE_WORKER) {
		r->prod = &h->sq;
		r->prod_slots = sq;
		r->cons = &h->cq;
		r->cons_slots = cq;
	} else {
		r->prod = &h->cq;
		r->prod_slots = cq;
		r->cons = &h->sq;
		r->cons_slots = sq;
	}
}

int ring_create(const struct ring_config *cfg, struct ring **out, char *err, size_t err_len)
{
	*out = NULL;
	if (!entries_ok(cfg->entries)) {
		errmsg_set(err, err_len, "ring entries %u: want a power of two in [%u, %u]",
			cfg->entries, RING_ENTRIES_MIN, RING_ENTRIES_MAX);
		return -EINVAL;
	}
	struct ring *r = calloc(1, sizeof *r);
	if (!r) {
		errmsg_set(err, err_len, "out of memory");
		return -ENOMEM;
	}
	if (cfg->shm_name && strlen(cfg->shm_name) < sizeof r->name)
		strcpy(r->name, cfg->shm_name);
	r->bytes = ring_segment_bytes(cfg->entries);
	struct pool_segment_config sc = {
		.name = cfg->shm_name,
		.bytes = r->bytes,
		.mode = cfg->mode,
		.group = cfg->group,
		.unlink_existing = cfg->unlink_existing,
	};
	int ret = pool_segment_create(&sc, &r->base, &r->fd, err, err_len);
	if (ret < 0) {
		free(r);
		return ret;
	}
	r->role = RING_ROLE_DAEMON;
	r->entries = cfg->entries;
	r->mask = cfg->entries - 1;
	r->watch_efd = -1;
	struct ring_hdr *h = r->base;
	h->version = RING_VERSION;
	h->entries = cfg->entries;
	h->entry_bytes = sizeof(struct ring_entry);
	h->seg_bytes = r->bytes;
	__atomic_store_n(&h->magic, RING_MAGIC, __ATOMIC_RELEASE); /* the header is complete */
	bind_role(r, h);
	*out = r;
	return 0;
}

int ring_open(const char *shm_name, struct ring **out, char *err, size_t err_len)
{
	*out = NULL;
	struct ring *r = calloc(1, sizeof *r);
	if (!r) {
		errmsg_set(err, err_len, "out of memory");
		return -ENOMEM;
	}
	r->watch_efd = -1;
	int ret = pool_segment_map(shm_name, NULL, 0, &r->base, &r->bytes, &r->fd, err, err_len);
	if (ret < 0) {
		free(r);
		return ret;
	}
	strcpy(r->name, shm_name); /* pool_segment_map checked its length */
	struct ring_hdr h;
	if (r->bytes < RING_HDR_BYTES) {
		ret = -EPROTO;
		errmsg_set(err, err_len, "'%s' is too small to be a ring", shm_name);
		goto fail;
	}
	memcpy(&h, r->base, sizeof h);
	if (h.magic != RING_MAGIC || h.version != RING_VERSION ||
	    h.entry_bytes != sizeof(struct ring_entry) || !entries_ok(h.entries) ||
	    h.seg_bytes != ring_segment_bytes(h.entries) || h.seg_bytes > r->bytes) {
		ret = -EPROTO;
		errmsg_set(err, err_len, "'%s' is not a freekv ring of version %u", shm_name,
			RING_VERSION);
		goto fail;
	}
	r->role = RING_ROLE_WORKER;
	r->entries = h.entries;
	r->mask = h.entries - 1;
	bind_role(r, r->base);
	r->prod_tail = atomic_load_explicit(&r->prod->tail, memory_order_acquire);
	r->cons_head = atomic_load_explicit(&r->cons->head, memory_order_acquire);
	*out = r;
	return 0;
fail:
	pool_segment_unmap(r->base, r->bytes, r->fd);
	free(r);
	return ret;
}

void ring_close(struct ring *r)
{
	if (!r)
		return;
	ring_watch_stop(r);
	pool_segment_unmap(r->base, r->bytes, r->fd);
	free(r);
}

void ring_destroy(struct ring *r)
{
	if (!r)
		return;
	char name[sizeof r->name];
	strcpy(name, r->name);
	bool creator = r->role == RING_ROLE_DAEMON;
	ring_close(r);
	if (creator)
		pool_segment_unlink(name, NULL);
}

enum ring_role ring_role(const struct ring *r)
{
	return r->role;
}

uint32_t ring_entries(const struct ring *r)
{
	return r->entries;
}

const char *ring_name(const struct ring *r)
{
	return r->name;
}

/* Free slots in the produced ring, or -EPROTO when the peer's head is impossible. */
static int64_t space_of(const struct ring *r)
{
	uint32_t head = atomic_load_explicit(&r->prod->head, memory_order_acquire);
	uint32_t used = r->prod_tail - head;
	if (used > r->entries)
		return -EPROTO;
	return r->entries - used;
}

/* Entries ready in the consumed ring, or -EPROTO when the peer's tail is impossible. The load
 * is seq_cst: with the seq_cst store of `sleeping` before it and the producer's seq_cst store of
 * tail before its load of `sleeping`, either the producer sees the sleeper or the sleeper sees
 * the new tail (no lost wake-up). */
static int64_t ready_of(const struct ring *r)
{
	uint32_t tail = atomic_load_explicit(&r->cons->tail, memory_order_seq_cst);
	uint32_t n = tail - r->cons_head;
	if (n > r->entries)
		return -EPROTO;
	return n;
}

unsigned ring_space(const struct ring *r)
{
	int64_t s = space_of(r);
	return s < 0 ? 0 : (unsigned)s;
}

unsigned ring_ready(const struct ring *r)
{
	int64_t n = ready_of(r);
	return n < 0 ? 0 : (unsigned)n;
}

static void wake_peer(struct ring *r)
{
	if (atomic_load_explicit(&r->prod->sleeping, memory_order_seq_cst)) {
		atomic_fetch_add_explicit(&r->prod->bell, 1, memory_order_release);
		futex(&r->prod->bell, FUTEX_WAKE, 1, NULL);
		r->st.wakes++;
	}
}

int ring_push(struct ring *r, const struct ring_entry *e, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (e[i].n_payload > RING_PAYLOAD_MAX)
			return -EINVAL;
	int64_t space = space_of(r);
	if (space < 0)
		return (int)space;
	unsigned k = n < space ? n : (unsigned)space;
	if (k == 0)
		return 0;
	for (unsigned i = 0; i < k; i++) {
		struct ring_entry *slot = &r->prod_slots[(r->prod_tail + i) & r->mask];
		/* Only the used part of the payload is copied; the rest of the slot is stale. */
		memcpy(slot, &e[i], offsetof(struct ring_entry, payload));
		memcpy(slot->payload, e[i].payload, sizeof(uint64_t) * e[i].n_payload);
	}
	r->prod_tail += k;
	atomic_store_explicit(&r->prod->tail, r->prod_tail, memory_order_seq_cst);
	r->st.pushed += k;
	wake_peer(r);
	return (int)k;
}

int ring_pop(struct ring *r, struct ring_entry *out, unsigned max)
{
	int64_t ready = ready_of(r);
	if (ready < 0)
		return (int)ready;
	unsigned k = max < ready ? max : (unsigned)ready;
	for (unsigned i = 0; i < k; i++) {
		const struct ring_entry *slot = &r->cons_slots[(r->cons_head + i) & r->mask];
		struct ring_entry *o = &out[i];
		/* Copy first, then judge the copy: the peer may rewrite the slot meanwhile. */
		memcpy(o, slot, offsetof(struct ring_entry, payload));
		if (o->op == RING_OP_INVALID || o->op > RING_OP_MAX ||
		    o->n_payload > RING_PAYLOAD_MAX) {
			o->op = RING_OP_INVALID;
			o->n_payload = 0;
			r->st.invalid++;
			continue;
		}
		memcpy(o->payload, slot->payload, sizeof(uint64_t) * o->n_payload);
	}
	if (k) {
		r->cons_head += k;
		atomic_store_explicit(&r->cons->head, r->cons_head, memory_order_release);
		r->st.popped += k;
	}
	return (int)k;
}

static int64_t ms_left(const struct timespec *deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (int64_t)(deadline->tv_sec - now.tv_sec) * 1000 +
	       (deadline->tv_nsec - now.tv_nsec) / 1000000;
}

/* One FUTEX_WAIT on a doorbell the caller announced it sleeps on (ms < 0: no timeout); clears
 * the announcement. 0 means "re-check the ring" (woken, bell moved, or timed out); -EINTR. */
static int doorbell_sleep(struct ring_idx *idx, uint32_t seen, int64_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
	long rc = futex(&idx->bell, FUTEX_WAIT, seen, ms < 0 ? NULL : &ts);
	int e = rc < 0 ? errno : 0;
	atomic_store_explicit(&idx->sleeping, 0, memory_order_relaxed);
	if (e == EINTR)
		return -EINTR;
	return 0; /* woken, EAGAIN (bell moved), or ETIMEDOUT: the caller re-checks */
}

int ring_wait(struct ring *r, int timeout_ms)
{
	struct timespec deadline;
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	if (timeout_ms > 0) {
		deadline.tv_sec += timeout_ms / 1000;
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (deadline.tv_nsec >= 1000000000) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000;
		}
	}
	uint64_t spin_end = clock_ns() + RING_SPIN_NS;
	for (unsigned i = 0;; i++) {
		int64_t n = ready_of(r);
		if (n != 0)
			return n < 0 ? (int)n : 0;
		if ((i & 31) == 31 && clock_ns() >= spin_end)
			break;
		/* After a short busy spin, yield: the peer may be runnable on this very CPU. */
		if (i < RING_BUSY_SPINS)
			ring_cpu_relax();
		else
			sched_yield();
	}
	for (;;) {
		uint32_t seen = atomic_load_explicit(&r->cons->bell, memory_order_acquire);
		atomic_store_explicit(&r->cons->sleeping, 1, memory_order_seq_cst);
		int64_t n = ready_of(r);
		if (n != 0) {
			atomic_store_explicit(&r->cons->sleeping, 0, memory_order_relaxed);
			return n < 0 ? (int)n : 0;
		}
		int64_t ms = -1;
		if (timeout_ms >= 0) {
			ms = ms_left(&deadline);
			if (ms <= 0) {
				atomic_store_explicit(&r->cons->sleeping, 0, memory_order_relaxed);
				return -ETIMEDOUT;
			}
		}
		r->st.sleeps++;
		int ret = doorbell_sleep(r->cons, seen, ms);
		if (ret < 0)
			return ret;
	}
}

int ring_sleep_prepare(struct ring *r, struct ring_bell *b)
{
	b->word = &r->cons->bell;
	b->seen = atomic_load_explicit(&r->cons->bell, memory_order_acquire);
	b->private_word = false;
	atomic_store_explicit(&r->cons->sleeping, 1, memory_order_seq_cst);
	int64_t n = ready_of(r);
	if (n == 0) {
		r->st.sleeps++;
		return 0;
	}
	atomic_store_explicit(&r->cons->sleeping, 0, memory_order_relaxed);
	return n < 0 ? (int)n : 1;
}

void ring_sleep_end(struct ring *r)
{
	atomic_store_explicit(&r->cons->sleeping, 0, memory_order_relaxed);
}

int ring_bells_wait(const struct ring_bell *b, size_t n, int timeout_ms)
{
	struct futex_waitv w[RING_BELLS_MAX];
	struct timespec ts;
	if (n > RING_BELLS_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		w[i] = (struct futex_waitv){
			.val = b[i].seen,
			.uaddr = (uint64_t)(uintptr_t)b[i].word,
			.flags = FUTEX_32 | (b[i].private_word ? FUTEX_PRIVATE_FLAG : 0),
		};
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	long rc = syscall(SYS_futex_waitv, w, (unsigned)n, 0u, timeout_ms < 0 ? NULL : &ts, CLOCK_MONOTONIC);
	if (rc >= 0)
		return 0;
	if (errno == EINTR || errno == ENOSYS)
		return -errno;
	return 0; /* EAGAIN (a bell moved), ETIMEDOUT, EFAULT (a ring went away): re-check */
}

void ring_kick(_Atomic uint32_t *word)
{
	atomic_fetch_add_explicit(word, 1, memory_order_release);
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *watch_main(void *arg)
{
	struct ring *r = arg;
	struct ring_idx *sq = r->cons;
	uint64_t one = 1;
	/* Submissions already waiting when the watch starts are announced once. */
	uint32_t last = atomic_load_explicit(&sq->tail, memory_order_acquire);
	if (write(r->watch_efd, &one, sizeof one) < 0 && errno != EAGAIN)
		return NULL;
	while (!atomic_load_explicit(&r->watch_stop, memory_order_acquire)) {
		uint32_t seen = atomic_load_explicit(&sq->bell, memory_order_acquire);
		uint32_t t = atomic_load_explicit(&sq->tail, memory_order_acquire);
		if (t == last) {
			atomic_store_explicit(&sq->sleeping, 1, memory_order_seq_cst);
			t = atomic_load_explicit(&sq->tail, memory_order_seq_cst);
			if (t == last) {
				doorbell_sleep(sq, seen, RING_WATCH_SLEEP_MS);
				continue;
			}
			atomic_store_explicit(&sq->sleeping, 0, memory_order_relaxed);
		}
		last = t;
		/* EAGAIN: the counter is saturated, the loop is signalled already. */
		if (write(r->watch_efd, &one, sizeof one) < 0 && errno != EAGAIN)
			return NULL;
	}
	return NULL;
}

int ring_watch_start(struct ring *r, int efd)
{
	if (r->role != RING_ROLE_DAEMON || efd < 0)
		return -EINVAL;
	if (r->watching)
		return -EBUSY;
	r->watch_efd = efd;
	atomic_store(&r->watch_stop, false);
	int ret = pthread_create(&r->watch_thread, NULL, watch_main, r);
	if (ret != 0)
		return -ret;
	r->watching = true;
	return 0;
}

void ring_watch_stop(struct ring *r)
{
	if (!r->watching)
		return;
	atomic_store(&r->watch_stop, true);
	atomic_fetch_add(&r->cons->bell, 1);
	futex(&r->cons->bell, FUTEX_WAKE, INT_MAX, NULL);
	pthread_join(r->watch_thread, NULL);
	r->watching = false;
	r->watch_efd = -1;
}

void ring_stats(const struct ring *r, struct ring_stats *s)
{
	*s = r->st;
}
