/* Tests for the hardkv policy and top-p selection (worker/kvcache/policy_hardkv.c, topp.c, and
 * freekv with --kv-top-p in policy_freekv.c) on the real stories260K model (p = 8, B = 64, S = 8,
 * W = 16: k = 5 selected pages a KV head) with greedy decoding over an embedded host copy:
 *   - limiting cases: with B at least the context hardkv is `full` exactly, for P = 0.9 and
 *     P = 1 (k at least the candidates: at a compressed step the candidates always number at
 *     least k + 1 — the window's full pages plus the sink plus k pages fill B, and the length
 *     is past B — so "k >= candidates" only happens while nothing is compressed); with P = 1
 *     every head attends exactly k pages at every compressed step;
 *   - an independent float64 reference of the calibration and the selection (this file: keys
 *     read from the host copy, summaries, scores, true attention mass, the grid search and the
 *     top-p prefix written from docs/design.md §5, none of the policy's code) gives the same
 *     temperatures and page sets at every layer of every compressed step, over 250 and more
 *     decode steps, for P = 0.9 with R = 16, P = 1 with R = 128 and P = 0.5 with R = 1; the
 *     attention op really gets each head's own token count;
 *   - a resumed sequence recalibrates at its first step, so at a resume that falls on a
 *     calibration step of the uninterrupted run (R = 34 here) it continues token for token and
 *     logit for logit;
 *   - freekv with --kv-top-p and tau > 1 is hardkv exactly; with tau 0.9 its debug invariants hold
 *     for a long generation and it attends fewer pages than top-k;
 *   - the debug invariants hold over a long hardkv generation, with the counters adding up;
 *   - options outside their range are refused: P outside (0, 1], R < 1. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "engine.h"
#include "hostkv.h"
#include "layout.h"

static struct fkv_model model;
static struct backend *be;
static struct hostkv *store;
static bool have_model;
static int seq_no;

enum { PROMPT = 16, VOCAB = 512, NL = 5, NQ = 8, NKV = 4, D = 8 };
enum { P = 8, B = 64, S = 8, W = 16, K = (B - S - W) / P, FL = 1 };

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
	if (model.cfg.n_layers != NL || model.cfg.n_heads != NQ || model.cfg.n_kv_heads != NKV ||
	    model.cfg.head_dim != D) {
		fprintf(stderr, "stories260K geometry changed\n");
		return -1;
	}
	struct hostkv_opts ho = { .worker_name = "test_hardkv" };
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

static struct kv_policy_opts kvo(int b, float tau, float top_p, int recal, bool dbg)
{
	return (struct kv_policy_opts){ .page = P, .budget = b, .sink = S, .window = W,
					.full_layers = FL, .tau = tau, .debug_invariants = dbg,
					.top_p = top_p, .recalibrate = recal };
}

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

static struct engine *new_engine_on(struct backend *bk, const char *policy,
				    struct kv_policy_opts kv)
{
	struct engine_opts o = { .max_ctx = 512, .policy = policy, .kv = kv };
	struct engine *e;
	char err[256];
	if (engine_new(&e, &model, bk, &o, err, sizeof err))
		fail_msg("engine_new %s: %s", policy, err);
	return e;
}

static struct engine *new_engine(const char *policy, struct kv_policy_opts kv)
{
	return new_engine_on(be, policy, kv);
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
	int32_t toks[512];
	float *logits; /* (steps + 1, VOCAB) */
	int steps;
	struct kv_stats st;
	struct kv_layer_stats ls[NL];
};

/* Called after every decode step with the engine, the sequence and its host copy. */
typedef void (*step_fn)(struct engine *e, int seq, struct hostkv_seq *hs, int len, void *arg);

/* Greedy on backend bk: prefill PROMPT ids, then `steps` decode steps, each followed by
 * each(). */
static void gen_on(struct backend *bk, const char *policy, struct kv_policy_opts kv, int steps,
		   struct run *r, step_fn each, void *arg)
{
	struct engine *e = new_engine_on(bk, policy, kv);
	char name[64], err[256];
	snprintf(name, sizeof name, "th-%d", seq_no++);
	struct hostkv_seq *hs = open_host(e, name);
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
		if (each)
			each(e, seq, hs, PROMPT + t + 1, arg);
	}
	assert_int_equal(engine_seq_stats(e, seq, &r->st), 0);
	for (int l = 0; l < NL; l++)
		assert_int_equal(engine_seq_layer_stats(e, seq, l, &r->ls[l]), 0);
	engine_seq_free(e, seq);
	hostkv_seq_close(hs, true);
	engine_free(e);
}

static void gen(const char *policy, struct kv_policy_opts kv, int steps, struct run *r,
		step_fn each, void *arg)
{
	gen_on(be, policy, kv, steps, r, each, arg);
}

static void expect_same(const struct run *a, const struct run *b, const char *what)
{
	for (int t = 0; t < PROMPT + a->steps; t++)
		if (a->toks[t] != b->toks[t])
			fail_msg("%s: token %d differs (%d vs %d)", what, t, a->toks[t], b->toks[t]);
	if (memcmp(a->logits, b->logits, (size_t)(a->steps + 1) * VOCAB * sizeof(float)))
		fail_msg("%s: logits differ", what);
}

/* ---- limiting cases ---- */

static void test_fits_budget_equals_full(void **state)
{
	(void)state;
	NEED_MODEL();
	/* B = 256: pages leave the window and move into the selected slots; B = 512: never. */
	const int budgets[] = { 256, 512 }, steps[] = { 256 - PROMPT, 200 };
	const float tops[] = { 0.9f, 1.0f };
	for (int b = 0; b < 2; b++) {
		struct run ref;
		gen("full", (struct kv_policy_opts){ .tau = 0.9f }, steps[b], &ref, NULL, NULL);
		for (int t = 0; t < 2; t++) {
			struct run r;
			gen("hardkv", kvo(budgets[b], 0.9f, tops[t], 0, true), steps[b], &r, NULL,
			    NULL);
			char what[64];
			snprintf(what, sizeof what, "hardkv B=%d P=%g", budgets[b], (double)tops[t]);
			expect_same(&r, &ref, what);
			assert_int_equal(r.st.sum.steps, 0);
			assert_int_equal(r.st.sum.pages_recalled, 0);
			assert_int_equal(r.st.sum.calibrations, 0);
			free(r.logits);
		}
		struct run f;
		gen("freekv", kvo(budgets[b], 0.9f, 0.9f, 0, true), steps[b], &f, NULL, NULL);
		expect_same(&f, &ref, "freekv --kv-top-p 0.9 within the budget");
		free(f.logits);
		free(ref.logits);
	}
}

/* P = 1 takes every candidate up to k: exactly k pages a head at every compressed step. */
static void test_top_p_one_attends_k(void **state)
{
	(void)state;
	NEED_MODEL();
	struct run r;
	gen("hardkv", kvo(B, 0.9f, 1.0f, 0, true), 200, &r, NULL, NULL);
	const int64_t compressed = PROMPT + 200 - B;
	assert_int_equal(r.st.sum.steps, (NL - FL) * compressed);
	assert_int_equal(r.st.sum.pages_selected, r.st.sum.steps * NKV * K);
	assert_int_equal(r.st.sum.pages_max, K);
	free(r.logits);
}

/* ---- the float64 reference ---- */

/* The CPU backend with attn_decode_slots recording each call's query and per-head counts: the
 * calls of one decode step are the retrieval layers in order. */
static const struct backend_ops *cap_real;
static float cap_q[NL][NQ * D];
static int32_t cap_tok[NL][NKV];
static int cap_calls;

static int cap_attn_decode_slots(void *c, float *o, const float *q, const void *slots,
				 int n_slots, const int32_t *list, int max_pages,
				 const int32_t *n_tok, int p, const struct backend_attn *a)
{
	assert_true(cap_calls < NL - FL);
	memcpy(cap_q[cap_calls], q, sizeof cap_q[0]);
	memcpy(cap_tok[cap_calls], n_tok, sizeof cap_tok[0]);
	cap_calls++;
	return cap_real->attn_decode_slots(c, o, q, slots, n_slots, list, max_pages, n_tok, p, a);
}

/* The engine's batch-wide decode attention (one sequence here): each slot item recorded as
 * its own attn_decode_slots call. */
static int cap_attn_decode_batch(void *c, float *o, const float *q,
				 const struct backend_attn_item *items, int n)
{
	for (int i = 0; i < n; i++) {
		const struct backend_attn_item *it = &items[i];
		const int64_t qd = (int64_t)it->a.n_heads * it->a.head_dim;
		int ret = it->slots ? cap_attn_decode_slots(c, o + it->row * qd, q + it->row * qd,
							    it->slots, it->n_slots, it->list,
							    it->max_pages, it->n_tok, it->p, &it->a)
				    : cap_real->attn_decode_batch(c, o, q, it, 1);
		if (ret)
			return ret;
	}
	return 0;
}

struct ref {
	double top_p;
	int recal;
	int since[NL];	   /* compressed steps since the last calibration; -1: none */
	int th[NL][NKV];   /* grid exponents: theta = 2^(k/2) */
	int64_t calibrations, theta_changes, compared, short_heads, full_heads;
	bool seen[13];	   /* grid exponents any calibration chose, k + 4 */
	double *keys;	   /* (512, NKV, D) */
};

/* Every key of a layer from the host copy, in double: keys (len, NKV, D). */
static void ref_keys(struct hostkv_seq *hs, const struct kv_geom *g, int layer, int len,
		     double *keys)
{
	float k[P * D], v[P * D];
	char err[256];
	for (int pg = 0; pg * P < len; pg++) {
		const void *block;
		int n = len - pg * P < P ? len - pg * P : P;
		if (hostkv_block_ro_pin(hs, layer, pg, &block, err, sizeof err))
			fail_msg("pin layer %d page %d: %s", layer, pg, err);
		for (int h = 0; h < NKV; h++) {
			layout_load_head(g, block, h, 0, n, k, v);
			for (int i = 0; i < n; i++)
				for (int c = 0; c < D; c++)
					keys[((size_t)(pg * P + i) * NKV + h) * D + c] = k[i * D + c];
		}
		assert_int_equal(hostkv_unpin(hs, layer, pg, err, sizeof err), 0);
	}
}

/* Group-mean softmax of the page scores of head h over candidates [cb, cb + n) at theta. */
static void ref_pi(const float *q, const double *keys, int h, int cb, int n, double theta,
		   double *pi)
{
	const int G = NQ / NKV;
	double s[64];
	assert_true(n <= 64);
	for (int j = 0; j < n; j++)
		pi[j] = 0.0;
	for (int gi = 0; gi < G; gi++) {
		const float *qi = q + (size_t)(h * G + gi) * D;
		double mx = -INFINITY, sum = 0.0;
		for (int j = 0; j < n; j++) {
			s[j] = 0.0;
			for (int c = 0; c < D; c++) {
				double lo = INFINITY, hi = -INFINITY;
				for (int t = (cb + j) * P; t < (cb + j + 1) * P; t++) {
					double x = keys[((size_t)t * NKV + h) * D + c];
					lo = x < lo ? x : lo;
					hi = x > hi ? x : hi;
				}
				s[j] += fmax(qi[c] * hi, qi[c] * lo);
			}
			s[j] = s[j] / sqrt((double)D) / theta;
			mx = fmax(mx, s[j]);
		}
		for (int j = 0; j < n; j++)
			sum += exp(s[j] - mx);
		for (int j = 0; j < n; j++)
			pi[j] += exp(s[j] - mx) / sum / G;
	}
}

/* The grid exponent of head h: least KL of the calibrated probabilities from the true page
 * mass of query q over all len keys, ties to the smaller temperature. */
static int ref_calibrate(const float *q, const double *keys, int len, int h, int cb, int n)
{
	const int G = NQ / NKV;
	double m[64] = { 0 }, a[512], pi[64], tot = 0.0, best = INFINITY;
	for (int gi = 0; gi < G; gi++) {
		const float *qi = q + (size_t)(h * G + gi) * D;
		double mx = -INFINITY, sum = 0.0;
		for (int t = 0; t < len; t++) {
			a[t] = 0.0;
			for (int c = 0; c < D; c++)
				a[t] += qi[c] * keys[((size_t)t * NKV + h) * D + c];
			a[t] /= sqrt((double)D);
			mx = fmax(mx, a[t]);
		}
		for (int t = 0; t < len; t++)
			sum += exp(a[t] - mx);
		for (int j = 0; j < n; j++)
			for (int t = (cb + j) * P; t < (cb + j + 1) * P; t++)
				m[j] += exp(a[t] - mx) / sum / G;
	}
	for (int j = 0; j < n; j++)
		tot += m[j];
	for (int j = 0; j < n; j++)
		m[j] /= tot;
	int bk = -4;
	for (int k = -4; k <= 8; k++) {
		ref_pi(q, keys, h, cb, n, pow(2.0, k / 2.0), pi);
		double kl = 0.0;
		for (int j = 0; j < n; j++)
			if (m[j] > 0.0)
				kl += m[j] * (log(m[j]) - log(pi[j]));
		if (kl < best) {
			best = kl;
			bk = k;
		}
	}
	return bk;
}

/* Head h's pages: candidates by probability (ties to the lower page), the shortest prefix
 * holding top_p (all up to K at 1), 1 to K of them, ascending, then -1. */
static void ref_select(const double *pi, int cb, int n, double top_p, int *out)
{
	int order[64];
	for (int j = 0; j < n; j++)
		order[j] = j;
	for (int i = 0; i < n; i++) /* selection sort: plain and stable enough to trust */
		for (int j = i + 1; j < n; j++)
			if (pi[order[j]] > pi[order[i]] ||
			    (pi[order[j]] == pi[order[i]] && order[j] < order[i])) {
				int t = order[i];
				order[i] = order[j];
				order[j] = t;
			}
	int c = 0;
	double cum = 0.0;
	while (c < K && c < n && (top_p >= 1.0 || cum < top_p))
		cum += pi[order[c++]];
	for (int i = 0; i < K; i++)
		out[i] = i < c ? cb + order[i] : -1;
	for (int i = 1; i < c; i++) /* ascending */
		for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
			int t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
}

/* After each decode step: the reference of every retrieval layer at this length against what
 * the policy selected and the temperatures it reports. */
static void ref_check(struct engine *e, int seq, struct hostkv_seq *hs, int len, void *arg)
{
	struct ref *R = arg;
	assert_int_equal(cap_calls, NL - FL);
	cap_calls = 0;
	if (len <= B)
		return;
	struct kv_geom g;
	engine_kv_geom(e, &g);
	const int n_full = len / P, tail = len % P;
	const int cb = S / P, ce = n_full - (W / P - (tail ? 1 : 0)), n = ce - cb;
	assert_true(n >= K + 1);
	for (int l = FL; l < NL; l++) {
		const float *q = cap_q[l - FL];
		int pages[NKV * K], want[K];
		float theta[NKV];
		assert_int_equal(engine_seq_layer_select(e, seq, l, pages, theta), 0);
		ref_keys(hs, &g, l, len, R->keys);
		bool cal = R->since[l] < 0 || ++R->since[l] >= R->recal;
		for (int h = 0; h < NKV; h++) {
			if (cal) {
				int k = ref_calibrate(q, R->keys, len, h, cb, n);
				R->theta_changes += R->since[l] >= 0 && k != R->th[l][h];
				R->th[l][h] = k;
				R->seen[k + 4] = true;
			}
			double pi[64];
			ref_pi(q, R->keys, h, cb, n, pow(2.0, R->th[l][h] / 2.0), pi);
			ref_select(pi, cb, n, R->top_p, want);
			if (theta[h] != (float)pow(2.0, R->th[l][h] / 2.0))
				fail_msg("len %d layer %d head %d: temperature %g, reference %g", len, l,
					 h, (double)theta[h], pow(2.0, R->th[l][h] / 2.0));
			int c = 0;
			for (int i = 0; i < K; i++) {
				if (pages[h * K + i] != want[i])
					fail_msg("len %d layer %d head %d: page %d of the selection is "
						 "%d, reference %d", len, l, h, i, pages[h * K + i],
						 want[i]);
				c += want[i] >= 0;
			}
			/* what the attention op was given: sink, c pages, window */
			assert_int_equal(cap_tok[l - FL][h], len - (n - c) * P);
			R->short_heads += c < K;
			R->full_heads += c == K;
			R->compared++;
		}
		if (cal) {
			R->since[l] = 0;
			R->calibrations++;
		}
	}
}

static void reference_run(double top_p, int recal, int steps, struct ref *R)
{
	memset(R, 0, sizeof *R);
	R->top_p = top_p;
	R->recal = recal;
	for (int l = 0; l < NL; l++)
		R->since[l] = -1;
	R->keys = malloc((size_t)512 * NKV * D * sizeof *R->keys);
	assert_non_null(R->keys);
	struct backend_ops ops = *be->ops;
	cap_real = be->ops;
	ops.attn_decode_slots = cap_attn_decode_slots;
	ops.attn_decode_batch = cap_attn_decode_batch;
	struct backend bc = { .ops = &ops, .ctx = be->ctx };
	cap_calls = 0;
	struct run r;
	gen_on(&bc, "hardkv", kvo(B, 0.9f, (float)top_p, recal, true), steps, &r, ref_check, R);
	const int64_t compressed = PROMPT + steps - B;
	assert_int_equal(R->compared, compressed * (NL - FL) * NKV);
	assert_int_equal(r.st.sum.calibrations, R->calibrations);
	int64_t want_cal = (NL - FL) * (1 + (compressed - 1) / recal);
	assert_int_equal(R->calibrations, want_cal);
	fprintf(stderr, "P %g R %d: %lld compressed steps, %lld calibrations (%lld temperatures "
		"changed), heads below k %lld of %lld\n", top_p, recal, (long long)compressed,
		(long long)R->calibrations, (long long)R->theta_changes,
		(long long)R->short_heads, (long long)R->compared);
	free(r.logits);
	free(R->keys);
}

static void test_reference(void **state)
{
	(void)state;
	NEED_MODEL();
	struct ref R;
	/* P = 0.9, R = 16: some heads attend fewer than k pages, the temperatures spread over the
	 * grid and move at recalibrations. */
	reference_run(0.9, 16, 300, &R);
	assert_true(R.short_heads > 0 && R.full_heads > 0);
	int distinct = 0;
	for (int k = 0; k < 13; k++)
		distinct += R.seen[k];
	assert_true(distinct >= 3);
	assert_true(R.theta_changes > 0);
	/* P = 1: every head k pages, ordered by calibrated probability. */
	reference_run(1.0, 128, 300, &R);
	assert_int_equal(R.short_heads, 0);
	/* P = 0.5, calibrated at every step. */
	reference_run(0.5, 1, 250, &R);
	assert_true(R.short_heads > R.full_heads);
}

/* ---- resume ---- */

static void test_resume_at_calibration_step(void **state)
{
	(void)state;
	NEED_MODEL();
	/* The first compressed decode step is 48 (length 65 > B); with R = 34 the uninterrupted
	 * run calibrates at 48, 82, 116, 150, ...: a resume at 150 calibrates where it would. */
	enum { FIRST = 150, TOTAL = 250, RECAL = 34 };
	static const char *const pols[] = { "hardkv", "freekv" };
	for (int pi = 0; pi < 2; pi++) {
		struct kv_policy_opts kv = kvo(B, 0.9f, 0.9f, RECAL, true);
		struct run ref;
		gen(pols[pi], kv, TOTAL, &ref, NULL, NULL);
		struct engine *e = new_engine(pols[pi], kv);
		char name[64], err[256];
		snprintf(name, sizeof name, "th-resume-%d", pi);
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
		toks[PROMPT + FIRST] = argmax(logits);
		assert_int_equal(engine_seq_keep(e, seq, &toks[PROMPT + FIRST], 1, err, sizeof err),
				 0);
		engine_seq_free(e, seq);
		engine_free(e);

		e = new_engine(pols[pi], kv);
		if (engine_seq_open(e, hs, &seq, err, sizeof err))
			fail_msg("%s: resume: %s", pols[pi], err);
		assert_int_equal(engine_seq_len(e, seq), PROMPT + FIRST);
		for (int t = FIRST; t < TOTAL; t++) {
			assert_int_equal(engine_decode(e, 1, &seq, &toks[PROMPT + t], logits, err,
						       sizeof err), 0);
			if (toks[PROMPT + t] != ref.toks[PROMPT + t])
				fail_msg("%s: resumed token %d differs", pols[pi], t);
			/* hardkv: every logit; freekv's first step after a resume selects with
			 * the current query (the previous one is not kept), so only its tokens
			 * are bound to agree. */
			if (pi == 0 && memcmp(logits, ref.logits + (size_t)(t + 1) * VOCAB,
					      sizeof logits))
				fail_msg("hardkv: resumed logits of step %d differ", t);
			if (t + 1 < TOTAL)
				toks[PROMPT + t + 1] = argmax(logits);
		}
		struct kv_layer_stats ls;
		assert_int_equal(engine_seq_layer_stats(e, seq, 1, &ls), 0);
		assert_int_equal(ls.calibrations, 1 + (TOTAL - FIRST - 1) / RECAL);
		engine_seq_free(e, seq);
		engine_free(e);
		hostkv_seq_close(hs, true);
		free(ref.logits);
	}
}

/* ---- freekv with --kv-top-p ---- */

static void test_freekv_top_p(void **state)
{
	(void)state;
	NEED_MODEL();
	struct run h, f, fk, q;
	gen("hardkv", kvo(B, 0.9f, 0.8f, 20, false), 300, &h, NULL, NULL);
	gen("freekv", kvo(B, 2.0f, 0.8f, 20, false), 300, &f, NULL, NULL);
	expect_same(&f, &h, "freekv tau 2 --kv-top-p 0.8 vs hardkv");
	assert_int_equal(f.st.sum.corrections, f.st.sum.head_checks);
	assert_int_equal(f.st.sum.calibrations, h.st.sum.calibrations);
	assert_true(h.st.sum.calibrations > NL - FL);
	/* The budget is in force and heads attend fewer pages than quest's k. */
	gen("quest", kvo(B, 0.9f, 0, 0, false), 300, &q, NULL, NULL);
	assert_true(memcmp(q.logits, h.logits, 301 * VOCAB * sizeof(float)) != 0);
	assert_true(h.st.sum.pages_selected < q.st.sum.pages_selected);
	/* Speculation with correction over top-p selection: invariants every step. */
	gen("freekv", kvo(B, 0.9f, 0.9f, 0, true), 480, &fk, NULL, NULL);
	double rate = kv_correction_rate(&fk.st.sum);
	assert_true(rate > 0.0 && rate < 1.0);
	assert_true(fk.st.sum.ns_recall_hidden > 0);
	assert_true(fk.st.sum.pages_selected < fk.st.sum.steps * NKV * K);
	assert_true(fk.st.sum.pages_selected >= fk.st.sum.steps * NKV);
	free(h.logits);
	free(f.logits);
	free(fk.logits);
	free(q.logits);
}

/* ---- a long generation ---- */

static void test_invariants_long(void **state)
{
	(void)state;
	NEED_MODEL();
	struct run r;
	gen("hardkv", kvo(B, 0.9f, 0, 0, true), 480, &r, NULL, NULL);
	const struct kv_layer_stats *s = &r.st.sum;
	const int64_t compressed = PROMPT + 480 - B;
	assert_int_equal(s->steps, (NL - FL) * compressed);
	/* default P 0.9: between 1 and k pages a head, fewer than k on the whole */
	assert_true(s->pages_selected >= s->steps * NKV);
	assert_true(s->pages_selected < s->steps * NKV * K);
	assert_true(s->pages_max <= K);
	/* default R 128: layers calibrate at their first compressed step and every 128 after */
	assert_int_equal(s->calibrations, (NL - FL) * (1 + (compressed - 1) / 128));
	assert_true(s->pages_recalled > 0);
	assert_int_equal(s->bytes_recalled, s->pages_recalled * 2 * P * D * 4);
	assert_int_equal(r.ls[0].steps, 0);
	assert_int_equal(r.ls[0].calibrations, 0);
	free(r.logits);
}

/* ---- options ---- */

static void test_bad_options(void **state)
{
	(void)state;
	NEED_MODEL();
	const struct kv_policy_ops *Pol = kvcache_policy("hardkv");
	assert_non_null(Pol);
	struct kv_geom g = { .n_kv = NKV, .p = P, .d = D, .dtype = FKV_F32 };
	struct hostkv_seq *hs;
	char err[256];
	if (hostkv_seq_open(store, "th-opts", model.fingerprint, NL, &g, true, &hs, err,
			    sizeof err))
		fail_msg("hostkv_seq_open: %s", err);
	struct kv_seq_params p = {
		.be = be, .n_layers = NL, .attn = { NQ, NKV, D, FKV_F32, 0.35f, 0 },
		.max_tokens = 512, .opts = kvo(B, 0.9f, 0.5f, 3, false), .host = hs,
	};
	void *st;
	assert_int_equal(Pol->create(&p, &st), 0);
	int pages[NKV * K];
	float theta[NKV];
	/* nothing selected yet */
	assert_int_equal(Pol->layer_select(st, FL, pages, theta), -ENODATA);
	assert_int_equal(Pol->layer_select(st, 0, pages, theta), -ENODATA);
	assert_int_equal(Pol->layer_select(st, NL, pages, theta), -EINVAL);
	Pol->destroy(st);
	const float bad_p[] = { 1.01f, -0.1f, NAN, INFINITY };
	for (size_t i = 0; i < sizeof bad_p / sizeof *bad_p; i++) {
		p.opts.top_p = bad_p[i];
		assert_int_equal(Pol->create(&p, &st), -EINVAL);
	}
	p.opts.top_p = 0.9f;
	p.opts.recalibrate = -1;
	assert_int_equal(Pol->create(&p, &st), -EINVAL);
	hostkv_seq_close(hs, true);
	/* and through the engine, with a message */
	struct engine_opts o = { .max_ctx = 512, .policy = "hardkv",
				 .kv = kvo(B, 0.9f, 2.0f, 0, false) };
	struct engine *e;
	assert_int_equal(engine_new(&e, &model, be, &o, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "kv-top-p"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fits_budget_equals_full),
		cmocka_unit_test(test_top_p_one_attends_k),
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_resume_at_calibration_step),
		cmocka_unit_test(test_freekv_top_p),
		cmocka_unit_test(test_invariants_long),
		cmocka_unit_test(test_bad_options),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
