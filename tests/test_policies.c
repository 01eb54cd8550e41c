/* Tests for the retrieval policies (worker/policy_streaming.c, policy_quest.c, policy_freekv.c
 * over policy_paged.c, recall.c and kv_writethrough.c) on the real stories260K model with
 * greedy decoding, each sequence over a host copy in the embedded store (hostkv.h):
 *   - while a sequence fits the budget every policy gives exactly `full`'s tokens and logits;
 *   - freekv with tau > 1 gives exactly quest's tokens and logits;
 *   - the debug invariants hold at every step of a long compressed generation;
 *   - correction rates order as tau says: 0 at tau 0, all heads above 1, between at 0.9;
 *   - a sequence resumed from its host copy continues token for token as an uninterrupted run
 *     (and with the same logits, except freekv, whose first step after a resume selects with
 *     the current query because the previous query is not kept). */
#include "test_util.h"

#include <errno.h>
#include <math.h>

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fits_budget_equals_full),
		cmocka_unit_test(test_freekv_tau_above_one_is_quest),
		cmocka_unit_test(test_invariants_long),
		cmocka_unit_test(test_correction_rates),
		cmocka_unit_test(test_resume_continues_exactly),
		cmocka_unit_test(test_chunked_prefill_is_dense),
		cmocka_unit_test(test_refusals),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
