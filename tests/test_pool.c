/* Tests kvstore/daemon/pool.c on real POSIX shared memory: segment creation (mode, group, EEXIST,
 * replace), a second process mapping the pool by name and sharing bytes, size checks, block
 * allocation and offset validation, the demote/promote state machine and its counters, the
 * victim scan against a brute-force reference, and the mlock failure message. */
#include "test_util.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "pool.h"

#define MIB (1ull << 20)

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static char name_buf[64];

static const char *test_name(const char *what)
{
	snprintf(name_buf, sizeof name_buf, "/freekv-test-%s-%d", what, (int)getpid());
	return name_buf;
}

static struct pool *make_pool(const char *name, uint64_t bytes)
{
	struct pool_config cfg = { .shm_name = name, .dram_bytes = bytes, .unlink_existing = true };
	struct pool *p = NULL;
	char err[POOL_ERR_LEN] = "";
	int ret = pool_create(&cfg, &p, err, sizeof err);
	if (ret)
		fprintf(stderr, "pool_create: %s\n", err);
	assert_int_equal(ret, 0);
	return p;
}

static void test_segment_lifecycle(void **state)
{
	(void)state;
	const char *name = test_name("life");
	struct pool *p = make_pool(name, 8 * MIB);
	char path[128];
	snprintf(path, sizeof path, "/dev/shm%s", name);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0660);
	assert_int_equal((uint64_t)st.st_size, 8 * MIB);
	/* A second creator is refused with a message, unless told to replace. */
	struct pool_config cfg = { .shm_name = name, .dram_bytes = 8 * MIB };
	struct pool *q = NULL;
	char err[POOL_ERR_LEN] = "";
	assert_int_equal(pool_create(&cfg, &q, err, sizeof err), -EEXIST);
	assert_non_null(strstr(err, "exists"));
	assert_null(q);
	pool_destroy(p);
	assert_int_equal(stat(path, &st), -1);
	assert_int_equal(errno, ENOENT);
}

static void test_bad_config(void **state)
{
	(void)state;
	struct pool *p = NULL;
	char err[POOL_ERR_LEN];
	struct pool_config cfg = { .shm_name = "no-slash", .dram_bytes = 8 * MIB };
	assert_int_equal(pool_create(&cfg, &p, err, sizeof err), -EINVAL);
	cfg.shm_name = "/a/b";
	assert_int_equal(pool_create(&cfg, &p, err, sizeof err), -EINVAL);
	cfg.shm_name = test_name("bad");
	cfg.dram_bytes = 4096; /* smaller than one slab unit */
	assert_int_equal(pool_create(&cfg, &p, err, sizeof err), -EINVAL);
	cfg.dram_bytes = 8 * MIB;
	cfg.group = "freekv-no-such-group-xyz";
	assert_int_equal(pool_create(&cfg, &p, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "freekv-no-such-group-xyz"));
	assert_int_equal(pool_segment_unlink(cfg.shm_name, NULL), -ENOENT); /* nothing left */
}

static void test_group_and_hugetlbfs_dir(void **state)
{
	(void)state;
	struct group *g = getgrgid(getegid());
	assert_non_null(g);
	char gname[256];
	snprintf(gname, sizeof gname, "%s", g->gr_name);
	/* The hugetlbfs path option: same code path with an ordinary directory. */
	char dir[] = FREEKV_BUILD_DIR "/pooldir-XXXXXX";
	assert_non_null(mkdtemp(dir));
	const char *name = test_name("dir");
	struct pool_config cfg = { .shm_name = name, .hugetlbfs_dir = dir, .dram_bytes = 4 * MIB,
				   .group = gname };
	struct pool *p = NULL;
	char err[POOL_ERR_LEN] = "";
	assert_int_equal(pool_create(&cfg, &p, err, sizeof err), 0);
	char path[512];
	snprintf(path, sizeof path, "%s%s", dir, name);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_gid, getegid());
	struct pool_map m;
	assert_int_equal(pool_map(name, dir, 4 * MIB, &m, err, sizeof err), 0);
	((char *)m.base)[100] = 'x';
	assert_int_equal(((char *)pool_base(p))[100], 'x');
	pool_unmap(&m);
	pool_destroy(p);
	assert_int_equal(stat(path, &st), -1);
	assert_int_equal(rmdir(dir), 0);
}

static void test_mapper_shares_bytes(void **state)
{
	(void)state;
	const char *name = test_name("map");
	struct pool *p = make_pool(name, 8 * MIB);
	unsigned cls;
	assert_int_equal(pool_class(p, 64 * 1024, &cls), 0);
	uint32_t id;
	assert_int_equal(pool_block_alloc(p, cls, &id), 0);
	uint64_t off = pool_block_get(p, id)->dram_off;
	char err[POOL_ERR_LEN] = "";
	struct pool_map m;
	assert_int_equal(pool_map(name, NULL, 4 * MIB, &m, err, sizeof err), -EMSGSIZE);
	assert_non_null(strstr(err, "expected"));
	assert_int_equal(pool_map("/freekv-test-absent", NULL, 0, &m, err, sizeof err), -ENOENT);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct pool_map cm;
		if (pool_map(name, NULL, 8 * MIB, &cm, NULL, 0) != 0)
			_exit(2);
		unsigned char *b = (unsigned char *)cm.base + off;
		for (int i = 0; i < 64 * 1024; i++)
			b[i] = (unsigned char)(i * 7 + 3);
		pool_unmap(&cm);
		_exit(0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	const unsigned char *b = pool_block_data(p, id);
	for (int i = 0; i < 64 * 1024; i++)
		assert_int_equal(b[i], (unsigned char)(i * 7 + 3));
	pool_destroy(p);
}

static void test_blocks_and_offsets(void **state)
{
	(void)state;
	struct pool *p = make_pool(test_name("blk"), 8 * MIB);
	assert_int_equal(pool_block_bytes(4, 32, 8, 4), 8192); /* stories260K, f32 */
	assert_int_equal(pool_block_bytes(8, 32, 128, 2), 128 * 1024); /* Llama-3.1-8B, bf16 */
	assert_int_equal(pool_block_bytes(0, 32, 128, 2), 0);
	assert_int_equal(pool_block_bytes(UINT32_MAX, UINT32_MAX, 128, 2), 0);
	unsigned cls;
	assert_int_equal(pool_class(p, 512 * 1024, &cls), 0);
	uint32_t ids[64];
	size_t n = 0;
	int ret;
	while ((ret = pool_block_alloc(p, cls, &ids[n])) == 0)
		n++;
	assert_int_equal(ret, -ENOSPC);
	assert_int_equal(n, 16); /* 8 MiB / 512 KiB */
	struct pool_usage u;
	pool_usage(p, &u);
	assert_int_equal(u.blocks, 16);
	assert_int_equal(u.blocks_dram, 16);
	assert_int_equal(u.dram_used_bytes, 8 * MIB);
	assert_int_equal(u.dram_free_bytes, 0);
	for (size_t i = 0; i < n; i++) {
		uint64_t off = pool_block_get(p, ids[i])->dram_off;
		uint32_t got;
		assert_int_equal(off % 4096, 0);
		assert_int_equal(pool_block_at(p, off, &got), 0);
		assert_int_equal(got, ids[i]);
		assert_int_equal(pool_block_at(p, off + 4096, &got), -EINVAL);
	}
	assert_int_equal(pool_block_at(p, 8 * MIB, &ids[0]), -ERANGE);
	assert_int_equal(pool_block_at(p, UINT64_MAX, &ids[0]), -ERANGE);
	uint64_t off0 = pool_block_get(p, ids[0])->dram_off;
	assert_int_equal(pool_block_lease(p, ids[0]), 0);
	assert_int_equal(pool_block_free(p, ids[0]), -EBUSY);
	assert_int_equal(pool_block_unlease(p, ids[0]), 0);
	assert_int_equal(pool_block_unlease(p, ids[0]), -EINVAL);
	assert_int_equal(pool_block_free(p, ids[0]), 0);
	assert_int_equal(pool_block_free(p, ids[0]), -EINVAL);
	assert_null(pool_block_get(p, ids[0]));
	uint32_t got;
	assert_int_equal(pool_block_at(p, off0, &got), -EINVAL); /* freed offset is not valid */
	assert_null(pool_block_get(p, 1000000));
	pool_destroy(p);
}

static void test_demote_promote_states(void **state)
{
	(void)state;
	struct pool *p = make_pool(test_name("tier"), 4 * MIB);
	unsigned cls;
	assert_int_equal(pool_class(p, 1 * MIB, &cls), 0);
	uint32_t a, b;
	assert_int_equal(pool_block_alloc(p, cls, &a), 0);
	assert_int_equal(pool_block_alloc(p, cls, &b), 0);
	assert_int_equal(pool_block_set_committed(p, a, true), 0);
	assert_int_equal(pool_block_lease(p, b), 0);
	assert_int_equal(pool_block_demote_begin(p, b, 0), -EBUSY);
	assert_int_equal(pool_block_unlease(p, b), 0);
	assert_int_equal(pool_block_promote_begin(p, a), -EINVAL); /* not on NVMe */
	uint64_t off_a = pool_block_get(p, a)->dram_off;
	assert_int_equal(pool_block_demote_begin(p, a, 1 * MIB), 0);
	struct pool_usage u;
	pool_usage(p, &u);
	assert_int_equal(u.blocks_inflight, 1);
	assert_int_equal(pool_block_free(p, a), -EBUSY);
	assert_int_equal(pool_block_demote_end(p, a, true, 0xabcd), 0);
	struct pool_block *d = pool_block_get(p, a);
	assert_int_equal(d->tier, POOL_TIER_NVME);
	assert_int_equal(d->dram_off, POOL_NO_OFFSET);
	assert_int_equal(d->nvme_off, 1 * MIB);
	assert_int_equal(d->crc, 0xabcd);
	uint32_t got;
	assert_int_equal(pool_block_at(p, off_a, &got), -EINVAL);
	pool_usage(p, &u);
	assert_int_equal(u.blocks_nvme, 1);
	assert_int_equal(u.blocks_dram, 1);
	assert_int_equal(u.blocks_committed, 1);
	assert_int_equal(u.dram_used_bytes, 1 * MIB);
	/* Promotion failing (e.g. checksum) returns the block to NVMe and frees the slot. */
	assert_int_equal(pool_block_promote_begin(p, a), 0);
	assert_int_equal(pool_block_promote_end(p, a, false, false), 0);
	assert_int_equal(d->tier, POOL_TIER_NVME);
	pool_usage(p, &u);
	assert_int_equal(u.dram_used_bytes, 1 * MIB);
	assert_int_equal(pool_block_promote_begin(p, a), 0);
	assert_int_equal(pool_block_at(p, d->dram_off, &got), 0);
	assert_int_equal(got, a);
	assert_int_equal(pool_block_promote_end(p, a, true, false), 0);
	assert_int_equal(d->tier, POOL_TIER_DRAM);
	assert_int_equal(d->nvme_off, POOL_NO_OFFSET);
	/* A failed demotion keeps the DRAM copy. */
	assert_int_equal(pool_block_demote_begin(p, b, 2 * MIB), 0);
	assert_int_equal(pool_block_demote_end(p, b, false, 0), 0);
	assert_int_equal(pool_block_get(p, b)->tier, POOL_TIER_DRAM);
	assert_int_equal(pool_block_get(p, b)->nvme_off, POOL_NO_OFFSET);
	/* Promotion needs a free DRAM slot. */
	uint32_t fill[4];
	int k = 0;
	while (pool_block_alloc(p, cls, &fill[k]) == 0)
		k++;
	assert_int_equal(k, 2);
	assert_int_equal(pool_block_demote_begin(p, a, 0), 0);
	assert_int_equal(pool_block_demote_end(p, a, true, 1), 0);
	assert_int_equal(pool_block_alloc(p, cls, &fill[k]), 0);
	assert_int_equal(pool_block_promote_begin(p, a), -ENOSPC);
	pool_destroy(p);
}

/* Swap: the NVMe block takes the victim's slot, the victim the NVMe block's extent; undone,
 * both are back as they were; usage counters stay exact throughout. */
/* Kept copies: a promotion that keeps its extent leaves it named by the DRAM block; demoting
 * it again takes that extent back with no write; unkeep hands it back; the newest kept comes
 * first; a swap's victim must have let its copy go. */
static void test_kept_copies(void **state)
{
	(void)state;
	struct pool *p = make_pool(test_name("kept"), 4 * MIB);
	unsigned cls;
	assert_int_equal(pool_class(p, 1 * MIB, &cls), 0);
	uint32_t id[3];
	for (int i = 0; i < 3; i++) {
		assert_int_equal(pool_block_alloc(p, cls, &id[i]), 0);
		assert_int_equal(pool_block_set_committed(p, id[i], true), 0);
		assert_int_equal(pool_block_demote_begin(p, id[i], (uint64_t)(i + 1) * MIB), 0);
		assert_int_equal(pool_block_demote_end(p, id[i], true, 0x100u + (uint32_t)i), 0);
	}
	assert_int_equal(pool_kept_newest(p), POOL_NO_BLOCK);
	/* Without keep the extent is forgotten, as before. */
	assert_int_equal(pool_block_promote_begin(p, id[0]), 0);
	assert_int_equal(pool_block_promote_end(p, id[0], true, false), 0);
	assert_int_equal(pool_block_get(p, id[0])->kept_off, POOL_NO_OFFSET);
	assert_int_equal(pool_block_demote_kept(p, id[0]), -EINVAL);
	/* A failed promotion keeps nothing either. */
	assert_int_equal(pool_block_promote_begin(p, id[1]), 0);
	assert_int_equal(pool_block_promote_end(p, id[1], false, true), 0);
	assert_int_equal(pool_kept_newest(p), POOL_NO_BLOCK);
	for (int i = 1; i < 3; i++) {
		assert_int_equal(pool_block_promote_begin(p, id[i]), 0);
		assert_int_equal(pool_block_promote_end(p, id[i], true, true), 0);
		struct pool_block *b = pool_block_get(p, id[i]);
		assert_int_equal(b->tier, POOL_TIER_DRAM);
		assert_int_equal(b->nvme_off, POOL_NO_OFFSET);
		assert_int_equal(b->kept_off, (uint64_t)(i + 1) * MIB);
	}
	struct pool_usage u;
	pool_usage(p, &u);
	assert_int_equal(u.blocks_kept, 2);
	assert_int_equal(u.kept_bytes, 2 * MIB);
	assert_int_equal(pool_kept_newest(p), id[2]);
	/* Demoting onto the kept extent: no slot, the same offset and crc, no longer kept. */
	assert_int_equal(pool_block_lease(p, id[1]), 0);
	assert_int_equal(pool_block_demote_kept(p, id[1]), -EBUSY);
	assert_int_equal(pool_block_unlease(p, id[1]), 0);
	uint64_t used = u.dram_used_bytes;
	assert_int_equal(pool_block_demote_kept(p, id[1]), 0);
	struct pool_block *b1 = pool_block_get(p, id[1]);
	assert_int_equal(b1->tier, POOL_TIER_NVME);
	assert_int_equal(b1->dram_off, POOL_NO_OFFSET);
	assert_int_equal(b1->nvme_off, 2 * MIB);
	assert_int_equal(b1->crc, 0x101);
	pool_usage(p, &u);
	assert_int_equal(u.dram_used_bytes, used - 1 * MIB);
	assert_int_equal(u.blocks_kept, 1);
	assert_int_equal(pool_kept_newest(p), id[2]);
	/* A swap's victim with a kept copy is refused until the copy goes. */
	assert_int_equal(pool_block_swap_begin(p, id[1], id[2]), -EINVAL);
	assert_int_equal(pool_block_unkeep(p, id[2]), 3 * MIB);
	assert_int_equal(pool_block_unkeep(p, id[2]), POOL_NO_OFFSET);
	assert_int_equal(pool_kept_newest(p), POOL_NO_BLOCK);
	pool_usage(p, &u);
	assert_int_equal(u.blocks_kept, 0);
	assert_int_equal(u.kept_bytes, 0);
	assert_int_equal(pool_block_swap_begin(p, id[1], id[2]), 0);
	pool_destroy(p);
}

static void test_swap_states(void **state)
{
	(void)state;
	struct pool *p = make_pool(test_name("swap"), 4 * MIB);
	unsigned cls, cls2;
	uint32_t a, v, other, small;
	assert_int_equal(pool_class(p, 256 * 1024, &cls2), 0);
	assert_int_equal(pool_block_alloc(p, cls2, &small), 0);	/* its slab takes one unit */
	assert_int_equal(pool_class(p, 512 * 1024, &cls), 0);
	assert_int_equal(pool_block_alloc(p, cls, &a), 0);
	assert_int_equal(pool_block_alloc(p, cls, &v), 0);
	assert_int_equal(pool_block_demote_begin(p, a, 3 * MIB), 0);
	assert_int_equal(pool_block_demote_end(p, a, true, 0x1111), 0);
	while (pool_block_alloc(p, cls, &other) == 0)
		;
	assert_int_equal(pool_block_promote_begin(p, a), -ENOSPC);	/* DRAM full */
	struct pool_usage u0, u;
	pool_usage(p, &u0);

	assert_int_equal(pool_block_swap_begin(p, v, a), -EINVAL);	/* roles reversed */
	assert_int_equal(pool_block_swap_begin(p, a, a), -EINVAL);
	assert_int_equal(pool_block_lease(p, v), 0);
	assert_int_equal(pool_block_swap_begin(p, a, v), -EBUSY);	/* leased: never a victim */
	assert_int_equal(pool_block_unlease(p, v), 0);

	struct pool_block *da = pool_block_get(p, a), *dv = pool_block_get(p, v);
	uint64_t slot = dv->dram_off;
	/* Undo after begin: both as they were. */
	assert_int_equal(pool_block_swap_begin(p, a, v), 0);
	assert_int_equal(da->tier, POOL_TIER_PROMOTING);
	assert_int_equal(da->dram_off, POOL_NO_OFFSET);
	assert_int_equal(dv->tier, POOL_TIER_DEMOTING);
	assert_int_equal(dv->nvme_off, 3 * MIB);
	assert_int_equal(pool_block_free(p, a), -EBUSY);
	assert_int_equal(pool_block_free(p, v), -EBUSY);
	pool_usage(p, &u);
	assert_int_equal(u.blocks_inflight, 2);
	assert_int_equal(u.dram_used_bytes, u0.dram_used_bytes);
	assert_int_equal(pool_block_demote_end(p, v, false, 0), 0);
	assert_int_equal(pool_block_promote_end(p, a, false, false), 0);
	assert_int_equal(da->tier, POOL_TIER_NVME);
	assert_int_equal(da->nvme_off, 3 * MIB);
	assert_int_equal(da->crc, 0x1111);
	assert_int_equal(dv->tier, POOL_TIER_DRAM);
	assert_int_equal(dv->dram_off, slot);
	assert_int_equal(dv->nvme_off, POOL_NO_OFFSET);
	pool_usage(p, &u);
	assert_memory_equal(&u, &u0, sizeof u);

	/* Commit: a owns the slot (offset lookups follow), v the extent with its crc. */
	assert_int_equal(pool_block_swap_commit(p, a, v, 0x2222), -EINVAL);	/* not begun */
	assert_int_equal(pool_block_swap_begin(p, a, v), 0);
	assert_int_equal(pool_block_swap_commit(p, a, v, 0x2222), 0);
	assert_int_equal(da->tier, POOL_TIER_DRAM);
	assert_int_equal(da->dram_off, slot);
	assert_int_equal(da->nvme_off, POOL_NO_OFFSET);
	assert_int_equal(dv->tier, POOL_TIER_NVME);
	assert_int_equal(dv->dram_off, POOL_NO_OFFSET);
	assert_int_equal(dv->nvme_off, 3 * MIB);
	assert_int_equal(dv->crc, 0x2222);
	assert_true(dv->has_crc);
	uint32_t got;
	assert_int_equal(pool_block_at(p, slot, &got), 0);
	assert_int_equal(got, a);
	pool_usage(p, &u);
	assert_int_equal(u.blocks_dram, u0.blocks_dram);
	assert_int_equal(u.blocks_nvme, u0.blocks_nvme);
	assert_int_equal(u.blocks_inflight, 0);
	assert_int_equal(u.dram_used_bytes, u0.dram_used_bytes);

	/* Different classes never swap. */
	assert_int_equal(pool_block_swap_begin(p, v, small), -EINVAL);
	pool_destroy(p);
}

struct rank_ctx {
	uint64_t detached_below; /* seq ids below this are "detached" */
	size_t calls;
};

static int rank_fn(void *ctx, const struct pool_block *b)
{
	struct rank_ctx *rc = ctx;
	rc->calls++;
	if (!b->committed)
		return -1;
	return b->seq_id < rc->detached_below ? 0 : 1;
}

/* A pool of n blocks of 8 KiB in ten sequences, 1 in uncommitted_1_in uncommitted, 1 in
 * leased_1_in leased (0: none), then `touches` random touches. */
static struct pool *lru_pool(const char *name, uint32_t *ids, int n, uint64_t *rng,
			     int uncommitted_1_in, int leased_1_in, int touches)
{
	struct pool *p = make_pool(test_name(name), 16 * MIB);
	unsigned cls;
	assert_int_equal(pool_class(p, 8192, &cls), 0);
	for (int i = 0; i < n; i++) {
		assert_int_equal(pool_block_alloc(p, cls, &ids[i]), 0);
		struct pool_block *b = pool_block_get(p, ids[i]);
		b->seq_id = test_rand(rng) % 10;
		pool_block_set_committed(p, ids[i], test_rand(rng) % uncommitted_1_in != 0);
		if (leased_1_in && test_rand(rng) % leased_1_in == 0)
			pool_block_lease(p, ids[i]);
	}
	for (int i = 0; i < touches; i++)
		pool_block_touch(p, ids[test_rand(rng) % n]);
	return p;
}

static void test_victims_match_reference(void **state)
{
	(void)state;
	enum { N = 1500 };
	uint32_t ids[N];
	uint64_t rng = 7;
	struct pool *p = lru_pool("lru", ids, N, &rng, 4, 8, 3 * N);
	for (int i = 0; i < 40; i++) { /* some on NVMe: never victims */
		uint32_t id = ids[test_rand(&rng) % N];
		if (pool_block_demote_begin(p, id, 4096ull * i) == 0)
			pool_block_demote_end(p, id, true, 0);
	}
	/* Demotions that fail come back to DRAM with their old lru (placed by the walk), some
	 * promoted blocks come back touched, touches go on, and some blocks are freed. */
	for (int i = 0; i < 60; i++) {
		uint32_t id = ids[test_rand(&rng) % N];
		if (pool_block_demote_begin(p, id, 4096ull * (100 + i)) == 0)
			pool_block_demote_end(p, id, false, 0);
		id = ids[test_rand(&rng) % N];
		struct pool_block *b = pool_block_get(p, id);
		if (b && b->tier == POOL_TIER_NVME && pool_block_promote_begin(p, id) == 0)
			pool_block_promote_end(p, id, i % 3 != 0, false);
		pool_block_touch(p, ids[test_rand(&rng) % N]);
	}
	for (int i = 0; i < N; i += 97) {
		struct pool_block *b = pool_block_get(p, ids[i]);
		if (b && !b->leases && b->tier != POOL_TIER_NVME && pool_block_free(p, ids[i]) == 0)
			ids[i] = ids[i == 0 ? 1 : i - 1]; /* keep ids[] live for the reference */
	}
	struct rank_ctx rc = { .detached_below = 4 };
	const size_t wants[] = { 1, 17, 300, N };
	for (size_t w = 0; w < 4; w++) {
		size_t max = wants[w], n;
		uint32_t *got = malloc(sizeof *got * max);
		assert_int_equal(pool_victims(p, rank_fn, &rc, got, max, &n), 0);
		/* Reference: every eligible block, selection-sorted by (rank, lru). */
		uint32_t *ref = malloc(sizeof *ref * N);
		size_t m = 0;
		for (int i = 0; i < N; i++) {
			struct pool_block *b = pool_block_get(p, ids[i]);
			if (b->tier == POOL_TIER_DRAM && !b->leases && rank_fn(&rc, b) >= 0)
				ref[m++] = ids[i];
		}
		/* ids[] may name a block twice now: keep each once. */
		size_t u = 0;
		for (size_t i = 0; i < m; i++) {
			bool dup = false;
			for (size_t j = 0; j < u && !dup; j++)
				dup = ref[j] == ref[i];
			if (!dup)
				ref[u++] = ref[i];
		}
		m = u;
		for (size_t i = 0; i < m; i++) {
			for (size_t j = i + 1; j < m; j++) {
				struct pool_block *x = pool_block_get(p, ref[i]);
				struct pool_block *y = pool_block_get(p, ref[j]);
				int rx = rank_fn(&rc, x), ry = rank_fn(&rc, y);
				if (ry < rx || (ry == rx && y->lru < x->lru)) {
					uint32_t t = ref[i];
					ref[i] = ref[j];
					ref[j] = t;
				}
			}
		}
		assert_int_equal(n, m < max ? m : max);
		for (size_t i = 0; i < n; i++)
			assert_int_equal(got[i], ref[i]);
		free(got);
		free(ref);
	}
	/* Every committed block detached (rank 0): a few victims are found near the cold end, not
	 * by a pass over every block. */
	rc = (struct rank_ctx){ .detached_below = 100 };
	uint32_t few[17];
	size_t n;
	assert_int_equal(pool_victims(p, rank_fn, &rc, few, 17, &n), 0);
	assert_int_equal(n, 17);
	assert_true(rc.calls < N / 8);
	pool_destroy(p);
}

/* A scan spread over steps gives pool_victims' answer when nothing changes between steps, and
 * survives blocks leaving DRAM (under its cursor too) and touches between them. */
static void test_scan_in_steps(void **state)
{
	(void)state;
	enum { N = 1200 };
	uint32_t ids[N];
	uint64_t rng = 11;
	struct pool *p = lru_pool("scan", ids, N, &rng, 5, 0, 2 * N);
	struct rank_ctx rc = { .detached_below = 3 };
	const size_t max = 200;
	uint32_t want[max], got[max];
	size_t nw, steps = 0;
	assert_int_equal(pool_victims(p, rank_fn, &rc, want, max, &nw), 0);
	struct pool_scan sc;
	assert_int_equal(pool_scan_begin(p, &sc, max), 0);
	while (!pool_scan_step(p, &sc, rank_fn, &rc, 7))
		steps++;
	assert_true(steps > 10);
	uint64_t lrus[max];
	assert_int_equal(pool_scan_end(p, &sc, got, lrus), nw);
	for (size_t i = 0; i < nw; i++) {
		assert_int_equal(got[i], want[i]);
		assert_int_equal(lrus[i], pool_block_get(p, got[i])->lru);
	}

	/* Changes between steps: demote the block under the cursor, touch others, free some. */
	assert_int_equal(pool_scan_begin(p, &sc, max), 0);
	int k = 0;
	while (!pool_scan_step(p, &sc, rank_fn, &rc, 5)) {
		if (sc.cursor != POOL_NO_BLOCK && k < 50 &&
		    pool_block_demote_begin(p, sc.cursor, 4096ull * k) == 0)
			pool_block_demote_end(p, sc.cursor, k % 2, 0), k++;
		pool_block_touch(p, ids[test_rand(&rng) % N]);
	}
	size_t n = pool_scan_end(p, &sc, got, lrus);
	assert_true(n > 0 && n <= max);
	assert_true(k > 10);
	/* Each lru is the one the walk saw: a block touched after its visit shows a newer one. */
	for (size_t i = 0; i < n; i++) {
		assert_non_null(pool_block_get(p, got[i]));
		assert_true(lrus[i] <= pool_block_get(p, got[i])->lru);
	}
	pool_destroy(p);
}

static int drop_ipc_lock(void)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct data[2];
	if (syscall(SYS_capget, &hdr, data) < 0)
		return -1;
	data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
	data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
	return (int)syscall(SYS_capset, &hdr, data);
}

static void test_mlock_failure_message(void **state)
{
	(void)state;
	const char *name = test_name("lock");
	/* Locking a small pool works under the default limit (or as root). */
	struct pool_config cfg = { .shm_name = name, .dram_bytes = 4 * MIB, .lock_memory = true,
				   .unlink_existing = true };
	struct pool *p = NULL;
	char err[POOL_ERR_LEN] = "";
	int ret = pool_create(&cfg, &p, err, sizeof err);
	assert_int_equal(ret, 0);
	struct pool_usage u;
	pool_usage(p, &u);
	assert_true(u.locked);
	pool_destroy(p);
#if SANITIZED
	/* The sanitizer runtimes intercept mlock() as a no-op: the failure cannot happen here. */
	fprintf(stderr, "note: mlock failure half skipped under a sanitizer\n");
	return;
#endif
	/* Without CAP_IPC_LOCK and a 64 KiB limit, locking 16 MiB fails with the hint. */
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		struct rlimit rl = { 64 * 1024, 64 * 1024 };
		if (drop_ipc_lock() < 0 || setrlimit(RLIMIT_MEMLOCK, &rl) < 0)
			_exit(3);
		cfg.dram_bytes = 16 * MIB;
		struct pool *c = NULL;
		char cerr[POOL_ERR_LEN] = "";
		int r = pool_create(&cfg, &c, cerr, sizeof cerr);
		if (write(fds[1], cerr, strlen(cerr) + 1) < 0)
			_exit(4);
		if (r == 0)
			pool_destroy(c);
		_exit(r == -ENOMEM || r == -EPERM || r == -EAGAIN ? 0 : 1);
	}
	close(fds[1]);
	char msg[POOL_ERR_LEN] = "";
	ssize_t got = read(fds[0], msg, sizeof msg - 1);
	close(fds[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) != 0)
		fprintf(stderr, "child: exit %d, '%s'\n", WEXITSTATUS(status), msg);
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_true(got > 0);
	assert_non_null(strstr(msg, "LimitMEMLOCK="));
	assert_non_null(strstr(msg, "ulimit -l"));
	assert_non_null(strstr(msg, "lock_memory=false"));
	assert_int_equal(pool_segment_unlink(name, NULL), -ENOENT); /* cleaned up on failure */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_segment_lifecycle),
		cmocka_unit_test(test_bad_config),
		cmocka_unit_test(test_group_and_hugetlbfs_dir),
		cmocka_unit_test(test_mapper_shares_bytes),
		cmocka_unit_test(test_blocks_and_offsets),
		cmocka_unit_test(test_demote_promote_states),
		cmocka_unit_test(test_kept_copies),
		cmocka_unit_test(test_swap_states),
		cmocka_unit_test(test_victims_match_reference),
		cmocka_unit_test(test_scan_in_steps),
		cmocka_unit_test(test_mlock_failure_message),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
