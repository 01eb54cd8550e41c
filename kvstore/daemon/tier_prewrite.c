/* tier_prewrite — zeros over the tier file's unwritten extents. See tier_prewrite.h. */
#include "tier_prewrite.h"

#include <errno.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "log.h"

#define FIEMAP_BATCH 256u

struct range {
	uint64_t off, len;
};

struct tpw {
	struct tier *t;
	struct range *r;	/* unwritten, sorted; r[i..n) still to do */
	size_t n, cap, i;
	uint64_t left;		/* bytes in r[i..n) */
	void *zeros;		/* TPW_PIECE aligned zero bytes */
	bool busy;		/* a piece in flight: [at, at + len) */
	uint64_t at;
	uint32_t len;
};

static int push(struct tpw *p, uint64_t off, uint64_t end)
{
	off = (off + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
	end = end / TIER_ALIGN * TIER_ALIGN;
	if (end <= off)
		return 0;
	if (p->n && p->r[p->n - 1].off + p->r[p->n - 1].len == off) {
		p->r[p->n - 1].len += end - off;
	} else {
		if (p->n == p->cap) {
			size_t cap = p->cap ? p->cap * 2 : 64;
			struct range *r = realloc(p->r, cap * sizeof *r);
			if (!r)
				return -ENOMEM;
			p->r = r;
			p->cap = cap;
		}
		p->r[p->n++] = (struct range){ off, end - off };
	}
	p->left += end - off;
	return 0;
}

/* Calls push for every unwritten range of fd's [0, size): extents flagged unwritten, and the
 * holes between extents. -errno when FIEMAP fails. */
static int scan(int fd, uint64_t size, struct tpw *p)
{
	size_t sz = sizeof(struct fiemap) + FIEMAP_BATCH * sizeof(struct fiemap_extent);
	struct fiemap *fm = calloc(1, sz);
	if (!fm)
		return -ENOMEM;
	uint64_t at = 0; /* everything below is accounted for */
	int ret = 0;
	while (at < size) {
		memset(fm, 0, sz);
		fm->fm_start = at;
		fm->fm_length = size - at;
		fm->fm_flags = FIEMAP_FLAG_SYNC;
		fm->fm_extent_count = FIEMAP_BATCH;
		if (ioctl(fd, FS_IOC_FIEMAP, fm) < 0) {
			ret = -errno;
			break;
		}
		if (!fm->fm_mapped_extents) {
			ret = push(p, at, size); /* a hole to the end */
			break;
		}
		bool last = false;
		for (unsigned k = 0; k < fm->fm_mapped_extents && !ret; k++) {
			const struct fiemap_extent *e = &fm->fm_extents[k];
			uint64_t end = e->fe_logical + e->fe_length;
			if (end > size)
				end = size;
			if (e->fe_logical > at)
				ret = push(p, at, e->fe_logical); /* a hole */
			if (!ret && (e->fe_flags & FIEMAP_EXTENT_UNWRITTEN))
				ret = push(p, e->fe_logical > at ? e->fe_logical : at, end);
			if (end > at)
				at = end;
			last |= (e->fe_flags & FIEMAP_EXTENT_LAST) != 0;
		}
		if (ret)
			break;
		if (last) {
			ret = push(p, at, size);
			break;
		}
	}
	free(fm);
	return ret;
}

int64_t tpw_unwritten_bytes(int fd, uint64_t size)
{
	struct tpw p = { 0 };
	int ret = scan(fd, size, &p);
	free(p.r);
	return ret ? ret : (int64_t)p.left;
}

int tpw_open(struct tier *t, struct tpw **out)
{
	*out = NULL;
	struct stat st;
	if (fstat(tier_fd(t), &st) || !S_ISREG(st.st_mode))
		return 0;
	struct tier_usage u;
	tier_usage(t, &u);
	struct tpw *p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->t = t;
	int ret = scan(tier_fd(t), u.bytes, p);
	if (ret == -ENOMEM) {
		tpw_close(p);
		return ret;
	}
	if (ret) {
		log_info("NVMe tier: the filesystem cannot say which of the file is unwritten (%s): "
			 "no zeros written ahead", strerror(-ret));
		tpw_close(p);
		return 0;
	}
	if (!p->left) {
		tpw_close(p);
		return 0;
	}
	if (posix_memalign(&p->zeros, TIER_ALIGN, TPW_PIECE)) {
		tpw_close(p);
		return -ENOMEM;
	}
	memset(p->zeros, 0, TPW_PIECE);
	log_info("NVMe tier: writing zeros over the %.1f MiB of the file never written, in the "
		 "background", (double)p->left / (1 << 20));
	*out = p;
	return 0;
}

void tpw_close(struct tpw *p)
{
	if (!p)
		return;
	free(p->zeros);
	free(p->r);
	free(p);
}

uint64_t tpw_left(const struct tpw *p)
{
	return p ? p->left : 0;
}

uint64_t tpw_held(const struct tpw *p)
{
	return p && p->busy ? p->len : 0;
}

/* The first range's bytes up to off are not ours to write (they hold blocks). */
static void skip_to(struct tpw *p, uint64_t off)
{
	struct range *r = &p->r[p->i];
	uint64_t d = off - r->off < r->len ? off - r->off : r->len;
	r->off += d;
	r->len -= d;
	p->left -= d;
	if (!r->len)
		p->i++;
	if (!p->left)
		log_info("NVMe tier: every byte of the file has been written once");
}

bool tpw_step(struct tpw *p, uint64_t cookie)
{
	if (!p || p->busy)
		return false;
	while (p->i < p->n) {
		struct range *r = &p->r[p->i];
		uint64_t off, len;
		if (tier_free_run(p->t, r->off, &off, &len) || off >= r->off + r->len) {
			skip_to(p, r->off + r->len);
			continue;
		}
		if (off > r->off)
			skip_to(p, off);
		uint64_t end = off + len < r->off + r->len ? off + len : r->off + r->len;
		uint64_t a = r->off > off ? r->off : off;
		uint32_t n = end - a < TPW_PIECE ? (uint32_t)(end - a) : TPW_PIECE;
		if (tier_extent_adopt(p->t, a, n))
			return false;
		if (tier_write(p->t, p->zeros, a, n, cookie)) { /* no request slot: next pass */
			tier_extent_free(p->t, a, n);
			return false;
		}
		p->busy = true;
		p->at = a;
		p->len = n;
		return true;
	}
	return false;
}

void tpw_done(struct tpw *p, const struct tier_result *r)
{
	if (!p || !p->busy)
		return;
	p->busy = false;
	tier_extent_free(p->t, p->at, p->len);
	if (r->status) {
		log_warn("NVMe tier: writing zeros at byte %llu failed (%s): no more are written "
			 "ahead", (unsigned long long)p->at, strerror(-r->status));
		p->i = p->n;
		p->left = 0;
		return;
	}
	if (p->i < p->n && p->r[p->i].off == p->at)
		skip_to(p, p->at + p->len);
}
