/* test_backend_cuda_select — the CUDA backend's selection ops against the CPU backend, the
 * reference (worker/backend/backend_cuda_select.c vs backend_cpu_select.c, which calls
 * select.c), on random inputs (never zeros), outputs poisoned (0xff bytes for floats: NaN;
 * 0x7f bytes for int32: a page no geometry here reaches):
 *   - page_summary: exact (min and max are exact) on f32, f16 and bf16 slots;
 *   - select_pages: pages, changed lists and counts exactly equal, with random resident masks
 *     (host memory, overwritten right after the call returns: the op staged it)
 *     and duplicated pages whose exact ties must go to the lower page; inputs where a score
 *     below the k-th is within 2e-5 of it (relative) are redrawn, so f32 summation
 *     order cannot flip a choice;
 *   - group_cosine within 1e-5 (absolute);
 *   - download_async + fence_wait with the device kept lagging (adds over 64 MiB queued
 *     first): the fence, waited for on another thread, delivers the selection, not the poison
 *     the pinned buffer held; a reused fence delivers the second result.
 * Skips (77) without a CUDA device. */
#include "gpu_test.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "backend.h"
#include "gpu_backend_test.h"
#include "select.h"

static uint64_t rng = 0x5e1ec7ed;

static void *poison_i32(struct backend *be, size_t n)
{
	int32_t *h = malloc(n * sizeof *h);
	assert_non_null(h);
	memset(h, 0x7f, n * sizeof *h);
	void *p = put(be, h, n * sizeof *h);
	free(h);
	return p;
}

static void test_page_summary(void **state)
{
	(void)state;
	const int P = 32, H = 8, d = 128, S = 12, page = 9;
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++) {
		const enum fkv_dtype dt = gpu_test_dtypes[t];
		const size_t n = (size_t)2 * P * H * d, ns = (size_t)H * S * d;
		float *slot = rand_f32(n, 3.0f);
		void *typed = gpu_test_to_dtype(slot, dt, n);
		void *cs = put(cpu, typed, n * dtype_size(dt)), *gs = put(gpu, typed, n * dtype_size(dt));
		float *cmn = poisoned(cpu, ns * 4), *cmx = poisoned(cpu, ns * 4);
		float *gmn = poisoned(gpu, ns * 4), *gmx = poisoned(gpu, ns * 4);
		assert_int_equal(cpu->ops->page_summary(cpu->ctx, cmn, cmx, S, page, cs, dt, P, H, d),
				 0);
		assert_int_equal(gpu->ops->page_summary(gpu->ctx, gmn, gmx, S, page, gs, dt, P, H, d),
				 0);
		float *a = malloc(ns * 4), *b = malloc(ns * 4);
		for (int which = 0; which < 2; which++) {
			get(cpu, a, which ? cmx : cmn, ns * 4);
			get(gpu, b, which ? gmx : gmn, ns * 4);
			for (int h = 0; h < H; h++) {
				size_t at = ((size_t)h * S + page) * d;
				if (memcmp(a + at, b + at, d * 4))
					fail_msg("page_summary %s head %d %s differs", dtype_name(dt), h,
						 which ? "max" : "min");
			}
		}
		assert_int_equal(gpu->ops->page_summary(gpu->ctx, gmn, gmx, S, S, gs, dt, P, H, d),
				 -EINVAL);
		free(a);
		free(b);
		free(slot);
		free(typed);
		drop(cpu, cs);
		drop(gpu, gs);
		drop(cpu, cmn);
		drop(cpu, cmx);
		drop(gpu, gmn);
		drop(gpu, gmx);
	}
}

struct sel_case {
	int n_q, n_kv, d, stride, begin, n_cand, k;
	bool dup;
};

/* Random summaries and query for c (redrawn while a cut is a near-tie of distinct pages). */
static void sel_inputs(const struct sel_case *c, float **q, float **mn, float **mx)
{
	const size_t nsum = (size_t)c->n_kv * c->stride * c->d;
	const struct select_geom sg = { .n_q = c->n_q, .n_kv = c->n_kv, .d = c->d, .p = 1 };
	const struct select_layout lay = { .compressed = true, .cand_begin = c->begin,
					   .cand_end = c->begin + c->n_cand, .k = c->k };
	float *sc = malloc((size_t)c->n_kv * c->n_cand * 4);
	float *scratch = malloc(select_scratch_floats(&sg, c->n_cand) * 4);
	for (int tries = 0;; tries++) {
		assert_true(tries < 50);
		*q = rand_f32((size_t)c->n_q * c->d, 1.0f);
		*mn = rand_f32(nsum, 1.0f);
		*mx = malloc(nsum * 4);
		for (size_t i = 0; i < nsum; i++)
			(*mx)[i] = (*mn)[i] + fabsf(test_randf(&rng));
		if (c->dup)
			for (int h = 0; h < c->n_kv; h++)
				for (int j = 1; j < c->stride; j += 3) {
					size_t at = ((size_t)h * c->stride + j) * c->d;
					memcpy(*mn + at, *mn + at - c->d, c->d * 4);
					memcpy(*mx + at, *mx + at - c->d, c->d * 4);
				}
		select_scores(&sg, &lay, *q, *mn, *mx, c->stride, sc, scratch);
		/* the k-th largest and the largest below it, per head */
		bool close = false;
		for (int h = 0; h < c->n_kv && c->k < c->n_cand; h++) {
			const float *s = sc + (size_t)h * c->n_cand;
			float *sorted = malloc(c->n_cand * 4);
			memcpy(sorted, s, c->n_cand * 4);
			for (int i = 1; i < c->n_cand; i++) /* descending insertion sort */
				for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
					float t = sorted[j];
					sorted[j] = sorted[j - 1];
					sorted[j - 1] = t;
				}
			float kth = sorted[c->k - 1];
			for (int i = 0; i < c->n_cand; i++)
				if (s[i] < kth && (kth - s[i]) / kth < 2e-5f)
					close = true;
			free(sorted);
		}
		if (!close)
			break;
		free(*q);
		free(*mn);
		free(*mx);
	}
	free(sc);
	free(scratch);
}

static void test_select_pages(void **state)
{
	(void)state;
	const struct sel_case cases[] = {
		{ 8, 2, 16, 40, 2, 30, 5, false },
		{ 4, 4, 8, 64, 1, 60, 12, true },
		{ 32, 8, 128, 1100, 4, 1000, 58, true }, /* llama-3.1-8b heads, 32K tokens */
		{ 6, 3, 80, 20, 0, 20, 20, false },	  /* k = every candidate */
		{ 64, 8, 128, 2100, 4, 2000, 100, false },
	};
	for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
		const struct sel_case *c = &cases[ci];
		const int H = c->n_kv, S = c->stride, k = c->k;
		float *q, *mn, *mx;
		sel_inputs(c, &q, &mn, &mx);
		uint8_t *res = malloc((size_t)H * S);
		for (size_t i = 0; i < (size_t)H * S; i++)
			res[i] = test_rand(&rng) % 3 == 0;
		const size_t nsum = (size_t)H * S * c->d * 4, nq = (size_t)c->n_q * c->d * 4;
		const size_t nout = (size_t)(2 * H * k + H);
		const struct backend_select g = { c->n_q, H, c->d, S, c->begin, c->n_cand, k };
		int32_t *out[2];
		struct backend *bes[2] = { cpu, gpu };
		for (int b = 0; b < 2; b++) {
			struct backend *be = bes[b];
			float *dq = put(be, q, nq), *dmn = put(be, mn, nsum), *dmx = put(be, mx, nsum);
			int32_t *dout = poison_i32(be, nout);
			/* the resident mask is host memory, read during the call */
			assert_int_equal(be->ops->select_pages(be->ctx, &g, dq, dmn, dmx, res, dout,
							       dout + (size_t)H * k,
							       dout + (size_t)2 * H * k), 0);
			/* read during the call: overwriting it now must change nothing */
			if (be == gpu)
				memset(res, 1, (size_t)H * S);
			out[b] = malloc(nout * 4);
			get(be, out[b], dout, nout * 4);
			drop(be, dq);
			drop(be, dmn);
			drop(be, dmx);
			drop(be, dout);
		}
		for (size_t i = 0; i < nout; i++)
			if (out[0][i] != out[1][i])
				fail_msg("select_pages case %zu: entry %zu is %d on cuda, %d on cpu", ci,
					 i, out[1][i], out[0][i]);
		struct backend_select bad = g;
		bad.k = c->n_cand + 1;
		assert_int_equal(gpu->ops->select_pages(gpu->ctx, &bad, NULL, NULL, NULL, NULL, NULL,
							NULL, NULL), -EINVAL);
		free(out[0]);
		free(out[1]);
		free(q);
		free(mn);
		free(mx);
		free(res);
	}
}

static void test_group_cosine(void **state)
{
	(void)state;
	const struct { int n_q, n_kv, d; } cases[] = { { 32, 8, 128 }, { 8, 8, 64 }, { 12, 3, 80 } };
	for (size_t ci = 0; ci < 3; ci++) {
		const int n_q = cases[ci].n_q, H = cases[ci].n_kv, d = cases[ci].d;
		const size_t nq = (size_t)n_q * d;
		float *a = rand_f32(nq, 1.0f), *b = rand_f32(nq, 1.0f);
		for (size_t i = 0; i < nq / 2; i++) /* half the heads near a, so cosines spread */
			b[i] = a[i] + 0.1f * b[i];
		float ref[8], got[8];
		void *ca = put(cpu, a, nq * 4), *cb = put(cpu, b, nq * 4), *co = poisoned(cpu, H * 4);
		void *ga = put(gpu, a, nq * 4), *gb = put(gpu, b, nq * 4), *go = poisoned(gpu, H * 4);
		assert_int_equal(cpu->ops->group_cosine(cpu->ctx, co, ca, cb, n_q, H, d), 0);
		assert_int_equal(gpu->ops->group_cosine(gpu->ctx, go, ga, gb, n_q, H, d), 0);
		get(cpu, ref, co, H * 4);
		get(gpu, got, go, H * 4);
		for (int h = 0; h < H; h++)
			if (!(fabsf(got[h] - ref[h]) <= 1e-5f))
				fail_msg("group_cosine case %zu head %d: %g vs %g", ci, h, got[h],
					 ref[h]);
		drop(cpu, ca);
		drop(cpu, cb);
		drop(cpu, co);
		drop(gpu, ga);
		drop(gpu, gb);
		drop(gpu, go);
		free(a);
		free(b);
	}
}

#define LAG_FLOATS ((size_t)1 << 24)

struct waiter {
	void *fence;
	int ret;
};

static void *wait_fence(void *arg)
{
	struct waiter *w = arg;
	w->ret = gpu->ops->fence_wait(gpu->ctx, w->fence);
	return NULL;
}

/* The fence orders the host read after the device's work: with the device lagging, a wait
 * that returned early would leave the pinned buffer's poison. */
static void test_fence_lagging(void **state)
{
	(void)state;
	const struct sel_case c = { 32, 8, 128, 600, 4, 500, 40, false };
	const int H = c.n_kv, S = c.stride, k = c.k;
	const size_t nout = (size_t)(2 * H * k + H);
	float *zero = calloc(LAG_FLOATS, sizeof *zero);
	float *lag = put(gpu, zero, LAG_FLOATS * 4);
	free(zero);
	void *fence;
	assert_int_equal(gpu->ops->fence_new(gpu->ctx, &fence), 0);
	int32_t *pinned = gpu->ops->host_alloc(gpu->ctx, nout * 4);
	assert_non_null(pinned);
	for (int rep = 0; rep < 2; rep++) {
		float *q, *mn, *mx;
		sel_inputs(&c, &q, &mn, &mx);
		uint8_t *res = calloc((size_t)H * S, 1);
		const size_t nsum = (size_t)H * S * c.d * 4, nq = (size_t)c.n_q * c.d * 4;
		const struct backend_select g = { c.n_q, H, c.d, S, c.begin, c.n_cand, k };
		int32_t *ref = malloc(nout * 4);
		float *cq = put(cpu, q, nq), *cmn = put(cpu, mn, nsum), *cmx = put(cpu, mx, nsum);
		int32_t *cout = poison_i32(cpu, nout);
		assert_int_equal(cpu->ops->select_pages(cpu->ctx, &g, cq, cmn, cmx, res, cout,
							cout + H * k, cout + 2 * H * k), 0);
		get(cpu, ref, cout, nout * 4);
		float *gq = put(gpu, q, nq), *gmn = put(gpu, mn, nsum), *gmx = put(gpu, mx, nsum);
		int32_t *gout = poison_i32(gpu, nout);
		memset(pinned, 0x7f, nout * 4);
		for (int i = 0; i < 16; i++)
			assert_int_equal(gpu->ops->add(gpu->ctx, lag, lag, (int64_t)LAG_FLOATS), 0);
		assert_int_equal(gpu->ops->select_pages(gpu->ctx, &g, gq, gmn, gmx, res, gout,
							gout + H * k, gout + 2 * H * k), 0);
		assert_int_equal(gpu->ops->download_async(gpu->ctx, pinned, gout, nout * 4, fence), 0);
		struct waiter w = { fence, -1 };
		pthread_t th;
		assert_int_equal(pthread_create(&th, NULL, wait_fence, &w), 0);
		assert_int_equal(pthread_join(th, NULL), 0);
		assert_int_equal(w.ret, 0);
		if (memcmp(pinned, ref, nout * 4))
			fail_msg("download_async %d: the fence let the host read before the copy", rep);
		assert_int_equal(gpu->ops->sync(gpu->ctx), 0);
		drop(cpu, cq);
		drop(cpu, cmn);
		drop(cpu, cmx);
		drop(cpu, cout);
		drop(gpu, gq);
		drop(gpu, gmn);
		drop(gpu, gmx);
		drop(gpu, gout);
		free(q);
		free(mn);
		free(mx);
		free(res);
		free(ref);
	}
	gpu->ops->host_free(gpu->ctx, pinned);
	gpu->ops->fence_free(gpu->ctx, fence);
	drop(gpu, lag);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_page_summary),
		cmocka_unit_test(test_select_pages),
		cmocka_unit_test(test_group_cosine),
		cmocka_unit_test(test_fence_lagging),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
