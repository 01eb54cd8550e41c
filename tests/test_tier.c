/* Tests kvstore/daemon/tier.c with real io_uring on a real O_DIRECT file in the build directory:
 * the extent allocator against a page-map reference, batched writes and reads through
 * registered buffers checked byte for byte (and against pread of the file), a flipped byte in
 * the file giving -EBADMSG, a tiny submission queue with many requests outstanding, the
 * eventfd, argument checks, queued reads submitted before queued writes, and a short read
 * continued until it runs out of file; zeros written over the file's unwritten extents
 * (tier_prewrite) around a block written there, which keeps its bytes. */
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "crc32c.h"
#include "tier.h"
#include "tier_prewrite.h"

#define MIB (1ull << 20)
#define BLK (16u * 1024)

static char path_buf[512];

static const char *tier_path(void)
{
	snprintf(path_buf, sizeof path_buf, "%s/test_tier-%d.img", FREEKV_BUILD_DIR, (int)getpid());
	return path_buf;
}

static struct tier *open_tier(uint64_t bytes, unsigned qd, unsigned max_req, void *reg,
			      uint64_t reg_bytes)
{
	struct tier_config cfg = {
		.path = tier_path(), .bytes = bytes, .queue_depth = qd, .max_requests = max_req,
		.reg_base = reg, .reg_bytes = reg_bytes,
	};
	struct tier *t = NULL;
	char err[TIER_ERR_LEN] = "";
	int ret = tier_open(&cfg, &t, err, sizeof err);
	if (ret)
		fprintf(stderr, "tier_open: %s\n", err);
	assert_int_equal(ret, 0);
	return t;
}

static void close_tier(struct tier *t)
{
	tier_close(t);
	unlink(tier_path());
}

static void *region(uint64_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(p != MAP_FAILED);
	return p;
}

static void fill(void *buf, uint64_t bytes, uint64_t seed)
{
	uint64_t *w = buf;
	for (uint64_t i = 0; i < bytes / 8; i++)
		w[i] = test_rand(&seed);
}

static void test_open_errors(void **state)
{
	(void)state;
	struct tier *t = NULL;
	char err[TIER_ERR_LEN] = "";
	struct tier_config cfg = { .path = "", .bytes = MIB };
	assert_int_equal(tier_open(&cfg, &t, err, sizeof err), -EINVAL);
	cfg.path = FREEKV_BUILD_DIR "/no-such-dir/tier.img";
	assert_int_equal(tier_open(&cfg, &t, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "no-such-dir"));
	assert_null(t);
	/* A real file system supports O_DIRECT and the file is preallocated. */
	t = open_tier(4 * MIB, 0, 0, NULL, 0);
	struct tier_usage u;
	tier_usage(t, &u);
	assert_true(u.direct);
	assert_true(u.fixed_file);
	assert_int_equal(u.bytes, 4 * MIB);
	struct stat st;
	assert_int_equal(stat(tier_path(), &st), 0);
	assert_true((uint64_t)st.st_blocks * 512 >= 4 * MIB);
	close_tier(t);
}

static void test_extents_against_reference(void **state)
{
	(void)state;
	const uint64_t bytes = 4 * MIB;
	struct tier *t = open_tier(bytes, 0, 0, NULL, 0);
	enum { PAGES = 4 * MIB / 4096 };
	uint8_t *owner = calloc(PAGES, 1); /* reference: which 4 KiB pages are allocated */
	struct { uint64_t off, len; } live[1024];
	size_t n = 0;
	uint64_t rng = 99;
	/* One block size only: every extent is aligned to its own length. */
	for (int step = 0; step < 4000; step++) {
		if (n < 1024 && (n == 0 || test_rand(&rng) % 100 < 60)) {
			uint64_t off;
			int ret = tier_extent_alloc(t, 3 * 4096, &off);
			if (ret == -ENOSPC) {
				size_t free_pages = 0;
				for (size_t p = 0; p + 3 <= PAGES; p += 3)
					free_pages += !owner[p] && !owner[p + 1] && !owner[p + 2];
				assert_int_equal(free_pages, 0);
				continue;
			}
			assert_int_equal(ret, 0);
			assert_int_equal(off % (3 * 4096), 0);
			for (uint64_t p = off / 4096; p < off / 4096 + 3; p++) {
				assert_int_equal(owner[p], 0);
				owner[p] = 1;
			}
			live[n].off = off;
			live[n++].len = 3 * 4096;
		} else {
			size_t i = test_rand(&rng) % n;
			assert_int_equal(tier_extent_free(t, live[i].off, 4096), -EINVAL);
			assert_int_equal(tier_extent_free(t, live[i].off + 4096, live[i].len), -EINVAL);
			assert_int_equal(tier_extent_free(t, live[i].off, live[i].len), 0);
			assert_int_equal(tier_extent_free(t, live[i].off, live[i].len), -EINVAL);
			for (uint64_t p = live[i].off / 4096; p < live[i].off / 4096 + 3; p++)
				owner[p] = 0;
			live[i] = live[--n];
		}
	}
	struct tier_usage u;
	tier_usage(t, &u);
	assert_int_equal(u.extents, n);
	assert_int_equal(u.used_bytes, n * 3 * 4096);
	while (n) {
		n--;
		assert_int_equal(tier_extent_free(t, live[n].off, live[n].len), 0);
	}
	tier_usage(t, &u);
	assert_int_equal(u.free_runs, 1); /* everything coalesced again */
	assert_int_equal(u.used_bytes, 0);
	/* Mixed sizes still never overlap and fill the file exactly. */
	uint64_t off, total = 0;
	for (int k = 0;; k++) {
		uint64_t len = k % 2 ? 8192 : 4096;
		if (tier_extent_alloc(t, len, &off) != 0)
			break;
		total += len;
	}
	tier_usage(t, &u);
	assert_int_equal(u.used_bytes, total);
	assert_true(u.used_bytes > bytes - 8192);
	assert_int_equal(tier_extent_alloc(t, 0, &off), -EINVAL);
	free(owner);
	close_tier(t);
}

struct collect {
	struct tier_result res[4096];
	size_t n;
};

static void collect_fn(void *ctx, const struct tier_result *r)
{
	struct collect *c = ctx;
	assert_true(c->n < 4096);
	c->res[c->n++] = *r;
}

/* Writes n blocks from src (registered or not) then reads them into dst, all asynchronous. */
static void roundtrip(struct tier *t, char *src, char *dst, unsigned n, uint32_t *crcs)
{
	struct collect *c = calloc(1, sizeof *c);
	unsigned sent = 0;
	while (c->n < n) {
		while (sent < n) {
			int ret = tier_write(t, src + (uint64_t)sent * BLK, (uint64_t)sent * BLK, BLK,
					     sent);
			if (ret == -EBUSY)
				break;
			assert_int_equal(ret, 0);
			sent++;
		}
		assert_true(tier_flush(t) >= 0);
		assert_true(tier_wait(t, 5000, collect_fn, c) >= 0);
	}
	for (size_t i = 0; i < c->n; i++) {
		assert_int_equal(c->res[i].status, 0);
		assert_int_equal(c->res[i].op, TIER_OP_WRITE);
		uint64_t k = c->res[i].cookie;
		assert_int_equal(c->res[i].crc, crc32c(0, src + k * BLK, BLK));
		crcs[k] = c->res[i].crc;
	}
	c->n = 0;
	sent = 0;
	while (c->n < n) {
		while (sent < n) {
			int ret = tier_read(t, dst + (uint64_t)sent * BLK, (uint64_t)sent * BLK, BLK,
					    crcs[sent], sent);
			if (ret == -EBUSY)
				break;
			assert_int_equal(ret, 0);
			sent++;
		}
		assert_true(tier_flush(t) >= 0);
		assert_true(tier_wait(t, 5000, collect_fn, c) >= 0);
	}
	for (size_t i = 0; i < c->n; i++)
		assert_int_equal(c->res[i].status, 0);
	assert_memory_equal(src, dst, (uint64_t)n * BLK);
	free(c);
}

static void test_registered_roundtrip(void **state)
{
	(void)state;
	const unsigned n = 256;
	char *reg = region(2ull * n * BLK);
	struct tier *t = open_tier(8 * MIB, 32, 0, reg, 2ull * n * BLK);
	struct tier_usage u;
	tier_usage(t, &u);
	assert_true(u.fixed_buffers);
	fill(reg, (uint64_t)n * BLK, 1);
	uint32_t crcs[256];
	roundtrip(t, reg, reg + (uint64_t)n * BLK, n, crcs);
	tier_usage(t, &u);
	assert_int_equal(u.writes, n);
	assert_int_equal(u.reads, n);
	assert_int_equal(u.inflight, 0);
	/* Reference: the file's bytes as plain pread sees them. */
	int fd = open(tier_path(), O_RDONLY);
	char *chk = malloc(BLK);
	for (unsigned i = 0; i < n; i += 37) {
		assert_int_equal(pread(fd, chk, BLK, (off_t)i * BLK), BLK);
		assert_memory_equal(chk, reg + (uint64_t)i * BLK, BLK);
	}
	free(chk);
	close(fd);
	close_tier(t);
	munmap(reg, 2ull * n * BLK);
}

static void test_tiny_queue_many_blocks(void **state)
{
	(void)state;
	/* 4 SQ entries, 512 requests accepted: the full queue is handled by submit-and-retry. */
	const unsigned n = 1024;
	char *src = region((uint64_t)n * BLK), *dst = region((uint64_t)n * BLK);
	struct tier *t = open_tier((uint64_t)n * BLK, 4, 512, NULL, 0);
	fill(src, (uint64_t)n * BLK, 2);
	uint32_t *crcs = calloc(n, sizeof *crcs);
	roundtrip(t, src, dst, n, crcs);
	free(crcs);
	close_tier(t);
	munmap(src, (uint64_t)n * BLK);
	munmap(dst, (uint64_t)n * BLK);
}

static void test_crc_mismatch(void **state)
{
	(void)state;
	char *buf = region(2 * BLK);
	struct tier *t = open_tier(1 * MIB, 8, 0, NULL, 0);
	fill(buf, BLK, 3);
	uint32_t crc;
	assert_int_equal(tier_write_sync(t, buf, 5 * BLK, BLK, &crc), 0);
	assert_int_equal(crc, crc32c(0, buf, BLK));
	assert_int_equal(tier_read_sync(t, buf + BLK, 5 * BLK, BLK, crc), 0);
	assert_memory_equal(buf, buf + BLK, BLK);
	/* Flip one byte in the middle of the block on disk. */
	int fd = open(tier_path(), O_RDWR);
	unsigned char b;
	assert_int_equal(pread(fd, &b, 1, 5 * BLK + 777), 1);
	b ^= 0x20;
	assert_int_equal(pwrite(fd, &b, 1, 5 * BLK + 777), 1);
	assert_int_equal(fsync(fd), 0);
	close(fd);
	assert_int_equal(tier_read_sync(t, buf + BLK, 5 * BLK, BLK, crc), -EBADMSG);
	struct tier_usage u;
	tier_usage(t, &u);
	assert_int_equal(u.crc_errors, 1);
	close_tier(t);
	munmap(buf, 2 * BLK);
}

static void test_arguments_and_eventfd(void **state)
{
	(void)state;
	char *buf = region(8 * BLK);
	struct tier *t = open_tier(1 * MIB, 8, 4, NULL, 0);
	assert_int_equal(tier_write(t, buf + 512, 0, BLK, 0), -EINVAL);
	assert_int_equal(tier_write(t, buf, 100, BLK, 0), -EINVAL);
	assert_int_equal(tier_write(t, buf, 0, 0, 0), -EINVAL);
	assert_int_equal(tier_write(t, buf, 1 * MIB, BLK, 0), -EINVAL);
	/* 4097 bytes move as two whole units: past the end of the file. */
	assert_int_equal(tier_write(t, buf, 1 * MIB - 4096, 4097, 0), -EINVAL);
	assert_int_equal(tier_read(t, buf, 1 * MIB - 4096, BLK, 0, 0), -EINVAL);
	for (int i = 0; i < 4; i++)
		assert_int_equal(tier_write(t, buf + i * BLK, (uint64_t)i * BLK, BLK, i), 0);
	assert_int_equal(tier_write(t, buf, 0, BLK, 9), -EBUSY);
	uint32_t crc;
	assert_int_equal(tier_write_sync(t, buf, 0, BLK, &crc), -EBUSY);
	assert_int_equal(tier_pending(t), 4);
	assert_int_equal(tier_flush(t), 4);
	int efd = tier_eventfd(t);
	assert_true(efd >= 0);
	struct pollfd pfd = { .fd = efd, .events = POLLIN };
	assert_int_equal(poll(&pfd, 1, 5000), 1);
	struct collect *c = calloc(1, sizeof *c);
	while (c->n < 4) {
		int ret = tier_reap(t, collect_fn, c);
		assert_true(ret >= 0);
		if (c->n < 4)
			assert_true(poll(&pfd, 1, 5000) == 1);
	}
	assert_int_equal(tier_pending(t), 0);
	free(c);
	close_tier(t);
	munmap(buf, 8 * BLK);
}

/* Queued reads go to the device before queued writes (what a RECALL waits for first). One SQ
 * entry and two CQ entries: the first tier_flush submits two requests, and their completions,
 * reaped after both are done, show which two. */
static void test_reads_before_writes(void **state)
{
	(void)state;
	char *buf = region(8 * BLK);
	struct tier *t = open_tier(1 * MIB, 1, 16, NULL, 0);
	fill(buf, 8 * BLK, 5);
	uint32_t crc0, crc1;
	assert_int_equal(tier_write_sync(t, buf, 0, BLK, &crc0), 0);
	assert_int_equal(tier_write_sync(t, buf + BLK, BLK, BLK, &crc1), 0);
	assert_int_equal(tier_write(t, buf + 2 * BLK, 2 * BLK, BLK, 10), 0);
	assert_int_equal(tier_write(t, buf + 3 * BLK, 3 * BLK, BLK, 11), 0);
	assert_int_equal(tier_read(t, buf + 6 * BLK, 0, BLK, crc0, 20), 0);
	assert_int_equal(tier_write(t, buf + 4 * BLK, 4 * BLK, BLK, 12), 0);
	assert_int_equal(tier_read(t, buf + 7 * BLK, BLK, BLK, crc1, 21), 0);
	assert_int_equal(tier_flush(t), 2);
	usleep(300000); /* both done before the first reap, which refills */
	struct collect *c = calloc(1, sizeof *c);
	while (c->n < 5)
		assert_true(tier_wait(t, 5000, collect_fn, c) > 0);
	uint64_t first = c->res[0].cookie, second = c->res[1].cookie;
	assert_true((first == 20 && second == 21) || (first == 21 && second == 20));
	for (size_t i = 0; i < c->n; i++)
		assert_int_equal(c->res[i].status, 0);
	assert_memory_equal(buf + 6 * BLK, buf, BLK);
	assert_memory_equal(buf + 7 * BLK, buf + BLK, BLK);
	free(c);
	close_tier(t);
	munmap(buf, 8 * BLK);
}

static void test_short_read_continues(void **state)
{
	(void)state;
	char *buf = region(4 * BLK);
	struct tier *t = open_tier(1 * MIB, 8, 0, NULL, 0);
	fill(buf, 4 * BLK, 4);
	uint32_t crc;
	assert_int_equal(tier_write_sync(t, buf, 0, 4 * BLK, &crc), 0);
	/* Cut the file under the tier: a read across the new end transfers part, continues from
	 * there, then gets no progress and fails with -EIO instead of looping. */
	assert_int_equal(truncate(tier_path(), 2 * BLK), 0);
	assert_int_equal(tier_read_sync(t, buf, BLK, 2 * BLK, crc), -EIO);
	struct tier_usage u;
	tier_usage(t, &u);
	assert_true(u.retries >= 1);
	close_tier(t);
	munmap(buf, 4 * BLK);
}

/* A length that is not a multiple of TIER_ALIGN (a small block): the transfer moves whole units,
 * the checksum covers the data only, so a flipped byte in the data fails and one in the padding
 * does not, and a read overwrites the buffer's padding but returns the data intact. */
static void test_unaligned_length(void **state)
{
	(void)state;
	const uint32_t len = 2048 + 100;
	char *buf = region(2 * BLK);
	struct tier *t = open_tier(1 * MIB, 8, 0, NULL, 0);
	fill(buf, 4096, 7);
	uint32_t crc;
	assert_int_equal(tier_write_sync(t, buf, 3 * 4096, len, &crc), 0);
	assert_int_equal(crc, crc32c(0, buf, len));
	char *back = buf + BLK;
	memset(back, 0xaa, 4096);
	assert_int_equal(tier_read_sync(t, back, 3 * 4096, len, crc), 0);
	assert_memory_equal(back, buf, len);
	int fd = open(tier_path(), O_RDWR);
	unsigned char b;
	assert_int_equal(pread(fd, &b, 1, 3 * 4096 + len + 10), 1);
	b ^= 0x01;
	assert_int_equal(pwrite(fd, &b, 1, 3 * 4096 + len + 10), 1);
	assert_int_equal(fsync(fd), 0);
	assert_int_equal(tier_read_sync(t, back, 3 * 4096, len, crc), 0);
	assert_int_equal(pread(fd, &b, 1, 3 * 4096 + len - 1), 1);
	b ^= 0x01;
	assert_int_equal(pwrite(fd, &b, 1, 3 * 4096 + len - 1), 1);
	assert_int_equal(fsync(fd), 0);
	close(fd);
	assert_int_equal(tier_read_sync(t, back, 3 * 4096, len, crc), -EBADMSG);
	struct tier_usage u;
	tier_usage(t, &u);
	assert_int_equal(u.crc_errors, 1);
	close_tier(t);
	munmap(buf, 2 * BLK);
}

struct pw_ctx {
	struct tpw *pw;
	unsigned data_done;
};

static void pw_done(void *ctx, const struct tier_result *r)
{
	struct pw_ctx *c = ctx;
	if (r->cookie == 7) {
		tpw_done(c->pw, r);
	} else {
		assert_int_equal(r->status, 0);
		c->data_done++;
	}
}

/* A fresh file is all unwritten extents. A block written at 3 MiB before the prewrite starts
 * and another allocated while a piece is in flight keep their bytes; the zeros cover the rest;
 * afterwards the filesystem reports nothing unwritten and the allocator has only the blocks. */
static void test_prewrite_zeros(void **state)
{
	(void)state;
	const uint64_t bytes = 8 * MIB;
	struct tier *t = open_tier(bytes, 8, 0, NULL, 0);
	int64_t unwritten = tpw_unwritten_bytes(tier_fd(t), bytes);
	if (unwritten != (int64_t)bytes) {
		fprintf(stderr, "skipped: this filesystem reports %lld unwritten bytes of a fresh "
			"fallocated file (no unwritten extents or no FIEMAP)\n", (long long)unwritten);
		close_tier(t);
		skip();
	}
	char *a = region(BLK), *b = region(BLK), *back = region(BLK);
	fill(a, BLK, 1);
	fill(b, BLK, 2);
	uint32_t crc_a, crc_b;
	assert_int_equal(tier_extent_adopt(t, 3 * MIB, BLK), 0);
	assert_int_equal(tier_write_sync(t, a, 3 * MIB, BLK, &crc_a), 0);
	struct pw_ctx c = { 0 };
	assert_int_equal(tpw_open(t, &c.pw), 0);
	assert_non_null(c.pw);
	assert_true(tpw_left(c.pw) <= bytes - BLK);
	assert_int_equal(tpw_held(c.pw), 0);
	assert_true(tpw_step(c.pw, 7));
	assert_false(tpw_step(c.pw, 7)); /* one piece at a time */
	assert_int_equal(tpw_held(c.pw), TPW_PIECE);
	uint64_t off_b;
	assert_int_equal(tier_extent_alloc(t, BLK, &off_b), 0);
	assert_true(off_b >= TPW_PIECE); /* not under the piece in flight (the file's first MiB) */
	assert_int_equal(tier_write(t, b, off_b, BLK, 9), 0);
	for (int rounds = 0; tpw_left(c.pw) && rounds < 1000; rounds++) {
		tpw_step(c.pw, 7);
		assert_true(tier_flush(t) >= 0);
		assert_true(tier_wait(t, 5000, pw_done, &c) >= 0);
	}
	while (tier_pending(t))
		assert_true(tier_wait(t, 5000, pw_done, &c) >= 0);
	assert_int_equal(tpw_left(c.pw), 0);
	assert_int_equal(tpw_held(c.pw), 0);
	assert_int_equal(c.data_done, 1);
	tpw_close(c.pw);
	assert_int_equal(tpw_unwritten_bytes(tier_fd(t), bytes), 0);
	struct tier_usage u;
	tier_usage(t, &u);
	assert_int_equal(u.used_bytes, 2 * BLK);
	assert_int_equal(u.extents, 2);
	assert_int_equal(tier_read_sync(t, back, 3 * MIB, BLK, crc_a), 0);
	assert_memory_equal(back, a, BLK);
	crc_b = crc32c(0, b, BLK);
	assert_int_equal(tier_read_sync(t, back, off_b, BLK, crc_b), 0);
	assert_memory_equal(back, b, BLK);
	/* Elsewhere the file reads as zeros. */
	assert_int_equal(tier_read_sync(t, back, 5 * MIB, BLK, crc32c(0, (char[BLK]){ 0 }, BLK)), 0);
	/* A file with nothing unwritten needs no prewrite. */
	struct tpw *again;
	assert_int_equal(tpw_open(t, &again), 0);
	assert_null(again);
	munmap(a, BLK);
	munmap(b, BLK);
	munmap(back, BLK);
	close_tier(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_errors),
		cmocka_unit_test(test_extents_against_reference),
		cmocka_unit_test(test_registered_roundtrip),
		cmocka_unit_test(test_tiny_queue_many_blocks),
		cmocka_unit_test(test_crc_mismatch),
		cmocka_unit_test(test_arguments_and_eventfd),
		cmocka_unit_test(test_reads_before_writes),
		cmocka_unit_test(test_short_read_continues),
		cmocka_unit_test(test_unaligned_length),
		cmocka_unit_test(test_prewrite_zeros),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
