/* Integration: a real kvstored and real client processes moving bytes through the pool, the
 * rings and the NVMe tier.
 * - 4 worker processes allocate, write random bytes, commit, force demotion (Demote), read back
 *   through RECALL (promotion from NVMe): every byte identical.
 * - A pool smaller than the data: ALLOC waits while demotion makes room; all bytes read back.
 * - Pool and NVMe both full: ALLOC fails with ENOSPC; nothing committed is lost.
 * - DRAM full of uncommitted blocks (nothing demotable): an ALLOC waits up to alloc_wait_ms and
 *   succeeds once they are committed (and so demotable), fails with ENOSPC when none is.
 * - A byte flipped in the NVMe file: RECALL reports a checksum error (EBADMSG).
 * - A Demote larger than the tier's request table completes in later passes.
 * - Above dram_high_watermark, demotion takes detached sequences' blocks first.
 * - A promoted block demoted again unchanged goes back to its kept extent with no write; one
 *   whose bytes changed is written; both read back exactly, also after a kill -9 and restart.
 * - A tier full of kept copies: they give way to a demotion that needs extents. */
#include "clock.h"
#include "test_kvstored_harness.h"

#include <inttypes.h>

#define PAGES 8

static int child_roundtrip(const struct harness *h, int i)
{
	char name[32];
	uint64_t seq;
	snprintf(name, sizeof name, "rt-%d", i);
	struct kvs *k = h_worker(h, name, &seq);
	if (!k)
		return 10;
	int rc = 0;
	if (h_write_pages(k, seq, (uint64_t)i, 0, PAGES)) {
		rc = 11;
		goto out;
	}
	Freekv__Reply *r;
	if (kvs_demote(k, seq, NULL, &r)) {
		rc = 12;
		goto out;
	}
	if (r->evicted->blocks != PAGES * h_geo.n_layers)
		rc = 13;
	kvs_reply_free(r);
	if (rc)
		goto out;
	r = h_settled(k, name);
	if (!r || r->sequence->pages->nvme != PAGES * h_geo.n_layers || r->sequence->pages->dram != 0)
		rc = 14;
	kvs_reply_free(r);
	if (rc)
		goto out;
	int ret = h_read_pages(k, seq, (uint64_t)i, 0, PAGES);
	if (ret)
		rc = ret == -EILSEQ ? 15 : 16;
out:
	if (rc)
		fprintf(stderr, "child %d: step %d: %s\n", i, rc, kvs_error(k));
	kvs_close(k);
	return rc;
}

static void test_four_clients_demote_recall(void **state)
{
	(void)state;
	struct harness h;
	harness_start(&h, NULL);
	pid_t kids[4];
	for (int i = 0; i < 4; i++) {
		kids[i] = fork();
		assert_true(kids[i] >= 0);
		if (kids[i] == 0)
			_exit(child_roundtrip(&h, i));
	}
	for (int i = 0; i < 4; i++) {
		int st;
		assert_int_equal(waitpid(kids[i], &st, 0), kids[i]);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
	}
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_stats(k, &r), 0);
	assert_true(r->stats->demoted_blocks >= 4 * PAGES * 2);
	assert_true(r->stats->promoted_blocks >= 4 * PAGES * 2);
	assert_int_equal(r->stats->crc_errors, 0);
	kvs_reply_free(r);
	kvs_close(k);
	harness_stop(&h);
}

/* dram_bytes=4M holds 2 slab units (512 blocks of 8 KiB); write 1200 blocks. */
static void test_pool_full_demotes(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "dram_bytes=4M", "--set", "dram_low_watermark=50", NULL };
	struct harness h;
	uint64_t seq;
	harness_start(&h, extra);
	struct kvs *k = h_worker(&h, "big", &seq);
	assert_non_null(k);
	for (uint32_t p = 0; p < 600; p += 40) {
		int ret = h_write_pages(k, seq, 77, p, 40);
		if (ret)
			fprintf(stderr, "write %u: %s\n", p, kvs_error(k));
		assert_int_equal(ret, 0);
	}
	assert_int_equal(h_read_pages(k, seq, 77, 0, 600), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_stats(k, &r), 0);
	assert_true(r->stats->demoted_blocks > 0);
	assert_true(r->stats->promoted_blocks > 0);
	kvs_reply_free(r);
	kvs_close(k);
	harness_stop(&h);
}

static void test_pool_and_nvme_full(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "dram_bytes=4M", "--set", "nvme_bytes=2M", NULL };
	struct harness h;
	uint64_t a, b;
	harness_start(&h, extra);
	struct kvs *k = h_worker(&h, "keep", &a);
	assert_non_null(k);
	/* 200 blocks of "keep" first, then fill with "filler" until ENOSPC. */
	assert_int_equal(h_write_pages(k, a, 5, 0, 100), 0);
	assert_int_equal(kvs_open_sequence(k, "filler", h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &b), 0);
	assert_int_equal(kvs_attach(k, b, NULL), 0);
	int ret = 0;
	uint32_t p = 0;
	for (; p < 4096 && !ret; p += 16)
		ret = h_write_pages(k, b, 6, p, 16);
	assert_int_equal(ret, -ENOSPC);
	assert_non_null(strstr(kvs_error(k), "No space"));
	assert_true(200 + 2 * p > 512 + 32); /* more than DRAM alone holds: demotion ran */
	/* Make room by dropping the filler, then every byte of "keep" must still be there. */
	ret = kvs_close_sequence(k, b, true);
	if (ret)
		fprintf(stderr, "close: %s\n", kvs_error(k));
	assert_int_equal(ret, 0);
	assert_int_equal(h_read_pages(k, a, 5, 0, 100), 0);
	kvs_close(k);
	harness_stop(&h);
}

static void test_nvme_corruption_detected(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq;
	harness_start(&h, NULL);
	struct kvs *k = h_worker(&h, "crc", &seq);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, seq, 9, 0, 4), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_demote(k, seq, NULL, &r), 0);
	kvs_reply_free(r);
	r = h_settled(k, "crc");
	assert_non_null(r);
	assert_int_equal(r->sequence->pages->nvme, 8);
	kvs_reply_free(r);

	/* Flip one byte in every written block of the tier file. */
	int fd = open(h.nvme, O_RDWR);
	assert_true(fd >= 0);
	uint8_t buf[H_BLOCK], zero[H_BLOCK] = { 0 };
	int flipped = 0;
	for (off_t off = 0; pread(fd, buf, H_BLOCK, off) == H_BLOCK && off < (32 << 20); off += H_BLOCK) {
		if (!memcmp(buf, zero, H_BLOCK))
			continue;
		buf[100] ^= 0x40;
		assert_int_equal(pwrite(fd, buf, H_BLOCK, off), H_BLOCK);
		flipped++;
	}
	fsync(fd);
	close(fd);
	assert_int_equal(flipped, 8);

	uint32_t page = 0;
	uint64_t mask = 1, off, lease;
	assert_int_equal(kvs_recall(k, seq, 0, &page, &mask, 1, &off, &lease), -EBADMSG);
	assert_int_equal(kvs_stats(k, &r), 0);
	assert_true(r->stats->crc_errors >= 1);
	kvs_reply_free(r);
	kvs_close(k);
	harness_stop(&h);
}

/* dram_bytes=8M holds 1024 blocks; above 60 % in use, demotion brings it down to 40 %, taking
 * the detached sequence's blocks before the attached one's. */
static void test_watermarks_detached_first(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "dram_bytes=8M", "--set", "dram_high_watermark=60",
					     "--set", "dram_low_watermark=40", NULL };
	struct harness h;
	uint64_t a, b;
	harness_start(&h, extra);
	struct kvs *k = h_worker(&h, "cold", &a);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, a, 1, 0, 150), 0); /* 300 blocks */
	assert_int_equal(kvs_detach(k, a), 0);
	assert_int_equal(kvs_open_sequence(k, "hot", h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &b), 0);
	assert_int_equal(kvs_attach(k, b, NULL), 0);
	assert_int_equal(h_write_pages(k, b, 2, 0, 200), 0); /* 400 more: 700 > 60 % of 1024 */
	/* Demotion runs in waves of a few writes, from past the high watermark down to (about) the
	 * low one: wait for that, then for the last wave. */
	Freekv__Reply *ra, *rb, *st;
	for (uint64_t t0 = clock_ms();; h_sleep_ms(5)) {
		assert_int_equal(kvs_stats(k, &st), 0);
		bool down = st->stats->dram_used_bytes <= st->stats->dram_bytes * 41 / 100;
		kvs_reply_free(st);
		if (down || clock_ms() - t0 > 10000)
			break;
	}
	ra = h_settled(k, "cold");
	rb = h_settled(k, "hot");
	assert_non_null(ra);
	assert_non_null(rb);
	fprintf(stderr, "cold: %" PRIu64 " DRAM / %" PRIu64 " NVMe, hot: %" PRIu64 " DRAM / %" PRIu64 " NVMe\n",
		ra->sequence->pages->dram, ra->sequence->pages->nvme, rb->sequence->pages->dram,
		rb->sequence->pages->nvme);
	assert_true(ra->sequence->pages->nvme >= 200);
	assert_int_equal(rb->sequence->pages->nvme, 0);
	assert_int_equal(kvs_stats(k, &st), 0);
	assert_true(st->stats->dram_used_bytes <= st->stats->dram_bytes * 60 / 100);
	kvs_reply_free(ra);
	kvs_reply_free(rb);
	kvs_reply_free(st);
	assert_int_equal(h_read_pages(k, b, 2, 0, 200), 0);
	kvs_close(k);
	harness_stop(&h);
}

/* io_queue_depth=8 allows 32 tier requests at once: a 200-block Demote must still finish. */
static void test_demote_more_than_queue(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "io_queue_depth=8", NULL };
	struct harness h;
	uint64_t seq;
	harness_start(&h, extra);
	struct kvs *k = h_worker(&h, "long", &seq);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, seq, 3, 0, 100), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_demote(k, seq, NULL, &r), 0);
	/* The reply counts the whole demotion, not the 32 writes the table took at once. */
	assert_int_equal(r->evicted->blocks, 200);
	kvs_reply_free(r);
	uint64_t t0 = clock_ms();
	for (;;) {
		assert_int_equal(kvs_show_sequence(k, seq, NULL, false, &r), 0);
		bool done = r->sequence->pages->nvme == 200;
		kvs_reply_free(r);
		if (done)
			break;
		assert_true(clock_ms() - t0 < 10000);
		h_sleep_ms(5);
	}
	assert_int_equal(h_read_pages(k, seq, 3, 0, 100), 0);
	kvs_close(k);
	harness_stop(&h);
}

/* Fill DRAM with blocks allocated but not committed: nothing can be demoted. With
 * alloc_wait_ms=0 the ALLOC that finds no room fails at once. Then another worker's ALLOC waits
 * (alloc_wait_ms=20000), and succeeds once the first worker commits; and with alloc_wait_ms=300
 * it fails with ENOSPC when nobody does. */
/* One ALLOC, which kvstored holds at least waited_ms for room: the completion's timing stamps
 * (ring.h "Timing") put that wait in the daemon's service, and the parts add up. */
static int child_alloc_one(const struct harness *h, const char *name, uint64_t waited_ms)
{
	uint64_t seq, off;
	struct kvs *k = h_worker(h, name, &seq);
	if (!k)
		return 10;
	struct kvs_ring_timing t;
	kvs_ring_last_timing(k, &t);
	if (t.round_trip_ns) {
		kvs_close(k);
		return 12; /* no ring op yet */
	}
	uint64_t t0 = clock_ns();
	int ret = kvs_alloc(k, seq, 0, 0, 1, &off);
	uint64_t rt = clock_ns() - t0;
	if (ret)
		fprintf(stderr, "child %s: %s\n", name, kvs_error(k));
	kvs_ring_last_timing(k, &t);
	kvs_close(k);
	if (t.queued_ns + t.served_ns + t.woken_ns != t.round_trip_ns || t.round_trip_ns > rt ||
	    t.served_ns < waited_ms * 1000000u || t.served_ns > t.round_trip_ns) {
		fprintf(stderr, "child %s: round trip %" PRIu64 " ns (measured %" PRIu64 ") = queued %"
			PRIu64 " + served %" PRIu64 " + woken %" PRIu64 "; waited at least %" PRIu64
			" ms\n", name, t.round_trip_ns, rt, t.queued_ns, t.served_ns, t.woken_ns, waited_ms);
		return 13;
	}
	return ret == 0 ? 0 : ret == -ENOSPC ? 28 : 11;
}

/* Waits for a child; the parent, a worker too, heartbeats meanwhile. */
static int wait_child_beating(struct kvs *k, pid_t kid)
{
	int st;
	pid_t r;
	while ((r = waitpid(kid, &st, WNOHANG)) == 0) {
		h_sleep_ms(50);
		assert_int_equal(kvs_heartbeat(k), 0);
	}
	assert_int_equal(r, kid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static void test_alloc_waits_for_room(void **state)
{
	(void)state;
	/* heartbeat_timeout_ms=300: the waiter's ALLOC, held three times that, must not be taken
	 * for silence (a worker waiting on kvstored is not silent). */
	static const char *const extra[] = { "--set", "dram_bytes=4M", "--set", "alloc_wait_ms=0",
					     "--set", "heartbeat_timeout_ms=300", NULL };
	struct harness h;
	uint64_t seq;
	harness_start(&h, extra);
	struct kvs *k = h_worker(&h, "holder", &seq);
	assert_non_null(k);
	static uint64_t offs[2][1024];
	uint32_t pages = 0;
	int ret = 0;
	for (; pages < 1024 && !ret; pages += 32)
		for (uint32_t l = 0; l < h_geo.n_layers && !ret; l++)
			ret = kvs_alloc(k, seq, l, pages, 32, &offs[l][pages]);
	assert_int_equal(ret, -ENOSPC);
	pages -= 32;
	assert_true(pages >= 128); /* most of the 512 blocks of DRAM */
	/* (A failed chunk of layer 1 may leave that chunk of layer 0 allocated: it stays so.) */
	Freekv__Reply *r;
	assert_int_equal(kvs_config_set(k, "alloc_wait_ms", "20000", &r), 0);
	kvs_reply_free(r);

	pid_t kid = fork();
	assert_true(kid >= 0);
	if (kid == 0)
		_exit(child_alloc_one(&h, "waiter", 0)); /* its wait: less than 300 ms by its start-up */
	for (int i = 0; i < 10; i++) { /* 1 s; this process heartbeats meanwhile */
		h_sleep_ms(100);
		assert_int_equal(kvs_heartbeat(k), 0);
	}
	assert_int_equal(waitpid(kid, NULL, WNOHANG), 0); /* still waiting for room */
	for (uint32_t p0 = 0; p0 < pages; p0 += 32)
		for (uint32_t l = 0; l < h_geo.n_layers; l++)
			assert_int_equal(kvs_commit(k, seq, (uint64_t)(p0 + 32) * h_geo.page_size,
						    &offs[l][p0], 32), 0);
	assert_int_equal(wait_child_beating(k, kid), 0);

	/* Room again taken by uncommitted blocks of a new sequence: a short wait runs out. */
	uint64_t b;
	assert_int_equal(kvs_open_sequence(k, "filler", h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &b), 0);
	assert_int_equal(kvs_attach(k, b, NULL), 0);
	assert_int_equal(kvs_config_set(k, "alloc_wait_ms", "0", &r), 0);
	kvs_reply_free(r);
	ret = 0;
	for (uint32_t p = 0; p < 4096 && !ret; p++)
		ret = kvs_alloc(k, b, 0, p, 1, &offs[0][0]);
	assert_int_equal(ret, -ENOSPC);
	assert_int_equal(kvs_config_set(k, "alloc_wait_ms", "300", &r), 0);
	kvs_reply_free(r);
	uint64_t t0 = clock_ms();
	kid = fork();
	assert_true(kid >= 0);
	if (kid == 0)
		_exit(child_alloc_one(&h, "late", 290));
	assert_int_equal(wait_child_beating(k, kid), 28);
	assert_true(clock_ms() - t0 >= 300);
	/* What was committed is intact. */
	assert_int_equal(kvs_stats(k, &r), 0);
	assert_int_equal(r->stats->crc_errors, 0);
	kvs_reply_free(r);
	kvs_close(k);
	harness_stop(&h);
}

static void demote_settled(struct kvs *k, uint64_t seq, const char *name, uint64_t blocks)
{
	Freekv__Reply *r;
	assert_int_equal(kvs_demote(k, seq, NULL, &r), 0);
	assert_int_equal(r->evicted->blocks, blocks);
	kvs_reply_free(r);
	/* At once, every block is on NVMe or on its way: one queued behind the tier's request
	 * table or a full tier counts as in flight, not as DRAM (a caller waiting for in_flight
	 * == 0 must not see the demotion half done). */
	assert_int_equal(kvs_show_sequence(k, 0, name, false, &r), 0);
	assert_int_equal(r->sequence->pages->dram, 0);
	assert_int_equal(r->sequence->pages->nvme + r->sequence->pages->in_flight, blocks);
	kvs_reply_free(r);
	/* What the tier's request table, or a full tier, held back follows in later passes. */
	uint64_t t0 = clock_ms();
	for (;;) {
		r = h_settled(k, name);
		assert_non_null(r);
		bool done = r->sequence->pages->nvme == blocks && r->sequence->pages->dram == 0;
		kvs_reply_free(r);
		if (done)
			break;
		assert_true(clock_ms() - t0 < 10000);
		h_sleep_ms(5);
	}
}

/* Every page of every layer reads back as tag, except (0, 1), which holds bytes of tag 99
 * written without a COMMIT, and (1, 2), rewritten as tag 98 and committed again. */
static int read_kept_case(struct kvs *k, uint64_t seq)
{
	uint8_t *base = kvs_pool_base(k);
	for (uint32_t l = 0; l < h_geo.n_layers; l++) {
		uint32_t pages[PAGES];
		uint64_t masks[PAGES], off[PAGES], leases[PAGES];
		for (uint32_t i = 0; i < PAGES; i++) {
			pages[i] = i;
			masks[i] = 3;
		}
		int ret = kvs_recall(k, seq, l, pages, masks, PAGES, off, leases);
		if (ret)
			return ret;
		for (uint32_t i = 0; i < PAGES; i++) {
			uint64_t tag = l == 0 && i == 1 ? 99 : l == 1 && i == 2 ? 98 : 21;
			if (!h_check(base + off[i], H_BLOCK, tag, l, i))
				return -EILSEQ;
		}
		if ((ret = kvs_release(k, leases, PAGES)))
			return ret;
	}
	return 0;
}

/* Kept copies (docs/design.md §4): a block promoted from NVMe and demoted again unchanged goes
 * back to the extent it came from with no write; one whose bytes changed — written without a
 * COMMIT, or committed again — is written afresh. What reads back after the second demotion,
 * and after a kill -9 and a restart from the journal, is exactly what DRAM held. */
static void test_demote_again_unwritten(void **state)
{
	(void)state;
	static const char *const persist_on[] = { "--set", "persist=true", NULL };
	const uint64_t blocks = PAGES * h_geo.n_layers;
	struct harness h;
	uint64_t seq;
	harness_start(&h, persist_on);
	struct kvs *k = h_worker(&h, "kept", &seq);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, seq, 21, 0, PAGES), 0);
	demote_settled(k, seq, "kept", blocks);
	Freekv__Reply *r = h_stats(&h);
	uint64_t demoted0 = r->stats->demoted_blocks, used0 = r->stats->nvme_used_bytes;
	assert_int_equal(r->stats->demoted_unwritten, 0);
	kvs_reply_free(r);

	assert_int_equal(h_read_pages(k, seq, 21, 0, PAGES), 0); /* promotes every block */
	r = h_stats(&h);
	assert_int_equal(r->stats->kept_blocks, blocks);
	assert_int_equal(r->stats->nvme_kept_bytes, blocks * H_BLOCK);
	assert_int_equal(r->stats->nvme_used_bytes, used0); /* the extents stayed */
	kvs_reply_free(r);

	/* (0, 1): new bytes, no COMMIT. (1, 2): new bytes, committed again. */
	uint8_t *base = kvs_pool_base(k);
	uint32_t page = 1;
	uint64_t mask = 3, off, lease;
	assert_int_equal(kvs_recall(k, seq, 0, &page, &mask, 1, &off, &lease), 0);
	h_fill(base + off, H_BLOCK, 99, 0, 1);
	assert_int_equal(kvs_release(k, &lease, 1), 0);
	page = 2;
	assert_int_equal(kvs_recall(k, seq, 1, &page, &mask, 1, &off, &lease), 0);
	h_fill(base + off, H_BLOCK, 98, 1, 2);
	assert_int_equal(kvs_commit(k, seq, (uint64_t)PAGES * h_geo.page_size, &off, 1), 0);
	assert_int_equal(kvs_release(k, &lease, 1), 0);
	r = h_stats(&h);
	assert_int_equal(r->stats->kept_blocks, blocks - 1); /* the COMMIT let its copy go */
	kvs_reply_free(r);

	demote_settled(k, seq, "kept", blocks);
	r = h_stats(&h);
	assert_int_equal(r->stats->demoted_blocks, demoted0 + blocks);
	assert_int_equal(r->stats->demoted_unwritten, blocks - 2);
	assert_int_equal(r->stats->kept_blocks, 0);
	assert_int_equal(r->stats->nvme_kept_bytes, 0);
	assert_int_equal(r->stats->crc_errors, 0);
	kvs_reply_free(r);
	assert_int_equal(read_kept_case(k, seq), 0);

	/* Once more onto the kept copies, then a kill -9: the journal names the extents that hold
	 * each block now, and every byte reads back from them. */
	demote_settled(k, seq, "kept", blocks);
	r = h_stats(&h);
	assert_int_equal(r->stats->demoted_unwritten, 2 * blocks - 2);
	kvs_reply_free(r);
	kvs_close(k);
	h_kill9(&h);
	harness_spawn(&h, persist_on, NULL);
	r = h_stats(&h);
	assert_int_equal(r->stats->blocks_nvme, blocks);
	assert_int_equal(r->stats->journal->ignored_bytes, 0);
	assert_int_equal(r->stats->journal->damaged_sequences, 0);
	kvs_reply_free(r);
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "kept"), 0);
	assert_int_equal(kvs_show_sequence(k, 0, "kept", false, &r), 0);
	seq = r->sequence->seq_id;
	kvs_reply_free(r);
	assert_int_equal(kvs_attach(k, seq, NULL), 0);
	assert_int_equal(read_kept_case(k, seq), 0);
	r = h_stats(&h);
	assert_int_equal(r->stats->crc_errors, 0);
	kvs_reply_free(r);
	kvs_close(k);
	h_finish(&h);
}

/* A Demote of 1,200 blocks that all have kept copies, more than one call takes back (256): the
 * reply counts them all, and every one of them goes back to its kept copy, unwritten, in the
 * passes that follow. (What the bound is for, the rings' latency, is measured by kvload.) */
static void test_unwritten_in_passes(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq;
	harness_start(&h, NULL);
	struct kvs *k = h_worker(&h, "many", &seq);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, seq, 41, 0, 600), 0);
	demote_settled(k, seq, "many", 1200);
	assert_int_equal(h_read_pages(k, seq, 41, 0, 600), 0);
	demote_settled(k, seq, "many", 1200);
	Freekv__Reply *r = h_stats(&h);
	assert_int_equal(r->stats->demoted_unwritten, 1200);
	kvs_reply_free(r);
	assert_int_equal(h_read_pages(k, seq, 41, 0, 600), 0);
	kvs_close(k);
	harness_stop(&h);
}

/* While zeros are written over a new tier file, the free space the piece in flight holds is not
 * reported as used: nvme_used_bytes counts blocks' extents only (an empty tier: 0 throughout). */
static void test_used_excludes_zeros(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "nvme_bytes=256M", NULL };
	struct harness h;
	harness_start(&h, extra);
	unsigned during = 0;
	for (uint64_t t0 = clock_ms(); clock_ms() - t0 < 20000;) {
		Freekv__Reply *r = h_stats(&h);
		uint64_t left = r->stats->nvme_unwritten_bytes, used = r->stats->nvme_used_bytes;
		kvs_reply_free(r);
		assert_int_equal(used, 0);
		if (!left)
			break;
		during++;
	}
	harness_stop(&h);
	if (!during) {
		fprintf(stderr, "skipped: no zeros were written over this tier file (no unwritten "
			"extents or no FIEMAP here)\n");
		skip();
	}
}

/* dram_bytes=4M holds 512 blocks of 8 KiB, nvme_bytes=2M 256. A's 120 blocks are demoted and
 * promoted (120 kept copies); B's 180 then need more extents than are free: kept copies give
 * way, newest first, B's demotion finishes, and every byte of both reads back. */
static void test_kept_copies_give_way(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "persist=true", "--set", "dram_bytes=4M",
					     "--set", "nvme_bytes=2M", NULL };
	struct harness h;
	uint64_t a, b;
	harness_start(&h, extra);
	struct kvs *k = h_worker(&h, "a", &a);
	assert_non_null(k);
	assert_int_equal(h_write_pages(k, a, 31, 0, 60), 0);
	demote_settled(k, a, "a", 120);
	assert_int_equal(h_read_pages(k, a, 31, 0, 60), 0);
	Freekv__Reply *r = h_stats(&h);
	assert_int_equal(r->stats->kept_blocks, 120);
	kvs_reply_free(r);
	assert_int_equal(kvs_open_sequence(k, "b", h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &b), 0);
	assert_int_equal(kvs_attach(k, b, NULL), 0);
	assert_int_equal(h_write_pages(k, b, 32, 0, 90), 0);
	demote_settled(k, b, "b", 180);
	r = h_stats(&h);
	assert_true(r->stats->kept_reclaimed >= 180 - (256 - 120));
	assert_int_equal(r->stats->kept_blocks, 120 - r->stats->kept_reclaimed);
	assert_int_equal(r->stats->nvme_kept_bytes, r->stats->kept_blocks * H_BLOCK);
	assert_int_equal(r->stats->demoted_unwritten, 0);
	kvs_reply_free(r);
	assert_int_equal(h_read_pages(k, a, 31, 0, 60), 0);
	assert_int_equal(h_read_pages(k, b, 32, 0, 90), 0);
	r = h_stats(&h);
	assert_int_equal(r->stats->crc_errors, 0);
	kvs_reply_free(r);
	kvs_close(k);
	h_finish(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_four_clients_demote_recall, h_teardown),
		cmocka_unit_test_teardown(test_pool_full_demotes, h_teardown),
		cmocka_unit_test_teardown(test_pool_and_nvme_full, h_teardown),
		cmocka_unit_test_teardown(test_alloc_waits_for_room, h_teardown),
		cmocka_unit_test_teardown(test_nvme_corruption_detected, h_teardown),
		cmocka_unit_test_teardown(test_demote_more_than_queue, h_teardown),
		cmocka_unit_test_teardown(test_watermarks_detached_first, h_teardown),
		cmocka_unit_test_teardown(test_demote_again_unwritten, h_teardown),
		cmocka_unit_test_teardown(test_kept_copies_give_way, h_teardown),
		cmocka_unit_test_teardown(test_unwritten_in_passes, h_teardown),
		cmocka_unit_test_teardown(test_used_excludes_zeros, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
