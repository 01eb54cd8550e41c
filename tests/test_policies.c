/* Tests for the retrieval policies (worker/kvcache/policy_streaming.c, policy_quest.c, policy_freekv.c
 * over policy_paged.c, recall.c and kv_writethrough.c; hardkv in test_hardkv.c, here only on the
 * device-memory backend and through attn_decode_slots) on the real stories260K model with
 * greedy decoding, each sequence over a host copy in the embedded store (hostkv.h):
 *   - while a sequence fits the budget every policy gives exactly `full`'s tokens and logits;
 *   - freekv with tau > 1 gives exactly quest's tokens and logits; so does freekv without
 *     speculation, and the recall ablations (per-token pieces, one staging buffer) change
 *     nothing in freekv's;
 *   - the debug invariants hold at every step of a long compressed generation;
 *   - correction rates order as tau says: 0 at tau 0, all heads above 1, between at 0.9;
 *   - a sequence resumed from its host copy continues token for token as an uninterrupted run
 *     (and with the same logits, except freekv, whose first step after a resume selects with
 *     the current query because the previous query is not kept);
 *   - decode attention goes through the backend's attn_decode_slots when it has the op, with
 *     exactly the results of attn_decode_heads;
 *   - the write-through from backend rows (store_rows, landing late as on a device; round_to)
 *     and its download fallback give exactly the CPU backend's results, and the former
 *     downloads no K/V rows in decode. */
#include "test_util.h"
#include "test_devmem.h"

#include <errno.h>
#include <math.h>
#include <unistd.h>

#include "engine.h"
#include "hostkv.h"

static struct fkv_model model;
static struct backend *be;
static struct hostkv *store;
static bool have_model;
static int seq_no;

enum { PROMPT = 16, VOCAB = 512 };

static int setup(void **state)
{
	(void)state;
	const char *path = test_model_path("stories260K/stories260K.gguf");
	if (!path)
		return 0;
	char err[256];
	if (model_load(path, &model, err, sizeof err)) {
		fprintf(stderr, "model_load: %s\n", err);
		return -1;
	}
	struct hostkv_opts ho = { .worker_name = "test_policies" };
	if (backend_cpu_new(&be, 2) || hostkv_open(&ho, &store, err, sizeof err)) {
		fprintf(stderr, "setup: %s\n", err);
		return -1;
	}
	have_model = true;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (!have_model)
		return 0;
	hostkv_close(store);
	backend_free(be);
	model_free(&model);
	return 0;
}

#define NEED_MODEL()                                                                           \
	do {                                                                                   \
		if (!have_model)                                                               \
			skip();                                                                \
	} while (0)

struct run {
	int32_t toks[512];
	float *logits; /* (steps + 1, VOCAB): the prefill's, then each decode step's */
	int steps;
	struct kv_stats st;
	struct kv_layer_stats ls[8];
};

static int argmax(const float *x)
{
	int b = 0;
	for (int i = 1; i < VOCAB; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

static void prompt_ids(int32_t *ids)
{
	uint64_t s = 4242;
	ids[0] = 1;
	for (int i = 1; i < PROMPT; i++)
		ids[i] = 3 + (int32_t)(test_rand(&s) % (VOCAB - 3));
}

static struct kv_policy_opts kvo(int p, int b, int s, int w, int fl, float tau, bool dbg)
{
	return (struct kv_policy_opts){ .page = p, .budget = b, .sink = s, .window = w,
					.full_layers = fl, .tau = tau, .debug_invariants = dbg };
}

static struct engine *new_engine(const char *policy, struct kv_policy_opts kv)
{
	struct engine_opts o = { .max_ctx = 512, .policy = policy, .kv = kv };
	struct engine *e;
	char err[256];
	if (engine_new(&e, &model, be, &o, err, sizeof err))
		fail_msg("engine_new %s: %s", policy, err);
	return e;
}

static struct hostkv_seq *open_host(struct engine *e, const char *name)
{
	struct kv_geom g;
	engine_kv_geom(e, &g);
	struct hostkv_seq *hs;
	char err[256];
	if (hostkv_seq_open(store, name, model.fingerprint, model.cfg.n_layers, &g, true, &hs, err,
			    sizeof err))
		fail_msg("hostkv_seq_open: %s", err);
	return hs;
}

/* Greedy: prefill PROMPT ids then `steps` decode steps; with_host opens a fresh host copy. */
static void gen(const char *policy, struct kv_policy_opts kv, int steps, bool with_host,
		struct run *r)
{
	struct engine *e = new_engine(policy, kv);
	char name[64], err[256];
	snprintf(name, sizeof name, "tp-%d", seq_no++);
	struct hostkv_seq *hs = with_host ? open_host(e, name) : NULL;
	int seq;
	if (engine_seq_open(e, hs, &seq, err, sizeof err))
		fail_msg("engine_seq_open %s: %s", policy, err);
	r->steps = steps;
	r->logits = malloc((size_t)(steps + 1) * VOCAB * sizeof *r->logits);
	assert_non_null(r->logits);
	prompt_ids(r->toks);
	if (engine_prefill(e, seq, r->toks, PROMPT, r->logits, false, err, sizeof err))
		fail_msg("prefill %s: %s", policy, err);
	for (int t = 0; t < steps; t++) {
		int32_t next = argmax(r->logits + (size_t)t * VOCAB);
		r->toks[PROMPT + t] = next;
		if (engine_decode(e, 1, &seq, &next, r->logits + (size_t)(t + 1) * VOCAB, err,
				  sizeof err))
			fail_msg("decode %s step %d: %s", policy, t, err);
	}
	assert_int_equal(engine_seq_stats(e, seq, &r->st), 0);
	for (int l = 0; l < model.cfg.n_layers; l++)
		assert_int_equal(engine_seq_layer_stats(e, seq, l, &r->ls[l]), 0);
	engine_seq_free(e, seq);
	if (hs)
		hostkv_seq_close(hs, true);
	engine_free(e);
}

static void expect_same(const struct run *a, const struct run *b, const char *what)
{
	for (int t = 0; t < PROMPT + a->steps; t++)
		if (a->toks[t] != b->toks[t])
			fail_msg("%s: token %d differs (%d vs %d)", what, t, a->toks[t], b->toks[t]);
	if (memcmp(a->logits, b->logits, (size_t)(a->steps + 1) * VOCAB * sizeof(float)))
		fail_msg("%s: logits differ", what);
}

static void test_fits_budget_equals_full(void **state)
{
	(void)state;
	NEED_MODEL();
	static const char *const pols[] = { "streaming", "quest", "freekv" };
	/* B = 256: pages leave the window and move into the selected slots; B = 512: never. */
	const int budgets[] = { 256, 512 };
	const int steps[] = { 256 - PROMPT, 200 };
	for (int b = 0; b < 2; b++) {
		struct run ref;
		gen("full", kvo(0, 0, 0, 0, 0, 0.9f, false), steps[b], true, &ref);
		for (int fl = 0; fl < 2; fl++)
			for (size_t i = 0; i < 3; i++) {
				struct run r;
				gen(pols[i], kvo(8, budgets[b], 8, 16, fl, 0.9f, true), steps[b], true,
				    &r);
				char what[64];
				snprintf(what, sizeof what, "%s B=%d full_layers=%d", pols[i],
					 budgets[b], fl);
				expect_same(&r, &ref, what);
				assert_int_equal(r.st.sum.steps, 0);
				assert_int_equal(r.st.sum.pages_recalled, 0);
				free(r.logits);
			}
		/* Streaming runs without a host copy too. */
		struct run r;
		gen("streaming", kvo(8, budgets[b], 8, 16, 0, 0.9f, false), steps[b], false, &r);
		expect_same(&r, &ref, "streaming without host");
		free(r.logits);
		free(ref.logits);
	}
}

/* The Fig. 8 ablations (docs/design.md §5 "Ablations"): freekv without speculation is quest's
 * step, exactly; per-token recall pieces and one staging buffer change how recalls move, not
 * what they bring: the same tokens and logits as the default. */
static void test_ablations(void **state)
{
	(void)state;
	NEED_MODEL();
	struct run q, f, a;
	gen("quest", kvo(8, 64, 8, 16, 1, 0.9f, false), 300, true, &q);
	struct kv_policy_opts o = kvo(8, 64, 8, 16, 1, 0.9f, false);
	o.no_speculation = true;
	gen("freekv", o, 300, true, &a);
	expect_same(&a, &q, "freekv --no-speculation vs quest");
	assert_int_equal(a.st.sum.corrections, a.st.sum.head_checks);
	free(a.logits);
	gen("freekv", kvo(8, 64, 8, 16, 1, 0.9f, false), 300, true, &f);
	assert_true(f.st.sum.corrections < f.st.sum.head_checks); /* speculation did run */
	for (int v = 1; v < 4; v++) {
		o = kvo(8, 64, 8, 16, 1, 0.9f, false);
		o.recall_fragmented = v & 1;
		o.recall_single_buffer = v & 2;
		gen("freekv", o, 300, true, &a);
		expect_same(&a, &f, "freekv with recall ablations vs freekv");
		free(a.logits);
	}
	free(q.logits);
	free(f.logits);
}

static void test_freekv_tau_above_one_is_quest(void **state)
{
	(void)state;
	NEED_MODEL();
	struct run q, f, full;
	gen("quest", kvo(8, 64, 8, 16, 1, 0.9f, false), 300, true, &q);
	gen("freekv", kvo(8, 64, 8, 16, 1, 2.0f, false), 300, true, &f);
	expect_same(&f, &q, "freekv tau 2 vs quest");
	assert_true(q.st.sum.steps > 0);
	assert_true(q.st.sum.pages_recalled > 0);
	assert_int_equal(f.st.sum.corrections, f.st.sum.head_checks);
	/* The budget is in force: some logit differs from full attention. */
	gen("full", kvo(0, 0, 0, 0, 0, 0.9f, false), 300, true, &full);
	assert_true(memcmp(q.logits, full.logits, 301 * VOCAB * sizeof(float)) != 0);
	free(q.logits);
	free(f.logits);
	free(full.logits);
}

static void test_invariants_long(void **state)
{
	(void)state;
	NEED_MODEL();
	static const char *const pols[] = { "streaming", "quest", "freekv" };
	for (size_t i = 0; i < 3; i++) {
		struct run r;
		gen(pols[i], kvo(8, 64, 8, 16, 1, 0.9f, true), 480, true, &r);
		const struct kv_layer_stats *s = &r.st.sum;
		/* Layers 1..4 retrieve at every step once the length passes B = 64. */
		int compressed = PROMPT + 480 - 64;
		assert_int_equal(s->steps, 4 * compressed);
		assert_int_equal(s->pages_selected, s->steps * 4 * 5); /* n_kv 4, k 5 */
		assert_int_equal(r.ls[0].steps, 0);
		if (i == 0) {
			assert_int_equal(s->pages_recalled, 0);
		} else {
			assert_true(s->pages_recalled > 0);
			assert_int_equal(s->bytes_recalled, s->pages_recalled * 2 * 8 * 8 * 4);
			/* Only changed pages: far fewer recalls than selections. */
			assert_true(s->pages_recalled < s->pages_selected / 2);
		}
		assert_true(r.st.device_bytes > 0);
		free(r.logits);
	}
}

static void test_correction_rates(void **state)
{
	(void)state;
	NEED_MODEL();
	const float taus[] = { 0.0f, 0.9f, 2.0f };
	double rate[3];
	int64_t hidden[3];
	for (int i = 0; i < 3; i++) {
		struct run r;
		gen("freekv", kvo(8, 64, 8, 16, 1, taus[i], true), 300, true, &r);
		assert_true(r.st.sum.head_checks > 0);
		rate[i] = kv_correction_rate(&r.st.sum);
		hidden[i] = r.st.sum.ns_recall_hidden;
		fprintf(stderr, "tau %.1f: correction rate %.3f, recalled %lld head-pages\n",
			taus[i], rate[i], (long long)r.st.sum.pages_recalled);
		free(r.logits);
	}
	assert_true(rate[0] == 0.0);
	assert_true(rate[1] > 0.0 && rate[1] < 1.0);
	assert_true(rate[2] == 1.0);
	/* Speculative recalls overlap the step; correcting every head leaves none to overlap. */
	assert_true(hidden[0] > 0);
	assert_true(hidden[2] == 0);
}

static void test_resume_continues_exactly(void **state)
{
	(void)state;
	NEED_MODEL();
	static const char *const pols[] = { "full", "streaming", "quest", "freekv" };
	enum { FIRST = 150, TOTAL = 250 };
	for (size_t i = 0; i < 4; i++) {
		struct kv_policy_opts kv = kvo(8, 64, 8, 16, 1, 0.9f, true);
		struct run ref;
		gen(pols[i], kv, TOTAL, true, &ref);

		struct engine *e = new_engine(pols[i], kv);
		char name[64], err[256];
		snprintf(name, sizeof name, "tp-resume-%zu", i);
		struct hostkv_seq *hs = open_host(e, name);
		int seq;
		float logits[VOCAB];
		int32_t toks[512];
		prompt_ids(toks);
		assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
		assert_int_equal(engine_prefill(e, seq, toks, PROMPT, logits, false, err, sizeof err),
				 0);
		for (int t = 0; t < FIRST; t++) {
			toks[PROMPT + t] = argmax(logits);
			assert_int_equal(engine_decode(e, 1, &seq, &toks[PROMPT + t], logits, err,
						       sizeof err), 0);
		}
		/* The next id is sampled and kept, then the worker's state is gone. */
		toks[PROMPT + FIRST] = argmax(logits);
		assert_int_equal(engine_seq_keep(e, seq, &toks[PROMPT + FIRST], 1, err, sizeof err),
				 0);
		engine_seq_free(e, seq);
		engine_free(e);

		e = new_engine(pols[i], kv);
		if (engine_seq_open(e, hs, &seq, err, sizeof err))
			fail_msg("%s: resume: %s", pols[i], err);
		assert_int_equal(engine_seq_len(e, seq), PROMPT + FIRST);
		for (int t = FIRST; t < TOTAL; t++) {
			assert_int_equal(engine_decode(e, 1, &seq, &toks[PROMPT + t], logits, err,
						       sizeof err), 0);
			if (toks[PROMPT + t] != ref.toks[PROMPT + t])
				fail_msg("%s: resumed token %d differs", pols[i], t);
			if (t + 1 < TOTAL)
				toks[PROMPT + t + 1] = argmax(logits);
		}
		/* freekv's first step after a resume selects with the current query (the previous
		 * one is not in the host copy), so only its tokens are bound to agree. */
		if (strcmp(pols[i], "freekv") &&
		    memcmp(logits, ref.logits + (size_t)TOTAL * VOCAB, sizeof logits))
			fail_msg("%s: resumed logits differ", pols[i]);
		engine_seq_free(e, seq);
		engine_free(e);
		hostkv_seq_close(hs, true);
		free(ref.logits);
	}
}

/* Prefill attends densely under every policy: a long prompt run in ubatches of 48 (so later
 * chunks read their past from the host copy once it outgrows the budget) gives exactly the
 * logits of `full` at every position. */
static void test_chunked_prefill_is_dense(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { N = 300 };
	static const char *const pols[] = { "full", "streaming", "quest", "freekv" };
	int32_t ids[N];
	uint64_t sd = 99;
	ids[0] = 1;
	for (int i = 1; i < N; i++)
		ids[i] = 3 + (int32_t)(test_rand(&sd) % (VOCAB - 3));
	float *ref = NULL;
	for (size_t i = 0; i < 4; i++) {
		struct engine_opts o = { .max_ctx = 512, .ubatch = 48, .policy = pols[i],
					 .kv = kvo(8, 64, 8, 16, 1, 0.9f, true) };
		struct engine *e;
		char err[256], name[64];
		assert_int_equal(engine_new(&e, &model, be, &o, err, sizeof err), 0);
		snprintf(name, sizeof name, "tp-chunk-%zu", i);
		struct hostkv_seq *hs = open_host(e, name);
		int seq;
		assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
		float *lg = malloc((size_t)N * VOCAB * sizeof *lg);
		assert_non_null(lg);
		if (engine_prefill(e, seq, ids, N, lg, true, err, sizeof err))
			fail_msg("%s: prefill: %s", pols[i], err);
		if (!ref)
			ref = lg;
		else if (memcmp(lg, ref, (size_t)N * VOCAB * sizeof *lg))
			fail_msg("%s: chunked prefill logits differ from full", pols[i]);
		/* And decoding goes on from there. */
		int32_t next = argmax(lg + (size_t)(N - 1) * VOCAB);
		float out[VOCAB];
		for (int t = 0; t < 20; t++) {
			assert_int_equal(engine_decode(e, 1, &seq, &next, out, err, sizeof err), 0);
			next = argmax(out);
		}
		if (lg != ref)
			free(lg);
		engine_seq_free(e, seq);
		hostkv_seq_close(hs, true);
		engine_free(e);
	}
	free(ref);
}

static void test_refusals(void **state)
{
	(void)state;
	NEED_MODEL();
	char err[256];
	int seq;
	/* Retrieval needs the host copy to recall from. */
	struct engine *e = new_engine("quest", kvo(8, 64, 8, 16, 1, 0.9f, false));
	assert_int_equal(engine_seq_new(e, &seq, err, sizeof err), -EINVAL);
	engine_free(e);
	/* Direct: restore needs a fresh state and a host copy. */
	const struct kv_policy_ops *P = kvcache_policy("freekv");
	assert_non_null(P);
	struct kv_seq_params p = {
		.be = be, .n_layers = 2, .attn = { 8, 4, 8, FKV_F32, 0.35f, 0 }, .max_tokens = 512,
		.opts = kvo(8, 60, 8, 16, 1, 0.9f, false),
	};
	void *st;
	assert_int_equal(P->create(&p, &st), -EINVAL); /* no host; budget not a page multiple */
	P = kvcache_policy("streaming");
	p.opts.budget = 64;
	assert_int_equal(P->create(&p, &st), 0);
	assert_int_equal(P->restore(st, 10), -EINVAL);
	assert_int_equal(P->step_begin(st, 513), -ENOSPC);
	assert_int_equal(P->step_begin(st, 0), -EINVAL);
	assert_int_equal(P->length(st), 0);
	P->destroy(st);
}

/* ---- a backend whose buffers the host cannot address: tests/test_devmem.h ---- */

/* ---- an offload that lands late ----
 * store_rows as a device runs it: the rows are taken at the call (later ops may overwrite
 * them), the host blocks written only at the next sync(), poison until then. A path that reads
 * or COMMITs the host copy without the fence sees the poison. */
struct dq_store {
	void *blocks[64];
	int t0, n, p, n_kv, d;
	enum fkv_dtype dt;
	float *k, *v; /* host copies of the rows */
};

static struct dq_store *dq;
static int dq_n, dq_cap;
static int64_t dq_calls, dq_downloads;

static int dq_store_rows(void *c, void *const *blocks, int t0, const float *k, const float *v,
			 int n, int p, int n_kv, int d, enum fkv_dtype dt)
{
	int nb = (t0 + n + p - 1) / p;
	assert_true(nb <= 64);
	if (dq_n == dq_cap) {
		dq_cap = dq_cap ? 2 * dq_cap : 64;
		dq = realloc(dq, (size_t)dq_cap * sizeof *dq);
		assert_non_null(dq);
	}
	struct dq_store *q = &dq[dq_n++];
	*q = (struct dq_store){ .t0 = t0, .n = n, .p = p, .n_kv = n_kv, .d = d, .dt = dt };
	memcpy(q->blocks, blocks, (size_t)nb * sizeof *blocks);
	size_t bytes = (size_t)n * n_kv * d * sizeof(float);
	q->k = malloc(bytes ? bytes : 1);
	q->v = malloc(bytes ? bytes : 1);
	assert_true(q->k && q->v);
	memcpy(q->k, dv(k), bytes);
	memcpy(q->v, dv(v), bytes);
	/* Until the fence the rows hold anything: poison, so that a read without one cannot
	 * pass on bytes an earlier sequence of the same tokens left in a reused pool block. */
	float *poison = malloc(bytes ? bytes : 1);
	assert_non_null(poison);
	for (size_t i = 0; i < bytes / sizeof *poison; i++)
		poison[i] = -1e30f;
	assert_int_equal(dm_real->store_rows(c, blocks, t0, poison, poison, n, p, n_kv, d, dt), 0);
	free(poison);
	dq_calls++;
	return 0;
}

static int dq_sync(void *c)
{
	for (int i = 0; i < dq_n; i++) {
		struct dq_store *q = &dq[i];
		int ret = dm_real->store_rows(c, q->blocks, q->t0, q->k, q->v, q->n, q->p, q->n_kv,
					       q->d, q->dt);
		assert_int_equal(ret, 0);
		free(q->k);
		free(q->v);
	}
	dq_n = 0;
	return 0;
}

static int dq_download(void *c, void *d, const void *s, size_t n)
{
	dq_downloads++;
	return dm_download(c, d, s, n);
}

/* A backend without the offload ops: the paged policies download rows and upload them. */
static int dl_store_rows(void *c, void *const *blocks, int t0, const float *k, const float *v,
			 int n, int p, int n_kv, int d, enum fkv_dtype dt)
{
	(void)c, (void)blocks, (void)t0, (void)k, (void)v, (void)n, (void)p, (void)n_kv, (void)d,
		(void)dt;
	return -EOPNOTSUPP;
}

/* Every policy on the devmem backend, past a small budget with the debug invariants on (slots
 * downloaded and compared with the host copy each step): logits bit-identical to the CPU
 * backend's, so the policies touch device memory only through ops (what the CUDA backend needs). */
static void test_device_memory_backend(void **state)
{
	(void)state;
	NEED_MODEL();
	static const char *const pols[] = { "full", "streaming", "quest", "freekv", "hardkv" };
	struct backend_ops ops;
	struct backend *cpu = be, dev = devmem_of(cpu, &ops);
	for (size_t i = 0; i < 5; i++) {
		struct run ref, r;
		struct kv_policy_opts kv = kvo(8, 64, 8, 16, 1, 0.9f, true);
		gen(pols[i], kv, 160, true, &ref);
		be = &dev;
		gen(pols[i], kv, 160, true, &r);
		be = cpu;
		char what[64];
		snprintf(what, sizeof what, "%s on devmem", pols[i]);
		expect_same(&r, &ref, what);
		if (i >= 2)
			assert_true(r.st.sum.pages_recalled > 0);
		if (i >= 1)
			assert_int_equal(r.st.sum.pages_recalled, ref.st.sum.pages_recalled);
		free(r.logits);
		free(ref.logits);
	}
}

/* On backend bw: a prefill without logits (no sync at its end but the engine's fence before
 * COMMIT); a fresh engine resumes it and decodes 30 greedy steps, the next token kept; another
 * resumes that and decodes 10 steps; lg gets the last logits. */
static struct engine *resume_engine(const char *policy, struct kv_policy_opts kv,
				    struct hostkv_seq *hs, int *seq)
{
	char err[256];
	struct engine *e = new_engine(policy, kv);
	if (engine_seq_open(e, hs, seq, err, sizeof err))
		fail_msg("resume %s: %s", policy, err);
	return e;
}

static void resume_on(const char *policy, struct kv_policy_opts kv, struct backend *bw,
		      const char *name, uint64_t seed, float *lg)
{
	struct backend *cpu = be;
	char err[256];
	int32_t toks[PROMPT];
	for (int i = 0; i < PROMPT; i++)
		toks[i] = 3 + (int32_t)(test_rand(&seed) % (VOCAB - 3));
	be = bw;
	struct engine *e = new_engine(policy, kv);
	struct hostkv_seq *hs = open_host(e, name);
	int seq;
	assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, seq, toks, PROMPT, NULL, false, err, sizeof err), 0);
	engine_seq_free(e, seq);
	engine_free(e);
	e = resume_engine(policy, kv, hs, &seq);
	int32_t next = toks[PROMPT - 1]; /* a resume runs the last kept token again */
	for (int t = 0; t < 30; t++) {
		if (engine_decode(e, 1, &seq, &next, lg, err, sizeof err))
			fail_msg("decode %s step %d: %s", policy, t, err);
		next = argmax(lg);
	}
	assert_int_equal(engine_seq_keep(e, seq, &next, 1, err, sizeof err), 0);
	engine_seq_free(e, seq);
	engine_free(e);
	e = resume_engine(policy, kv, hs, &seq);
	for (int t = 0; t < 10; t++) {
		assert_int_equal(engine_decode(e, 1, &seq, &next, lg, err, sizeof err), 0);
		next = argmax(lg);
	}
	engine_seq_free(e, seq);
	engine_free(e);
	hostkv_seq_close(hs, true);
	be = cpu;
}

/* The write-through from backend rows (kv_wt_put: store_rows; round_to on the slot rows) on the
 * devmem backend, every policy, debug invariants on and off: with the stores deferred to sync()
 * (as a device's offload stream lands them) and with store_rows refusing every block and no
 * round_to (the download fallback), tokens and logits equal the CPU backend's bit for bit. With
 * the debug checks off (no fence but the engine's before COMMIT) the deferred run downloads no
 * K/V rows in decode (logits, queries, prefill rows and the keys of pages that fill only), the
 * fallback two more per layer and step. A sequence written through deferred stores, kept and
 * resumed in a fresh engine continues as on the CPU backend: its host copy was complete at
 * COMMIT. */
static void test_offload_paths(void **state)
{
	(void)state;
	NEED_MODEL();
	static const char *const pols[] = { "full", "streaming", "quest", "freekv" };
	enum { STEPS = 64 };
	struct backend_ops dm, deferred, dl;
	struct backend *cpu = be;
	(void)devmem_of(cpu, &dm);
	deferred = dm;
	deferred.name = "deferred";
	deferred.store_rows = dq_store_rows;
	deferred.sync = dq_sync;
	deferred.download = dq_download;
	dl = dm;
	dl.name = "download";
	dl.store_rows = dl_store_rows;
	dl.round_to = NULL;
	dl.download = dq_download;
	struct backend bq = { .ops = &deferred, .ctx = cpu->ctx };
	struct backend bd = { .ops = &dl, .ctx = cpu->ctx };
	const int64_t L = model.cfg.n_layers;
	for (size_t i = 0; i < 4; i++)
		for (int dbg = 1; dbg >= 0; dbg--) {
			struct kv_policy_opts kv = kvo(8, 64, 8, 16, 1, 0.9f, dbg);
			struct run ref, rq, rd;
			char what[96];
			gen(pols[i], kv, STEPS, true, &ref);
			dq_calls = dq_downloads = 0;
			be = &bq;
			gen(pols[i], kv, STEPS, true, &rq);
			be = cpu;
			int64_t q_dl = dq_downloads;
			assert_true(dq_calls >= STEPS * L);
			assert_int_equal(dq_n, 0);
			if (i)
				assert_true(rq.st.sum.steps > 0); /* the budget was exceeded */
			dq_downloads = 0;
			be = &bd;
			gen(pols[i], kv, STEPS, true, &rd);
			be = cpu;
			snprintf(what, sizeof what, "%s debug %d: deferred stores", pols[i], dbg);
			expect_same(&rq, &ref, what);
			snprintf(what, sizeof what, "%s debug %d: download fallback", pols[i], dbg);
			expect_same(&rd, &ref, what);
			if (!dbg) {
				/* logits; each paged layer's query (host-side selection); prefill
				 * rows; the keys of pages that fill */
				int64_t bound = (STEPS + 1) * (1 + L) + 2 * L +
						((PROMPT + STEPS) / 8 + 1) * L;
				if (q_dl > bound || dq_downloads - q_dl < 2 * L * STEPS)
					fail_msg("%s: %lld downloads with store_rows (at most %lld), "
						 "%lld without", pols[i], (long long)q_dl,
						 (long long)bound, (long long)dq_downloads);
			}
			free(ref.logits);
			free(rq.logits);
			free(rd.logits);
		}
	static const char *const resumed[] = { "full", "quest" };
	for (size_t i = 0; i < 2; i++) {
		struct kv_policy_opts kv = kvo(8, 64, 8, 16, 1, 0.9f, false);
		float a[VOCAB], b[VOCAB];
		char name[64];
		/* Deferred first, on a prompt no earlier sequence had: pool blocks freed by a run of
		 * the same prompt would hold the very bytes a missing fence leaves unwritten. */
		snprintf(name, sizeof name, "tp-offload-deferred-%zu", i);
		resume_on(resumed[i], kv, &bq, name, 777 + i, b);
		snprintf(name, sizeof name, "tp-offload-cpu-%zu", i);
		resume_on(resumed[i], kv, cpu, name, 777 + i, a);
		assert_memory_equal(a, b, sizeof a);
	}
	free(dq);
	dq = NULL;
	dq_cap = 0;
}

/* ---- which decode op the paged policies call ----
 * The CPU backend with its two per-head decode ops counted (test code around the real ops). */
static const struct backend_ops *cnt_real;
static int64_t cnt_slots, cnt_heads;

static int cnt_attn_decode_slots(void *c, float *o, const float *q, const void *slots,
				 int n_slots, const int32_t *list, int max_pages,
				 const int32_t *n_tok, int p, const struct backend_attn *a)
{
	cnt_slots++;
	return cnt_real->attn_decode_slots(c, o, q, slots, n_slots, list, max_pages, n_tok, p, a);
}

/* The engine's batch-wide decode attention: its slot items counted as slot calls (and the
 * batches), then the real op. */
static int64_t cnt_batches;

static int cnt_attn_decode_batch(void *c, float *o, const float *q,
				 const struct backend_attn_item *items, int n)
{
	cnt_batches++;
	for (int i = 0; i < n; i++)
		cnt_slots += items[i].slots != NULL;
	return cnt_real->attn_decode_batch(c, o, q, items, n);
}

static int cnt_attn_decode_heads(void *c, float *o, const float *q,
				 const struct backend_kv_span *s, const int *first,
				 const struct backend_attn *a)
{
	cnt_heads++;
	return cnt_real->attn_decode_heads(c, o, q, s, first, a);
}

/* Three sequences of different lengths, each with its own host copy, decoded together for
 * steps steps on backend bw: their logits (steps, 3, VOCAB), malloc'd. */
static float *gen_three(const char *policy, struct kv_policy_opts kv, int steps, struct backend *bw)
{
	enum { NS = 3 };
	static const int lens[NS] = { PROMPT, PROMPT - 7, PROMPT - 3 };
	struct backend *cpu = be;
	be = bw;
	struct engine *e = new_engine(policy, kv);
	be = cpu;
	struct hostkv_seq *hs[NS];
	int seqs[NS];
	int32_t next[NS];
	char name[64], err[256];
	float *lg = malloc((size_t)(steps + 1) * NS * VOCAB * sizeof *lg);
	assert_non_null(lg);
	for (int i = 0; i < NS; i++) {
		int32_t ids[PROMPT];
		prompt_ids(ids);
		ids[1] = 3 + 11 * i; /* the prompts differ */
		snprintf(name, sizeof name, "tp-three-%d", seq_no++);
		hs[i] = open_host(e, name);
		if (engine_seq_open(e, hs[i], &seqs[i], err, sizeof err) ||
		    engine_prefill(e, seqs[i], ids, lens[i], lg + (size_t)i * VOCAB, false, err,
				   sizeof err))
			fail_msg("%s sequence %d: %s", policy, i, err);
	}
	for (int t = 0; t < steps; t++) {
		for (int i = 0; i < NS; i++)
			next[i] = argmax(lg + ((size_t)t * NS + i) * VOCAB);
		if (engine_decode(e, NS, seqs, next, lg + (size_t)(t + 1) * NS * VOCAB, err,
				  sizeof err))
			fail_msg("%s step %d: %s", policy, t, err);
	}
	for (int i = 0; i < NS; i++) {
		engine_seq_free(e, seqs[i]);
		hostkv_seq_close(hs[i], true);
	}
	engine_free(e);
	return lg;
}

/* A decode batch of several sequences of every paged policy (and full) gives, through the
 * engine's one attn_decode_batch per layer, the logits of one attention call per sequence bit
 * for bit (the CPU op runs exactly those calls: what this holds is the policies' split of
 * attend around the batch), past the budget, with the debug invariants on. */
static void test_batched_decode_attention(void **state)
{
	(void)state;
	NEED_MODEL();
	static const char *const pols[] = { "full", "streaming", "quest", "freekv", "hardkv" };
	const struct kv_policy_opts kv = kvo(8, 64, 8, 16, 1, 0.9f, true);
	enum { STEPS = 90 };
	struct backend *cpu = be;
	cnt_real = cpu->ops;
	struct backend_ops with = *cpu->ops, single;
	with.attn_decode_slots = cnt_attn_decode_slots;
	with.attn_decode_heads = cnt_attn_decode_heads;
	with.attn_decode_batch = cnt_attn_decode_batch;
	single = with;
	single.attn_decode_batch = NULL;
	struct backend bw = { .ops = &with, .ctx = cpu->ctx };
	struct backend b1 = { .ops = &single, .ctx = cpu->ctx };
	for (size_t i = 0; i < sizeof pols / sizeof *pols; i++) {
		const bool paged = i > 0;
		cnt_slots = cnt_heads = cnt_batches = 0;
		float *a = gen_three(pols[i], kv, STEPS, &bw);
		assert_int_equal(cnt_batches, (int64_t)STEPS * model.cfg.n_layers);
		assert_int_equal(cnt_slots, paged ? (int64_t)3 * STEPS *
							    (model.cfg.n_layers - kv.full_layers)
						  : 0);
		assert_int_equal(cnt_heads, 0);
		cnt_slots = cnt_batches = 0;
		float *b = gen_three(pols[i], kv, STEPS, &b1);
		assert_int_equal(cnt_batches, 0);
		if (memcmp(a, b, (size_t)(STEPS + 1) * 3 * VOCAB * sizeof *a))
			fail_msg("%s: batched decode attention changes the logits", pols[i]);
		free(a);
		free(b);
	}
}

/* Every decode step of every paged policy at every retrieval layer goes through
 * attn_decode_slots when the backend has it (before the budget is exceeded, compressed, with
 * the window ring wrapping, keeping recent pages for streaming, and after a resume from the
 * host copy), with the debug invariants checking the slot lists the op reads: as slot items
 * of the engine's one attn_decode_batch per layer, or without that op one attn_decode_slots
 * call each; a backend without the slots op runs attn_decode_heads instead. All three give the
 * same tokens and logits bit for bit. */
static void test_decode_goes_through_slots(void **state)
{
	(void)state;
	NEED_MODEL();
	static const char *const pols[] = { "streaming", "quest", "freekv", "hardkv" };
	const struct kv_policy_opts geoms[] = { kvo(8, 64, 8, 16, 1, 0.9f, true),
						kvo(4, 48, 4, 12, 0, 0.9f, true) };
	enum { STEPS = 120 };
	struct backend *cpu = be;
	cnt_real = cpu->ops;
	assert_non_null(cnt_real->attn_decode_slots);
	struct backend_ops with = *cpu->ops, without, single;
	with.name = "counted";
	with.attn_decode_slots = cnt_attn_decode_slots;
	with.attn_decode_heads = cnt_attn_decode_heads;
	with.attn_decode_batch = cnt_attn_decode_batch;
	without = single = with;
	without.attn_decode_slots = NULL;
	single.attn_decode_batch = NULL;
	struct backend bw = { .ops = &with, .ctx = cpu->ctx };
	struct backend bo = { .ops = &without, .ctx = cpu->ctx };
	struct backend b1 = { .ops = &single, .ctx = cpu->ctx };
	for (size_t gi = 0; gi < 2; gi++)
		for (size_t i = 0; i < 4; i++) {
			const int64_t calls =
				(int64_t)STEPS * (model.cfg.n_layers - geoms[gi].full_layers);
			struct run rs, rh, r1;
			cnt_slots = cnt_heads = cnt_batches = 0;
			be = &bw;
			gen(pols[i], geoms[gi], STEPS, true, &rs);
			be = cpu;
			assert_int_equal(cnt_slots, calls);
			assert_int_equal(cnt_heads, 0);
			/* one a layer and step, the full layers' dense item included */
			assert_int_equal(cnt_batches, (int64_t)STEPS * model.cfg.n_layers);
			assert_true(rs.st.sum.steps > 0); /* the budget was exceeded */
			cnt_slots = cnt_heads = cnt_batches = 0;
			be = &b1;
			gen(pols[i], geoms[gi], STEPS, true, &r1);
			be = cpu;
			assert_int_equal(cnt_slots, calls);
			assert_int_equal(cnt_batches, 0);
			char what1[64];
			snprintf(what1, sizeof what1, "%s geometry %zu: batched vs single", pols[i],
				 gi);
			expect_same(&rs, &r1, what1);
			free(r1.logits);
			cnt_slots = cnt_heads = 0;
			be = &bo;
			gen(pols[i], geoms[gi], STEPS, true, &rh);
			be = cpu;
			assert_int_equal(cnt_slots, 0);
			assert_int_equal(cnt_heads, calls);
			char what[64];
			snprintf(what, sizeof what, "%s geometry %zu: slots vs heads", pols[i], gi);
			expect_same(&rs, &rh, what);
			free(rs.logits);
			free(rh.logits);
		}
	/* Resumed sequences: their pages placed from the host copy (two identical copies, one
	 * resumed on each backend), then decoded. */
	const struct kv_policy_opts kv = geoms[0];
	float lg[2][VOCAB];
	for (int pass = 0; pass < 2; pass++) {
		char name[64], err[256];
		snprintf(name, sizeof name, "tp-slots-resume-%d", pass);
		struct engine *e = new_engine("quest", kv);
		struct hostkv_seq *hs = open_host(e, name);
		int seq;
		int32_t toks[PROMPT + 81];
		prompt_ids(toks);
		assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
		assert_int_equal(engine_prefill(e, seq, toks, PROMPT, lg[pass], false, err,
						sizeof err), 0);
		for (int t = 0; t <= 80; t++) {
			toks[PROMPT + t] = argmax(lg[pass]);
			if (t < 80)
				assert_int_equal(engine_decode(e, 1, &seq, &toks[PROMPT + t], lg[pass],
							       err, sizeof err), 0);
		}
		assert_int_equal(engine_seq_keep(e, seq, &toks[PROMPT + 80], 1, err, sizeof err),
				 0);
		engine_seq_free(e, seq);
		engine_free(e);
		be = pass ? &bo : &bw;
		e = new_engine("quest", kv);
		cnt_slots = cnt_heads = 0;
		if (engine_seq_open(e, hs, &seq, err, sizeof err))
			fail_msg("resume: %s", err);
		int32_t next = toks[PROMPT + 80];
		for (int t = 0; t < 10; t++) {
			assert_int_equal(engine_decode(e, 1, &seq, &next, lg[pass], err, sizeof err),
					 0);
			next = argmax(lg[pass]);
		}
		be = cpu;
		engine_seq_free(e, seq);
		engine_free(e);
		hostkv_seq_close(hs, true);
		const int64_t calls = 10 * (model.cfg.n_layers - kv.full_layers);
		assert_int_equal(pass ? cnt_heads : cnt_slots, calls);
		assert_int_equal(pass ? cnt_slots : cnt_heads, 0);
	}
	assert_memory_equal(lg[0], lg[1], sizeof lg[0]);
}

/* One decode token at layer l from fresh random rows in [-1, 1): kv (n_kv * d) K and V values,
 * qn (n_q * d) query values, uploaded into k, v, q; returns what attend returned. */
static int random_layer(const struct kv_policy_ops *P, void *st, int l, float *k, float *v,
			float *q, float *out, int kv, int qn, uint64_t *rs)
{
	const struct backend_ops *o = be->ops;
	float *h = malloc((size_t)(2 * kv + qn) * sizeof *h);
	assert_non_null(h);
	for (int i = 0; i < 2 * kv + qn; i++)
		h[i] = test_randf(rs) * 2.0f - 1.0f;
	assert_int_equal(o->upload(be->ctx, k, h, (size_t)kv * sizeof *h), 0);
	assert_int_equal(o->upload(be->ctx, v, h + kv, (size_t)kv * sizeof *h), 0);
	assert_int_equal(o->upload(be->ctx, q, h + 2 * kv, (size_t)qn * sizeof *h), 0);
	free(h);
	assert_int_equal(P->append(st, l, k, v, 1), 0);
	return P->attend(st, l, out, q, 1);
}

/* A model with more layers than the recall stream's job ring had entries (64): with tau 0 every
 * retrieval layer leaves a speculative recall in flight until the next step, so the ring must
 * hold one per layer or submitting the 65th blocks forever (a watchdog alarm fails the test
 * instead of hanging it). Direct policy API on synthetic f32 rows, debug invariants on. */
static void test_many_layers_in_flight(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { NL = 80, NQ = 2, NKV = 1, D = 8, STEPS = 40 };
	const struct kv_policy_ops *P = kvcache_policy("freekv");
	struct kv_geom g = { .n_kv = NKV, .p = 4, .d = D, .dtype = FKV_F32 };
	struct hostkv_seq *hs;
	char err[256];
	if (hostkv_seq_open(store, "tp-many-layers", model.fingerprint, NL, &g, true, &hs, err,
			    sizeof err))
		fail_msg("hostkv_seq_open: %s", err);
	struct kv_seq_params p = {
		.be = be, .n_layers = NL, .attn = { NQ, NKV, D, FKV_F32, 0.35f, 0 },
		.max_tokens = 256, .opts = kvo(4, 16, 4, 4, 1, 0.0f, true), .host = hs,
	};
	void *st;
	assert_int_equal(P->create(&p, &st), 0);
	const struct backend_ops *o = be->ops;
	float *k = o->buf_alloc(be->ctx, NKV * D * sizeof *k);
	float *v = o->buf_alloc(be->ctx, NKV * D * sizeof *v);
	float *q = o->buf_alloc(be->ctx, NQ * D * sizeof *q);
	float *out = o->buf_alloc(be->ctx, NQ * D * sizeof *out);
	assert_true(k && v && q && out);
	uint64_t rs = 99;
	alarm(60);
	for (int t = 0; t < STEPS; t++) {
		assert_int_equal(P->step_begin(st, 1), 0);
		for (int l = 0; l < NL; l++)
			assert_int_equal(random_layer(P, st, l, k, v, q, out, NKV * D, NQ * D, &rs), 0);
		P->step_end(st);
	}
	alarm(0);
	struct kv_stats ks;
	P->stats(st, &ks);
	assert_int_equal(ks.tokens, STEPS);
	assert_true(ks.sum.pages_recalled > 0);
	P->destroy(st);
	o->buf_free(be->ctx, k);
	o->buf_free(be->ctx, v);
	o->buf_free(be->ctx, q);
	o->buf_free(be->ctx, out);
	hostkv_seq_close(hs, true);
}

/* The debug invariants are live: a slot that no longer matches its page in the host copy (here
 * the host copy of an attended sink page is changed behind the policy's back) fails the step
 * with -EIO, for every retrieval policy, before and after the budget is exceeded. */
static void test_invariants_catch_divergence(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { NL = 2, NQ = 4, NKV = 2, D = 8 };
	static const char *const pols[] = { "streaming", "quest", "freekv" };
	struct kv_geom g = { .n_kv = NKV, .p = 4, .d = D, .dtype = FKV_F32 };
	const struct backend_ops *o = be->ops;
	float *k = o->buf_alloc(be->ctx, NKV * D * sizeof *k);
	float *v = o->buf_alloc(be->ctx, NKV * D * sizeof *v);
	float *q = o->buf_alloc(be->ctx, NQ * D * sizeof *q);
	float *out = o->buf_alloc(be->ctx, NQ * D * sizeof *out);
	assert_true(k && v && q && out);
	for (int pi = 0; pi < 3; pi++)
		for (int steps = 6; steps <= 30; steps += 24) {
			char name[64], err[256];
			snprintf(name, sizeof name, "tp-div-%d-%d", pi, steps);
			struct hostkv_seq *hs;
			if (hostkv_seq_open(store, name, model.fingerprint, NL, &g, true, &hs, err,
					    sizeof err))
				fail_msg("hostkv_seq_open: %s", err);
			const struct kv_policy_ops *P = kvcache_policy(pols[pi]);
			struct kv_seq_params p = {
				.be = be, .n_layers = NL, .attn = { NQ, NKV, D, FKV_F32, 0.35f, 0 },
				.max_tokens = 256, .opts = kvo(4, 16, 4, 4, 1, 0.9f, true), .host = hs,
			};
			void *st;
			assert_int_equal(P->create(&p, &st), 0);
			uint64_t rs = 7;
			int ret = 0;
			for (int t = 0; t <= steps && !ret; t++) {
				if (t == steps) {
					void *block;
					assert_int_equal(hostkv_block(hs, 1, 0, &block, err, sizeof err), 0);
					((float *)block)[1] += 1.0f; /* head 0, K row 0 of sink page 0 */
				}
				assert_int_equal(P->step_begin(st, 1), 0);
				for (int l = 0; l < NL && !ret; l++)
					ret = random_layer(P, st, l, k, v, q, out, NKV * D, NQ * D, &rs);
				if (!ret)
					P->step_end(st);
				else if (t < steps)
					fail_msg("%s: step %d failed before the corruption", pols[pi], t);
			}
			if (ret != -EIO)
				fail_msg("%s after %d steps: divergence not caught (%d)", pols[pi], steps,
					 ret);
			P->destroy(st);
			hostkv_seq_close(hs, true);
		}
	o->buf_free(be->ctx, k);
	o->buf_free(be->ctx, v);
	o->buf_free(be->ctx, q);
	o->buf_free(be->ctx, out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fits_budget_equals_full),
		cmocka_unit_test(test_freekv_tau_above_one_is_quest),
		cmocka_unit_test(test_ablations),
		cmocka_unit_test(test_invariants_long),
		cmocka_unit_test(test_correction_rates),
		cmocka_unit_test(test_resume_continues_exactly),
		cmocka_unit_test(test_chunked_prefill_is_dense),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_device_memory_backend),
		cmocka_unit_test(test_offload_paths),
		cmocka_unit_test(test_decode_goes_through_slots),
		cmocka_unit_test(test_batched_decode_attention),
		cmocka_unit_test(test_many_layers_in_flight),
		cmocka_unit_test(test_invariants_catch_divergence),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
