/* Prefix sharing across workers (docs/design.md §4 "Prefix sharing"), with a real kvstored and
 * real kvworker processes on stories260K: a second prompt that shares about 3/4 of the first's
 * text attaches the first's pages, prefills only the rest, and decodes the tokens of a cold
 * run; the first worker's kill -9 changes nothing for the second; shared pages outlive the
 * sequence that made them and go with the last one; pages demoted to NVMe are shared and come
 * back, and corrupted there they fail every sharer (nothing silently wrong); another salt or
 * page size never shares; a fork continues exactly as its source. */
#include "clock.h"
#include "test_kvworker_proc.h"

static const char *g_model;
static char g_p1[128], g_p2[128];	/* prompt files */
static char g_dir[64];

#define N_GEN "24"
#define KV_FLAGS "--page-size", "16", "--budget", "256", "--sink", "16", "--window", "32"

/* Writes the two prompts: the story corpus, and its first 3/4 with another ending. */
static int setup(void **state)
{
	(void)state;
	snprintf(g_dir, sizeof g_dir, "/tmp/fkv-prefix-%d", (int)getpid());
	if (mkdir(g_dir, 0700) && errno != EEXIST)
		return -1;
	char path[4096];
	snprintf(path, sizeof path, "%s/tests/data/stories_corpus.txt", FREEKV_SOURCE_DIR);
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	static char text[65536];
	size_t n = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	size_t cut = n * 3 / 4;
	while (cut > 0 && text[cut] != ' ')
		cut--;
	snprintf(g_p1, sizeof g_p1, "%s/p1.txt", g_dir);
	snprintf(g_p2, sizeof g_p2, "%s/p2.txt", g_dir);
	FILE *a = fopen(g_p1, "wb"), *b = fopen(g_p2, "wb");
	if (!a || !b)
		return -1;
	fwrite(text, 1, n, a);
	fwrite(text, 1, cut, b);
	fputs(" Then a small red bird flew over the hill, and Tom asked his dad where it went.", b);
	fclose(a);
	fclose(b);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(g_p1);
	unlink(g_p2);
	rmdir(g_dir);
	return 0;
}

/* kvworker generate on a prompt file against the store; extra flags follow (NULL-ended). */
static void gen_start(struct proc *p, const char *endpoint, const char *file, const char *seq,
		      const char *n, const char *policy, const char *const *extra)
{
	const char *args[P_MAX_ARGS] = { "generate", "-m", g_model, "-f", file, "-n", n, "--temp",
					 "0", "--ids", "-c", "4096", "--policy", policy, "--store",
					 endpoint, "--seq", seq, "--keep", "-t", "1", KV_FLAGS };
	int k = 0;
	while (args[k])
		k++;
	for (int i = 0; extra && extra[i] && k < P_MAX_ARGS - 1; i++)
		args[k++] = extra[i];
	args[k] = NULL;
	p_start(p, args);
}

static int gen(struct proc *p, const char *endpoint, const char *file, const char *seq,
	       const char *policy, const char *const *extra)
{
	gen_start(p, endpoint, file, seq, N_GEN, policy, extra);
	return p_wait(p);
}

static Freekv__Reply *show(const char *endpoint, const char *name)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(endpoint, 5000, &k), 0);
	int ret = kvs_show_sequence(k, 0, name, false, &r);
	if (ret)
		fprintf(stderr, "show %s: %s\n", name, kvs_error(k));
	assert_int_equal(ret, 0);
	kvs_close(k);
	return r;
}

static uint64_t covered(const char *endpoint, const char *name)
{
	Freekv__Reply *r = show(endpoint, name);
	uint64_t c = r->sequence->prefix_covered_tokens;
	kvs_reply_free(r);
	return c;
}

static uint32_t shared_pages(const char *endpoint, const char *name)
{
	Freekv__Reply *r = show(endpoint, name);
	uint32_t c = r->sequence->shared_pages;
	kvs_reply_free(r);
	return c;
}

static Freekv__Reply *stats(const char *endpoint)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(endpoint, 5000, &k), 0);
	assert_int_equal(kvs_stats(k, &r), 0);
	kvs_close(k);
	assert_non_null(r->stats->prefix);
	return r;
}

static void evict(const char *endpoint, const char *name)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(endpoint, 5000, &k), 0);
	int ret = kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, 0, name, 0, false, &r);
	if (ret)
		fprintf(stderr, "evict %s: %s\n", name, kvs_error(k));
	assert_int_equal(ret, 0);
	kvs_reply_free(r);
	kvs_close(k);
}

/* kvctl evict --detached: every detached sequence, and the pages only the index keeps. */
static void evict_detached(const char *endpoint)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(endpoint, 5000, &k), 0);
	assert_int_equal(kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_DETACHED, 0, NULL, 0,
				   false, &r), 0);
	kvs_reply_free(r);
	kvs_close(k);
}

static void same_ids(const struct proc *a, const struct proc *b)
{
	assert_int_equal(a->n_ids, atoi(N_GEN));
	assert_int_equal(a->n_ids, b->n_ids);
	assert_memory_equal(a->ids, b->ids, sizeof(int) * (size_t)a->n_ids);
}

/* A's prompt pages serve B: B's tokens equal a cold run's, and the counters say so. */
static void share_case(const char *policy)
{
	static struct proc a, b, cold;
	static const char *const noprefix[] = { "--no-prefix", NULL };
	struct harness hs;
	harness_start(&hs, NULL);
	assert_int_equal(gen(&cold, hs.endpoint, g_p2, "cold", policy, noprefix), 0);
	assert_int_equal(covered(hs.endpoint, "cold"), 0);
	assert_int_equal(gen(&a, hs.endpoint, g_p1, "a", policy, NULL), 0);
	assert_int_equal(covered(hs.endpoint, "a"), 0); /* nothing to find yet */
	assert_int_equal(gen(&b, hs.endpoint, g_p2, "b", policy, NULL), 0);
	uint64_t c = covered(hs.endpoint, "b");
	fprintf(stderr, "%s: b found %llu prompt tokens in the pool\n", policy,
		(unsigned long long)c);
	assert_true(c >= 512);
	assert_int_equal(c % 256, 0); /* whole ubatches (the engine's default 256) */
	same_ids(&b, &cold);
	assert_int_equal(shared_pages(hs.endpoint, "b"), c / 16);
	assert_int_equal(shared_pages(hs.endpoint, "a"), c / 16);
	Freekv__Reply *r = stats(hs.endpoint);
	assert_int_equal(r->stats->prefix->lookups, 2); /* a and b; cold asked for none */
	assert_int_equal(r->stats->prefix->hits, 1);
	assert_int_equal(r->stats->prefix->tokens_saved, c);
	assert_true(r->stats->prefix->indexed_pages >= c / 16);
	/* A block per (layer, shared page): stories260K has 5 layers. */
	assert_int_equal(r->stats->prefix->shared_blocks, 5 * c / 16);
	kvs_reply_free(r);
	harness_stop(&hs);
}

static void test_share_full(void **state)
{
	(void)state;
	share_case("full");
}

static void test_share_freekv(void **state)
{
	(void)state;
	if (!p_policy_built("freekv"))
		skip();
	share_case("freekv");
}

/* A is killed while B decodes over A's pages: B goes on untouched. Then dropping A leaves the
 * shared pages to B; dropping B leaves the prompt pages to the index alone, as a cache that a
 * third prompt still finds; evicting the detached sequences lets the cache go too: the pool
 * ends empty. */
static void test_kill_first_worker(void **state)
{
	(void)state;
	static struct proc a, b, cold;
	static const char *const noprefix[] = { "--no-prefix", NULL };
	struct harness hs;
	harness_start(&hs, NULL);
	assert_int_equal(gen(&cold, hs.endpoint, g_p2, "cold", "full", noprefix), 0);
	evict(hs.endpoint, "cold");
	gen_start(&a, hs.endpoint, g_p1, "a", "100000", "full", NULL);
	assert_true(p_read_ids(&a, 4) >= 4); /* its prompt is prefilled and committed */
	/* Commits travel on a's ring and are published when kvstored takes them: wait for the
	 * daemon to hold the 1792 tokens b shares with a (7 whole ubatches) before b looks. */
	for (uint64_t t0 = clock_ms(); clock_ms() - t0 < 10000;) {
		Freekv__Reply *r = show(hs.endpoint, "a");
		uint64_t n = r->sequence->committed_tokens;
		kvs_reply_free(r);
		if (n >= 1792)
			break;
		usleep(20 * 1000);
	}
	gen_start(&b, hs.endpoint, g_p2, "b", N_GEN, "full", NULL);
	assert_true(p_read_ids(&b, 2) >= 2); /* attached, decoding over a's pages */
	assert_int_equal(kill(a.pid, SIGKILL), 0);
	assert_int_equal(p_wait(&a), 128 + SIGKILL);
	assert_int_equal(p_wait(&b), 0);
	same_ids(&b, &cold);
	uint64_t cov = covered(hs.endpoint, "b");
	assert_true(cov >= 512);
	assert_int_equal(shared_pages(hs.endpoint, "b"), cov / 16);
	/* a is orphaned (its worker died); drop it: b keeps every page it shared. */
	for (uint64_t t0 = clock_ms(); clock_ms() - t0 < 5000;) {
		Freekv__Reply *r = show(hs.endpoint, "a");
		bool orphan = r->sequence->state == FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ORPHANED;
		kvs_reply_free(r);
		if (orphan)
			break;
		h_sleep_ms(20);
	}
	evict(hs.endpoint, "a");
	Freekv__Reply *r = show(hs.endpoint, "b");
	assert_int_equal(r->sequence->shared_pages, 0); /* b is their only holder now */
	uint64_t b_blocks = r->sequence->pages->dram, b_kv = r->sequence->committed_tokens;
	assert_int_equal(b_blocks, 5 * ((b_kv + 15) / 16)); /* 5 layers, every page kept */
	kvs_reply_free(r);
	r = stats(hs.endpoint);
	assert_int_equal(r->stats->prefix->shared_blocks, 0);
	/* b's blocks, and of a's only its indexed prompt pages that b does not use (cached). */
	assert_true(r->stats->prefix->cached_blocks > 0);
	assert_int_equal(r->stats->blocks_dram, b_blocks + r->stats->prefix->cached_blocks);
	uint64_t indexed = r->stats->prefix->indexed_pages;
	kvs_reply_free(r);
	evict(hs.endpoint, "b");
	r = stats(hs.endpoint);
	assert_int_equal(r->stats->blocks_dram, 5 * indexed); /* the index's pages alone */
	assert_int_equal(r->stats->prefix->cached_blocks, 5 * indexed);
	kvs_reply_free(r);
	static struct proc c;
	assert_int_equal(gen(&c, hs.endpoint, g_p2, "c", "full", NULL), 0);
	assert_int_equal(covered(hs.endpoint, "c"), cov);
	same_ids(&c, &cold);
	evict_detached(hs.endpoint);
	r = stats(hs.endpoint);
	assert_int_equal(r->stats->blocks_dram + r->stats->blocks_nvme, 0);
	assert_int_equal(r->stats->prefix->indexed_pages, 0);
	kvs_reply_free(r);
	harness_stop(&hs);
}

/* Another cache_salt or page size never shares; the same salt does. */
static void test_salt_and_geometry(void **state)
{
	(void)state;
	static struct proc a, b;
	static const char *const t1[] = { "--cache-salt", "tenant-1", NULL };
	static const char *const t2[] = { "--cache-salt", "tenant-2", NULL };
	static const char *const t1_page32[] = { "--cache-salt", "tenant-1", "--page-size", "32",
						 "--sink", "32", NULL };
	struct harness hs;
	harness_start(&hs, NULL);
	assert_int_equal(gen(&a, hs.endpoint, g_p1, "a", "full", t1), 0);
	assert_int_equal(gen(&b, hs.endpoint, g_p1, "other-salt", "full", t2), 0);
	assert_int_equal(covered(hs.endpoint, "other-salt"), 0);
	assert_int_equal(gen(&b, hs.endpoint, g_p1, "default-salt", "full", NULL), 0);
	assert_int_equal(covered(hs.endpoint, "default-salt"), 0);
	assert_int_equal(gen(&b, hs.endpoint, g_p1, "page32", "full", t1_page32), 0);
	assert_int_equal(covered(hs.endpoint, "page32"), 0);
	Freekv__Reply *r = stats(hs.endpoint);
	assert_int_equal(r->stats->prefix->hits, 0);
	assert_int_equal(r->stats->prefix->misses, 4);
	kvs_reply_free(r);
	assert_int_equal(gen(&b, hs.endpoint, g_p1, "same-salt", "full", t1), 0);
	assert_true(covered(hs.endpoint, "same-salt") >= 512);
	same_ids(&a, &b);
	harness_stop(&hs);
}

/* Shared pages on NVMe: demoted, attached and promoted back exactly; corrupted on NVMe, every
 * sharer's read fails with a checksum error and nothing decodes over them. */
static void test_nvme_shared(void **state)
{
	(void)state;
	static struct proc a, b, cold, bad;
	static const char *const noprefix[] = { "--no-prefix", NULL };
	struct harness hs;
	harness_start(&hs, NULL);
	assert_int_equal(gen(&cold, hs.endpoint, g_p2, "cold", "full", noprefix), 0);
	evict(hs.endpoint, "cold");
	assert_int_equal(gen(&a, hs.endpoint, g_p1, "a", "full", NULL), 0);
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(hs.endpoint, 5000, &k), 0);
	assert_int_equal(kvs_demote(k, 0, "a", &r), 0);
	kvs_reply_free(r);
	r = h_settled(k, "a");
	assert_int_equal(r->sequence->pages->dram, 0);
	kvs_reply_free(r);
	assert_int_equal(gen(&b, hs.endpoint, g_p2, "b", "full", NULL), 0);
	assert_true(covered(hs.endpoint, "b") >= 512);
	same_ids(&b, &cold);
	Freekv__Reply *st = stats(hs.endpoint);
	assert_true(st->stats->promoted_blocks > 0);
	kvs_reply_free(st);
	evict(hs.endpoint, "b");
	/* Demote a again and damage every byte of the tier. */
	assert_int_equal(kvs_demote(k, 0, "a", &r), 0);
	kvs_reply_free(r);
	r = h_settled(k, "a");
	assert_int_equal(r->sequence->pages->dram, 0);
	kvs_reply_free(r);
	kvs_close(k);
	int fd = open(hs.nvme, O_WRONLY);
	assert_true(fd >= 0);
	static uint8_t junk[1 << 16];
	memset(junk, 0xa5, sizeof junk);
	struct stat sb;
	assert_int_equal(fstat(fd, &sb), 0);
	for (off_t off = 0; off < sb.st_size; off += (off_t)sizeof junk)
		assert_true(pwrite(fd, junk, sizeof junk, off) > 0);
	fsync(fd);
	close(fd);
	/* A new sharer attaches the damaged pages and fails reading them. */
	assert_int_not_equal(gen(&bad, hs.endpoint, g_p2, "b2", "full", NULL), 0);
	assert_int_equal(bad.n_ids, 0);
	/* The sequence that made them fails too: resume refuses to decode over them. */
	const char *args[] = { "resume", "-m", g_model, "--store", hs.endpoint, "--seq", "a",
			       "-n", "4", "--temp", "0", "--ids", "-c", "4096", "--policy", "full",
			       "-t", "1", NULL };
	assert_int_not_equal(p_run(&bad, args), 0);
	assert_int_equal(bad.n_ids, 0);
	st = stats(hs.endpoint);
	assert_true(st->stats->crc_errors > 0);
	kvs_reply_free(st);
	harness_stop(&hs);
}

/* kvctl fork's request: f shares a's full pages and copies its tail; resuming f and resuming a
 * give the same tokens. */
static void test_fork(void **state)
{
	(void)state;
	static struct proc a, ra, rf;
	struct harness hs;
	harness_start(&hs, NULL);
	assert_int_equal(gen(&a, hs.endpoint, g_p2, "a", "full", NULL), 0);
	Freekv__Reply *r = show(hs.endpoint, "a");
	const Freekv__SequenceInfo *s = r->sequence;
	struct kvs_geometry g = { s->geometry->n_layers, s->geometry->n_kv_heads,
				  s->geometry->head_dim, s->geometry->page_size,
				  (uint32_t)s->geometry->dtype };
	uint64_t committed = s->committed_tokens, id, c = 0;
	struct kvs *k;
	assert_int_equal(kvs_connect(hs.endpoint, 5000, &k), 0);
	struct kvs_prefix_req px = { .fork_from = "a" };
	assert_int_equal(kvs_open_sequence_px(k, "f", s->model_fingerprint.data,
					      s->model_fingerprint.len, &g, NULL, 0, true, &px,
					      &id, &c), 0);
	assert_int_equal(c, committed);
	/* A fork into an existing name, or from a missing one, is refused. */
	assert_int_equal(kvs_open_sequence_px(k, "f", s->model_fingerprint.data,
					      s->model_fingerprint.len, &g, NULL, 0, true, &px,
					      &id, &c), -EEXIST);
	px.fork_from = "nope";
	assert_int_equal(kvs_open_sequence_px(k, "g", s->model_fingerprint.data,
					      s->model_fingerprint.len, &g, NULL, 0, true, &px,
					      &id, &c), -ENOENT);
	kvs_close(k);
	kvs_reply_free(r);
	assert_int_equal(shared_pages(hs.endpoint, "f"), committed / 16);
	const char *rf_args[] = { "resume", "-m", g_model, "--store", hs.endpoint, "--seq", "f",
				  "-n", N_GEN, "--temp", "0", "--ids", "-c", "4096", "--policy",
				  "full", "-t", "1", "--keep", NULL };
	assert_int_equal(p_run(&rf, rf_args), 0);
	const char *ra_args[] = { "resume", "-m", g_model, "--store", hs.endpoint, "--seq", "a",
				  "-n", N_GEN, "--temp", "0", "--ids", "-c", "4096", "--policy",
				  "full", "-t", "1", "--keep", NULL };
	assert_int_equal(p_run(&ra, ra_args), 0);
	same_ids(&rf, &ra);
	harness_stop(&hs);
}

/* A restart (kill -9, persist = true) keeps shared blocks once, with both holders, and rebuilds
 * the index from the ids: a later prompt finds the pages again. */
static void test_restart_shared(void **state)
{
	(void)state;
	static struct proc a, b, c;
	static const char *const persist_on[] = { "--set", "persist=true", NULL };
	struct harness hs;
	harness_start(&hs, persist_on);
	assert_int_equal(gen(&a, hs.endpoint, g_p1, "a", "full", NULL), 0);
	assert_int_equal(gen(&b, hs.endpoint, g_p2, "b", "full", NULL), 0);
	uint64_t cov = covered(hs.endpoint, "b");
	assert_true(cov >= 512);
	Freekv__Reply *before = stats(hs.endpoint);
	uint64_t blocks = before->stats->blocks_dram;
	kvs_reply_free(before);
	h_kill9(&hs);
	harness_spawn(&hs, persist_on, NULL);
	for (int i = 0; i < 2; i++) {
		Freekv__Reply *r = show(hs.endpoint, i ? "b" : "a");
		assert_false(r->sequence->has_damaged_blocks);
		assert_int_equal(r->sequence->shared_pages, cov / 16);
		kvs_reply_free(r);
	}
	assert_int_equal(covered(hs.endpoint, "b"), cov);
	Freekv__Reply *r = stats(hs.endpoint);
	assert_int_equal(r->stats->blocks_dram, blocks); /* each shared block adopted once */
	assert_int_equal(r->stats->prefix->shared_blocks, 5 * cov / 16);
	assert_true(r->stats->prefix->indexed_pages >= cov / 16);
	kvs_reply_free(r);
	assert_int_equal(gen(&c, hs.endpoint, g_p2, "c", "full", NULL), 0);
	assert_int_equal(covered(hs.endpoint, "c"), cov);
	same_ids(&c, &b);
	evict_detached(hs.endpoint);
	r = stats(hs.endpoint);
	assert_int_equal(r->stats->blocks_dram + r->stats->blocks_nvme, 0);
	kvs_reply_free(r);
	h_finish(&hs);
}

/* The protocol itself, with the harness's synthetic geometry (2 layers, page 16): a reader
 * attaches the publisher's pages and reads its bytes; a COMMIT to a shared block is refused
 * (EROFS); once both are dropped the pages stay as a cache; an ALLOC that finds no room (no
 * NVMe tier) lets the cache go, least recently used first. */
static void test_cache_gives_way(void **state)
{
	(void)state;
	static const char *const small[] = { "--set", "dram_bytes=4M", "--set", "nvme_path=",
					     NULL };
	struct harness hs;
	harness_start(&hs, small);
	static uint32_t ids[1025];
	for (int i = 0; i < 1025; i++)
		ids[i] = (uint32_t)(i * 7 + 3) % 500;
	struct kvs_prefix_req px = { .ubatch = 16, .variant = "test", .variant_len = 4 };
	struct kvs *k[2];
	uint64_t seq[2], cov[2];
	for (int w = 0; w < 2; w++) {
		const char *name = w ? "reader" : "publisher";
		assert_int_equal(kvs_connect(hs.endpoint, 5000, &k[w]), 0);
		assert_int_equal(kvs_hello(k[w], KVS_ROLE_WORKER, name), 0);
		assert_int_equal(kvs_open_sequence_px(k[w], name, h_fp, sizeof h_fp, &h_geo, ids, 1025,
						      true, &px, &seq[w], &cov[w]), 0);
		assert_int_equal(kvs_attach(k[w], seq[w], NULL), 0);
		if (!w)
			assert_int_equal(h_write_pages(k[0], seq[0], 1, 0, 64), 0);
	}
	assert_int_equal(cov[0], 0);
	assert_int_equal(cov[1], 1024); /* every page, below the 1025-token prompt */
	assert_int_equal(h_read_pages(k[1], seq[1], 1, 0, 64), 0); /* the publisher's bytes */
	uint32_t page = 0;
	uint64_t mask = 3, off, lease;
	assert_int_equal(kvs_recall(k[1], seq[1], 0, &page, &mask, 1, &off, &lease), 0);
	assert_int_equal(kvs_commit(k[1], seq[1], 1024, &off, 1), -EROFS);
	assert_int_equal(kvs_release(k[1], &lease, 1), 0);
	/* Another model fingerprint, dtype, ubatch or variant finds nothing. */
	uint8_t fp2[sizeof h_fp];
	memcpy(fp2, h_fp, sizeof fp2);
	fp2[5] ^= 1;
	struct kvs_geometry g32 = h_geo;
	g32.dtype = 1; /* f32 */
	struct kvs_prefix_req ub32 = px, var2 = px;
	ub32.ubatch = 32;
	var2.variant = "tesT";
	struct {
		const char *name;
		const uint8_t *fp;
		const struct kvs_geometry *g;
		const struct kvs_prefix_req *q;
	} miss[] = { { "other-fp", fp2, &h_geo, &px }, { "other-dtype", h_fp, &g32, &px },
		     { "other-ubatch", h_fp, &h_geo, &ub32 }, { "other-variant", h_fp, &h_geo, &var2 } };
	for (size_t i = 0; i < sizeof miss / sizeof miss[0]; i++) {
		uint64_t id, c = 99;
		assert_int_equal(kvs_open_sequence_px(k[1], miss[i].name, miss[i].fp, sizeof h_fp,
						      miss[i].g, ids, 1025, true, miss[i].q, &id, &c), 0);
		assert_int_equal(c, 0);
		assert_int_equal(kvs_close_sequence(k[1], id, true), 0);
	}
	for (int w = 0; w < 2; w++) {
		assert_int_equal(kvs_close_sequence(k[w], seq[w], true), 0);
		kvs_close(k[w]);
	}
	Freekv__Reply *r = stats(hs.endpoint);
	assert_int_equal(r->stats->prefix->cached_blocks, 2 * 64);
	assert_int_equal(r->stats->prefix->indexed_pages, 64);
	uint64_t total = r->stats->dram_bytes / H_BLOCK;
	kvs_reply_free(r);
	/* A filler that needs more than what the cache leaves free. */
	uint64_t fseq;
	struct kvs *f = h_worker(&hs, "filler", &fseq);
	assert_non_null(f);
	uint32_t pages = (uint32_t)((total - 64) / 2);
	assert_int_equal(h_write_pages(f, fseq, 2, 0, pages), 0);
	r = stats(hs.endpoint);
	fprintf(stderr, "pool of %llu blocks: filler wrote %u pages, %llu cached pages let go\n",
		(unsigned long long)total, pages, (unsigned long long)r->stats->prefix->evicted_pages);
	assert_true(r->stats->prefix->evicted_pages > 0);
	assert_true(r->stats->prefix->cached_blocks < 2 * 64);
	assert_int_equal(r->stats->prefix->cached_blocks, 2 * r->stats->prefix->indexed_pages);
	kvs_reply_free(r);
	assert_int_equal(h_read_pages(f, fseq, 2, 0, pages), 0);
	kvs_close(f);
	harness_stop(&hs);
}

int main(void)
{
	g_model = test_model_path("stories260K/stories260K.gguf");
	if (!g_model)
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_share_full, h_teardown),
		cmocka_unit_test_teardown(test_share_freekv, h_teardown),
		cmocka_unit_test_teardown(test_kill_first_worker, h_teardown),
		cmocka_unit_test_teardown(test_salt_and_geometry, h_teardown),
		cmocka_unit_test_teardown(test_nvme_shared, h_teardown),
		cmocka_unit_test_teardown(test_fork, h_teardown),
		cmocka_unit_test_teardown(test_restart_shared, h_teardown),
		cmocka_unit_test_teardown(test_cache_gives_way, h_teardown),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
