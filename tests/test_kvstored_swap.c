/* Integration: DRAM <-> NVMe swaps in a real kvstored whose pool (256 blocks) and NVMe tier
 * (128 blocks) are both filled to the last block by one sequence.
 * - Every page is recalled in turn, one RECALL each, forwards and backwards, then in RECALLs of
 *   32 pages: each NVMe-resident page swaps places with a cold DRAM block; every byte is checked
 *   against what was written, a block leased throughout never moves, and the tiers stay full.
 *   (Without swaps the first NVMe-resident page fails with ENOSPC.)
 * - A byte flipped in every NVMe extent: each swap fails on the read with EBADMSG and leaves both
 *   pages where they were, so every DRAM-resident page still reads back intact; once the bytes
 *   are flipped back, every page reads back intact again, the NVMe ones through swaps.
 * - DRAM full of another worker's uncommitted blocks, the tier full of cold pages: a RECALL of a
 *   cold page has no slot and nothing to trade places with. It waits alloc_wait_ms (300: then
 *   ENOSPC, not at once), and with a longer wait it completes, intact, once the other worker
 *   commits and a swap has a victim. */
#include "test_kvstored_harness.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define DRAM_BLOCKS 256u	/* dram_bytes=2M: one 2 MiB slab unit of 8 KiB blocks */
#define NVME_BLOCKS 128u	/* nvme_bytes=1M */
#define N_PAGES ((DRAM_BLOCKS + NVME_BLOCKS) / 2)	/* per layer; 2 layers fill both tiers */
#define TAG 11u

static const char *const small_tiers[] = { "--set", "dram_bytes=2M", "--set", "nvme_bytes=1M", NULL };

/* RECALL one page, compare its bytes, release. 0, the ring error, or -EILSEQ on a mismatch;
 * *off (optional) gets the page's pool offset. */
static int recall_one(struct kvs *k, uint64_t seq, uint32_t layer, uint32_t page, uint64_t *off)
{
	uint64_t mask = 3, o, lease;
	int ret = kvs_recall(k, seq, layer, &page, &mask, 1, &o, &lease);
	if (ret)
		return ret;
	bool same = h_check((uint8_t *)kvs_pool_base(k) + o, H_BLOCK, TAG, layer, page);
	if (off)
		*off = o;
	ret = kvs_release(k, &lease, 1);
	return same ? ret : -EILSEQ;
}

static void expect_tiers(struct kvs *k, const char *name, uint64_t dram, uint64_t nvme)
{
	Freekv__Reply *r = h_settled(k, name);
	assert_non_null(r);
	assert_int_equal(r->sequence->pages->in_flight, 0);
	assert_int_equal(r->sequence->pages->dram, dram);
	assert_int_equal(r->sequence->pages->nvme, nvme);
	kvs_reply_free(r);
}

static void get_stats(struct kvs *k, uint64_t *swaps, uint64_t *failures, uint64_t *crc_errors)
{
	Freekv__Reply *r;
	assert_int_equal(kvs_stats(k, &r), 0);
	assert_true(r->stats->has_swaps && r->stats->has_swap_failures);
	*swaps = r->stats->swaps;
	*failures = r->stats->swap_failures;
	*crc_errors = r->stats->crc_errors;
	kvs_reply_free(r);
}

/* `kvctl stats --json` shows the counters the daemon keeps. */
static void expect_kvctl_swaps(const struct harness *h, uint64_t swaps, uint64_t failures)
{
	char cmd[512], out[1 << 16];
	snprintf(cmd, sizeof cmd, "%s/ctl/kvctl -e %s stats --json", FREEKV_BUILD_DIR, h->endpoint);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	assert_int_equal(pclose(p), 0);
	json_object *j = json_tokener_parse(out), *v;
	assert_non_null(j);
	assert_true(json_object_object_get_ex(j, "swaps", &v));
	assert_int_equal(json_object_get_int64(v), swaps);
	assert_true(json_object_object_get_ex(j, "swap_failures", &v));
	assert_int_equal(json_object_get_int64(v), failures);
	json_object_put(j);
}

/* A worker whose sequence "swap" fills DRAM and the tier exactly. */
static struct kvs *fill_both(struct harness *h, uint64_t *seq)
{
	harness_start(h, small_tiers);
	struct kvs *k = h_worker(h, "swap", seq);
	assert_non_null(k);
	int ret = h_write_pages(k, *seq, TAG, 0, N_PAGES);
	if (ret)
		fprintf(stderr, "fill: %s\n", kvs_error(k));
	assert_int_equal(ret, 0);
	expect_tiers(k, "swap", DRAM_BLOCKS, NVME_BLOCKS);
	return k;
}

static void test_swap_when_both_full(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq, swaps, failures, crc_errors, pinned_off, off;
	struct kvs *k = fill_both(&h, &seq);

	/* The last page written is in DRAM; a lease held on it pins it for the whole test. */
	uint32_t pin_page = N_PAGES - 1, pin_layer = 1;
	uint64_t mask = 3, pin_lease;
	assert_int_equal(kvs_recall(k, seq, pin_layer, &pin_page, &mask, 1, &pinned_off, &pin_lease), 0);

	for (int dir = 0; dir < 2; dir++) {
		for (uint32_t i = 0; i < N_PAGES; i++) {
			uint32_t p = dir ? N_PAGES - 1 - i : i;
			for (uint32_t l = 0; l < h_geo.n_layers; l++) {
				int ret = recall_one(k, seq, l, p, &off);
				if (ret)
					fprintf(stderr, "recall layer %u page %u: %s\n", l, p, kvs_error(k));
				assert_int_equal(ret, 0);
			}
		}
		get_stats(k, &swaps, &failures, &crc_errors);
		fprintf(stderr, "after pass %d: %" PRIu64 " swaps\n", dir, swaps);
		/* Each of the first pass's 128 NVMe-resident pages needed one. */
		assert_true(swaps >= NVME_BLOCKS * (uint64_t)(dir + 1));
		assert_int_equal(failures, 0);
	}
	/* 32 pages per RECALL: each needs all of its pages in DRAM at once. */
	assert_int_equal(h_read_pages(k, seq, TAG, 0, N_PAGES), 0);

	assert_int_equal(recall_one(k, seq, pin_layer, pin_page, &off), 0);
	assert_int_equal(off, pinned_off);
	assert_true(h_check((uint8_t *)kvs_pool_base(k) + pinned_off, H_BLOCK, TAG, pin_layer, pin_page));
	assert_int_equal(kvs_release(k, &pin_lease, 1), 0);
	get_stats(k, &swaps, &failures, &crc_errors);
	assert_int_equal(failures, 0);
	assert_int_equal(crc_errors, 0);
	expect_tiers(k, "swap", DRAM_BLOCKS, NVME_BLOCKS);
	expect_kvctl_swaps(&h, swaps, 0);
	kvs_close(k);
	harness_stop(&h);
}

/* XOR one byte of every block-sized extent of the tier file (twice restores it). O_DIRECT, as
 * the daemon reads it, so that no page cache stands between. Returns the extents changed. */
static unsigned flip_tier(const char *path)
{
	int fd = open(path, O_RDWR | O_DIRECT);
	assert_true(fd >= 0);
	void *buf = NULL;
	assert_int_equal(posix_memalign(&buf, 4096, H_BLOCK), 0);
	unsigned n = 0;
	for (off_t off = 0; pread(fd, buf, H_BLOCK, off) == H_BLOCK; off += H_BLOCK) {
		((uint8_t *)buf)[100] ^= 0x40;
		assert_int_equal(pwrite(fd, buf, H_BLOCK, off), H_BLOCK);
		n++;
	}
	close(fd);
	free(buf);
	return n;
}

static void test_swap_crc_error_keeps_both(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq, swaps, failures, crc_errors;
	struct kvs *k = fill_both(&h, &seq);
	assert_int_equal(flip_tier(h.nvme), NVME_BLOCKS);

	unsigned ok = 0, bad = 0;
	for (uint32_t p = 0; p < N_PAGES; p++) {
		for (uint32_t l = 0; l < h_geo.n_layers; l++) {
			int ret = recall_one(k, seq, l, p, NULL);
			if (ret == -EBADMSG) {
				bad++;
				continue;
			}
			if (ret)
				fprintf(stderr, "recall layer %u page %u: %s (%s)\n", l, p, strerror(-ret), kvs_error(k));
			assert_int_equal(ret, 0);
			ok++;
		}
	}
	/* Every swap failed on its read; no DRAM victim was lost or changed. */
	assert_int_equal(ok, DRAM_BLOCKS);
	assert_int_equal(bad, NVME_BLOCKS);
	get_stats(k, &swaps, &failures, &crc_errors);
	assert_int_equal(swaps, 0);
	assert_int_equal(failures, NVME_BLOCKS);
	assert_true(crc_errors >= NVME_BLOCKS);
	expect_tiers(k, "swap", DRAM_BLOCKS, NVME_BLOCKS);
	assert_true(harness_alive(&h));

	/* The NVMe pages were left where they were: repaired, all of them read back. */
	assert_int_equal(flip_tier(h.nvme), NVME_BLOCKS);
	for (uint32_t p = 0; p < N_PAGES; p++)
		for (uint32_t l = 0; l < h_geo.n_layers; l++)
			assert_int_equal(recall_one(k, seq, l, p, NULL), 0);
	get_stats(k, &swaps, &failures, &crc_errors);
	assert_true(swaps >= NVME_BLOCKS);
	assert_int_equal(failures, NVME_BLOCKS);
	expect_tiers(k, "swap", DRAM_BLOCKS, NVME_BLOCKS);
	expect_kvctl_swaps(&h, swaps, NVME_BLOCKS);
	kvs_close(k);
	harness_stop(&h);
}

struct late_commit {
	struct kvs *k;
	uint64_t seq;
	uint64_t (*offs)[DRAM_BLOCKS / 2];
	atomic_bool committed;
	int ret;
};

/* After 300 ms, commit the hot sequence's blocks (32 pages per COMMIT, as they were allocated). */
static void *commit_later(void *arg)
{
	struct late_commit *c = arg;
	h_sleep_ms(300);
	atomic_store(&c->committed, true);
	for (uint32_t p0 = 0; p0 < DRAM_BLOCKS / 2 && !c->ret; p0 += 32)
		for (uint32_t l = 0; l < h_geo.n_layers && !c->ret; l++)
			c->ret = kvs_commit(c->k, c->seq, (uint64_t)(p0 + 32) * h_geo.page_size,
					    &c->offs[l][p0], 32);
	return NULL;
}

static void set_conf(struct kvs *k, const char *key, const char *value)
{
	Freekv__Reply *r;
	assert_int_equal(kvs_config_set(k, key, value, &r), 0);
	kvs_reply_free(r);
}

static void test_recall_waits_for_room(void **state)
{
	(void)state;
	struct harness h;
	uint64_t cold, hot, off;
	harness_start(&h, small_tiers);
	/* The cold sequence fills the tier: written, then demoted whole. */
	struct kvs *kc = h_worker(&h, "cold", &cold);
	assert_non_null(kc);
	assert_int_equal(h_write_pages(kc, cold, TAG, 0, NVME_BLOCKS / 2), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_demote(kc, cold, NULL, &r), 0);
	kvs_reply_free(r);
	expect_tiers(kc, "cold", 0, NVME_BLOCKS);
	/* The hot one fills DRAM with blocks it has not committed: nothing can move. */
	struct kvs *kh = h_worker(&h, "hot", &hot);
	assert_non_null(kh);
	static uint64_t offs[2][DRAM_BLOCKS / 2];
	for (uint32_t p0 = 0; p0 < DRAM_BLOCKS / 2; p0 += 32)
		for (uint32_t l = 0; l < h_geo.n_layers; l++)
			assert_int_equal(kvs_alloc(kh, hot, l, p0, 32, &offs[l][p0]), 0);

	set_conf(kc, "alloc_wait_ms", "300");
	uint64_t t0 = clock_ms();
	assert_int_equal(recall_one(kc, cold, 0, 5, &off), -ENOSPC);
	assert_true(clock_ms() - t0 >= 300);

	set_conf(kc, "alloc_wait_ms", "20000");
	struct late_commit c = { .k = kh, .seq = hot, .offs = offs };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, commit_later, &c), 0);
	int ret = recall_one(kc, cold, 0, 5, &off);
	bool waited = atomic_load(&c.committed);
	assert_int_equal(pthread_join(th, NULL), 0);
	if (ret)
		fprintf(stderr, "recall: %s\n", kvs_error(kc));
	assert_int_equal(ret, 0);
	assert_true(waited);
	assert_int_equal(c.ret, 0);
	/* Every cold page reads back intact (through swaps with the hot blocks). */
	assert_int_equal(h_read_pages(kc, cold, TAG, 0, NVME_BLOCKS / 2), 0);
	kvs_close(kh);
	kvs_close(kc);
	harness_stop(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_swap_when_both_full, h_teardown),
		cmocka_unit_test_teardown(test_swap_crc_error_keeps_both, h_teardown),
		cmocka_unit_test_teardown(test_recall_waits_for_room, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
