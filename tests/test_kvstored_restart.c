/* Integration: kvstored restarts without losing a committed byte (docs/design.md §4 "Restart
 * without loss"), with real daemons and real clients.
 * - kill -9 while a worker is attached, then start again: the sequences come back detached
 *   with their token ids and committed lengths; every committed block reads back identical,
 *   from DRAM (the re-adopted pool segment) and from NVMe (promoted after the restart, its
 *   checksum verified); an uncommitted block is not kept; new sequences get new ids.
 * - SIGTERM and start (a planned restart): the same; `persist = false` starts empty and says so.
 * - The journal truncated at a random byte, or one byte of it flipped: start succeeds, the
 *   damage is reported (ignored bytes), and whatever is served is byte-exact: a sequence is
 *   either absent or its committed pages read back right.
 * - A committed DRAM block flipped in the pool while the daemon is down: its sequence is marked
 *   damaged (kvctl shows it), its committed length cut to that page, the page never served.
 * - Compaction by snapshot past journal_compact_bytes; a restart from the snapshot keeps all,
 *   also when sequences opened, grew, moved and closed between the steps of its snapshot; a
 *   compaction that cannot start is logged and put off, and loses nothing.
 * - Control replies committed in groups: a batch of CommitTokens waiting together costs one
 *   journal sync, and its ids survive a kill -9. */
#include "clock.h"
#include "test_kvstored_harness.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <unistd.h>

#define PAGES 6
#define NVME_PAGES 4

static const char *const persist_on[] = { "--set", "persist=true", NULL };
/* A journal compacted as soon as it passes 4 KiB (and twice its last snapshot). */
static const char *const small[] = { "--set", "persist=true", "--set",
				     "journal_compact_bytes=4096", NULL };

static void journal_of(const struct harness *h, char *path, size_t len)
{
	snprintf(path, len, "%s.journal", h->nvme);
}

static uint32_t tok(uint64_t tag, size_t i)
{
	return (uint32_t)(tag * 7919u + i * 31u) % 50000u;
}

/* Sequence `name` with PAGES committed pages of tag `tag` and their token ids; with demote, its
 * blocks are demoted to NVMe afterwards. Leaves one more page allocated, written, uncommitted. */
static void fill_seq(const struct harness *h, struct kvs *k, const char *name, uint64_t tag,
		     uint32_t pages, bool demote)
{
	uint64_t seq;
	(void)h;
	assert_int_equal(kvs_open_sequence(k, name, h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &seq),
			 0);
	assert_int_equal(kvs_attach(k, seq, NULL), 0);
	assert_int_equal(h_write_pages(k, seq, tag, 0, pages), 0);
	uint32_t n = pages * h_geo.page_size;
	uint32_t *ids = malloc(n * sizeof *ids);
	for (uint32_t i = 0; i < n; i++)
		ids[i] = tok(tag, i);
	assert_int_equal(kvs_commit_tokens(k, seq, n, 0, ids, n), 0);
	free(ids);
	uint64_t off;
	assert_int_equal(kvs_alloc(k, seq, 0, pages, 1, &off), 0);
	h_fill((uint8_t *)kvs_pool_base(k) + off, H_BLOCK, tag, 0, pages);
	if (demote) {
		Freekv__Reply *r;
		assert_int_equal(kvs_demote(k, seq, NULL, &r), 0);
		kvs_reply_free(r);
		r = h_settled(k, name);
		assert_non_null(r);
		assert_int_equal(r->sequence->pages->nvme, pages * h_geo.n_layers);
		kvs_reply_free(r);
	}
}

/* Checks sequence `name` after a restart: detached, `pages` committed pages that read back as
 * tag (RECALL, promoting from NVMe where needed), the ids kept, no page past them. */
static void check_seq(const struct harness *h, const char *name, uint64_t tag, uint32_t pages)
{
	struct kvs *k;
	uint64_t seq;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h->endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "check"), 0);
	assert_int_equal(kvs_show_sequence(k, 0, name, true, &r), 0);
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
	assert_int_equal(r->sequence->committed_tokens, pages * h_geo.page_size);
	assert_false(r->sequence->has_damaged_blocks);
	assert_int_equal(r->sequence->n_token_ids, pages * h_geo.page_size);
	for (size_t i = 0; i < r->sequence->n_token_ids; i++)
		assert_int_equal(r->sequence->token_ids[i], tok(tag, i));
	seq = r->sequence->seq_id;
	kvs_reply_free(r);
	assert_int_equal(kvs_attach(k, seq, NULL), 0);
	assert_int_equal(h_read_pages(k, seq, tag, 0, pages), 0);
	/* The uncommitted page was not kept: allocating it again works. */
	uint64_t off;
	assert_int_equal(kvs_alloc(k, seq, 0, pages, 1, &off), 0);
	kvs_close(k);
}

static void restart_case(bool kill9)
{
	struct harness h;
	harness_start(&h, persist_on);
	uint64_t first_ids[3];
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "writer"), 0);
	fill_seq(&h, k, "dram", 1, PAGES, false);
	fill_seq(&h, k, "nvme", 2, NVME_PAGES, true);
	fill_seq(&h, k, "dram2", 3, 1, false);
	Freekv__Reply *r;
	assert_int_equal(kvs_list_sequences(k, &r), 0);
	assert_int_equal(r->sequences->n_sequences, 3);
	for (int i = 0; i < 3; i++)
		first_ids[i] = r->sequences->sequences[i]->seq_id;
	kvs_reply_free(r);

	if (kill9) {
		h_kill9(&h); /* with the worker still attached */
	} else {
		h_term(&h);
		assert_true(shm_exists(h.shm)); /* kept for the next daemon */
	}
	kvs_close(k);
	harness_spawn(&h, persist_on, NULL);

	r = h_stats(&h);
	assert_non_null(r->stats->journal);
	assert_true(r->stats->journal->replayed > 0);
	assert_int_equal(r->stats->journal->adopted_sequences, 3);
	assert_int_equal(r->stats->journal->adopted_blocks, (PAGES + NVME_PAGES + 1) * h_geo.n_layers);
	assert_int_equal(r->stats->journal->damaged_sequences, 0);
	assert_int_equal(r->stats->journal->ignored_bytes, 0);
	assert_int_equal(r->stats->blocks_nvme, NVME_PAGES * h_geo.n_layers);
	kvs_reply_free(r);

	check_seq(&h, "dram", 1, PAGES);
	check_seq(&h, "nvme", 2, NVME_PAGES);
	check_seq(&h, "dram2", 3, 1);
	r = h_stats(&h);
	assert_true(r->stats->promoted_blocks >= NVME_PAGES * h_geo.n_layers);
	assert_int_equal(r->stats->crc_errors, 0);
	kvs_reply_free(r);

	/* A new sequence gets an id none of the restored ones has. */
	uint64_t seq;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_open_sequence(k, "new", h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &seq),
			 0);
	for (int i = 0; i < 3; i++)
		assert_true(seq != first_ids[i]);
	kvs_close(k);

	/* And a second restart keeps what the first adopted. */
	h_kill9(&h);
	harness_spawn(&h, persist_on, NULL);
	check_seq(&h, "dram", 1, PAGES);
	h_finish(&h);
}

static void test_kill9_restart(void **state)
{
	(void)state;
	restart_case(true);
}

static void test_sigterm_restart(void **state)
{
	(void)state;
	restart_case(false);
}

/* persist = false: a restart starts empty and the pool goes at a stop, as before. */
static void test_persist_off(void **state)
{
	(void)state;
	static const char *const off[] = { "--set", "persist=false", NULL };
	struct harness h;
	harness_start(&h, off);
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "w"), 0);
	fill_seq(&h, k, "gone", 4, 2, false);
	kvs_close(k);
	Freekv__Reply *r = h_stats(&h);
	assert_null(r->stats->journal);
	kvs_reply_free(r);
	h_kill9(&h);
	harness_spawn(&h, off, NULL);
	r = h_stats(&h);
	assert_int_equal(r->stats->sequences, 0);
	kvs_reply_free(r);
	harness_stop(&h);
}

/* Past the journal's last byte that is not zero. */
static off_t nonzero_end(const char *jp)
{
	FILE *f = fopen(jp, "rb");
	assert_non_null(f);
	off_t end = 0, at = 0;
	int c;
	while ((c = getc(f)) != EOF) {
		at++;
		if (c)
			end = at;
	}
	fclose(f);
	return end;
}

/* Where the journal's records end: its 16-byte header, then records of a 12-byte header (payload
 * length first) and the payload, walked up to the zeros the daemon writes ahead of them. */
static off_t records_end(const char *jp)
{
	FILE *f = fopen(jp, "rb");
	assert_non_null(f);
	off_t end = 16;
	uint8_t h[12];
	while (fseeko(f, end, SEEK_SET) == 0 && fread(h, 1, sizeof h, f) == sizeof h) {
		static const uint8_t zero[12];
		if (!memcmp(h, zero, sizeof h))
			break;
		uint32_t len;
		memcpy(&len, h, 4);
		end += 12 + (off_t)len;
	}
	fclose(f);
	return end;
}

/* Writes sequences s0..s(n-1) into a fresh persistent daemon, kills it and returns where the
 * journal's snapshot (written at start) ends, and where its records end. */
static void workload(struct harness *h, int n, off_t *snap, off_t *total)
{
	char jp[256];
	harness_start(h, persist_on);
	journal_of(h, jp, sizeof jp);
	*snap = records_end(jp);
	struct kvs *k;
	assert_int_equal(kvs_connect(h->endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "w"), 0);
	for (int i = 0; i < n; i++) {
		char name[16];
		snprintf(name, sizeof name, "s%d", i);
		fill_seq(h, k, name, 10 + (uint64_t)i, 2 + (uint32_t)i % 3, i % 2 == 1);
	}
	h_kill9(h);
	kvs_close(k);
	*total = records_end(jp);
	assert_true(*total > *snap);
}

/* After damage: every sequence still listed reads back exactly what was written for it, up to
 * its committed length; nothing past it is served. */
static void check_served(const struct harness *h, int n)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(h->endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "check"), 0);
	assert_int_equal(kvs_list_sequences(k, &r), 0);
	for (size_t i = 0; i < r->sequences->n_sequences; i++) {
		const Freekv__SequenceInfo *si = r->sequences->sequences[i];
		int idx;
		assert_int_equal(sscanf(si->name, "s%d", &idx), 1);
		assert_true(idx >= 0 && idx < n);
		uint32_t pages = (uint32_t)(si->committed_tokens / h_geo.page_size);
		assert_true(pages <= 2 + (uint32_t)idx % 3);
		assert_int_equal(kvs_attach(k, si->seq_id, NULL), 0);
		assert_int_equal(h_read_pages(k, si->seq_id, 10 + (uint64_t)idx, 0, pages), 0);
		uint32_t page = pages;
		uint64_t mask = 3, off, lease;
		assert_int_not_equal(kvs_recall(k, si->seq_id, 0, &page, &mask, 1, &off, &lease), 0);
		assert_int_equal(kvs_detach(k, si->seq_id), 0);
	}
	kvs_reply_free(r);
	kvs_close(k);
}

static void test_journal_truncated(void **state)
{
	(void)state;
	uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
	struct harness h;
	off_t snap, total;
	workload(&h, 6, &snap, &total);
	char jp[256];
	journal_of(&h, jp, sizeof jp);
	off_t cut = snap + (off_t)(test_rand(&seed) % (uint64_t)(total - snap));
	fprintf(stderr, "journal of %lld bytes cut at %lld (seed %" PRIu64 ")\n", (long long)total,
		(long long)cut, seed);
	assert_int_equal(truncate(jp, cut), 0);
	harness_spawn(&h, persist_on, NULL);
	Freekv__Reply *r = h_stats(&h);
	/* A cut exactly between two records leaves a shorter, valid journal. */
	fprintf(stderr, "replayed %" PRIu64 " records, %" PRIu64 " bytes ignored\n",
		r->stats->journal->replayed, r->stats->journal->ignored_bytes);
	assert_true(r->stats->journal->replayed > 0);
	kvs_reply_free(r);
	check_served(&h, 6);
	h_finish(&h);
}

static void test_journal_byte_flipped(void **state)
{
	(void)state;
	uint64_t seed = (uint64_t)time(NULL) * 31u ^ (uint64_t)getpid();
	struct harness h;
	off_t snap, total;
	workload(&h, 6, &snap, &total);
	char jp[256];
	journal_of(&h, jp, sizeof jp);
	off_t at = snap + (off_t)(test_rand(&seed) % (uint64_t)(total - snap));
	int fd = open(jp, O_RDWR);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, at), 1);
	b ^= (uint8_t)(1u << (test_rand(&seed) % 8));
	assert_int_equal(pwrite(fd, &b, 1, at), 1);
	close(fd);
	fprintf(stderr, "journal of %lld bytes: byte %lld flipped (seed %" PRIu64 ")\n",
		(long long)total, (long long)at, seed);
	off_t data_end = nonzero_end(jp);
	harness_spawn(&h, persist_on, NULL);
	Freekv__Reply *r = h_stats(&h);
	/* The flipped record and everything after it are ignored, and said so: up to the last
	 * byte that is not zero, since zeros that end the file (the last record's own among them)
	 * read as those written ahead of the records. */
	assert_true(r->stats->journal->ignored_bytes > 0);
	assert_true(r->stats->journal->ignored_bytes >= (uint64_t)(data_end - at));
	assert_true(r->stats->journal->ignored_bytes <= (uint64_t)(total - snap));
	kvs_reply_free(r);
	char aside[300];
	snprintf(aside, sizeof aside, "%s.damaged", jp);
	assert_int_equal(access(aside, F_OK), 0);
	check_served(&h, 6);
	h_finish(&h);
}

/* A committed block changed in the pool while no daemon ran: never served. */
static void test_block_damaged(void **state)
{
	(void)state;
	struct harness h;
	harness_start(&h, persist_on);
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "w"), 0);
	fill_seq(&h, k, "victim", 5, PAGES, false);
	/* Where page 3 of layer 1 sits. */
	Freekv__Reply *r;
	assert_int_equal(kvs_show_sequence(k, 0, "victim", false, &r), 0);
	uint64_t seq = r->sequence->seq_id;
	kvs_reply_free(r);
	uint32_t page = 3;
	uint64_t mask = 3, off, lease;
	assert_int_equal(kvs_recall(k, seq, 1, &page, &mask, 1, &off, &lease), 0);
	uint8_t *blk = (uint8_t *)kvs_pool_base(k) + off;
	h_kill9(&h);
	blk[100] ^= 0x40; /* a committed row of that block */
	kvs_close(k);

	harness_spawn(&h, persist_on, NULL);
	r = h_stats(&h);
	assert_int_equal(r->stats->journal->damaged_sequences, 1);
	kvs_reply_free(r);
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "w"), 0);
	assert_int_equal(kvs_show_sequence(k, 0, "victim", true, &r), 0);
	assert_true(r->sequence->has_damaged_blocks);
	assert_true(r->sequence->damaged_blocks >= 1);
	assert_int_equal(r->sequence->damaged_cut_from, PAGES * h_geo.page_size);
	assert_int_equal(r->sequence->committed_tokens, 3 * h_geo.page_size);
	/* The ids stay, so a resume can run the lost tokens again. */
	assert_int_equal(r->sequence->n_token_ids, PAGES * h_geo.page_size);
	kvs_reply_free(r);
	assert_int_equal(kvs_attach(k, seq, NULL), 0);
	assert_int_equal(h_read_pages(k, seq, 5, 0, 3), 0);
	assert_int_not_equal(kvs_recall(k, seq, 1, &page, &mask, 1, &off, &lease), 0);
	kvs_close(k);

	/* kvctl shows it. */
	char cmd[512], out[4096] = "";
	snprintf(cmd, sizeof cmd, "%s/ctl/kvctl --endpoint %s show victim 2>&1", FREEKV_BUILD_DIR,
		 h.endpoint);
	FILE *f = popen(cmd, "r");
	assert_non_null(f);
	size_t n = fread(out, 1, sizeof out - 1, f);
	out[n] = '\0';
	pclose(f);
	fprintf(stderr, "%s", out);
	assert_non_null(strstr(out, "damaged"));
	h_finish(&h);
}

/* The journal is compacted by snapshot once it passes journal_compact_bytes; a restart from
 * the compacted journal keeps everything. */
static void test_compaction(void **state)
{
	(void)state;
	struct harness h;
	harness_start(&h, small);
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "w"), 0);
	fill_seq(&h, k, "c1", 21, PAGES, false);
	fill_seq(&h, k, "c2", 22, NVME_PAGES, true);
	for (int i = 0; i < 8; i++) { /* enough records to pass 4 KiB */
		char name[16];
		snprintf(name, sizeof name, "x%d", i);
		fill_seq(&h, k, name, 30 + (uint64_t)i, 3, false);
	}
	kvs_close(k);
	/* The control loop checks once a second. */
	uint64_t t0 = clock_ms(), compactions = 0;
	while (clock_ms() - t0 < 5000 && compactions < 2) {
		Freekv__Reply *r = h_stats(&h);
		compactions = r->stats->journal->compactions;
		kvs_reply_free(r);
		h_sleep_ms(100);
	}
	assert_true(compactions >= 2); /* the start's, and one for size */
	h_kill9(&h);
	harness_spawn(&h, small, NULL);
	check_seq(&h, "c1", 21, PAGES);
	check_seq(&h, "c2", 22, NVME_PAGES);
	h_finish(&h);
}

/* One sequence of the traffic test, as the test expects it to come back. */
struct tseq {
	char name[16];
	uint64_t id, tag;
	uint32_t pages;
	bool live;
};

/* One more committed page of t (every layer) and its token ids. Returns 0 or what failed (no
 * cmocka assertion: the traffic clients run on threads of their own). */
static int t_grow(struct kvs *k, struct tseq *t)
{
	int ret = h_write_pages(k, t->id, t->tag, t->pages, 1);
	if (ret)
		return ret;
	uint32_t ids[64], ps = h_geo.page_size;
	if (ps > 64)
		return -E2BIG;
	for (uint32_t i = 0; i < ps; i++)
		ids[i] = tok(t->tag, t->pages * ps + i);
	ret = kvs_commit_tokens(k, t->id, (uint64_t)(t->pages + 1) * ps, (uint64_t)t->pages * ps,
				ids, ps);
	if (!ret)
		t->pages++;
	return ret;
}

static int t_open(struct kvs *k, struct tseq *t, const char *prefix, int i, uint64_t tag)
{
	snprintf(t->name, sizeof t->name, "%s%d", prefix, i);
	t->tag = tag;
	t->pages = 0;
	t->live = false;
	int ret = kvs_open_sequence(k, t->name, h_fp, sizeof h_fp, &h_geo, NULL, 0, true, &t->id);
	if (!ret)
		ret = kvs_attach(k, t->id, NULL);
	t->live = ret == 0;
	return ret ? ret : t_grow(k, t);
}

static uint64_t compactions_of(const struct harness *h)
{
	Freekv__Reply *r = h_stats(h);
	uint64_t n = r->stats->journal->compactions;
	kvs_reply_free(r);
	return n;
}

/* One client of the traffic test: its own connection and its own sequences, t[0..n). */
enum { TRAFFIC_CLIENTS = 4, TRAFFIC_SEQS = 100 };	/* at most 3,200 of the 8,192 blocks */
struct traffic {
	const struct harness *h;
	int who;
	struct tseq t[TRAFFIC_SEQS];
	size_t n;
	atomic_bool *stop;
	int rounds, err, line;
};

static void *traffic_main(void *arg)
{
	struct traffic *c = arg;
	struct kvs *k;
	char prefix[8];
	snprintf(prefix, sizeof prefix, "c%d-", c->who);
	c->err = kvs_connect(c->h->endpoint, 5000, &k);
	if (c->err)
		return NULL;
	c->err = kvs_hello(k, KVS_ROLE_WORKER, "traffic");
	for (c->n = 0; !c->err && c->n < TRAFFIC_SEQS / 2; c->n++)
		c->err = t_open(k, &c->t[c->n], prefix, (int)c->n, (uint64_t)c->who * 100000 + c->n);
	for (int r = 0; !c->err && !atomic_load(c->stop); r++, c->rounds++) {
		if (c->n < TRAFFIC_SEQS && r % 2 == 0) {
			c->err = t_open(k, &c->t[c->n], prefix, (int)c->n,
					(uint64_t)c->who * 100000 + c->n);
			c->n++;
		}
		struct tseq *g = &c->t[(size_t)(r * 7) % c->n], *x = &c->t[(size_t)(r * 31 + 11) % c->n];
		struct tseq *d = &c->t[(size_t)(r * 13 + 5) % c->n];
		if (!c->err && g->live && g->pages < 4)
			c->err = t_grow(k, g);
		if (!c->err && d->live) { /* its blocks move to NVMe, each journaled as it lands */
			Freekv__Reply *rep;
			c->err = kvs_demote(k, d->id, NULL, &rep);
			if (!c->err)
				kvs_reply_free(rep);
		}
		if (!c->err && x->live && r % 4 == 1) {
			c->err = kvs_close_sequence(k, x->id, true);
			x->live = c->err != 0;
		}
		c->line = c->err ? r : c->line;
	}
	kvs_close(k);
	return NULL;
}

/* The journal compacted in steps while four clients open sequences, grow them, move them to
 * NVMe and close them between the steps (one sequence per step, so every compaction spans many
 * of them): after a kill -9 the compacted journal gives back exactly the sequences that were
 * open, with every page and token id. */
static void test_compaction_under_traffic(void **state)
{
	(void)state;
	static const char *const stepped[] = { "--set", "persist=true", "--set",
					       "journal_compact_bytes=4096", "--set",
					       "journal_compact_step=1", NULL };
	static struct traffic c[TRAFFIC_CLIENTS];
	struct harness h;
	harness_start(&h, stepped);
	atomic_bool stop = false;
	pthread_t th[TRAFFIC_CLIENTS];
	for (int i = 0; i < TRAFFIC_CLIENTS; i++) {
		c[i] = (struct traffic){ .h = &h, .who = i, .stop = &stop };
		assert_int_equal(pthread_create(&th[i], NULL, traffic_main, &c[i]), 0);
	}
	h_sleep_ms(300);
	uint64_t c0 = compactions_of(&h), c1 = c0;
	for (int i = 0; i < 1200 && c1 < c0 + 3; i++) { /* 60 s at most: slower on a busy machine */
		h_sleep_ms(50);
		c1 = compactions_of(&h);
	}
	atomic_store(&stop, true);
	for (int i = 0; i < TRAFFIC_CLIENTS; i++) {
		pthread_join(th[i], NULL);
		if (c[i].err)
			fprintf(stderr, "client %d: %s in round %d\n", i, strerror(-c[i].err),
				c[i].line);
		assert_int_equal(c[i].err, 0);
	}
	fprintf(stderr, "%" PRIu64 " compactions under traffic\n", c1 - c0);
	assert_true(c1 >= c0 + 2);
	h_kill9(&h);
	harness_spawn(&h, stepped, NULL);
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "check"), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_list_sequences(k, &r), 0);
	size_t live = 0;
	for (int i = 0; i < TRAFFIC_CLIENTS; i++)
		for (size_t j = 0; j < c[i].n; j++)
			live += c[i].t[j].live;
	assert_int_equal(r->sequences->n_sequences, live);
	kvs_reply_free(r);
	for (int i = 0; i < TRAFFIC_CLIENTS; i++) {
		for (size_t j = 0; j < c[i].n; j++) {
			const struct tseq *t = &c[i].t[j];
			if (!t->live) {
				assert_int_not_equal(kvs_show_sequence(k, 0, t->name, false, &r), 0);
				continue;
			}
			check_seq(&h, t->name, t->tag, t->pages);
		}
	}
	kvs_close(k);
	h_finish(&h);
}

/* A compaction that cannot even start (its .tmp path is a directory here; a full disk does the
 * same) is logged and put off (tried again after 10 s): the daemon goes on serving, the journal
 * goes on growing, and nothing is lost at a kill -9. */
static void test_compaction_fails(void **state)
{
	(void)state;
	struct harness h;
	harness_start(&h, small);
	char jpath[PATH_MAX], tmp[PATH_MAX + 8];
	journal_of(&h, jpath, sizeof jpath);
	snprintf(tmp, sizeof tmp, "%s.tmp", jpath);
	uint64_t c0 = compactions_of(&h);
	assert_int_equal(mkdir(tmp, 0700), 0);
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "w"), 0);
	struct tseq t[12];
	for (int i = 0; i < 12; i++) /* past journal_compact_bytes */
		assert_int_equal(t_open(k, &t[i], "f", i, 700 + (uint64_t)i), 0);
	h_sleep_ms(300);
	Freekv__Reply *r = h_stats(&h);
	assert_int_equal(r->stats->journal->compactions, c0);
	assert_true(r->stats->journal->bytes >= 4096); /* past the limit, yet not compacted */
	kvs_reply_free(r);
	assert_true(harness_alive(&h));
	assert_int_equal(rmdir(tmp), 0);
	h_kill9(&h);
	kvs_close(k);
	harness_spawn(&h, small, NULL);
	for (int i = 0; i < 12; i++)
		check_seq(&h, t[i].name, t[i].tag, t[i].pages);
	h_finish(&h);
}

static void *cont_later(void *arg)
{
	const struct harness *h = arg;
	usleep(200 * 1000);
	kill(h->pid, SIGCONT);
	return NULL;
}

/* Group commit of control replies: eight sequences' CommitTokens sent together while the daemon
 * is stopped (SIGSTOP), so that all eight wait in its queue when it goes on, are answered after
 * one journal sync (two at most, should the socket hand them over in two reads; one each
 * before), and every id is still there after a kill -9 and a restart. */
static void test_group_commit(void **state)
{
	(void)state;
	enum { NS = 8 };
	struct harness h;
	harness_start(&h, persist_on);
	struct kvs *k;
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "batch"), 0);
	uint64_t seq[NS];
	uint32_t ids[NS][2];
	struct kvs_commit c[NS];
	for (int i = 0; i < NS; i++) {
		char name[16];
		snprintf(name, sizeof name, "g%d", i);
		assert_int_equal(kvs_open_sequence(k, name, h_fp, sizeof h_fp, &h_geo, NULL, 0, true,
						   &seq[i]), 0);
		assert_int_equal(kvs_attach(k, seq[i], NULL), 0);
		ids[i][0] = 100u + (uint32_t)i;
		ids[i][1] = 200u + (uint32_t)i;
		c[i] = (struct kvs_commit){ .seq_id = seq[i], .first = 0, .tokens = ids[i], .n = 2 };
	}
	Freekv__Reply *r = h_stats(&h);
	const uint64_t syncs0 = r->stats->journal->syncs;
	kvs_reply_free(r);
	pthread_t t;
	assert_int_equal(kill(h.pid, SIGSTOP), 0);
	assert_int_equal(pthread_create(&t, NULL, cont_later, &h), 0);
	int rets[NS];
	int ret = kvs_commit_tokens_many(k, c, NS, rets);
	pthread_join(t, NULL);
	if (ret)
		fail_msg("commit: %s", kvs_error(k));
	for (int i = 0; i < NS; i++)
		assert_int_equal(rets[i], 0);
	r = h_stats(&h);
	const uint64_t syncs = r->stats->journal->syncs - syncs0;
	kvs_reply_free(r);
	if (syncs < 1 || syncs > 2)
		fail_msg("%d CommitTokens took %" PRIu64 " journal syncs", NS, syncs);
	h_kill9(&h);
	kvs_close(k);
	harness_spawn(&h, persist_on, NULL);
	assert_int_equal(kvs_connect(h.endpoint, 5000, &k), 0);
	for (int i = 0; i < NS; i++) {
		assert_int_equal(kvs_show_sequence(k, seq[i], NULL, true, &r), 0);
		assert_int_equal(r->sequence->n_token_ids, 2);
		assert_int_equal(r->sequence->token_ids[0], ids[i][0]);
		assert_int_equal(r->sequence->token_ids[1], ids[i][1]);
		kvs_reply_free(r);
	}
	kvs_close(k);
	h_finish(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_kill9_restart, h_teardown),
		cmocka_unit_test_teardown(test_sigterm_restart, h_teardown),
		cmocka_unit_test_teardown(test_persist_off, h_teardown),
		cmocka_unit_test_teardown(test_journal_truncated, h_teardown),
		cmocka_unit_test_teardown(test_journal_byte_flipped, h_teardown),
		cmocka_unit_test_teardown(test_block_damaged, h_teardown),
		cmocka_unit_test_teardown(test_compaction, h_teardown),
		cmocka_unit_test_teardown(test_compaction_under_traffic, h_teardown),
		cmocka_unit_test_teardown(test_compaction_fails, h_teardown),
		cmocka_unit_test_teardown(test_group_commit, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
