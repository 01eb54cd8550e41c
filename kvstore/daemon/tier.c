/* tier — the NVMe tier: an O_DIRECT file, an extent allocator and io_uring block I/O.
 * See tier.h. */
#include "tier.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "errmsg.h"
#include "log.h"

#define NONE UINT32_MAX
#define TIER_REFILL_BATCH 32u /* queued refills tier_reap submits together */

/* user_data of every SQE: which request, which incarnation of it, which operation. A stale or
 * foreign completion (gen or op mismatch) is reported and ignored instead of corrupting a
 * reused request slot. */
union tier_tag {
	uint64_t u64;
	struct {
		uint32_t idx;
		uint32_t gen : 24;
		uint32_t op : 8;
	} f;
};

_Static_assert(sizeof(union tier_tag) == sizeof(uint64_t), "user_data is 64 bits");

enum req_state { REQ_FREE, REQ_QUEUED, REQ_INFLIGHT };

struct tier_req {
	uint64_t cookie;
	char *buf;
	uint64_t file_off;
	uint32_t len;           /* the data: what the checksum covers */
	uint32_t io_len;        /* len rounded up to TIER_ALIGN: what O_DIRECT transfers */
	uint32_t done;          /* bytes transferred so far (short I/O continues from here) */
	uint32_t crc, crc_expected;
	uint32_t gen;
	uint32_t next;          /* queue / free-list link */
	uint8_t op;
	uint8_t state;
	bool crc_ready;         /* writes: crc holds the checksum of buf */
};

struct extent {
	uint64_t off, len;
};

/* Allocated extents, open addressing keyed by offset (len 0 = empty slot). */
struct ext_map {
	struct extent *slots;
	size_t cap, n;
};

struct tier {
	int fd;
	uint64_t bytes;
	struct io_uring ring;
	bool ring_ok;
	unsigned qd;
	int efd;
	bool efd_quiet;         /* tier_notify(false) took: completions do not signal efd */
	bool fixed_file;
	char *reg_base;
	uint64_t reg_bytes;
	unsigned n_chunks;      /* registered buffers, TIER_CHUNK_MAX each except the last */
	struct tier_req *reqs;
	uint32_t *crc_todo;     /* (max_reqs,) writes submitted by tier_flush, checksummed after */
	uint32_t max_reqs;
	uint32_t free_head;
	uint32_t n_free;	/* request slots on the free list */
	uint32_t q_head, q_tail;
	uint32_t q_rlast;	/* the last read of the reads queued ahead of every write, or NONE */
	unsigned n_queued, n_inflight;
	struct extent *free_ext; /* sorted by offset, never adjacent (coalesced) */
	size_t n_free_ext, cap_free_ext;
	struct ext_map used;
	struct tier_usage u;
	unsigned inject_n[TIER_OP_READ + 1];	/* by enum tier_op: see tier_inject_error */
	int inject_err[TIER_OP_READ + 1];
};

static uint64_t round_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

/* ---------------------------------------------------------------- extent allocator */

static size_t ext_hash(const struct ext_map *m, uint64_t off)
{
	return (size_t)((off / TIER_ALIGN) * 0x9E3779B97F4A7C15ull >> 20) & (m->cap - 1);
}

static int ext_map_grow(struct ext_map *m)
{
	size_t cap = m->cap ? m->cap * 2 : 1024;
	struct extent *s = calloc(cap, sizeof *s);
	if (!s)
		return -ENOMEM;
	struct ext_map nm = { s, cap, 0 };
	for (size_t i = 0; i < m->cap; i++) {
		if (!m->slots[i].len)
			continue;
		size_t h = ext_hash(&nm, m->slots[i].off);
		while (nm.slots[h].len)
			h = (h + 1) & (cap - 1);
		nm.slots[h] = m->slots[i];
		nm.n++;
	}
	free(m->slots);
	*m = nm;
	return 0;
}

static size_t ext_map_find(const struct ext_map *m, uint64_t off)
{
	if (!m->cap)
		return SIZE_MAX;
	for (size_t h = ext_hash(m, off);; h = (h + 1) & (m->cap - 1)) {
		if (!m->slots[h].len)
			return SIZE_MAX;
		if (m->slots[h].off == off)
			return h;
	}
}

static int ext_map_put(struct ext_map *m, uint64_t off, uint64_t len)
{
	if ((m->n + 1) * 2 > m->cap) {
		int ret = ext_map_grow(m);
		if (ret < 0)
			return ret;
	}
	size_t h = ext_hash(m, off);
	while (m->slots[h].len)
		h = (h + 1) & (m->cap - 1);
	m->slots[h] = (struct extent){ off, len };
	m->n++;
	return 0;
}

/* Linear-probing delete with backward shift, so lookups never need tombstones. */
static void ext_map_del(struct ext_map *m, size_t h)
{
	size_t mask = m->cap - 1;
	m->slots[h].len = 0;
	for (size_t j = (h + 1) & mask; m->slots[j].len; j = (j + 1) & mask) {
		size_t home = ext_hash(m, m->slots[j].off);
		/* Move j back into the hole when its home is not cyclically within (h, j]. */
		bool stays = h <= j ? (home > h && home <= j) : (home > h || home <= j);
		if (!stays) {
			m->slots[h] = m->slots[j];
			m->slots[j].len = 0;
			h = j;
		}
	}
	m->n--;
}

static int free_insert_at(struct tier *t, size_t i, uint64_t off, uint64_t len)
{
	if (t->n_free_ext == t->cap_free_ext) {
		size_t cap = t->cap_free_ext ? t->cap_free_ext * 2 : 64;
		struct extent *n = realloc(t->free_ext, sizeof *n * cap);
		if (!n)
			return -ENOMEM;
		t->free_ext = n;
		t->cap_free_ext = cap;
	}
	memmove(&t->free_ext[i + 1], &t->free_ext[i], sizeof *t->free_ext * (t->n_free_ext - i));
	t->free_ext[i] = (struct extent){ off, len };
	t->n_free_ext++;
	return 0;
}

static void free_remove_at(struct tier *t, size_t i)
{
	memmove(&t->free_ext[i], &t->free_ext[i + 1], sizeof *t->free_ext * (t->n_free_ext - i - 1));
	t->n_free_ext--;
}

/* Carves [a, a+len) out of free extent i. */
static int take(struct tier *t, size_t i, uint64_t a, uint64_t len)
{
	struct extent e = t->free_ext[i];
	uint64_t before = a - e.off, after = e.off + e.len - (a + len);
	if (before && after) {
		int ret = free_insert_at(t, i + 1, a + len, after);
		if (ret < 0)
			return ret;
		t->free_ext[i].len = before;
	} else if (before) {
		t->free_ext[i].len = before;
	} else if (after) {
		t->free_ext[i] = (struct extent){ a + len, after };
	} else {
		free_remove_at(t, i);
	}
	return 0;
}

int tier_extent_alloc(struct tier *t, uint64_t len, uint64_t *off)
{
	if (len == 0 || len > t->bytes)
		return len == 0 ? -EINVAL : -ENOSPC;
	uint64_t l = round_up(len, TIER_ALIGN);
	size_t pick = SIZE_MAX;
	uint64_t at = 0;
	for (size_t i = 0; i < t->n_free_ext; i++) {
		const struct extent *e = &t->free_ext[i];
		uint64_t a = round_up(e->off, l);
		if (a + l <= e->off + e->len) {
			pick = i;
			at = a;
			break;
		}
	}
	for (size_t i = 0; pick == SIZE_MAX && i < t->n_free_ext; i++) {
		if (t->free_ext[i].len >= l) {
			pick = i;
			at = t->free_ext[i].off;
		}
	}
	if (pick == SIZE_MAX)
		return -ENOSPC;
	int ret = ext_map_put(&t->used, at, l);
	if (ret < 0)
		return ret;
	ret = take(t, pick, at, l);
	if (ret < 0) {
		ext_map_del(&t->used, ext_map_find(&t->used, at));
		return ret;
	}
	t->u.used_bytes += l;
	t->u.extents++;
	*off = at;
	return 0;
}

int tier_extent_adopt(struct tier *t, uint64_t off, uint64_t len)
{
	uint64_t l = round_up(len, TIER_ALIGN);
	if (len == 0 || off % TIER_ALIGN || off > t->bytes || l > t->bytes - off)
		return -EINVAL;
	/* The free extent that contains [off, off+l) whole, if any (sorted, binary search). */
	size_t lo = 0, hi = t->n_free_ext;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (t->free_ext[mid].off <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0 || t->free_ext[lo - 1].off + t->free_ext[lo - 1].len < off + l)
		return -EEXIST; /* overlaps an extent in use */
	int ret = ext_map_put(&t->used, off, l);
	if (ret < 0)
		return ret;
	ret = take(t, lo - 1, off, l);
	if (ret < 0) {
		ext_map_del(&t->used, ext_map_find(&t->used, off));
		return ret;
	}
	t->u.used_bytes += l;
	t->u.extents++;
	return 0;
}

int tier_free_run(const struct tier *t, uint64_t from, uint64_t *off, uint64_t *len)
{
	size_t lo = 0, hi = t->n_free_ext;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (t->free_ext[mid].off + t->free_ext[mid].len <= from)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == t->n_free_ext)
		return -ENOENT;
	*off = t->free_ext[lo].off;
	*len = t->free_ext[lo].len;
	return 0;
}

bool tier_extent_taken(const struct tier *t, uint64_t off, uint64_t len)
{
	size_t h = ext_map_find(&t->used, off);
	return h != SIZE_MAX && t->used.slots[h].len == round_up(len, TIER_ALIGN);
}

int tier_extent_free(struct tier *t, uint64_t off, uint64_t len)
{
	uint64_t l = round_up(len, TIER_ALIGN);
	size_t h = ext_map_find(&t->used, off);
	if (len == 0 || h == SIZE_MAX || t->used.slots[h].len != l)
		return -EINVAL;
	/* First free extent after off; merge with the neighbours that touch it. */
	size_t lo = 0, hi = t->n_free_ext;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (t->free_ext[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	bool merge_prev = lo > 0 && t->free_ext[lo - 1].off + t->free_ext[lo - 1].len == off;
	bool merge_next = lo < t->n_free_ext && off + l == t->free_ext[lo].off;
	if (merge_prev && merge_next) {
		t->free_ext[lo - 1].len += l + t->free_ext[lo].len;
		free_remove_at(t, lo);
	} else if (merge_prev) {
		t->free_ext[lo - 1].len += l;
	} else if (merge_next) {
		t->free_ext[lo].off = off;
		t->free_ext[lo].len += l;
	} else {
		int ret = free_insert_at(t, lo, off, l);
		if (ret < 0)
			return ret;
	}
	ext_map_del(&t->used, h);
	t->u.used_bytes -= l;
	t->u.extents--;
	return 0;
}

/* ---------------------------------------------------------------- open / close */

static int open_file(struct tier *t, const struct tier_config *cfg, char *err, size_t err_len)
{
	struct stat st;
	bool blk = stat(cfg->path, &st) == 0 && S_ISBLK(st.st_mode);
	int flags = O_RDWR | O_CLOEXEC | (blk ? 0 : O_CREAT);
	int fd = open(cfg->path, flags | O_DIRECT, 0600);
	if (fd < 0 && errno == EINVAL) {
		if (!cfg->allow_buffered) {
			errmsg_set(err, err_len, "%s: O_DIRECT not supported on this file system (tmpfs?); "
				"put nvme_path on a real disk", cfg->path);
			return -EINVAL;
		}
		log_warn("NVMe tier %s: O_DIRECT not supported, using buffered I/O", cfg->path);
		fd = open(cfg->path, flags, 0600);
	} else if (fd >= 0) {
		t->u.direct = true;
	}
	if (fd < 0) {
		int ret = -errno;
		errmsg_set(err, err_len, "cannot open %s: %s", cfg->path, strerror(-ret));
		return ret;
	}
	t->fd = fd;
	uint64_t size = cfg->bytes;
	if (blk) {
		if (ioctl(fd, BLKGETSIZE64, &size) < 0) {
			int ret = -errno;
			errmsg_set(err, err_len, "%s: cannot read device size: %s", cfg->path,
				strerror(-ret));
			return ret;
		}
	} else if (fallocate(fd, 0, 0, (off_t)cfg->bytes) < 0) {
		int ret = -errno;
		if (ret != -EOPNOTSUPP) {
			errmsg_set(err, err_len, "cannot preallocate %llu bytes at %s: %s",
				(unsigned long long)cfg->bytes, cfg->path, strerror(-ret));
			return ret;
		}
		log_warn("NVMe tier %s: fallocate unsupported, file is sparse", cfg->path);
		if (ftruncate(fd, (off_t)cfg->bytes) < 0) {
			ret = -errno;
			errmsg_set(err, err_len, "cannot size %s: %s", cfg->path, strerror(-ret));
			return ret;
		}
	}
	t->bytes = size / TIER_ALIGN * TIER_ALIGN;
	if (t->bytes == 0) {
		errmsg_set(err, err_len, "%s: tier size must be at least %u bytes", cfg->path,
			TIER_ALIGN);
		return -EINVAL;
	}
	return 0;
}

static void register_buffers(struct tier *t, const struct tier_config *cfg)
{
	if (!cfg->reg_base || cfg->reg_bytes == 0)
		return;
	unsigned n = (unsigned)((cfg->reg_bytes + TIER_CHUNK_MAX - 1) / TIER_CHUNK_MAX);
	struct iovec *iov = calloc(n, sizeof *iov);
	if (!iov)
		return;
	for (unsigned i = 0; i < n; i++) {
		uint64_t off = (uint64_t)i * TIER_CHUNK_MAX;
		uint64_t left = cfg->reg_bytes - off;
		iov[i].iov_base = (char *)cfg->reg_base + off;
		iov[i].iov_len = left < TIER_CHUNK_MAX ? left : TIER_CHUNK_MAX;
	}
	int ret = io_uring_register_buffers(&t->ring, iov, n);
	free(iov);
	if (ret < 0) {
		log_warn("NVMe tier: registering %llu bytes as fixed buffers failed (%s); using "
			"plain buffers (a higher LimitMEMLOCK= enables them)",
			(unsigned long long)cfg->reg_bytes, strerror(-ret));
		return;
	}
	t->reg_base = cfg->reg_base;
	t->reg_bytes = cfg->reg_bytes;
	t->n_chunks = n;
	t->u.fixed_buffers = true;
}

int tier_open(const struct tier_config *cfg, struct tier **out, char *err, size_t err_len)
{
	*out = NULL;
	if (!cfg->path || !cfg->path[0]) {
		errmsg_set(err, err_len, "no NVMe tier path");
		return -EINVAL;
	}
	struct tier *t = calloc(1, sizeof *t);
	if (!t) {
		errmsg_set(err, err_len, "out of memory");
		return -ENOMEM;
	}
	t->fd = -1;
	t->efd = -1;
	t->qd = cfg->queue_depth ? cfg->queue_depth : 64;
	t->max_reqs = cfg->max_requests ? cfg->max_requests : 4 * t->qd;
	int ret = open_file(t, cfg, err, err_len);
	if (ret < 0)
		goto fail;
	t->reqs = calloc(t->max_reqs, sizeof *t->reqs);
	t->crc_todo = calloc(t->max_reqs, sizeof *t->crc_todo);
	ret = -ENOMEM;
	if (!t->reqs || !t->crc_todo || free_insert_at(t, 0, 0, t->bytes) < 0) {
		errmsg_set(err, err_len, "out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < t->max_reqs; i++)
		t->reqs[i].next = i + 1 < t->max_reqs ? i + 1 : NONE;
	t->free_head = 0;
	t->n_free = t->max_reqs;
	t->q_head = t->q_tail = t->q_rlast = NONE;
	ret = io_uring_queue_init(t->qd, &t->ring, 0);
	if (ret < 0) {
		errmsg_set(err, err_len, "io_uring setup (%u entries) failed: %s", t->qd, strerror(-ret));
		goto fail;
	}
	t->ring_ok = true;
	if (io_uring_register_files(&t->ring, &t->fd, 1) == 0)
		t->fixed_file = true;
	else
		log_warn("NVMe tier: registering the file failed; using its descriptor");
	t->u.fixed_file = t->fixed_file;
	register_buffers(t, cfg);
	t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->efd >= 0 && io_uring_register_eventfd(&t->ring, t->efd) < 0) {
		close(t->efd);
		t->efd = -1;
	}
	t->u.bytes = t->bytes;
	*out = t;
	return 0;
fail:
	tier_close(t);
	return ret;
}

static void drop_result(void *ctx, const struct tier_result *res)
{
	(void)ctx;
	(void)res;
}

void tier_close(struct tier *t)
{
	if (!t)
		return;
	if (t->ring_ok) {
		while (t->n_inflight) {
			if (tier_wait(t, 1000, drop_result, NULL) < 0)
				break;
		}
		io_uring_queue_exit(&t->ring);
	}
	if (t->efd >= 0)
		close(t->efd);
	if (t->fd >= 0)
		close(t->fd);
	free(t->reqs);
	free(t->crc_todo);
	free(t->free_ext);
	free(t->used.slots);
	free(t);
}

/* ---------------------------------------------------------------- requests */

static int queue_req(struct tier *t, uint8_t op, void *buf, uint64_t file_off, uint32_t len,
		     uint32_t crc, uint64_t cookie)
{
	uint64_t io_len = round_up(len, TIER_ALIGN);
	if (!buf || len == 0 || file_off % TIER_ALIGN || (uintptr_t)buf % TIER_ALIGN ||
	    io_len > UINT32_MAX || file_off > t->bytes || io_len > t->bytes - file_off)
		return -EINVAL;
	if (t->free_head == NONE)
		return -EBUSY;
	uint32_t i = t->free_head;
	struct tier_req *r = &t->reqs[i];
	t->free_head = r->next;
	t->n_free--;
	uint32_t gen = (r->gen + 1) & 0xffffff;
	*r = (struct tier_req){
		.cookie = cookie, .buf = buf, .file_off = file_off, .len = len,
		.io_len = (uint32_t)io_len, .crc_expected = crc, .gen = gen, .next = NONE, .op = op,
		.state = REQ_QUEUED,
	};
	if (op == TIER_OP_READ) {
		/* Reads go ahead of queued writes, in their own order: a read is what a RECALL waits
		 * for, a write (a demotion) only frees room ahead of need. */
		uint32_t after = t->q_rlast;
		r->next = after == NONE ? t->q_head : t->reqs[after].next;
		if (after == NONE)
			t->q_head = i;
		else
			t->reqs[after].next = i;
		if (t->q_tail == after)
			t->q_tail = i;
		t->q_rlast = i;
	} else {
		if (t->q_tail == NONE)
			t->q_head = i;
		else
			t->reqs[t->q_tail].next = i;
		t->q_tail = i;
	}
	t->n_queued++;
	return 0;
}

int tier_write(struct tier *t, const void *buf, uint64_t file_off, uint32_t len, uint64_t cookie)
{
	return queue_req(t, TIER_OP_WRITE, (void *)buf, file_off, len, 0, cookie);
}

int tier_read(struct tier *t, void *buf, uint64_t file_off, uint32_t len, uint32_t crc,
	      uint64_t cookie)
{
	return queue_req(t, TIER_OP_READ, buf, file_off, len, crc, cookie);
}

/* Registered-buffer index holding [p, p+len), or -1. */
static int chunk_of(const struct tier *t, const char *p, uint32_t len)
{
	if (!t->n_chunks || p < t->reg_base || p + len > t->reg_base + t->reg_bytes)
		return -1;
	uint64_t off = (uint64_t)(p - t->reg_base);
	uint64_t c = off / TIER_CHUNK_MAX;
	if ((off + len - 1) / TIER_CHUNK_MAX != c)
		return -1;
	return (int)c;
}

static void prep(struct tier *t, struct io_uring_sqe *sqe, uint32_t i)
{
	struct tier_req *r = &t->reqs[i];
	char *p = r->buf + r->done;
	uint32_t n = r->io_len - r->done;
	uint64_t off = r->file_off + r->done;
	int fd = t->fixed_file ? 0 : t->fd;
	int c = chunk_of(t, p, n);
	if (r->op == TIER_OP_WRITE) {
		if (c >= 0)
			io_uring_prep_write_fixed(sqe, fd, p, n, off, c);
		else
			io_uring_prep_write(sqe, fd, p, n, off);
	} else {
		if (c >= 0)
			io_uring_prep_read_fixed(sqe, fd, p, n, off, c);
		else
			io_uring_prep_read(sqe, fd, p, n, off);
	}
	if (t->fixed_file)
		sqe->flags |= IOSQE_FIXED_FILE;
	union tier_tag tag = { .f = { .idx = i, .gen = r->gen, .op = r->op } };
	io_uring_sqe_set_data64(sqe, tag.u64);
}

/* A write's checksum: computed once, after its submission when tier_flush gets to it (the CPU
 * work then overlaps the device's), else when it completes. The buffer is unchanged meanwhile
 * (see tier.h), so both give the checksum of the bytes written. */
static void write_crc(struct tier_req *r)
{
	if (!r->crc_ready) {
		r->crc = crc32c(0, r->buf, r->len);
		r->crc_ready = true;
	}
}

/* Submits what the submission queue holds, then checksums the writes just handed over. */
static int submit(struct tier *t, uint32_t n_todo)
{
	int ret = io_uring_sq_ready(&t->ring) ? io_uring_submit(&t->ring) : 0;
	for (uint32_t k = 0; k < n_todo; k++)
		write_crc(&t->reqs[t->crc_todo[k]]);
	return ret;
}

int tier_flush(struct tier *t)
{
	int moved = 0;
	uint32_t n_todo = 0;
	/* Never more in flight than the completion queue holds, so it cannot overflow. */
	while (t->q_head != NONE && t->n_inflight < t->ring.cq.ring_entries) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
		if (!sqe) {
			/* Full submission queue: hand what is there to the kernel and retry once. */
			int ret = submit(t, n_todo);
			n_todo = 0;
			if (ret < 0 && ret != -EAGAIN && ret != -EBUSY && ret != -EINTR)
				return ret;
			sqe = io_uring_get_sqe(&t->ring);
			if (!sqe)
				break;
		}
		uint32_t i = t->q_head;
		t->q_head = t->reqs[i].next;
		if (t->q_head == NONE)
			t->q_tail = NONE;
		if (t->q_rlast == i)
			t->q_rlast = NONE;
		t->reqs[i].next = NONE;
		t->reqs[i].state = REQ_INFLIGHT;
		t->n_queued--;
		t->n_inflight++;
		prep(t, sqe, i);
		if (t->reqs[i].op == TIER_OP_WRITE && !t->reqs[i].crc_ready)
			t->crc_todo[n_todo++] = i;
		moved++;
	}
	int ret = submit(t, n_todo); /* no system call when nothing is new */
	if (ret < 0 && ret != -EAGAIN && ret != -EBUSY && ret != -EINTR)
		return ret;
	return moved;
}

static void req_release(struct tier *t, uint32_t i)
{
	t->reqs[i].state = REQ_FREE;
	t->reqs[i].next = t->free_head;
	t->free_head = i;
	t->n_free++;
}

static void requeue_front(struct tier *t, uint32_t i)
{
	struct tier_req *r = &t->reqs[i];
	r->state = REQ_QUEUED;
	r->next = t->q_head;
	t->q_head = i;
	if (t->q_tail == NONE)
		t->q_tail = i;
	if (r->op == TIER_OP_READ && t->q_rlast == NONE)
		t->q_rlast = i;
	t->n_inflight--;
	t->n_queued++;
	t->u.retries++;
}

/* Handles one CQE. Returns 1 when a request finished (and was reported), else 0. */
static int complete(struct tier *t, uint64_t user_data, int res, tier_done_fn done, void *ctx)
{
	union tier_tag tag = { .u64 = user_data };
	if (tag.f.idx >= t->max_reqs || t->reqs[tag.f.idx].state != REQ_INFLIGHT ||
	    t->reqs[tag.f.idx].gen != tag.f.gen || t->reqs[tag.f.idx].op != tag.f.op) {
		log_warn("NVMe tier: completion for unknown request %#llx ignored",
			(unsigned long long)user_data);
		return 0;
	}
	uint32_t i = tag.f.idx;
	struct tier_req *r = &t->reqs[i];
	int status = 0;
	if (res == -EAGAIN || res == -EINTR) {
		requeue_front(t, i);
		return 0;
	}
	if (res < 0) {
		status = res;
	} else if (res == 0) {
		status = -EIO; /* no progress: past the end of the file or device */
	} else {
		r->done += (uint32_t)res;
		if (r->done < r->io_len) {
			requeue_front(t, i);
			return 0;
		}
	}
	if (r->op == TIER_OP_WRITE)
		write_crc(r);
	if (status == 0 && t->inject_n[r->op]) {
		t->inject_n[r->op]--;
		status = t->inject_err[r->op];
	}
	struct tier_result out = {
		.cookie = r->cookie, .file_off = r->file_off, .buf = r->buf, .len = r->len,
		.op = r->op, .status = status, .crc = r->crc, .crc_expected = r->crc_expected,
	};
	if (status == 0 && r->op == TIER_OP_READ) {
		out.crc = crc32c(0, r->buf, r->len);
		if (out.crc != r->crc_expected) {
			out.status = -EBADMSG;
			t->u.crc_errors++;
			log_error("NVMe tier: crc32c mismatch reading %u bytes at offset %llu: "
				"expected %08x, got %08x", r->len, (unsigned long long)r->file_off,
				r->crc_expected, out.crc);
		}
	}
	if (status == 0) {
		if (r->op == TIER_OP_WRITE) {
			t->u.writes++;
			t->u.write_bytes += r->len;
		} else {
			t->u.reads++;
			t->u.read_bytes += r->len;
		}
	}
	t->n_inflight--;
	req_release(t, i);
	done(ctx, &out);
	return 1;
}

int tier_reap(struct tier *t, tier_done_fn done, void *ctx)
{
	return tier_reap_some(t, UINT_MAX, true, done, ctx);
}

int tier_reap_some(struct tier *t, unsigned max, bool submit, tier_done_fn done, void *ctx)
{
	if (t->efd >= 0 && !t->efd_quiet) {
		uint64_t v;
		if (read(t->efd, &v, sizeof v) < 0 && errno != EAGAIN)
			return -errno;
	}
	int reported = 0;
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0, taken = 0;
	io_uring_for_each_cqe(&t->ring, head, cqe) {
		if (taken++ == max)
			break;
		reported += complete(t, cqe->user_data, cqe->res, done, ctx);
		seen++;
		/* What the callbacks queued (refills) goes to the device in groups of
		 * TIER_REFILL_BATCH, not after the crc32c of every other completion in this batch (the
		 * queue stays deep) nor one submission each (each is a system call and, on a virtual
		 * disk, a doorbell write). The CQEs seen so far are released first: tier_flush's
		 * in-flight bound assumes an empty completion queue. */
		if (submit && t->n_queued >= TIER_REFILL_BATCH) {
			io_uring_cq_advance(&t->ring, seen);
			seen = 0;
			int ret = tier_flush(t);
			if (ret < 0)
				return ret;
		}
	}
	io_uring_cq_advance(&t->ring, seen);
	if (submit && t->n_queued) {
		int ret = tier_flush(t);
		if (ret < 0)
			return ret;
	}
	return reported;
}

int tier_wait(struct tier *t, int timeout_ms, tier_done_fn done, void *ctx)
{
	if (t->n_queued) {
		int ret = tier_flush(t);
		if (ret < 0)
			return ret;
	}
	if (t->n_inflight == 0)
		return 0;
	struct io_uring_cqe *cqe;
	int ret;
	if (timeout_ms < 0) {
		ret = io_uring_wait_cqe(&t->ring, &cqe);
	} else {
		struct __kernel_timespec ts = {
			.tv_sec = timeout_ms / 1000,
			.tv_nsec = (long long)(timeout_ms % 1000) * 1000000,
		};
		ret = io_uring_wait_cqe_timeout(&t->ring, &cqe, &ts);
	}
	if (ret == -ETIME || ret == -EINTR)
		return 0;
	if (ret < 0)
		return ret;
	return tier_reap(t, done, ctx);
}

unsigned tier_pending(const struct tier *t)
{
	return t->n_queued + t->n_inflight;
}

unsigned tier_room(const struct tier *t)
{
	return t->n_free;
}

struct sync_result {
	bool done;
	struct tier_result res;
};

static void sync_done(void *ctx, const struct tier_result *res)
{
	struct sync_result *s = ctx;
	s->done = true;
	s->res = *res;
}

static int run_sync(struct tier *t, struct sync_result *s)
{
	int ret = tier_flush(t);
	while (ret >= 0 && !s->done)
		ret = tier_wait(t, -1, sync_done, s);
	if (ret < 0)
		return ret;
	return s->res.status;
}

int tier_write_sync(struct tier *t, const void *buf, uint64_t file_off, uint32_t len,
		    uint32_t *crc)
{
	if (tier_pending(t))
		return -EBUSY;
	struct sync_result s = { 0 };
	int ret = tier_write(t, buf, file_off, len, 0);
	if (ret < 0)
		return ret;
	ret = run_sync(t, &s);
	if (ret == 0 && crc)
		*crc = s.res.crc;
	return ret;
}

int tier_read_sync(struct tier *t, void *buf, uint64_t file_off, uint32_t len, uint32_t crc)
{
	if (tier_pending(t))
		return -EBUSY;
	struct sync_result s = { 0 };
	int ret = tier_read(t, buf, file_off, len, crc, 0);
	if (ret < 0)
		return ret;
	return run_sync(t, &s);
}

void tier_inject_error(struct tier *t, enum tier_op op, unsigned n, int err)
{
	assert(op == TIER_OP_WRITE || op == TIER_OP_READ);
	assert(err < 0);
	t->inject_n[op] = n;
	t->inject_err[op] = err;
}

int tier_eventfd(const struct tier *t)
{
	return t->efd;
}

bool tier_notify(struct tier *t, bool on)
{
	if (t->efd < 0 || !t->ring_ok || io_uring_cq_eventfd_toggle(&t->ring, on) < 0)
		return false;
	t->efd_quiet = !on;
	return true;
}

bool tier_ready(const struct tier *t)
{
	return t->ring_ok && io_uring_cq_ready(&t->ring) > 0;
}

int tier_fd(const struct tier *t)
{
	return t->fd;
}

void tier_usage(const struct tier *t, struct tier_usage *u)
{
	*u = t->u;
	u->free_runs = t->n_free_ext;
	u->queued = t->n_queued;
	u->inflight = t->n_inflight;
}
