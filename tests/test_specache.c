/* Tests for the `specache` policy (worker/kvcache/policy_specache.c, specache_fetch.c) and the
 * engine's speculative steps (worker/engine/engine.c forward_spec), on the real stories260K
 * model with greedy decoding, each sequence over a host copy in the embedded store:
 *   - a float64 reference of the whole policy (test_specache_ref.h) agrees with it on the rows
 *     fetched for every step, layer and KV head, on every token and on every speculative
 *     token, for 160 decode steps (p 8, W 16, k 16, 2 bits; and 1 bit), with the debug
 *     invariants checked at every step (residual, KIVI copy and exact rows against the host
 *     copy);
 *   - limiting cases: a residual window covering the context, or k covering it, gives exactly
 *     `full`'s tokens and logits (full fed the same way: the last prompt token as a decode
 *     step);
 *   - a prompt prefilled in ubatches reads its past exactly (from the host copy once it is
 *     quantised): the prompt's logits equal full's bit for bit;
 *   - a resumed sequence continues token for token as an uninterrupted run (the restored copy
 *     is exact, the debug invariants check it; the first step after a resume is a pre-step,
 *     so only tokens are bound to agree, and only while no near-tie flips: of 17 resume points
 *     from 20 to 340 tried, one diverged, 89 steps after its resume);
 *   - two sequences decoded in one batch give the tokens each gives alone;
 *   - the counters (rows fetched, speculative hits, device bytes) and the refusals;
 *   - specache_topk against a selection by sorting. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "engine.h"
#include "hostkv.h"
#include "specache.h"
#include "test_specache_ref.h"

static struct fkv_model model;
static struct backend *be;
static struct hostkv *store;
static bool have_model;
static int seq_no;

enum { PROMPT = 16, VOCAB = 512, CTX = 512 };

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
	struct hostkv_opts ho = { .worker_name = "test_specache" };
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

static int argmax(const float *x)
{
	int b = 0;
	for (int i = 1; i < VOCAB; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

static void prompt_ids(int32_t *ids, uint64_t s)
{
	ids[0] = 1;
	for (int i = 1; i < PROMPT; i++)
		ids[i] = 3 + (int32_t)(test_rand(&s) % (VOCAB - 3));
}

/* page p, window W, k, bits, full layers; budget and sink are not specache's. */
static struct kv_policy_opts kvo(int p, int w, int k, int bits, int fl, bool dbg)
{
	return (struct kv_policy_opts){ .page = p, .budget = CTX + 2 * p, .sink = 0,
					.window = w, .full_layers = fl, .tau = 0.9f,
					.kv_bits = bits, .spec_topk = k, .debug_invariants = dbg };
}

static struct engine *new_engine(const char *policy, struct kv_policy_opts kv, int ubatch)
{
	struct engine_opts o = { .max_ctx = CTX, .policy = policy, .kv = kv, .ubatch = ubatch };
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

struct run {
	int32_t toks[CTX];
	float *logits; /* (steps + 1, VOCAB): the last prompt token's, then each decode step's */
	int steps;
	struct kv_stats st;
	struct engine_spec_stats spec;
};

/* Greedy: the prompt, then `steps` decode steps. split: the prompt's last token goes in as a
 * decode step (how specache runs it; for `full`, the same shapes of computation). */
static void gen(const char *policy, struct kv_policy_opts kv, int steps, bool split, uint64_t ps,
		struct run *r)
{
	struct engine *e = new_engine(policy, kv, 0);
	char name[64], err[256];
	snprintf(name, sizeof name, "ts-%d", seq_no++);
	struct hostkv_seq *hs = open_host(e, name);
	int seq;
	if (engine_seq_open(e, hs, &seq, err, sizeof err))
		fail_msg("engine_seq_open %s: %s", policy, err);
	r->steps = steps;
	r->logits = malloc((size_t)(steps + 1) * VOCAB * sizeof *r->logits);
	assert_non_null(r->logits);
	prompt_ids(r->toks, ps);
	int first = split ? PROMPT - 1 : PROMPT;
	if (engine_prefill(e, seq, r->toks, first, r->logits, false, err, sizeof err) ||
	    (split && engine_decode(e, 1, &seq, &r->toks[PROMPT - 1], r->logits, err, sizeof err)))
		fail_msg("prompt %s: %s", policy, err);
	for (int t = 0; t < steps; t++) {
		int32_t next = argmax(r->logits + (size_t)t * VOCAB);
		r->toks[PROMPT + t] = next;
		if (engine_decode(e, 1, &seq, &next, r->logits + (size_t)(t + 1) * VOCAB, err,
				  sizeof err))
			fail_msg("decode %s step %d: %s", policy, t, err);
	}
	assert_int_equal(engine_seq_stats(e, seq, &r->st), 0);
	assert_int_equal(engine_seq_spec_stats(e, seq, &r->spec), 0);
	engine_seq_free(e, seq);
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

static void test_topk(void **state)
{
	(void)state;
	uint64_t s = 77;
	float p[300];
	double pd[300];
	int32_t got[64], want[64], heap[64];
	static const int ks[] = { 1, 5, 16, 64 };
	for (int it = 0; it < 400; it++) {
		const int n = 1 + (int)(test_rand(&s) % 300), k = ks[it % 4];
		/* Few distinct values: many ties. */
		for (int i = 0; i < n; i++)
			pd[i] = p[i] = (float)(test_rand(&s) % 7) / 7.0f;
		int a = specache_topk(p, n, k, got, heap), b = sref_topk(pd, n, k, want);
		assert_int_equal(a, b);
		if (memcmp(got, want, (size_t)a * sizeof *got))
			fail_msg("top-%d of %d values differs from the selection by sorting", k, n);
	}
}

/* The engine against the float64 reference, step by step: fetched rows, tokens, speculative
 * tokens. */
static void check_reference(int bits, int steps)
{
	const int P = 8, W = 16, K = 16, FL = 1;
	const int L = model.cfg.n_layers, KV = model.cfg.n_kv_heads;
	struct engine *e = new_engine("specache", kvo(P, W, K, bits, FL, true), 0);
	char name[64], err[256];
	snprintf(name, sizeof name, "ts-ref-%d", seq_no++);
	struct hostkv_seq *hs = open_host(e, name);
	int seq;
	assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
	struct sref r;
	sref_init(&r, &model, P, W, K, bits, FL, CTX);
	int32_t toks[CTX], got[64];
	float logits[VOCAB];
	prompt_ids(toks, 4242);
	for (int t = 0; t < PROMPT - 1; t++)
		sref_dense(&r, toks[t]);
	int32_t spec = 0, ran, hits = 0;
	double worst = 0;
	for (int t = 0; t <= steps; t++) {
		const int pos = PROMPT - 1 + t;
		if (t == 0)
			assert_int_equal(engine_prefill(e, seq, toks, PROMPT, logits, false, err,
							sizeof err), 0);
		else
			assert_int_equal(engine_decode(e, 1, &seq, &toks[pos], logits, err,
						       sizeof err), 0);
		if (t > 0)
			hits += toks[pos] == ran;
		spec = sref_step(&r, toks[pos], spec, t == 0, &ran);
		void *st = engine_seq_policy(e, seq);
		for (int l = FL; l < L; l++)
			for (int h = 0; h < KV; h++) {
				const int n = specache_fetched(st, l, h, got);
				const int32_t *want = r.F + ((size_t)l * KV + h) * K;
				if (n != r.nF[l * KV + h] || memcmp(got, want, (size_t)n * sizeof *got))
					fail_msg("bits %d step %d layer %d head %d: fetched rows differ "
						 "from the float64 reference (%d vs %d rows)", bits, t,
						 l, h, n, r.nF[l * KV + h]);
			}
		double e2 = 0, m2 = 0;
		for (int i = 0; i < VOCAB; i++) {
			e2 = fmax(e2, fabs(logits[i] - r.logits[0][i]));
			m2 = fmax(m2, fabs(r.logits[0][i]));
		}
		worst = fmax(worst, e2 / m2);
		const int32_t next = argmax(logits);
		if (next != sref_argmax(r.logits[0], VOCAB))
			fail_msg("bits %d step %d: token differs from the float64 reference", bits, t);
		toks[pos + 1] = next;
	}
	struct engine_spec_stats sp;
	assert_int_equal(engine_seq_spec_stats(e, seq, &sp), 0);
	assert_int_equal(sp.checked, steps);
	assert_int_equal(sp.hits, hits); /* and so the speculative tokens agreed */
	assert_true(hits > 0 && hits < steps);
	/* The rows really were the mix: positions below tq were quantised. */
	assert_true(r.tq >= PROMPT + steps - W - P);
	fprintf(stderr, "specache bits %d: %d steps agree with float64 (logits error %.2g, "
		"speculative hits %d)\n", bits, steps, worst, hits);
	assert_true(worst < 1e-4);
	sref_free(&r);
	engine_seq_free(e, seq);
	hostkv_seq_close(hs, true);
	engine_free(e);
}

static void test_reference_agrees(void **state)
{
	(void)state;
	NEED_MODEL();
	check_reference(2, 160);
	check_reference(1, 160);
}

static void test_window_covers_context_is_full(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 300 };
	for (int fl = 0; fl < 2; fl++) {
		struct run ref, r;
		gen("full", kvo(8, 16, 16, 2, fl, false), STEPS, true, 9, &ref);
		gen("specache", kvo(8, CTX, 16, 2, fl, true), STEPS, false, 9, &r);
		expect_same(&r, &ref, "specache window >= context");
		assert_int_equal(r.st.sum.tokens_fetched, 0);
		assert_int_equal(r.st.sum.steps, 0);
		free(r.logits);
		free(ref.logits);
	}
}

static void test_topk_covers_context_is_full(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 300 };
	struct run ref;
	gen("full", kvo(8, 16, 16, 2, 1, false), STEPS, true, 11, &ref);
	for (int bits = 1; bits <= 2; bits++) {
		struct run r;
		gen("specache", kvo(8, 16, CTX, bits, 1, bits == 2), STEPS, false, 11, &r);
		expect_same(&r, &ref, "specache k >= context");
		/* Every quantised position was read from an exact row, fetched once. */
		assert_true(r.st.sum.steps > 0);
		assert_true(r.st.sum.tokens_fetched > 0);
		free(r.logits);
	}
	free(ref.logits);
}

/* A 300-token prompt in ubatches of 48: later chunks read positions below tq from the host
 * copy. Every prompt row but the last (a decode step) equals full's with the same chunks: full
 * prefills the first 299 tokens and decodes the last, as specache runs them (a product's rows
 * may depend on how many run together: BLAS kernels vary with the row count). */
static void test_chunked_prefill_is_exact(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { N = 300 };
	int32_t ids[N];
	uint64_t s = 5;
	ids[0] = 1;
	for (int i = 1; i < N; i++)
		ids[i] = 3 + (int32_t)(test_rand(&s) % (VOCAB - 3));
	float *lg[2];
	for (int pass = 0; pass < 2; pass++) {
		struct engine *e = new_engine(pass ? "specache" : "full", kvo(8, 16, 16, 2, 1, pass),
					      48);
		char name[64], err[256];
		snprintf(name, sizeof name, "ts-chunk-%d", seq_no++);
		struct hostkv_seq *hs = open_host(e, name);
		int seq;
		assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
		lg[pass] = malloc((size_t)N * VOCAB * sizeof *lg[pass]);
		assert_non_null(lg[pass]);
		if (pass)
			assert_int_equal(engine_prefill(e, seq, ids, N, lg[pass], true, err,
							sizeof err), 0);
		else
			assert_true(!engine_prefill(e, seq, ids, N - 1, lg[pass], true, err,
						    sizeof err) &&
				    !engine_decode(e, 1, &seq, &ids[N - 1],
						   lg[pass] + (size_t)(N - 1) * VOCAB, err, sizeof err));
		assert_int_equal(engine_seq_len(e, seq), N);
		engine_seq_free(e, seq);
		hostkv_seq_close(hs, true);
		engine_free(e);
	}
	if (memcmp(lg[0], lg[1], (size_t)(N - 1) * VOCAB * sizeof(float)))
		fail_msg("chunked prefill: prompt logits differ from full");
	/* The last row is a decode step over the quantised past: close, not equal. */
	assert_true(memcmp(lg[0] + (size_t)(N - 1) * VOCAB, lg[1] + (size_t)(N - 1) * VOCAB,
			   VOCAB * sizeof(float)) != 0);
	free(lg[0]);
	free(lg[1]);
}

static void test_resume_continues(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { FIRST = 150, TOTAL = 250 };
	struct kv_policy_opts kv = kvo(8, 16, 16, 2, 1, true);
	struct run ref;
	gen("specache", kv, TOTAL, false, 4242, &ref);
	struct engine *e = new_engine("specache", kv, 0);
	char err[256];
	struct hostkv_seq *hs = open_host(e, "ts-resume");
	int seq;
	float logits[VOCAB];
	int32_t toks[CTX];
	prompt_ids(toks, 4242);
	assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, seq, toks, PROMPT, logits, false, err, sizeof err), 0);
	for (int t = 0; t < FIRST; t++) {
		toks[PROMPT + t] = argmax(logits);
		assert_int_equal(engine_decode(e, 1, &seq, &toks[PROMPT + t], logits, err,
					       sizeof err), 0);
	}
	toks[PROMPT + FIRST] = argmax(logits);
	assert_int_equal(engine_seq_keep(e, seq, &toks[PROMPT + FIRST], 1, err, sizeof err), 0);
	engine_seq_free(e, seq);
	engine_free(e);

	e = new_engine("specache", kv, 0);
	if (engine_seq_open(e, hs, &seq, err, sizeof err))
		fail_msg("resume: %s", err);
	assert_int_equal(engine_seq_len(e, seq), PROMPT + FIRST);
	for (int t = FIRST; t < TOTAL; t++) {
		assert_int_equal(engine_decode(e, 1, &seq, &toks[PROMPT + t], logits, err,
					       sizeof err), 0);
		if (toks[PROMPT + t] != ref.toks[PROMPT + t])
			fail_msg("resumed token %d differs", t);
		if (t + 1 < TOTAL)
			toks[PROMPT + t + 1] = argmax(logits);
	}
	/* The first step after the resume ran a pre-step (its rows chosen by the real token, not
	 * by the speculative one of a previous step), so only the tokens are bound to agree. */
	struct engine_spec_stats sp;
	assert_int_equal(engine_seq_spec_stats(e, seq, &sp), 0);
	assert_int_equal(sp.checked, TOTAL - FIRST - 1);
	engine_seq_free(e, seq);
	engine_free(e);
	hostkv_seq_close(hs, true);
	free(ref.logits);
}

/* Two sequences decoded in one engine_decode call: their phases batch (four rows a step), and
 * each gives the tokens it gives alone. */
static void test_batch_equals_alone(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 120 };
	struct kv_policy_opts kv = kvo(8, 16, 16, 2, 1, false);
	struct run alone[2];
	for (int i = 0; i < 2; i++)
		gen("specache", kv, STEPS, false, 100 + (uint64_t)i, &alone[i]);
	struct engine *e = new_engine("specache", kv, 0);
	char err[256], name[64];
	struct hostkv_seq *hs[2];
	int seqs[2];
	int32_t toks[2][CTX];
	float lg[2 * VOCAB];
	for (int i = 0; i < 2; i++) {
		snprintf(name, sizeof name, "ts-batch-%d", i);
		hs[i] = open_host(e, name);
		assert_int_equal(engine_seq_open(e, hs[i], &seqs[i], err, sizeof err), 0);
		prompt_ids(toks[i], 100 + (uint64_t)i);
	}
	const int32_t *ids[2] = { toks[0], toks[1] };
	const int n[2] = { PROMPT, PROMPT };
	assert_int_equal(engine_forward(e, 2, seqs, ids, n, lg, false, err, sizeof err), 0);
	for (int t = 0; t < STEPS; t++) {
		int32_t next[2];
		for (int i = 0; i < 2; i++) {
			next[i] = toks[i][PROMPT + t] = argmax(lg + (size_t)i * VOCAB);
			if (next[i] != alone[i].toks[PROMPT + t])
				fail_msg("sequence %d step %d: batched token differs from alone", i, t);
		}
		assert_int_equal(engine_decode(e, 2, seqs, next, lg, err, sizeof err), 0);
	}
	for (int i = 0; i < 2; i++) {
		engine_seq_free(e, seqs[i]);
		hostkv_seq_close(hs[i], true);
		free(alone[i].logits);
	}
	engine_free(e);
}

static void test_counters(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 200 };
	const int P = 8, W = 16, K = 16, L = model.cfg.n_layers, KV = model.cfg.n_kv_heads;
	const int d = model.cfg.head_dim;
	for (int bits = 1; bits <= 2; bits++) {
		struct run r;
		gen("specache", kvo(P, W, K, bits, 1, false), STEPS, false, 3, &r);
		/* tq of the last step (T = len - 1): groups leave the residual when a step begins. */
		const int64_t len = PROMPT + STEPS, tq = (len - 1 - W) / P * P;
		/* Every decode step but the first compared its token with a speculative one. */
		assert_int_equal(r.spec.checked, STEPS);
		assert_true(r.spec.hits > 0 && r.spec.hits <= r.spec.checked);
		/* Rows: at most k per head and layer a step, two rows (K, V) of d f32 each. */
		assert_true(r.st.sum.tokens_fetched > 0);
		assert_true(r.st.sum.tokens_fetched <= (int64_t)(STEPS + 1) * (L - 1) * KV * K);
		assert_int_equal(r.st.sum.bytes_recalled, r.st.sum.tokens_fetched * 2 * d * 4);
		/* Device bytes: per quantised layer the KIVI copy of tq positions (codes, f32 zero
		 * and scale per key group and channel, per value group), the residual in f32, k
		 * exact rows per head; the full layer every position. */
		const int64_t kivi = tq * KV * (2 * d * bits / 8 + 2 * 4) + tq / P * KV * d * 2 * 4;
		const int64_t want = (L - 1) * (kivi + 2 * (len - tq) * KV * d * 4 +
						2 * (int64_t)KV * K * d * 4) +
				     2 * len * KV * d * 4;
		assert_int_equal(r.st.tokens, len);
		assert_int_equal(r.st.device_bytes, want);
		free(r.logits);
	}
}

static void test_refusals(void **state)
{
	(void)state;
	NEED_MODEL();
	char err[256];
	struct engine *e = new_engine("specache", kvo(8, 16, 16, 2, 1, false), 0);
	int seq;
	/* The exact rows come from the host copy. */
	assert_int_equal(engine_seq_new(e, &seq, err, sizeof err), -EINVAL);
	engine_free(e);
	struct engine_opts o = { .max_ctx = CTX, .policy = "specache", .ubatch = 1,
				 .kv = kvo(8, 16, 16, 2, 1, false) };
	assert_int_equal(engine_new(&e, &model, be, &o, err, sizeof err), -EINVAL);
	const struct kv_policy_ops *P = kvcache_policy("specache");
	assert_non_null(P);
	assert_int_equal(P->spec_rows, 1);
	struct hostkv_seq *hs = NULL;
	struct kv_geom g = { .n_kv = model.cfg.n_kv_heads, .p = 8, .d = model.cfg.head_dim,
			     .dtype = FKV_F32 };
	assert_int_equal(hostkv_seq_open(store, "ts-refuse", model.fingerprint, model.cfg.n_layers,
					 &g, true, &hs, err, sizeof err), 0);
	struct kv_seq_params p = {
		.be = be, .n_layers = model.cfg.n_layers, .max_tokens = CTX, .host = hs,
		.attn = { model.cfg.n_heads, model.cfg.n_kv_heads, model.cfg.head_dim, FKV_F32,
			  0.35f, 0 },
	};
	void *st;
	p.opts = kvo(8, 12, 16, 2, 1, false); /* window not a page multiple */
	assert_int_equal(P->create(&p, &st), -EINVAL);
	p.opts = kvo(8, 16, 16, 3, 1, false); /* 3 bits */
	assert_int_equal(P->create(&p, &st), -EINVAL);
	p.opts = kvo(8, 16, 16, 2, 1, false);
	assert_int_equal(P->create(&p, &st), 0);
	assert_int_equal(P->step_begin_keep(st, 1, 2), -EINVAL); /* keeps more than it runs */
	assert_int_equal(P->step_begin(st, CTX + 1), -ENOSPC);
	assert_int_equal(P->restore(st, 4), -ENOENT); /* nothing in the host copy yet */
	P->destroy(st);
	hostkv_seq_close(hs, true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_topk),
		cmocka_unit_test(test_reference_agrees),
		cmocka_unit_test(test_window_covers_context_is_full),
		cmocka_unit_test(test_topk_covers_context_is_full),
		cmocka_unit_test(test_chunked_prefill_is_exact),
		cmocka_unit_test(test_resume_continues),
		cmocka_unit_test(test_batch_equals_alone),
		cmocka_unit_test(test_counters),
		cmocka_unit_test(test_refusals),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
