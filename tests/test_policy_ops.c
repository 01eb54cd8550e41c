/* Tests for the selection ops of the backend (worker/backend/backend_cpu_select.c, backend.h)
 * and for the paged policies' use of them (worker/kvcache/policy_paged_select.c):
 *   - the CPU backend's select_pages equals a sort-based top-k (score desc, page asc) of
 *     select_scores() on random inputs, with duplicated pages forcing exact ties (the lower page
 *     wins), and its changed lists are exactly the selected pages outside a random resident
 *     mask, ascending, padded with -1; a bad geometry is refused;
 *   - page_summary equals select_page_summary per head on f32, f16 and bf16 slots;
 *   - group_cosine equals select_group_cosine;
 *   - download_async lands the bytes by fence_wait;
 *   - quest and freekv on the CPU backend wrapped by counters: every compressed step selects
 *     through select_pages, every filled page is summarised by page_summary, freekv's check
 *     runs through group_cosine once per step, its speculative selections go through
 *     download_async (tau 0) and each of their recalls is ordered by its layer's event
 *     (fence_stream_wait) when the next step reaches the layer, and none do when every head is
 *     corrected (tau 2); the
 *     decode downloads nothing but logits, cosines and selections (no query, no page), every
 *     recalled unit goes through the recall path asked for (recall_direct by default: read in
 *     the pool, no host copy; recall_mapped; or recall_units, staged), with the same tokens and
 *     logits as the unwrapped backend;
 *   - slots in the KV dtype (bf16, f16: the CUDA backend's slot_dtype) on the CPU backend give
 *     every paged policy exactly the tokens and logits of f32 slots, in half the memory;
 *   - prefill stays on the backend (no rows downloaded; a chunked prompt's dense context kept
 *     from chunk to chunk), with `full`'s prefill logits. */
#include "test_util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "hostkv.h"
#include "recall.h"
#include "select.h"

static uint64_t rng = 0x5e1ec7;

static float *rnd(size_t n)
{
	float *x = malloc(n * sizeof *x);
	assert_non_null(x);
	for (size_t i = 0; i < n; i++)
		x[i] = test_randf(&rng);
	return x;
}

static const float *cmp_s;

static int by_score_then_page(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	if (cmp_s[i] != cmp_s[j])
		return cmp_s[i] > cmp_s[j] ? -1 : 1;
	return i < j ? -1 : i > j;
}

static int ascending(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	return i < j ? -1 : i > j;
}

static void test_select_pages_cpu(void **state)
{
	(void)state;
	struct backend *be;
	assert_int_equal(backend_cpu_new(&be, 1), 0);
	const struct { int n_q, n_kv, d, stride, begin, n_cand, k, dup; } cases[] = {
		{ 8, 2, 16, 40, 2, 30, 5, 0 },
		{ 4, 4, 8, 64, 1, 60, 12, 1 },	/* duplicated pages: exact ties */
		{ 32, 8, 128, 300, 4, 280, 58, 1 },
		{ 6, 3, 10, 20, 0, 20, 20, 0 },	/* k = every candidate */
		{ 2, 1, 4, 9, 3, 5, 1, 1 },
	};
	for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
		const int n_q = cases[ci].n_q, H = cases[ci].n_kv, d = cases[ci].d;
		const int S = cases[ci].stride, b0 = cases[ci].begin, n = cases[ci].n_cand;
		const int k = cases[ci].k;
		float *q = rnd((size_t)n_q * d), *mn = rnd((size_t)H * S * d);
		float *mx = malloc((size_t)H * S * d * sizeof *mx);
		assert_non_null(mx);
		for (size_t i = 0; i < (size_t)H * S * d; i++)
			mx[i] = mn[i] + fabsf(test_randf(&rng));
		if (cases[ci].dup) /* every third page a copy of the one before it */
			for (int h = 0; h < H; h++)
				for (int j = 1; j < S; j += 3) {
					size_t a = ((size_t)h * S + j) * d, p = a - d;
					memcpy(mn + a, mn + p, d * sizeof *mn);
					memcpy(mx + a, mx + p, d * sizeof *mx);
				}
		uint8_t *res = malloc((size_t)H * S);
		assert_non_null(res);
		for (size_t i = 0; i < (size_t)H * S; i++)
			res[i] = test_rand(&rng) % 3 == 0;
		const struct backend_select g = { n_q, H, d, S, b0, n, k };
		int32_t *pages = malloc((size_t)H * k * 4), *chg = malloc((size_t)H * k * 4);
		int32_t *nchg = malloc((size_t)H * 4);
		memset(pages, 0x7f, (size_t)H * k * 4);
		memset(chg, 0x7f, (size_t)H * k * 4);
		memset(nchg, 0x7f, (size_t)H * 4);
		assert_int_equal(be->ops->select_pages(be->ctx, &g, q, mn, mx, res, pages, chg, nchg),
				 0);
		/* Reference: select_scores, then a sort. */
		const struct select_geom sg = { .n_q = n_q, .n_kv = H, .d = d, .p = 1 };
		const struct select_layout lay = { .compressed = true, .cand_begin = b0,
						   .cand_end = b0 + n, .k = k };
		float *sc = malloc((size_t)H * n * sizeof *sc);
		float *scratch = malloc(select_scratch_floats(&sg, n) * sizeof *scratch);
		int *idx = malloc((size_t)n * sizeof *idx);
		select_scores(&sg, &lay, q, mn, mx, S, sc, scratch);
		int ties = 0;
		for (int h = 0; h < H; h++) {
			cmp_s = sc + (size_t)h * n;
			for (int j = 0; j < n; j++)
				idx[j] = j;
			qsort(idx, n, sizeof *idx, by_score_then_page);
			if (k < n && cmp_s[idx[k - 1]] == cmp_s[idx[k]])
				ties++;
			qsort(idx, k, sizeof *idx, ascending);
			int m = 0;
			for (int i = 0; i < k; i++) {
				int pg = b0 + idx[i];
				assert_int_equal(pages[h * k + i], pg);
				if (!res[(size_t)h * S + pg])
					assert_int_equal(chg[h * k + m++], pg);
			}
			assert_int_equal(nchg[h], m);
			for (int i = m; i < k; i++)
				assert_int_equal(chg[h * k + i], -1);
		}
		/* With duplicated pages some head's cut falls on a tie, decided by the page index. */
		if (cases[ci].dup && ci == 1)
			assert_true(ties > 0 || k == n);
		struct backend_select bad = g;
		bad.k = n + 1;
		assert_int_equal(be->ops->select_pages(be->ctx, &bad, q, mn, mx, res, pages, chg,
						       nchg), -EINVAL);
		bad = g;
		bad.n_cand = S - b0 + 1;
		assert_int_equal(be->ops->select_pages(be->ctx, &bad, q, mn, mx, res, pages, chg,
						       nchg), -EINVAL);
		free(q);
		free(mn);
		free(mx);
		free(res);
		free(pages);
		free(chg);
		free(nchg);
		free(sc);
		free(scratch);
		free(idx);
	}
	backend_free(be);
}

static void test_summary_and_cosine_cpu(void **state)
{
	(void)state;
	struct backend *be;
	assert_int_equal(backend_cpu_new(&be, 1), 0);
	const int P = 16, H = 4, d = 32, S = 7, page = 5;
	const enum fkv_dtype dts[] = { FKV_F32, FKV_F16, FKV_BF16 };
	for (int t = 0; t < 3; t++) {
		const size_t n = (size_t)2 * P * H * d;
		float *slot = rnd(n);
		dtype_round(slot, dts[t], n);
		void *typed = malloc(n * dtype_size(dts[t]));
		assert_non_null(typed);
		dtype_from_f32(typed, slot, dts[t], n);
		float *mn = malloc((size_t)H * S * d * 4), *mx = malloc((size_t)H * S * d * 4);
		memset(mn, 0xff, (size_t)H * S * d * 4);
		memset(mx, 0xff, (size_t)H * S * d * 4);
		assert_int_equal(be->ops->page_summary(be->ctx, mn, mx, S, page, typed, dts[t], P, H,
						       d), 0);
		float rmn[32], rmx[32];
		for (int h = 0; h < H; h++) {
			select_page_summary(P, d, slot + (size_t)h * d, (size_t)H * d, rmn, rmx);
			size_t at = ((size_t)h * S + page) * d;
			assert_memory_equal(mn + at, rmn, sizeof rmn);
			assert_memory_equal(mx + at, rmx, sizeof rmx);
		}
		assert_int_equal(be->ops->page_summary(be->ctx, mn, mx, S, S, typed, dts[t], P, H, d),
				 -EINVAL);
		free(slot);
		free(typed);
		free(mn);
		free(mx);
	}
	const int n_q = 12, n_kv = 3;
	float *a = rnd((size_t)n_q * d), *b = rnd((size_t)n_q * d), out[3], ref[3];
	memset(b, 0, d * sizeof *b); /* a zero vector: cosine 0 against a non-zero one */
	const struct select_geom sg = { .n_q = n_q, .n_kv = n_kv, .d = d, .p = 1 };
	select_group_cosine(&sg, a, b, ref);
	assert_int_equal(be->ops->group_cosine(be->ctx, out, a, b, n_q, n_kv, d), 0);
	assert_memory_equal(out, ref, sizeof ref);
	assert_int_equal(be->ops->group_cosine(be->ctx, out, a, b, n_q, 5, d), -EINVAL);
	/* download_async: the bytes are there once the fence is waited for. */
	void *f;
	assert_int_equal(be->ops->fence_new(be->ctx, &f), 0);
	float *h = be->ops->host_alloc(be->ctx, sizeof ref);
	assert_non_null(h);
	assert_int_equal(be->ops->download_async(be->ctx, h, ref, sizeof ref, f), 0);
	assert_int_equal(be->ops->fence_wait(be->ctx, f), 0);
	assert_memory_equal(h, ref, sizeof ref);
	be->ops->host_free(be->ctx, h);
	be->ops->fence_free(be->ctx, f);
	free(a);
	free(b);
	backend_free(be);
}

/* ---- the policies through a counted CPU backend ---- */

static struct fkv_model model;
static struct backend *cpu;
static struct hostkv *store;
static bool have_model;
static int seq_no;

enum { PROMPT = 16, VOCAB = 512, STEPS = 120 };

static const struct backend_ops *real;
static int64_t n_select, n_summary, n_cosine, n_async, n_bad_download;
static bool decoding, prefilling;
static size_t ok_sizes[4];

static int c_select_pages(void *c, const struct backend_select *g, const float *q,
			  const float *mn, const float *mx, const uint8_t *res, int32_t *pages,
			  int32_t *chg, int32_t *nchg)
{
	n_select++;
	return real->select_pages(c, g, q, mn, mx, res, pages, chg, nchg);
}

static int c_page_summary(void *c, float *mn, float *mx, int stride, int page, const void *slot,
			  enum fkv_dtype dt, int p, int n_kv, int d)
{
	n_summary++;
	return real->page_summary(c, mn, mx, stride, page, slot, dt, p, n_kv, d);
}

static int c_group_cosine(void *c, float *o, const float *a, const float *b, int n_q, int n_kv,
			  int d)
{
	n_cosine++;
	return real->group_cosine(c, o, a, b, n_q, n_kv, d);
}

static int64_t n_direct, n_staged;

static int c_recall_direct(void *c, void *const *slots, const int *heads, const void *const *srcs,
			   int n, int p, int n_kv, int d, enum fkv_dtype dt, enum fkv_dtype sdt,
			   void *done)
{
	n_direct += n;
	return real->recall_direct(c, slots, heads, srcs, n, p, n_kv, d, dt, sdt, done);
}

static int64_t n_mapped, n_fsw;

static int c_fence_stream_wait(void *c, void *f)
{
	n_fsw++;
	return real->fence_stream_wait(c, f);
}

static int c_recall_mapped(void *c, void *const *slots, const int *heads, const void *const *srcs,
			   int n, int p, int n_kv, int d, enum fkv_dtype dt, enum fkv_dtype sdt,
			   void *done)
{
	n_mapped += n;
	return real->recall_mapped(c, slots, heads, srcs, n, p, n_kv, d, dt, sdt, done);
}

static int c_recall_units(void *c, void *const *slots, const int *heads, const void *units, int n,
			  int p, int n_kv, int d, enum fkv_dtype dt, enum fkv_dtype sdt, void *done)
{
	n_staged += n;
	return real->recall_units(c, slots, heads, units, n, p, n_kv, d, dt, sdt, done);
}

static int c_download_async(void *c, void *d, const void *s, size_t n, void *f)
{
	n_async++;
	return real->download_async(c, d, s, n, f);
}

/* In decode only the logits, the cosines and the selections come back; in prefill
 * (prefilling) only logits, rows of VOCAB floats. */
static int c_download(void *c, void *d, const void *s, size_t n)
{
	bool ok = !decoding && !prefilling;
	for (size_t i = 0; decoding && i < sizeof ok_sizes / sizeof *ok_sizes; i++)
		ok |= n == ok_sizes[i];
	ok |= prefilling && n % (VOCAB * sizeof(float)) == 0;
	n_bad_download += !ok;
	return real->download(c, d, s, n);
}

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
	struct hostkv_opts ho = { .worker_name = "test_policy_ops" };
	if (backend_cpu_new(&cpu, 2) || hostkv_open(&ho, &store, err, sizeof err)) {
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
	backend_free(cpu);
	model_free(&model);
	return 0;
}

static int argmax(const float *x)
{
	int b = 0;
	for (int i = 1; i < VOCAB; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* Greedy: PROMPT ids, then STEPS decode steps on be; logits (STEPS + 1, VOCAB). */
static enum fkv_dtype gen_kv_dtype; /* with gen_kv_dtype_set, the sequences' KV dtype */
static bool gen_kv_dtype_set;

static void gen(struct backend *be, const char *policy, struct kv_policy_opts kv, float *logits,
		struct kv_stats *st)
{
	struct engine_opts o = { .max_ctx = 512, .policy = policy, .kv = kv,
				 .kv_dtype = gen_kv_dtype, .kv_dtype_set = gen_kv_dtype_set };
	struct engine *e;
	char err[256], name[64];
	if (engine_new(&e, &model, be, &o, err, sizeof err))
		fail_msg("engine_new %s: %s", policy, err);
	struct kv_geom g;
	engine_kv_geom(e, &g);
	snprintf(name, sizeof name, "tpo-%d", seq_no++);
	struct hostkv_seq *hs;
	if (hostkv_seq_open(store, name, model.fingerprint, model.cfg.n_layers, &g, true, &hs, err,
			    sizeof err))
		fail_msg("hostkv_seq_open: %s", err);
	int seq;
	if (engine_seq_open(e, hs, &seq, err, sizeof err))
		fail_msg("engine_seq_open: %s", err);
	int32_t toks[PROMPT];
	uint64_t s = 4242;
	toks[0] = 1;
	for (int i = 1; i < PROMPT; i++)
		toks[i] = 3 + (int32_t)(test_rand(&s) % (VOCAB - 3));
	if (engine_prefill(e, seq, toks, PROMPT, logits, false, err, sizeof err))
		fail_msg("prefill: %s", err);
	decoding = true;
	for (int t = 0; t < STEPS; t++) {
		int32_t next = argmax(logits + (size_t)t * VOCAB);
		if (engine_decode(e, 1, &seq, &next, logits + (size_t)(t + 1) * VOCAB, err,
				  sizeof err))
			fail_msg("decode %s step %d: %s", policy, t, err);
	}
	decoding = false;
	assert_int_equal(engine_seq_stats(e, seq, st), 0);
	engine_seq_free(e, seq);
	hostkv_seq_close(hs, true);
	engine_free(e);
}

static void test_policies_use_ops(void **state)
{
	(void)state;
	if (!have_model)
		skip();
	real = cpu->ops;
	struct backend_ops ops = *cpu->ops;
	ops.name = "counted";
	ops.select_pages = c_select_pages;
	ops.page_summary = c_page_summary;
	ops.group_cosine = c_group_cosine;
	ops.download_async = c_download_async;
	ops.download = c_download;
	ops.recall_direct = c_recall_direct;
	ops.recall_units = c_recall_units;
	ops.recall_mapped = c_recall_mapped;
	ops.fence_stream_wait = c_fence_stream_wait;
	struct backend counted = { .ops = &ops, .ctx = cpu->ctx };
	const int P = 8, FL = 1, B = 64, K = (B - 8 - 16) / P;
	const int H = model.cfg.n_kv_heads, retr = model.cfg.n_layers - FL;
	ok_sizes[0] = (size_t)VOCAB * sizeof(float);
	ok_sizes[1] = (size_t)H * sizeof(float);
	ok_sizes[2] = (2 * (size_t)H * K + H) * sizeof(int32_t);
	const struct { const char *pol; float tau; int path; } runs[] = {
		{ "quest", 0.9f, RECALL_DMA },	  { "freekv", 0.0f, RECALL_DMA },
		{ "freekv", 0.9f, RECALL_DMA },	  { "freekv", 2.0f, RECALL_DMA },
		{ "quest", 0.9f, RECALL_MAPPED }, { "freekv", 0.9f, RECALL_STAGED },
	};
	float *ref = malloc((size_t)(STEPS + 1) * VOCAB * sizeof *ref);
	float *got = malloc((size_t)(STEPS + 1) * VOCAB * sizeof *got);
	assert_non_null(ref);
	assert_non_null(got);
	for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
		struct kv_policy_opts kv = { .page = P, .budget = B, .sink = 8, .window = 16,
					     .full_layers = FL, .tau = runs[i].tau,
					     .recall_path = runs[i].path };
		struct kv_stats st, st_ref;
		gen(cpu, runs[i].pol, kv, ref, &st_ref);
		n_select = n_summary = n_cosine = n_async = n_bad_download = 0;
		n_direct = n_staged = n_mapped = n_fsw = 0;
		gen(&counted, runs[i].pol, kv, got, &st);
		char what[64];
		snprintf(what, sizeof what, "%s tau %.1f", runs[i].pol, runs[i].tau);
		if (memcmp(got, ref, (size_t)(STEPS + 1) * VOCAB * sizeof *got))
			fail_msg("%s: counted logits differ", what);
		assert_true(st.sum.steps > 0);
		/* Every page that filled, at every retrieval layer. */
		assert_int_equal(n_summary, (int64_t)retr * ((PROMPT + STEPS) / P));
		assert_int_equal(n_bad_download, 0);
		/* every recalled unit through the path asked for: read where it lies in the pool by
		 * the device itself (mapped, the default) or by DMA, or copied (staged); the last
		 * step's speculative jobs ran, but are counted only once waited for */
		int64_t by[3];
		by[RECALL_MAPPED] = n_mapped;
		by[RECALL_STAGED] = n_staged;
		by[RECALL_DMA] = n_direct;
		for (int k = 0; k < 3; k++)
			if (k == runs[i].path)
				assert_true(by[k] >= st.sum.pages_recalled && by[k] > 0);
			else
				assert_int_equal(by[k], 0);
		if (!strcmp(runs[i].pol, "quest")) {
			assert_int_equal(n_fsw, 0); /* blocking recalls order at once */
			assert_int_equal(n_select, st.sum.steps);
			assert_int_equal(n_cosine, 0);
			assert_int_equal(n_async, 0);
			continue;
		}
		/* One check a step after each layer's first compressed one; its cosines are
		 * computed (and waited for) only where they can change the outcome: not at tau 0
		 * (no head is flagged) nor above 1 (every head is). */
		assert_int_equal(st.sum.head_checks / H, st.sum.steps - retr);
		const bool cos_matters = runs[i].tau > 0.0f && runs[i].tau <= 1.0f;
		assert_int_equal(n_cosine, cos_matters ? st.sum.steps - retr : 0);
		if (runs[i].tau == 0.0f) {
			/* the first step blocking, every later one speculative, behind a fence */
			assert_int_equal(n_select, st.sum.steps);
			assert_int_equal(n_async, st.sum.steps - retr);
			/* each speculative recall ordered by its per-layer event when the next step
			 * reaches the layer (the last step's are never reached) */
			assert_int_equal(n_fsw, n_async - retr);
		} else if (runs[i].tau > 1.0f) {
			assert_int_equal(n_select, st.sum.steps);
			assert_int_equal(n_async, 0);
		} else {
			/* one selection a step: blocking where a head was flagged, else queued */
			assert_int_equal(n_select, st.sum.steps);
			assert_true(n_async > 0 && n_async < st.sum.steps - retr);
		}
	}
	free(ref);
	free(got);
}

static enum fkv_dtype kv_slot_dtype(void *ctx, enum fkv_dtype kv)
{
	(void)ctx;
	return kv;
}

/* Slots in the KV dtype, as the CUDA backend keeps them, on the CPU backend: every paged
 * policy's tokens and logits equal those of f32 slots bit for bit (the slots hold the same
 * values; attention accumulates in f32 either way), with the debug invariants comparing every
 * attended slot (converted) with the host copy each step, and half the slot memory. */
static void test_slots_in_kv_dtype(void **state)
{
	(void)state;
	if (!have_model)
		skip();
	struct backend_ops ops = *cpu->ops;
	ops.name = "slots16";
	ops.slot_dtype = kv_slot_dtype;
	struct backend b16 = { .ops = &ops, .ctx = cpu->ctx };
	const enum fkv_dtype dts[] = { FKV_BF16, FKV_F16 };
	static const char *const pols[] = { "streaming", "quest", "freekv" };
	float *ref = malloc((size_t)(STEPS + 1) * VOCAB * sizeof *ref);
	float *got = malloc((size_t)(STEPS + 1) * VOCAB * sizeof *got);
	assert_non_null(ref);
	assert_non_null(got);
	for (size_t t = 0; t < 2; t++)
		for (size_t i = 0; i < 3; i++) {
			struct kv_policy_opts kv = { .page = 8, .budget = 64, .sink = 8, .window = 16,
						     .full_layers = 1, .tau = 0.9f,
						     .debug_invariants = true };
			struct kv_stats a, b;
			gen_kv_dtype = dts[t];
			gen_kv_dtype_set = true;
			gen(cpu, pols[i], kv, ref, &a);
			gen(&b16, pols[i], kv, got, &b);
			gen_kv_dtype_set = false;
			if (memcmp(got, ref, (size_t)(STEPS + 1) * VOCAB * sizeof *got))
				fail_msg("%s, %s slots: logits differ from f32 slots", pols[i],
					 dtype_name(dts[t]));
			assert_true(b.sum.steps > 0);
			assert_int_equal(b.sum.pages_recalled, a.sum.pages_recalled);
			/* the retrieval layers' 8 slots of (2, 8, n_kv, d): 4 bytes an element, then 2 */
			const int64_t f32_slots = (int64_t)(model.cfg.n_layers - 1) * 8 * 2 * 8 *
						  model.cfg.n_kv_heads * model.cfg.head_dim * 4;
			assert_int_equal(a.device_bytes - b.device_bytes, f32_slots / 2);
		}
	free(ref);
	free(got);
}

/* A prompt of 300 tokens in one chunk and in chunks of 24 (past the budget of 64 from the
 * fourth chunk on, the dense context growing past 256 rows): every paged policy prefills on the
 * backend — the step's rows go from the backend into the slots, the host copy (store_rows) and
 * the dense context the previous chunk left, and nothing comes back but logits (and hardkv's
 * summaries) — with the logits of `full` at every prompt row, bit for bit (prefill attention
 * is dense in both, chunked alike). Then 40 decode steps, once with the debug invariants on:
 * the slots, summaries and selections they check against the host copy hold after a chunked
 * prefill too. */
static void test_prefill_on_device(void **state)
{
	(void)state;
	if (!have_model)
		skip();
	enum { N = 300, UB = 24, DEC = 40 };
	real = cpu->ops;
	struct backend_ops ops = *cpu->ops;
	ops.name = "counted";
	ops.download = c_download;
	struct backend counted = { .ops = &ops, .ctx = cpu->ctx };
	int32_t toks[N];
	uint64_t sd = 777;
	toks[0] = 1;
	for (int i = 1; i < N; i++)
		toks[i] = 3 + (int32_t)(test_rand(&sd) % (VOCAB - 3));
	static const char *const pols[] = { "full", "streaming", "quest", "freekv", "hardkv" };
	float *lg[2][2];
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			assert_non_null(lg[i][j] = malloc((size_t)(N + DEC) * VOCAB * sizeof(float)));
	for (size_t pi = 0; pi < sizeof pols / sizeof *pols; pi++)
		for (int run = 0; run < 3; run++) {
			const bool chunked = run > 0, dbg = run == 2;
			struct kv_policy_opts kv = { .page = 8, .budget = 64, .sink = 8, .window = 16,
						     .full_layers = 1, .tau = 0.9f,
						     .debug_invariants = dbg };
			struct engine_opts o = { .max_ctx = 512, .policy = pols[pi], .kv = kv,
						 .ubatch = chunked ? UB : 256 };
			struct engine *e;
			char err[256], name[64];
			if (engine_new(&e, &model, &counted, &o, err, sizeof err))
				fail_msg("engine_new %s: %s", pols[pi], err);
			struct kv_geom g;
			engine_kv_geom(e, &g);
			snprintf(name, sizeof name, "tpo-pre-%d", seq_no++);
			struct hostkv_seq *hs;
			int seq;
			if (hostkv_seq_open(store, name, model.fingerprint, model.cfg.n_layers, &g,
					    true, &hs, err, sizeof err) ||
			    engine_seq_open(e, hs, &seq, err, sizeof err))
				fail_msg("open: %s", err);
			float *out = lg[pi > 0][chunked];
			n_bad_download = 0;
			/* the checks download what they compare; hardkv's top-p selection keeps a
			 * host copy of the summaries (a download of each page's, as it fills) */
			prefilling = !dbg && strcmp(pols[pi], "hardkv");
			if (engine_prefill(e, seq, toks, N, out, true, err, sizeof err))
				fail_msg("prefill %s: %s", pols[pi], err);
			prefilling = false;
			assert_int_equal(n_bad_download, 0);
			for (int t = 0; t < DEC; t++) {
				int32_t next = argmax(out + (size_t)(N - 1 + t) * VOCAB);
				if (engine_decode(e, 1, &seq, &next, out + (size_t)(N + t) * VOCAB,
						  err, sizeof err))
					fail_msg("decode %s: %s", pols[pi], err);
			}
			engine_seq_free(e, seq);
			hostkv_seq_close(hs, true);
			engine_free(e);
			if (pi > 0 && memcmp(lg[1][chunked], lg[0][chunked],
					     (size_t)N * VOCAB * sizeof(float)))
				fail_msg("%s%s: prefill logits differ from full's", pols[pi],
					 chunked ? " in chunks" : "");
		}
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			free(lg[i][j]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_select_pages_cpu),
		cmocka_unit_test(test_summary_and_cosine_cpu),
		cmocka_unit_test(test_policies_use_ops),
		cmocka_unit_test(test_slots_in_kv_dtype),
		cmocka_unit_test(test_prefill_on_device),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
