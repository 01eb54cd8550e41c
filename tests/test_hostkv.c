/* hostkv (worker/hostkv/hostkv.c) against both stores: the embedded in-process store and a real
 * kvstored process (temporary shm, ipc endpoint and NVMe file). Blocks are written through
 * hostkv_block, committed with token ids, the sequence closed and reopened (from another
 * connection for kvstored), and every byte read back; wrong fingerprints, geometries, id gaps
 * and disagreeing ids are refused; the heartbeat thread keeps an idle worker alive; stats
 * reported with hostkv_report_stats show up in ListWorkers. With a lease budget (kvstored):
 * the evictable leases stay within the budget after every call, a pinned block and the tail
 * and uncommitted blocks are never released (a Demote request moves exactly the others to
 * NVMe), released blocks come back through a pin with their bytes (promoted), two threads
 * pinning at once agree, and the daemon's lease count equals the worker's; hostkv_pin_many
 * pins a mix of pages with one RECALL entry per 32 released ones, all or nothing. */
#include "test_kvstored_harness.h"

#include <pthread.h>

#include "hostkv.h"

/* 3 layers, 2 KV heads, page 4, d 8, f16: 256-byte blocks (the NVMe tier moves them in whole
 * 4 KiB units, checksumming the 256 bytes). */
static const struct kv_geom t_geo = { .n_kv = 2, .p = 4, .d = 8, .dtype = FKV_F16 };
#define T_LAYERS 3
#define T_PAGES 21 /* past one allocation-ahead batch */
static uint8_t t_fp[FKV_FINGERPRINT_BYTES] = { 0x5e, 0x9a, 0x11 };

static struct hostkv *t_open_budget(const char *endpoint, uint32_t budget)
{
	struct hostkv_opts o = { .endpoint = endpoint, .worker_name = "test_hostkv",
				 .embedded_bytes = 8u << 20, .timeout_ms = 5000,
				 .lease_budget = budget };
	struct hostkv *h = NULL;
	char err[256];
	int ret = hostkv_open(&o, &h, err, sizeof err);
	if (ret)
		fprintf(stderr, "hostkv_open: %s\n", err);
	assert_int_equal(ret, 0);
	assert_int_equal(hostkv_is_remote(h), endpoint != NULL);
	return h;
}

static struct hostkv *t_open(const char *endpoint)
{
	return t_open_budget(endpoint, 0);
}

static struct hostkv_seq *t_seq(struct hostkv *h, const char *name, bool create)
{
	struct hostkv_seq *s = NULL;
	char err[256];
	int ret = hostkv_seq_open(h, name, t_fp, T_LAYERS, &t_geo, create, &s, err, sizeof err);
	if (ret)
		fprintf(stderr, "hostkv_seq_open: %s\n", err);
	assert_int_equal(ret, 0);
	return s;
}

/* Writes every block of pages [0, T_PAGES), then commits n tokens in two steps with ids. */
static void t_write(struct hostkv_seq *s, uint64_t tag, int64_t n)
{
	size_t bb = layout_block_bytes(&t_geo);
	char err[256];
	for (int p = 0; p < T_PAGES; p++)
		for (int l = 0; l < T_LAYERS; l++) {
			void *b = NULL;
			assert_int_equal(hostkv_block(s, l, p, &b, err, sizeof err), 0);
			h_fill(b, bb, tag, (uint32_t)l, (uint32_t)p);
		}
	int32_t ids[T_PAGES * 4];
	for (int i = 0; i < T_PAGES * 4; i++)
		ids[i] = (int32_t)(tag * 7 + (uint64_t)i) % 500;
	assert_int_equal(hostkv_commit(s, 10, ids, 0, 11, err, sizeof err), 0); /* one ahead */
	assert_int_equal(hostkv_seq_committed(s), 10);
	/* Ids already kept are accepted again; the rest are appended. */
	assert_int_equal(hostkv_commit(s, n, ids + 10, 10, n - 10, err, sizeof err), 0);
	assert_int_equal(hostkv_seq_committed(s), n);
	const int32_t *kept;
	assert_int_equal(hostkv_seq_tokens(s, &kept), n);
	assert_memory_equal(kept, ids, (size_t)n * sizeof *ids);
}

/* Reads back the committed pages and the ids. */
static void t_check(struct hostkv_seq *s, uint64_t tag, int64_t n)
{
	size_t bb = layout_block_bytes(&t_geo);
	char err[256];
	assert_int_equal(hostkv_seq_committed(s), n);
	const int32_t *kept;
	assert_int_equal(hostkv_seq_tokens(s, &kept), n);
	for (int i = 0; i < n; i++)
		assert_int_equal(kept[i], (int32_t)(tag * 7 + (uint64_t)i) % 500);
	int pages = (int)((n + t_geo.p - 1) / t_geo.p);
	for (int p = 0; p < pages; p++)
		for (int l = 0; l < T_LAYERS; l++) {
			const void *b = NULL;
			assert_int_equal(hostkv_block_ro_pin(s, l, p, &b, err, sizeof err), 0);
			assert_true(h_check(b, bb, tag, (uint32_t)l, (uint32_t)p));
			assert_int_equal(hostkv_unpin(s, l, p, err, sizeof err), 0);
		}
	const void *b;
	assert_int_equal(hostkv_block_ro_pin(s, 0, pages + 40, &b, err, sizeof err), -ENOENT);
	assert_int_equal(hostkv_block_ro_pin(s, T_LAYERS, 0, &b, err, sizeof err), -EINVAL);
	assert_int_equal(hostkv_unpin(s, 0, 0, err, sizeof err), -EINVAL);
}

/* Refusals that must leave the sequence as it was. */
static void t_refusals(struct hostkv *h, struct hostkv_seq *s, const char *name)
{
	char err[256];
	int64_t n = hostkv_seq_committed(s);
	int32_t ids[4] = { 1, 2, 3, 4 };
	/* A gap after the kept ids; an id disagreeing with a kept one; going backwards;
	 * committing tokens whose ids were never given. */
	assert_int_equal(hostkv_commit(s, n, ids, n + 2, 1, err, sizeof err), -EINVAL);
	const int32_t *kept;
	hostkv_seq_tokens(s, &kept);
	int32_t wrong = kept[0] + 1;
	assert_int_equal(hostkv_commit(s, n, &wrong, 0, 1, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "disagrees"));
	assert_int_equal(hostkv_commit(s, n - 1, NULL, 0, 0, err, sizeof err), -EINVAL);
	assert_int_equal(hostkv_commit(s, n + 3, NULL, 0, 0, err, sizeof err), -EINVAL);
	assert_int_equal(hostkv_seq_committed(s), n);
	/* Another model's fingerprint, another geometry. */
	uint8_t fp2[FKV_FINGERPRINT_BYTES] = { 0x01 };
	struct hostkv_seq *o = NULL;
	assert_int_not_equal(hostkv_seq_open(h, name, fp2, T_LAYERS, &t_geo, true, &o, err,
					     sizeof err), 0);
	assert_null(o);
	struct kv_geom g2 = t_geo;
	g2.p = 8;
	assert_int_not_equal(hostkv_seq_open(h, name, t_fp, T_LAYERS, &g2, true, &o, err,
					     sizeof err), 0);
	assert_int_not_equal(hostkv_seq_open(h, name, t_fp, T_LAYERS + 1, &t_geo, true, &o, err,
					     sizeof err), 0);
	assert_int_not_equal(hostkv_seq_open(h, "absent", t_fp, T_LAYERS, &t_geo, false, &o, err,
					     sizeof err), 0);
	assert_null(o);
}

static void test_embedded(void **state)
{
	(void)state;
	struct hostkv *h = t_open(NULL);
	struct hostkv_seq *s = t_seq(h, "emb", true);
	assert_int_equal(hostkv_seq_committed(s), 0);
	t_write(s, 1, 70);
	t_check(s, 1, 70);
	/* Lease-all: every allocated block (pages 0..31: allocated ahead) stays leased. */
	struct hostkv_lease_stats st;
	hostkv_seq_lease_stats(s, &st);
	assert_int_equal(st.budget, 0);
	assert_int_equal(st.held, (uint64_t)T_LAYERS * 32);
	assert_int_equal(st.releases + st.recalls + st.pinned, 0);
	t_refusals(h, s, "emb");
	/* Two sequences never share a block. */
	struct hostkv_seq *s2 = t_seq(h, "emb2", true);
	t_write(s2, 2, 33);
	t_check(s, 1, 70);
	t_check(s2, 2, 33);
	assert_int_equal(hostkv_seq_close(s, false), 0);
	/* Reopened: committed blocks and ids are kept; the blocks allocated ahead past the
	 * committed pages were freed on close and are allocated again on demand. */
	s = t_seq(h, "emb", false);
	t_check(s, 1, 70);
	void *b;
	char err[256];
	assert_int_equal(hostkv_block(s, 1, 40, &b, err, sizeof err), 0);
	assert_int_equal(hostkv_seq_close(s, true), 0); /* dropped */
	struct hostkv_seq *o = NULL;
	assert_int_not_equal(hostkv_seq_open(h, "emb", t_fp, T_LAYERS, &t_geo, false, &o, err,
					     sizeof err), 0);
	hostkv_close(h); /* closes emb2 */
	/* Nothing left in /dev/shm by the embedded store. */
	char cmd[128];
	snprintf(cmd, sizeof cmd, "ls /dev/shm | grep -q '^fkv-emb-%d-'", (int)getpid());
	assert_int_not_equal(system(cmd), 0);
}

static Freekv__WorkerInfo *find_worker(Freekv__Reply *r, const char *name)
{
	for (size_t i = 0; i < r->workers->n_workers; i++)
		if (r->workers->workers[i]->name && !strcmp(r->workers->workers[i]->name, name))
			return r->workers->workers[i];
	return NULL;
}

static void test_remote(void **state)
{
	(void)state;
	static const char *const extra[] = { "--set", "heartbeat_timeout_ms=400", NULL };
	struct harness hs;
	harness_start(&hs, extra);
	struct hostkv *h = t_open(hs.endpoint);
	struct hostkv_seq *s = t_seq(h, "r1", true);
	t_write(s, 3, 75);
	t_check(s, 3, 75);
	t_refusals(h, s, "r1");

	/* Another worker cannot attach it while we hold it. */
	struct hostkv *h2 = t_open(hs.endpoint);
	struct hostkv_seq *o = NULL;
	char err[256];
	assert_int_equal(hostkv_seq_open(h2, "r1", t_fp, T_LAYERS, &t_geo, false, &o, err,
					 sizeof err), -EBUSY);

	/* Idle for longer than the heartbeat timeout: the heartbeat thread keeps us alive. */
	h_sleep_ms(1000);
	struct kvs *ctl;
	assert_int_equal(kvs_connect(hs.endpoint, 2000, &ctl), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_show_sequence(ctl, 0, "r1", false, &r), 0);
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ATTACHED);
	assert_int_equal(r->sequence->committed_tokens, 75);
	/* Lease-all: every allocated block of the attached sequence is leased. */
	assert_true(r->sequence->leases >= (uint64_t)T_LAYERS * 19);
	kvs_reply_free(r);

	assert_int_equal(hostkv_report_stats(h, "{\"decode_tok_s\": 123.5, \"tokens_decoded\": 7,"
					     " \"pages_recalled\": 9, \"correction_rate\": 0.25}"), 0);
	assert_int_equal(hostkv_report_stats(h, "not json"), -EINVAL);
	assert_int_equal(kvs_list_workers(ctl, &r), 0);
	Freekv__WorkerInfo *wi = find_worker(r, "test_hostkv");
	assert_non_null(wi);
	assert_non_null(wi->stats);
	assert_true(wi->stats->decode_tok_s == 123.5);
	assert_int_equal(wi->stats->tokens_decoded, 7);
	assert_int_equal(wi->stats->pages_recalled, 9);
	assert_false(wi->stats->has_full_step_rate);
	kvs_reply_free(r);
	/* refreshkv's counters, per layer from the layers array (a full layer has none: 0). */
	assert_int_equal(hostkv_report_stats(h, "{\"decode_tok_s\": 5, \"full_step_rate\": 0.25,"
					     " \"tokens_fetched\": 640, \"full_step_ms\": 12.5,"
					     " \"layers\": [{\"layer\": 0}, {\"full_step_rate\": 0.5},"
					     " {\"full_step_rate\": 0.125}]}"), 0);
	assert_int_equal(kvs_list_workers(ctl, &r), 0);
	wi = find_worker(r, "test_hostkv");
	assert_true(wi && wi->stats && wi->stats->has_full_step_rate);
	assert_true(wi->stats->full_step_rate == 0.25 && wi->stats->full_step_ms == 12.5);
	assert_int_equal(wi->stats->tokens_fetched, 640);
	assert_int_equal(wi->stats->n_layer_full_step_rate, 3);
	assert_true(wi->stats->layer_full_step_rate[0] == 0.0);
	assert_true(wi->stats->layer_full_step_rate[1] == 0.5);
	assert_true(wi->stats->layer_full_step_rate[2] == 0.125);
	kvs_reply_free(r);

	/* Detached by close: the other worker attaches and reads every byte back; the blocks
	 * allocated ahead and never committed are gone. */
	assert_int_equal(hostkv_seq_close(s, false), 0);
	o = t_seq(h2, "r1", false);
	t_check(o, 3, 75);
	assert_int_equal(kvs_show_sequence(ctl, 0, "r1", false, &r), 0);
	assert_int_equal(r->sequence->pages->dram, (uint64_t)T_LAYERS * 19);
	kvs_reply_free(r);
	/* It goes on writing and committing where the first one stopped. */
	void *b;
	int32_t more[5] = { 9, 9, 9, 9, 9 };
	assert_int_equal(hostkv_block(o, 2, 19, &b, err, sizeof err), 0);
	assert_int_equal(hostkv_block(o, 0, 19, &b, err, sizeof err), 0);
	assert_int_equal(hostkv_commit(o, 79, more, 75, 5, err, sizeof err), 0);
	/* A length moving inside committed pages without new ids rides on the next request:
	 * the store lags until close flushes it. */
	assert_int_equal(hostkv_commit(o, 80, NULL, 0, 0, err, sizeof err), 0);
	assert_int_equal(hostkv_seq_committed(o), 80);
	assert_int_equal(kvs_show_sequence(ctl, 0, "r1", false, &r), 0);
	assert_int_equal(r->sequence->committed_tokens, 79);
	kvs_reply_free(r);
	hostkv_close(h2); /* Goodbye: detached, kept */
	assert_int_equal(kvs_show_sequence(ctl, 0, "r1", false, &r), 0);
	assert_int_equal(r->sequence->state, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
	assert_int_equal(r->sequence->committed_tokens, 80);
	kvs_reply_free(r);
	hostkv_close(h);
	kvs_close(ctl);
	harness_stop(&hs);
}

#define T_BUDGET 4

/* Lease counters, checked against the budget. */
static struct hostkv_lease_stats t_leases(struct hostkv_seq *s)
{
	struct hostkv_lease_stats st;
	hostkv_seq_lease_stats(s, &st);
	assert_int_equal(st.budget, T_BUDGET);
	assert_true(st.evictable <= T_BUDGET);
	return st;
}

/* Pins (layer, page), checks its bytes, unpins; the budget holds after each call. */
static void t_pin_check(struct hostkv_seq *s, uint64_t tag, int l, int p)
{
	size_t bb = layout_block_bytes(&t_geo);
	char err[256];
	const void *b;
	int ret = hostkv_block_ro_pin(s, l, p, &b, err, sizeof err);
	if (ret)
		fprintf(stderr, "pin (%d, %d): %s\n", l, p, err);
	assert_int_equal(ret, 0);
	t_leases(s);
	assert_true(h_check(b, bb, tag, (uint32_t)l, (uint32_t)p));
	assert_int_equal(hostkv_unpin(s, l, p, err, sizeof err), 0);
	t_leases(s);
}

struct t_pinner {
	struct hostkv_seq *s;
	int first, n, rounds, bad;
	bool many; /* all n pages of a layer with one hostkv_pin_many */
};

/* Recall-thread stand-in: pins and reads pages [first, first + n) (n <= 16) of every layer in
 * turn, one by one or a layer's at once. */
static void *t_pinner_main(void *arg)
{
	struct t_pinner *t = arg;
	size_t bb = layout_block_bytes(&t_geo);
	char err[256];
	int pages[16];
	const void *b[16];
	for (int i = 0; i < t->n; i++)
		pages[i] = t->first + i;
	for (int r = 0; r < t->rounds; r++)
		for (int l = 0; l < T_LAYERS; l++) {
			if (t->many) {
				if (hostkv_pin_many(t->s, l, pages, t->n, b, err, sizeof err)) {
					t->bad++;
					continue;
				}
				for (int i = 0; i < t->n; i++)
					t->bad += !h_check(b[i], bb, 5, (uint32_t)l, (uint32_t)pages[i]);
				t->bad += hostkv_unpin_many(t->s, l, pages, t->n, err, sizeof err) != 0;
				continue;
			}
			for (int i = 0; i < t->n; i++) {
				if (hostkv_block_ro_pin(t->s, l, pages[i], &b[0], err, sizeof err)) {
					t->bad++;
					continue;
				}
				t->bad += !h_check(b[0], bb, 5, (uint32_t)l, (uint32_t)pages[i]);
				t->bad += hostkv_unpin(t->s, l, pages[i], err, sizeof err) != 0;
			}
		}
	return NULL;
}

static uint64_t t_daemon_leases(struct kvs *ctl, const char *name, uint64_t *nvme)
{
	Freekv__Reply *r = h_settled(ctl, name);
	assert_non_null(r);
	uint64_t n = r->sequence->leases;
	*nvme = r->sequence->pages->nvme;
	kvs_reply_free(r);
	return n;
}

static void test_budget(void **state)
{
	(void)state;
	struct harness hs;
	harness_start(&hs, NULL);
	struct kvs *ctl;
	assert_int_equal(kvs_connect(hs.endpoint, 2000, &ctl), 0);
	struct hostkv *h = t_open_budget(hs.endpoint, T_BUDGET);
	struct hostkv_seq *s = t_seq(h, "lb", true);
	char err[256];
	size_t bb = layout_block_bytes(&t_geo);
	/* 70 tokens: pages 0..16 full and committed, 17 the tail (committed, being written),
	 * 18..20 written, not committed; allocated ahead to 31. */
	t_write(s, 5, 70);
	struct hostkv_lease_stats st = t_leases(s);
	assert_true(st.releases > 0);
	assert_int_equal(st.pinned, 0);
	assert_int_equal(st.held, st.evictable + (uint64_t)T_LAYERS * (32 - 17));
	uint64_t nvme;
	assert_int_equal(t_daemon_leases(ctl, "lb", &nvme), st.held);

	/* A pinned block survives any amount of traffic past the budget. */
	const void *a, *a2;
	assert_int_equal(hostkv_block_ro_pin(s, 1, 2, &a, err, sizeof err), 0);
	for (int p = 0; p < 17; p++)
		for (int l = 0; l < T_LAYERS; l++)
			t_pin_check(s, 5, l, p);
	st = t_leases(s);
	assert_int_equal(st.pinned, 1);
	assert_true(st.recalls > 0);
	/* Demote everything the daemon may move: exactly the unleased committed blocks go, the
	 * pinned one, the evictable leases and the tail page stay. */
	Freekv__Reply *r;
	assert_int_equal(kvs_demote(ctl, 0, "lb", &r), 0);
	kvs_reply_free(r);
	assert_int_equal(t_daemon_leases(ctl, "lb", &nvme), st.held);
	assert_int_equal(nvme, (uint64_t)T_LAYERS * 18 - st.evictable - 1 - T_LAYERS);
	assert_true(h_check(a, bb, 5, 1, 2));
	assert_int_equal(hostkv_block_ro_pin(s, 1, 2, &a2, err, sizeof err), 0); /* nested */
	assert_ptr_equal(a, a2);
	assert_int_equal(hostkv_unpin(s, 1, 2, err, sizeof err), 0);
	assert_int_equal(hostkv_unpin(s, 1, 2, err, sizeof err), 0);
	assert_int_equal(hostkv_unpin(s, 1, 2, err, sizeof err), -EINVAL);
	/* Demoted blocks come back through a pin (promoted) with their bytes. */
	uint64_t recalls = st.recalls;
	for (int p = 0; p < 17; p++)
		for (int l = 0; l < T_LAYERS; l++)
			t_pin_check(s, 5, l, p);
	st = t_leases(s);
	assert_true(st.recalls > recalls);
	assert_int_equal(kvs_stats(ctl, &r), 0);
	assert_true(r->stats->promoted_blocks > 0);
	kvs_reply_free(r);
	/* Writers: the tail and uncommitted pages are leased and intact; a full committed page
	 * is read through a pin only. */
	void *w;
	for (int p = 17; p < T_PAGES; p++)
		for (int l = 0; l < T_LAYERS; l++) {
			assert_int_equal(hostkv_block(s, l, p, &w, err, sizeof err), 0);
			assert_true(h_check(w, bb, 5, (uint32_t)l, (uint32_t)p));
		}
	assert_int_equal(hostkv_block(s, 0, 16, &w, err, sizeof err), -EBUSY);

	/* Two threads pinning the same pages at once (the recall thread beside the compute
	 * thread; one of them a layer's pages at once): every read sees its bytes, and no lease
	 * is lost or doubled. */
	struct t_pinner t[2] = { { s, 0, 12, 6, 0, false }, { s, 5, 12, 6, 0, true } };
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&th[i], NULL, t_pinner_main, &t[i]), 0);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_join(th[i], NULL), 0);
	assert_int_equal(t[0].bad + t[1].bad, 0);
	st = t_leases(s);
	assert_int_equal(st.pinned, 0);
	assert_int_equal(t_daemon_leases(ctl, "lb", &nvme), st.held);

	/* Committing past more pages keeps the budget; a reopened sequence (budget too) reads
	 * every committed byte back. */
	int32_t more[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	assert_int_equal(hostkv_commit(s, 78, more, 70, 8, err, sizeof err), 0);
	st = t_leases(s);
	assert_int_equal(st.held, st.evictable + (uint64_t)T_LAYERS * (32 - 19));
	assert_int_equal(hostkv_seq_close(s, false), 0);
	assert_int_equal(t_daemon_leases(ctl, "lb", &nvme), 0);
	s = t_seq(h, "lb", false);
	st = t_leases(s);
	assert_int_equal(st.held, (uint64_t)T_LAYERS); /* the tail page */
	for (int p = 0; p < 19; p++)
		for (int l = 0; l < T_LAYERS; l++)
			t_pin_check(s, 5, l, p);
	hostkv_close(h);
	kvs_close(ctl);
	harness_stop(&hs);
}

#define PM_PAGES 48 /* full, committed pages of the hostkv_pin_many sequence */

/* Pins pages[0..n) of layer l at once; the bytes of every full page are checked. */
static void t_pin_many_check(struct hostkv_seq *s, int l, const int *pages, int n,
			     const void **b)
{
	size_t bb = layout_block_bytes(&t_geo);
	char err[256];
	int ret = hostkv_pin_many(s, l, pages, n, b, err, sizeof err);
	if (ret)
		fprintf(stderr, "pin_many: %s\n", err);
	assert_int_equal(ret, 0);
	for (int i = 0; i < n; i++) {
		assert_non_null(b[i]);
		if (pages[i] < PM_PAGES)
			assert_true(h_check(b[i], bb, 9, (uint32_t)l, (uint32_t)pages[i]));
		for (int j = 0; j < i; j++)
			assert_true((b[i] == b[j]) == (pages[i] == pages[j]));
	}
}

/* hostkv_pin_many / hostkv_unpin_many with a budget (kvstored): a mix of leased, released,
 * pinned, uncommitted and repeated pages comes back with the right bytes, the released ones in
 * one RECALL entry per 32 pages, and the budget holds after; an error (a page never allocated,
 * a page not pinned) leaves no pin changed; without a budget the pins cost no RECALL. */
static void test_pin_many(void **state)
{
	(void)state;
	struct harness hs;
	harness_start(&hs, NULL);
	struct kvs *ctl;
	assert_int_equal(kvs_connect(hs.endpoint, 2000, &ctl), 0);
	size_t bb = layout_block_bytes(&t_geo);
	char err[256];
	static int32_t ids[PM_PAGES * 4];
	for (int i = 0; i < PM_PAGES * 4; i++)
		ids[i] = i % 500;
	for (int budget = T_BUDGET; budget >= 0; budget -= T_BUDGET) {
		struct hostkv *h = t_open_budget(budget ? hs.endpoint : NULL, (uint32_t)budget);
		struct hostkv_seq *s = t_seq(h, "pm", true);
		void *w;
		for (int p = 0; p < PM_PAGES; p++)
			for (int l = 0; l < T_LAYERS; l++) {
				assert_int_equal(hostkv_block(s, l, p, &w, err, sizeof err), 0);
				h_fill(w, bb, 9, (uint32_t)l, (uint32_t)p);
			}
		assert_int_equal(hostkv_commit(s, PM_PAGES * 4, ids, 0, PM_PAGES * 4, err,
					       sizeof err), 0);
		struct hostkv_lease_stats st0, st;
		hostkv_seq_lease_stats(s, &st0);
		assert_true(st0.evictable <= (uint64_t)budget || !budget);

		/* Page 3 pinned before; every full page once, 3 and 5 again, 0 twice more, and
		 * pages 50 and 51 past the tail (leased, allocated ahead by a writer). */
		void *w50;
		assert_int_equal(hostkv_block(s, 1, 50, &w50, err, sizeof err), 0);
		const void *pre;
		assert_int_equal(hostkv_block_ro_pin(s, 1, 3, &pre, err, sizeof err), 0);
		int pages[PM_PAGES + 7];
		const void *b[PM_PAGES + 7];
		int n = 0;
		for (int p = PM_PAGES; p--;)
			pages[n++] = p;
		pages[n++] = 3;
		pages[n++] = 5;
		pages[n++] = 0;
		pages[n++] = 51;
		pages[n++] = 0;
		pages[n++] = 50;
		hostkv_seq_lease_stats(s, &st0);
		t_pin_many_check(s, 1, pages, n, b);
		hostkv_seq_lease_stats(s, &st);
		assert_ptr_equal(b[PM_PAGES - 1 - 3], pre);
		assert_ptr_equal(b[n - 1], w50);
		assert_int_equal(st.pinned, PM_PAGES + 2);
		uint64_t recalled = st.recalls - st0.recalls;
		if (budget) {
			/* All but the pinned page and the few evictable leases came back, in two
			 * RECALL entries of up to 32 pages. */
			assert_true(recalled >= PM_PAGES - 1 - (uint64_t)budget);
			assert_int_equal(st.recall_ops - st0.recall_ops, (recalled + 31) / 32);
			assert_int_equal(st.recall_ops - st0.recall_ops, 2);
			assert_true(st.evictable <= (uint64_t)budget);
			uint64_t nvme;
			assert_int_equal(t_daemon_leases(ctl, "pm", &nvme), st.held);
		} else {
			assert_int_equal(recalled, 0);
			assert_int_equal(st.recall_ops, 0);
			/* Lease-all: every full page unpinned is leased. */
			assert_int_equal(st.evictable, (uint64_t)(T_LAYERS - 1) * PM_PAGES);
		}

		/* An unpin list with a page holding no pin changes nothing; without it, it drops
		 * the call's pins (page 3 keeps the first one). */
		pages[n] = 49;
		assert_int_equal(hostkv_unpin_many(s, 1, pages, n + 1, err, sizeof err), -EINVAL);
		hostkv_seq_lease_stats(s, &st);
		assert_int_equal(st.pinned, PM_PAGES + 2);
		assert_int_equal(hostkv_unpin_many(s, 1, pages, n, err, sizeof err), 0);
		hostkv_seq_lease_stats(s, &st);
		assert_int_equal(st.pinned, 1);
		assert_true(st.evictable <= (uint64_t)budget || !budget);
		assert_true(h_check(pre, bb, 9, 1, 3));
		assert_int_equal(hostkv_unpin_many(s, 1, &pages[PM_PAGES - 1 - 3], 1, err,
						   sizeof err), 0);
		assert_int_equal(hostkv_unpin_many(s, 1, &pages[PM_PAGES - 1 - 3], 1, err,
						   sizeof err), -EINVAL);

		/* A page never allocated (or negative, or a bad layer) in the middle: refused
		 * before anything is pinned or recalled. */
		int bad[4] = { 0, 1, 1000, 2 };
		hostkv_seq_lease_stats(s, &st0);
		assert_int_equal(hostkv_pin_many(s, 2, bad, 4, b, err, sizeof err), -ENOENT);
		bad[2] = -1;
		assert_int_equal(hostkv_pin_many(s, 2, bad, 4, b, err, sizeof err), -EINVAL);
		assert_int_equal(hostkv_pin_many(s, T_LAYERS, bad, 2, b, err, sizeof err), -EINVAL);
		assert_int_equal(hostkv_pin_many(s, 2, bad, -1, b, err, sizeof err), -EINVAL);
		assert_int_equal(hostkv_pin_many(s, 2, bad, 0, b, err, sizeof err), 0);
		hostkv_seq_lease_stats(s, &st);
		assert_int_equal(st.pinned, 0);
		assert_int_equal(st.recalls, st0.recalls);
		assert_int_equal(st.recall_ops, st0.recall_ops);
		/* The same pages pinned again read right: nothing was left half done. */
		t_pin_many_check(s, 2, bad, 2, b);
		assert_int_equal(hostkv_unpin_many(s, 2, bad, 2, err, sizeof err), 0);
		assert_int_equal(hostkv_seq_close(s, true), 0);
		hostkv_close(h);
	}
	kvs_close(ctl);
	harness_stop(&hs);
}

/* hostkv_commit_many: four sequences kept together one id a step, as a batch's decode keeps
 * each sequence's sampled id, their pages filling on the way; one sequence's refusal (an id
 * that disagrees with a kept one) fails that sequence alone; a sequence twice is refused. On
 * kvstored the ids are read back from a second worker after a detach: they reached the store. */
static void t_commit_many(const char *endpoint)
{
	enum { NS = 4, STEPS = 4 * 6 + 1 };
	struct hostkv *h = t_open(endpoint);
	struct hostkv_seq *ss[NS];
	char err[256], name[16];
	size_t bb = layout_block_bytes(&t_geo);
	for (int i = 0; i < NS; i++) {
		snprintf(name, sizeof name, "many%d", i);
		ss[i] = t_seq(h, name, true);
		for (int p = 0; p < 7; p++)
			for (int l = 0; l < T_LAYERS; l++) {
				void *b = NULL;
				assert_int_equal(hostkv_block(ss[i], l, p, &b, err, sizeof err), 0);
				h_fill(b, bb, (uint64_t)i, (uint32_t)l, (uint32_t)p);
			}
	}
	int32_t ids[NS][STEPS];
	for (int i = 0; i < NS; i++)
		for (int t = 0; t < STEPS; t++)
			ids[i][t] = (int32_t)(i * 100 + t);
	int rets[NS];
	for (int t = 0; t < STEPS; t++) {
		int64_t committed[NS], first[NS], n[NS];
		const int32_t *idp[NS];
		for (int i = 0; i < NS; i++) {
			committed[i] = first[i] = t; /* id t kept, positions < t run */
			n[i] = 1;
			idp[i] = &ids[i][t];
		}
		int ret = hostkv_commit_many(ss, committed, idp, first, n, NS, rets, err, sizeof err);
		if (ret)
			fail_msg("step %d: %s", t, err);
		for (int i = 0; i < NS; i++) {
			assert_int_equal(rets[i], 0);
			assert_int_equal(hostkv_seq_committed(ss[i]), t);
		}
	}
	for (int i = 0; i < NS; i++) {
		const int32_t *kept;
		assert_int_equal(hostkv_seq_tokens(ss[i], &kept), STEPS);
		assert_memory_equal(kept, ids[i], sizeof ids[i]);
	}
	/* Sequence 2 offers an id that disagrees with its kept one; the others go on. */
	int64_t committed[NS], first[NS], n[NS];
	const int32_t *idp[NS];
	int32_t next[NS], wrong = ids[2][STEPS - 1] + 1;
	for (int i = 0; i < NS; i++) {
		next[i] = (int32_t)(i * 100 + STEPS);
		committed[i] = STEPS;
		first[i] = i == 2 ? STEPS - 1 : STEPS;
		n[i] = 1;
		idp[i] = i == 2 ? &wrong : &next[i];
	}
	assert_int_equal(hostkv_commit_many(ss, committed, idp, first, n, NS, rets, err, sizeof err),
			 -EINVAL);
	assert_non_null(strstr(err, "disagrees"));
	for (int i = 0; i < NS; i++) {
		assert_int_equal(rets[i], i == 2 ? -EINVAL : 0);
		assert_int_equal(hostkv_seq_committed(ss[i]), i == 2 ? STEPS - 1 : STEPS);
	}
	struct hostkv_seq *twice[2] = { ss[0], ss[0] };
	assert_int_equal(hostkv_commit_many(twice, committed, idp, first, n, 2, rets, err,
					    sizeof err), -EINVAL);
	if (endpoint) {
		for (int i = 0; i < NS; i++)
			assert_int_equal(hostkv_seq_close(ss[i], false), 0);
		struct hostkv *h2 = t_open(endpoint);
		for (int i = 0; i < NS; i++) {
			snprintf(name, sizeof name, "many%d", i);
			struct hostkv_seq *o = t_seq(h2, name, false);
			const int32_t *kept;
			int64_t want = i == 2 ? STEPS : STEPS + 1;
			assert_int_equal(hostkv_seq_tokens(o, &kept), want);
			assert_memory_equal(kept, ids[i], (size_t)STEPS * sizeof *kept);
			if (i != 2)
				assert_int_equal(kept[STEPS], next[i]);
			assert_int_equal(hostkv_seq_close(o, true), 0);
		}
		hostkv_close(h2);
	} else {
		for (int i = 0; i < NS; i++)
			assert_int_equal(hostkv_seq_close(ss[i], true), 0);
	}
	hostkv_close(h);
}

/* kvs_commit_tokens_many on the wire: three requests sent before any reply is read, the
 * middle one for a sequence kvstored does not have: it alone fails (its status and message),
 * the others' ids are kept. */
static void t_kvs_commit_many(const struct harness *hs)
{
	uint64_t seq, off[1];
	struct kvs *k = h_worker(hs, "wire", &seq);
	assert_non_null(k);
	assert_int_equal(kvs_alloc(k, seq, 0, 0, 1, off), 0);
	const uint32_t a[2] = { 7, 8 }, b[1] = { 9 }, c[1] = { 10 };
	const struct kvs_commit cm[3] = {
		{ .seq_id = seq, .committed_tokens = 0, .first = 0, .tokens = a, .n = 2 },
		{ .seq_id = seq + 1000, .committed_tokens = 0, .first = 0, .tokens = b, .n = 1 },
		{ .seq_id = seq, .committed_tokens = 0, .first = 2, .tokens = c, .n = 1 },
	};
	int rets[3];
	assert_int_equal(kvs_commit_tokens_many(k, cm, 3, rets), -ENOENT);
	assert_int_equal(rets[0], 0);
	assert_int_equal(rets[1], -ENOENT);
	assert_int_equal(rets[2], 0);
	assert_true(kvs_error(k)[0]);
	Freekv__Reply *r = NULL;
	assert_int_equal(kvs_attach(k, seq, &r), 0);
	assert_non_null(r);
	assert_int_equal(r->sequence->n_token_ids, 3);
	assert_int_equal(r->sequence->token_ids[2], 10);
	kvs_reply_free(r);
	assert_int_equal(kvs_commit_tokens_many(k, cm, 0, rets), 0);
	kvs_close(k);
}

static void test_commit_many(void **state)
{
	(void)state;
	t_commit_many(NULL);
	struct harness hs;
	harness_start(&hs, NULL);
	t_commit_many(hs.endpoint);
	t_kvs_commit_many(&hs);
	harness_stop(&hs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_embedded, h_teardown),
		cmocka_unit_test_teardown(test_remote, h_teardown),
		cmocka_unit_test_teardown(test_budget, h_teardown),
		cmocka_unit_test_teardown(test_pin_many, h_teardown),
		cmocka_unit_test_teardown(test_commit_many, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
