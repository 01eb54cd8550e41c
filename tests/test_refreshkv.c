/* Tests for the refreshkv policy (worker/kvcache/policy_refresh.c, refresh_full.c,
 * refresh_select.c; docs/design.md §5 "refreshkv — exact semantics") on the real stories260K
 * model with greedy decoding over a host copy in the embedded store:
 *   - the limiting cases: a budget covering the context gives exactly `full`'s tokens and
 *     logits, and so does Q = 1 with s > 1 (every step past the budget is a full step);
 *   - an independent float64 reference (tests/refresh_ref.c) agrees with the policy's
 *     full/partial decisions and partial sets at every layer of every decode step past the
 *     budget (p 8, B 64, full_layers 1, Q 5, s 0.85, 300 steps), up to ties float32 breaks,
 *     and the rows fetched are exactly the positions new to a set at its full steps;
 *   - the streamed full step (a backend whose buffers are not host memory: recall into staging
 *     halves, gather_heads) gives the direct path's tokens and logits bit for bit, as do the
 *     fallbacks without gather_heads and round_to, with the debug invariants on;
 *   - a sequence resumed from its host copy continues token for token (its first step at each
 *     layer is a full step), and a retried decode step changes nothing;
 *   - refresh_topk and refresh_evict_order against plain sorts; bad options are refused with
 *     a message naming the option. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "engine.h"
#include "hostkv.h"
#include "layout.h"
#include "policy_opts.h"
#include "refresh_ref.h"
#include "refresh_select.h"
#include "test_devmem.h"

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
	struct hostkv_opts ho = { .worker_name = "test_refreshkv" };
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

static struct kv_policy_opts kvo(int p, int b, int fl, int Q, float s, bool dbg)
{
	return (struct kv_policy_opts){ .page = p, .budget = b, .sink = p, .window = 2 * p,
					.full_layers = fl, .tau = 0.9f, .debug_invariants = dbg,
					.refresh_stride = Q, .refresh_threshold = s };
}

struct run {
	int32_t toks[512];
	float *logits; /* (steps + 1, VOCAB) */
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

/* Greedy: prefill PROMPT ids then `steps` decode steps. With keep, the host copy stays open
 * and is returned (the caller closes it). */
static struct hostkv_seq *gen_keep(const char *policy, struct kv_policy_opts kv, int steps,
				   struct run *r, bool keep)
{
	struct engine *e = new_engine(policy, kv);
	char name[64], err[256];
	snprintf(name, sizeof name, "tr-%d", seq_no++);
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
	}
	assert_int_equal(engine_seq_stats(e, seq, &r->st), 0);
	for (int l = 0; l < model.cfg.n_layers; l++)
		assert_int_equal(engine_seq_layer_stats(e, seq, l, &r->ls[l]), 0);
	engine_seq_free(e, seq);
	engine_free(e);
	if (keep)
		return hs;
	hostkv_seq_close(hs, true);
	return NULL;
}

static void gen(const char *policy, struct kv_policy_opts kv, int steps, struct run *r)
{
	gen_keep(policy, kv, steps, r, false);
}

static void expect_same(const struct run *a, const struct run *b, const char *what)
{
	for (int t = 0; t < PROMPT + a->steps; t++)
		if (a->toks[t] != b->toks[t])
			fail_msg("%s: token %d differs (%d vs %d)", what, t, a->toks[t], b->toks[t]);
	for (int t = 0; t <= a->steps; t++)
		if (memcmp(a->logits + (size_t)t * VOCAB, b->logits + (size_t)t * VOCAB,
			   VOCAB * sizeof(float)))
			fail_msg("%s: logits of step %d differ", what, t);
}

static void test_budget_covers_context_is_full(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 250 };
	struct run ref;
	gen("full", kvo(0, 0, 0, 5, 0.85f, false), STEPS, &ref);
	/* 512: the model's context; 300: above every T reached, not a page multiple. */
	const int budgets[] = { 512, 300 };
	for (int b = 0; b < 2; b++)
		for (int fl = 0; fl < 2; fl++) {
			struct run r;
			gen("refreshkv", kvo(8, budgets[b], fl, 5, 0.85f, true), STEPS, &r);
			char what[64];
			snprintf(what, sizeof what, "refreshkv B=%d full_layers=%d", budgets[b], fl);
			expect_same(&r, &ref, what);
			assert_int_equal(r.st.sum.steps, 0);
			assert_int_equal(r.st.sum.full_steps, 0);
			assert_int_equal(r.st.sum.tokens_fetched, 0);
			free(r.logits);
		}
	free(ref.logits);
}

/* Q = 1, s > 1: every step past the budget is a full step, whose output is dense attention
 * over the host copy: `full`'s, to the bit, on the direct and the streamed path. */
static void test_stride_one_is_full(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 250 };
	struct run ref;
	gen("full", kvo(0, 0, 0, 5, 0.85f, false), STEPS, &ref);
	struct backend_ops ops;
	struct backend *cpu = be, dev = devmem_of(cpu, &ops);
	for (int path = 0; path < 2; path++)
		for (int fl = 0; fl < 2; fl++) {
			struct run r;
			be = path ? &dev : cpu;
			gen("refreshkv", kvo(8, 64, fl, 1, 1.5f, fl == 1), STEPS, &r);
			be = cpu;
			char what[64];
			snprintf(what, sizeof what, "refreshkv Q=1 s=1.5 full_layers=%d %s", fl,
				 path ? "streamed" : "direct");
			expect_same(&r, &ref, what);
			const int retr = model.cfg.n_layers - fl;
			assert_int_equal(r.st.sum.steps, (int64_t)retr * (PROMPT + STEPS - 64));
			assert_int_equal(r.st.sum.full_steps, r.st.sum.steps);
			assert_true(r.st.sum.tokens_fetched > 0);
			assert_true(r.st.sum.ns_full > 0);
			if (path)
				assert_true(r.st.sum.pages_recalled > 0);
			else
				assert_int_equal(r.st.sum.pages_recalled, 0);
			free(r.logits);
		}
	free(ref.logits);
}

/* ---- the float64 reference, step by step ---- */

struct rec {
	int layer;
	int64_t T;
	bool full;
	float *q;      /* (n_q, d) */
	int32_t *set;  /* (n_kv, B) */
};

struct trace_log {
	struct rec *r;
	int n, cap;
};

static void on_trace(void *arg, const struct kv_trace *t)
{
	struct trace_log *lg = arg;
	if (lg->n == lg->cap) {
		lg->cap = lg->cap ? 2 * lg->cap : 256;
		lg->r = realloc(lg->r, (size_t)lg->cap * sizeof *lg->r);
		assert_non_null(lg->r);
	}
	struct rec *r = &lg->r[lg->n++];
	size_t qn = (size_t)t->n_q * t->d, sn = (size_t)t->n_kv * t->budget;
	*r = (struct rec){ .layer = t->layer, .T = t->T, .full = t->full,
			   .q = malloc(qn * sizeof(float)), .set = malloc(sn * sizeof(int32_t)) };
	assert_true(r->q && r->set);
	memcpy(r->q, t->q, qn * sizeof(float));
	memcpy(r->set, t->set, sn * sizeof(int32_t));
}

/* Keys [0, T) of layer l from the host copy, as float64 (T, n_kv, d). */
static double *host_keys(struct hostkv_seq *hs, int l, int64_t T, const struct kv_geom *g)
{
	double *K = malloc((size_t)T * g->n_kv * g->d * sizeof *K);
	float *k = malloc((size_t)2 * g->p * g->d * sizeof *k), *v = k + (size_t)g->p * g->d;
	assert_true(K && k);
	char err[256];
	for (int64_t pg = 0; pg * g->p < T; pg++) {
		const void *blk;
		assert_int_equal(hostkv_block_ro_pin(hs, l, (int)pg, &blk, err, sizeof err), 0);
		int n = T - pg * g->p < g->p ? (int)(T - pg * g->p) : g->p;
		for (int h = 0; h < g->n_kv; h++) {
			layout_load_head(g, blk, h, 0, n, k, v);
			for (int t = 0; t < n; t++)
				for (int i = 0; i < g->d; i++)
					K[(((size_t)pg * g->p + t) * g->n_kv + h) * g->d + i] =
						k[(size_t)t * g->d + i];
		}
		assert_int_equal(hostkv_unpin(hs, l, (int)pg, err, sizeof err), 0);
	}
	free(k);
	return K;
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* Sorted copies of a set of B and of the reference's members of head h. */
static void sorted_sets(const struct rref *rf, int l, int h, const int32_t *pol, int32_t *a,
			int32_t *b)
{
	const struct rref_layer *L = &rf->L[l];
	memcpy(a, pol, (size_t)rf->B * sizeof *a);
	qsort(a, (size_t)rf->B, sizeof *a, cmp_i32);
	assert_int_equal(L->n[h], rf->B);
	for (int i = 0; i < rf->B; i++)
		b[i] = L->m[(size_t)h * (rf->B + 1) + i].pos;
	qsort(b, (size_t)rf->B, sizeof *b, cmp_i32);
}

/* Relative size of a float32 rounding difference in u or the cosine. */
#define TIE_EPS 1e-5

static void test_float64_reference(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 300, B = 64, Q = 5 };
	const float S = 0.85f;
	struct trace_log lg = { 0 };
	struct kv_policy_opts kv = kvo(8, B, 1, Q, S, true);
	kv.trace = on_trace;
	kv.trace_arg = &lg;
	struct run r;
	struct hostkv_seq *hs = gen_keep("refreshkv", kv, STEPS, &r, true);
	const int L = model.cfg.n_layers, H = model.cfg.n_kv_heads;
	struct kv_geom g = { .n_kv = H, .p = 8, .d = model.cfg.head_dim, .dtype = model.cfg.dtype };
	struct rref rf;
	assert_int_equal(rref_init(&rf, L, model.cfg.n_heads, H, g.d, B, Q, S), 0);
	int per_layer[8] = { 0 }, full = 0, partial = 0, ties = 0;
	int32_t a[B], b[B], ev[H];
	/* The policy's previous sets, to count what its full steps had to fetch: before the
	 * first step past the budget every head holds positions 0 .. B-1. */
	int32_t prev[8][H][B];
	int64_t new_members = 0;
	for (int l = 0; l < L; l++)
		for (int h = 0; h < H; h++)
			for (int k = 0; k < B; k++)
				prev[l][h][k] = k;
	for (int i = 0; i < lg.n; i++) {
		const struct rec *c = &lg.r[i];
		assert_true(c->layer >= 1 && c->layer < L); /* layer 0 keeps full attention */
		assert_true(c->T > B);
		per_layer[c->layer]++;
		double margin;
		bool want = rref_decide(&rf, c->layer, c->q, &margin);
		if (want != c->full) {
			if (margin > TIE_EPS)
				fail_msg("layer %d T %lld: policy took a %s step, the reference a %s "
					 "one (cos - s = %g)", c->layer, (long long)c->T,
					 c->full ? "full" : "partial", want ? "full" : "partial",
					 margin);
			ties++;
		}
		if (c->full) {
			full++;
			double *K = host_keys(hs, c->layer, c->T, &g);
			assert_int_equal(rref_full(&rf, c->layer, c->q, K, c->T), 0);
			free(K);
		} else {
			partial++;
			rref_partial(&rf, c->layer, c->T, ev, &margin);
		}
		for (int h = 0; h < H; h++) {
			sorted_sets(&rf, c->layer, h, c->set + (size_t)h * B, a, b);
			for (int k = 0; c->full && k < B; k++) {
				bool had = false;
				for (int j = 0; j < B && !had; j++)
					had = prev[c->layer][h][j] == a[k];
				new_members += !had;
			}
			memcpy(prev[c->layer][h], a, sizeof a);
			if (!memcmp(a, b, sizeof a))
				continue;
			/* Only a near tie may differ: at a full step, members the two sets do not
			 * share are all within float32 rounding of the reference's boundary; at a
			 * partial step, the evicted member had a runner-up that close. */
			const struct rref_layer *RL = &rf.L[c->layer];
			const double *u = RL->u + (size_t)h * RL->uT;
			double bound = INFINITY;
			for (int k = 0; k < B; k++)
				bound = fmin(bound, RL->m[(size_t)h * (B + 1) + k].u);
			for (int k = 0; k < B; k++) {
				bool in_b = bsearch(&a[k], b, B, sizeof *b, cmp_i32) != NULL;
				double du = a[k] < RL->uT ? fabs(u[a[k]] - bound) : INFINITY;
				bool near = c->full ? du <= TIE_EPS * bound : margin <= TIE_EPS;
				if (!in_b && !near)
					fail_msg("layer %d T %lld head %d: position %d is in the "
						 "policy's set, not the reference's (u %g, bound %g)",
						 c->layer, (long long)c->T, h, a[k],
						 a[k] < RL->uT ? u[a[k]] : -1.0, bound);
			}
			ties++;
			rref_adopt(&rf, c->layer, h, c->set + (size_t)h * B, B);
		}
	}
	fprintf(stderr, "reference: %d records, %d full and %d partial steps, %d ties adopted\n",
		lg.n, full, partial, ties);
	for (int l = 1; l < L; l++)
		assert_int_equal(per_layer[l], PROMPT + STEPS - B);
	assert_true(PROMPT + STEPS - B >= 150);
	assert_true(full > L - 1);	/* more than the first step of each layer */
	assert_true(partial > full);
	assert_true(ties * 100 <= lg.n); /* ties are rare; a systematic difference is not one */
	assert_int_equal(r.st.sum.full_steps, full);
	/* Only positions new to a set are fetched. */
	assert_int_equal(r.st.sum.tokens_fetched, new_members);
	assert_int_equal(r.st.sum.steps, lg.n);
	rref_free(&rf);
	for (int i = 0; i < lg.n; i++) {
		free(lg.r[i].q);
		free(lg.r[i].set);
	}
	free(lg.r);
	free(r.logits);
	hostkv_seq_close(hs, true);
}

/* A backend-side pool_topk for the devmem backend: what a device computes, here by the host
 * function on the probabilities read through the real op (test plumbing for the op's path). */
static int dm_pool_topk(void *c, int32_t *pos, float *uval, const float *probs, int64_t ld,
			int n_q, int n_kv, int64_t T, int B)
{
	float *h = malloc((size_t)n_q * ld * sizeof *h);
	float *scr = malloc(refresh_scratch_floats(T) * sizeof *scr);
	assert_true(h && scr);
	int ret = dm_real->download(c, h, dv(probs), (size_t)n_q * ld * sizeof *h);
	if (!ret)
		refresh_topk(h, ld, n_q, n_kv, T, B, pos, uval, scr);
	free(h);
	free(scr);
	return ret;
}

/* The streamed full step and the fallbacks against the direct path, bit for bit: on a backend
 * whose buffers are not host memory (recall into staging, gather_heads), without gather_heads
 * and round_to (copies, host rounding), and with a backend-side pool_topk. */
static void test_streamed_equals_direct(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { STEPS = 260 };
	struct kv_policy_opts kv = kvo(8, 64, 1, 5, 0.85f, true);
	struct run ref;
	gen("refreshkv", kv, STEPS, &ref);
	assert_true(ref.st.sum.full_steps > 0 && ref.st.sum.full_steps < ref.st.sum.steps);
	struct backend_ops dm, bare, pooled;
	struct backend *cpu = be, dev = devmem_of(cpu, &dm);
	bare = dm;
	bare.name = "devmem-bare";
	bare.gather_heads = NULL;
	bare.round_to = NULL;
	pooled = dm;
	pooled.name = "devmem-pool_topk";
	pooled.pool_topk = dm_pool_topk;
	struct backend devb = { .ops = &bare, .ctx = cpu->ctx };
	struct backend devp = { .ops = &pooled, .ctx = cpu->ctx };
	struct backend *bs[] = { &dev, &devb, &devp };
	for (int i = 0; i < 3; i++) {
		struct run r;
		be = bs[i];
		gen("refreshkv", kv, STEPS, &r);
		be = cpu;
		char what[64];
		snprintf(what, sizeof what, "refreshkv on %s", bs[i]->ops->name);
		expect_same(&r, &ref, what);
		assert_int_equal(r.st.sum.full_steps, ref.st.sum.full_steps);
		assert_int_equal(r.st.sum.tokens_fetched, ref.st.sum.tokens_fetched);
		/* 4 layers x 4 heads x every page of the layer, twice once it spans two chunks. */
		assert_true(r.st.sum.pages_recalled >= r.st.sum.full_steps * 4 * (65 / 8));
		free(r.logits);
	}
	free(ref.logits);
}

/* Greedy run of `first` decode steps into a fresh host copy, the next id kept: what a worker
 * leaves behind when it dies. toks gets the ids (PROMPT + first + 1). */
static struct hostkv_seq *run_and_keep(struct kv_policy_opts kv, int first, int32_t *toks,
				       const char *name)
{
	struct engine *e = new_engine("refreshkv", kv);
	struct hostkv_seq *hs = open_host(e, name);
	char err[256];
	int seq;
	float logits[VOCAB];
	prompt_ids(toks);
	assert_int_equal(engine_seq_open(e, hs, &seq, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, seq, toks, PROMPT, logits, false, err, sizeof err), 0);
	for (int t = 0; t < first; t++) {
		toks[PROMPT + t] = argmax(logits);
		assert_int_equal(engine_decode(e, 1, &seq, &toks[PROMPT + t], logits, err,
					       sizeof err), 0);
	}
	toks[PROMPT + first] = argmax(logits);
	assert_int_equal(engine_seq_keep(e, seq, &toks[PROMPT + first], 1, err, sizeof err), 0);
	engine_seq_free(e, seq);
	engine_free(e);
	return hs;
}

/* A resumed sequence's first step is a full step at every retrieval layer (docs/design.md §5):
 * its logits are those of `full` resumed from an identical host copy, bit for bit, and each
 * layer fetched whole sets. With Q = 1, s > 1 (every step full) a resumed run equals the
 * uninterrupted one token for token and logit for logit. */
static void test_resume_continues(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { FIRST = 150, MORE = 100 };
	struct kv_policy_opts kv = kvo(8, 64, 1, 5, 0.85f, true);
	int32_t toks[2][512];
	struct hostkv_seq *hr = run_and_keep(kv, FIRST, toks[0], "tr-resume-r");
	struct hostkv_seq *hf = run_and_keep(kv, FIRST, toks[1], "tr-resume-f");
	assert_memory_equal(toks[0], toks[1], (PROMPT + FIRST + 1) * sizeof toks[0][0]);
	char err[256];
	int sr, sf;
	float lr[VOCAB], lf[VOCAB];
	struct engine *er = new_engine("refreshkv", kv), *ef = new_engine("full", kv);
	if (engine_seq_open(er, hr, &sr, err, sizeof err) ||
	    engine_seq_open(ef, hf, &sf, err, sizeof err))
		fail_msg("resume: %s", err);
	assert_int_equal(engine_seq_len(er, sr), PROMPT + FIRST);
	int32_t next = toks[0][PROMPT + FIRST];
	assert_int_equal(engine_decode(er, 1, &sr, &next, lr, err, sizeof err), 0);
	assert_int_equal(engine_decode(ef, 1, &sf, &next, lf, err, sizeof err), 0);
	assert_memory_equal(lr, lf, sizeof lr);
	for (int l = 1; l < model.cfg.n_layers; l++) {
		struct kv_layer_stats ls;
		assert_int_equal(engine_seq_layer_stats(er, sr, l, &ls), 0);
		assert_int_equal(ls.steps, 1);
		assert_int_equal(ls.full_steps, 1);
		assert_int_equal(ls.tokens_fetched, model.cfg.n_kv_heads * 64);
	}
	/* And it goes on (invariants checked at every step). */
	for (int t = 0; t < MORE; t++) {
		next = argmax(lr);
		assert_int_equal(engine_decode(er, 1, &sr, &next, lr, err, sizeof err), 0);
	}
	engine_seq_free(er, sr);
	engine_seq_free(ef, sf);
	engine_free(er);
	engine_free(ef);
	hostkv_seq_close(hr, true);
	hostkv_seq_close(hf, true);

	struct kv_policy_opts every = kvo(8, 64, 1, 1, 1.5f, true);
	struct run ref;
	gen("refreshkv", every, FIRST + MORE, &ref);
	struct hostkv_seq *hs = run_and_keep(every, FIRST, toks[0], "tr-resume-q1");
	struct engine *e = new_engine("refreshkv", every);
	int seq;
	float lg[VOCAB];
	if (engine_seq_open(e, hs, &seq, err, sizeof err))
		fail_msg("resume: %s", err);
	for (int t = FIRST; t < FIRST + MORE; t++) {
		assert_int_equal(engine_decode(e, 1, &seq, &toks[0][PROMPT + t], lg, err,
					       sizeof err), 0);
		if (toks[0][PROMPT + t] != ref.toks[PROMPT + t])
			fail_msg("Q=1: resumed token %d differs", t);
		toks[0][PROMPT + t + 1] = argmax(lg);
	}
	assert_memory_equal(lg, ref.logits + (size_t)(FIRST + MORE) * VOCAB, sizeof lg);
	engine_seq_free(e, seq);
	engine_free(e);
	hostkv_seq_close(hs, true);
	free(ref.logits);
}

/* Direct policy API on synthetic rows: a run whose decode steps are each attempted twice at
 * every layer (a retry after a failure further on) gives the outputs of a run without. */
static void test_retried_step(void **state)
{
	(void)state;
	NEED_MODEL();
	enum { NL = 3, NQ = 4, NKV = 2, D = 8, STEPS = 90 };
	const struct kv_policy_ops *P = kvcache_policy("refreshkv");
	assert_non_null(P);
	struct kv_geom g = { .n_kv = NKV, .p = 4, .d = D, .dtype = FKV_F32 };
	const struct backend_ops *o = be->ops;
	float *k = o->buf_alloc(be->ctx, NKV * D * sizeof *k);
	float *v = o->buf_alloc(be->ctx, NKV * D * sizeof *v);
	float *q = o->buf_alloc(be->ctx, NQ * D * sizeof *q);
	float *out = o->buf_alloc(be->ctx, NQ * D * sizeof *out);
	float outs[2][STEPS][NL][NQ * D];
	int64_t fulls[2];
	for (int pass = 0; pass < 2; pass++) {
		char name[32], err[256];
		snprintf(name, sizeof name, "tr-retry-%d", pass);
		struct hostkv_seq *hs;
		assert_int_equal(hostkv_seq_open(store, name, model.fingerprint, NL, &g, true, &hs,
						 err, sizeof err), 0);
		struct kv_seq_params p = {
			.be = be, .n_layers = NL, .attn = { NQ, NKV, D, FKV_F32, 0.35f, 0 },
			.max_tokens = 256, .opts = kvo(4, 16, 1, 2, 0.9f, true), .host = hs,
		};
		void *st;
		assert_int_equal(P->create(&p, &st), 0);
		uint64_t rs = 7;
		for (int t = 0; t < STEPS; t++) {
			assert_int_equal(P->step_begin(st, 1), 0);
			for (int l = 0; l < NL; l++) {
				float h[3 * NQ * D];
				for (int i = 0; i < 2 * NKV * D + NQ * D; i++)
					h[i] = test_randf(&rs);
				o->upload(be->ctx, k, h, NKV * D * sizeof(float));
				o->upload(be->ctx, v, h + NKV * D, NKV * D * sizeof(float));
				o->upload(be->ctx, q, h + 2 * NKV * D, NQ * D * sizeof(float));
				for (int a = 0; a <= pass; a++) {
					assert_int_equal(P->append(st, l, k, v, 1), 0);
					assert_int_equal(P->attend(st, l, out, q, 1), 0);
				}
				o->download(be->ctx, outs[pass][t][l], out, NQ * D * sizeof(float));
			}
			P->step_end(st);
		}
		struct kv_stats ks;
		P->stats(st, &ks);
		fulls[pass] = ks.sum.full_steps;
		P->destroy(st);
		hostkv_seq_close(hs, true);
	}
	assert_memory_equal(outs[0], outs[1], sizeof outs[0]);
	assert_int_equal(fulls[0], fulls[1]);
	assert_true(fulls[0] > 2); /* Q 2, s 0.9 on random queries: full steps recur */
	o->buf_free(be->ctx, k);
	o->buf_free(be->ctx, v);
	o->buf_free(be->ctx, q);
	o->buf_free(be->ctx, out);
}

/* refresh_topk and refresh_evict_order against plain sorts, with plateaus (ties) in u. */
static const float *g_u;

static int cmp_desc(const void *x, const void *y)
{
	int a = *(const int *)x, b = *(const int *)y;
	if (g_u[a] != g_u[b])
		return g_u[a] > g_u[b] ? -1 : 1;
	return (a > b) - (a < b);
}

static void test_select_helpers(void **state)
{
	(void)state;
	enum { NQ = 6, NKV = 2, T = 300, B = 40 };
	uint64_t rs = 3;
	float *pr = malloc((size_t)NQ * T * sizeof *pr), s[T], u[T];
	float *scr = malloc(refresh_scratch_floats(T) * sizeof *scr), uv[NKV * B];
	int32_t pos[NKV * B];
	assert_true(pr && scr);
	for (int trial = 0; trial < 20; trial++) {
		/* Few distinct values, so that ties are everywhere. */
		for (int i = 0; i < NQ * T; i++)
			pr[i] = (float)(test_rand(&rs) % (trial % 2 ? 7 : 1000)) / 1000.0f;
		refresh_topk(pr, T, NQ, NKV, T, B, pos, uv, scr);
		for (int h = 0; h < NKV; h++) {
			refresh_pool(pr, T, h * 3, 3, T, s, u);
			for (int j = 0; j < T; j++) {
				float m = 0, mu = 0;
				for (int g = 0; g < 3; g++)
					m = fmaxf(m, pr[(size_t)(h * 3 + g) * T + j]);
				assert_true(s[j] == m);
				for (int i = j - 3; i <= j + 3; i++)
					if (i >= 0 && i < T)
						for (int g = 0; g < 3; g++)
							mu = fmaxf(mu, pr[(size_t)(h * 3 + g) * T + i]);
				assert_true(u[j] == mu);
			}
			int idx[T];
			for (int j = 0; j < T; j++)
				idx[j] = j;
			g_u = u;
			qsort(idx, T, sizeof *idx, cmp_desc);
			qsort(idx, B, sizeof *idx, cmp_i32);
			for (int i = 0; i < B; i++) {
				assert_int_equal(pos[h * B + i], idx[i]);
				assert_true(uv[h * B + i] == u[idx[i]]);
			}
			int order[B], tmp[B];
			refresh_evict_order(pos + h * B, uv + h * B, B, order, tmp);
			for (int i = 1; i < B; i++) {
				int a = order[i - 1], b = order[i];
				float ua = uv[h * B + a], ub = uv[h * B + b];
				assert_true(ua < ub || (ua == ub && pos[h * B + a] > pos[h * B + b]));
			}
		}
	}
	float z[4] = { 0 }, one[4] = { 1, 0, 0, 0 }, m[4];
	assert_true(refresh_cos(z, z, 4) == 1.0);
	assert_true(refresh_cos(z, one, 4) == 0.0);
	float qq[8] = { 1, 2, 3, 4, 3, 2, 1, 0 };
	refresh_qmean(qq, 2, 4, m);
	assert_true(m[0] == 2.0f && m[3] == 2.0f);
	free(pr);
	free(scr);
}

static void test_bad_options(void **state)
{
	(void)state;
	struct {
		const char *a[6];
		const char *names;
	} cases[] = {
		{ { "--policy", "refreshkv", "--refresh-stride", "0", NULL }, "--refresh-stride" },
		{ { "--policy", "refreshkv", "--refresh-threshold", "2.5", NULL },
		  "--refresh-threshold" },
		{ { "--policy", "refreshkv", "--refresh-threshold", "-1.01", NULL },
		  "--refresh-threshold" },
		{ { "--policy", "refreshkv", "--budget", "7", NULL }, "--budget" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct policy_opts o;
		policy_opts_default(&o);
		char err[256] = "";
		int ret = 0, argc = 0;
		while (cases[i].a[argc])
			argc++;
		for (int j = 0; j < argc && !ret; j++)
			ret = policy_opts_parse_flag(&o, argc, (char **)cases[i].a, &j, err,
						     sizeof err) < 0 ? -EINVAL : 0;
		if (!ret)
			ret = policy_opts_finalize(&o, 512, NULL, err, sizeof err);
		assert_int_equal(ret, -EINVAL);
		if (!strstr(err, cases[i].names))
			fail_msg("case %zu: '%s' does not name %s", i, err, cases[i].names);
	}
	/* In range: the bounds themselves, and a budget of 8 that is no page multiple of the
	 * paged policies' kind (refreshkv's budget is tokens per head). */
	const char *good[] = { "--policy", "refreshkv", "--refresh-stride", "1",
			       "--refresh-threshold", "-1", "--budget", "12", NULL };
	struct policy_opts o;
	policy_opts_default(&o);
	char err[256];
	for (int j = 0; good[j]; j++)
		assert_true(policy_opts_parse_flag(&o, 8, (char **)good, &j, err, sizeof err) == 1);
	assert_int_equal(policy_opts_finalize(&o, 512, NULL, err, sizeof err), 0);
	assert_int_equal(o.kv.budget, 12);
	/* The policy refuses them too, whoever builds its options. */
	NEED_MODEL();
	const struct kv_policy_ops *P = kvcache_policy("refreshkv");
	struct kv_seq_params p = {
		.be = be, .n_layers = 2, .attn = { 8, 4, 8, FKV_F32, 0.35f, 0 }, .max_tokens = 512,
		.opts = kvo(8, 64, 1, 5, 0.85f, false),
	};
	void *st;
	assert_int_equal(P->create(&p, &st), -EINVAL); /* no host copy */
	struct hostkv_seq *hs;
	struct kv_geom g = { .n_kv = 4, .p = 8, .d = 8, .dtype = FKV_F32 };
	assert_int_equal(hostkv_seq_open(store, "tr-bad", model.fingerprint, 2, &g, true, &hs, err,
					 sizeof err), 0);
	p.host = hs;
	const struct kv_policy_opts bad[] = { kvo(8, 7, 1, 5, 0.85f, false),
					      kvo(8, 64, 1, 0, 0.85f, false),
					      kvo(8, 64, 1, 5, 2.01f, false),
					      kvo(8, 64, 1, 5, NAN, false) };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		p.opts = bad[i];
		assert_int_equal(P->create(&p, &st), -EINVAL);
	}
	p.opts = kvo(8, 64, 1, 5, 0.85f, false);
	assert_int_equal(P->create(&p, &st), 0);
	assert_int_equal(P->step_begin(st, 513), -ENOSPC);
	assert_int_equal(P->restore(st, 513), -EINVAL);
	P->destroy(st);
	hostkv_seq_close(hs, true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_select_helpers),
		cmocka_unit_test(test_bad_options),
		cmocka_unit_test(test_budget_covers_context_is_full),
		cmocka_unit_test(test_stride_one_is_full),
		cmocka_unit_test(test_float64_reference),
		cmocka_unit_test(test_streamed_equals_direct),
		cmocka_unit_test(test_resume_continues),
		cmocka_unit_test(test_retried_step),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
