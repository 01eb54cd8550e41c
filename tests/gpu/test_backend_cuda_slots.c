/* test_backend_cuda_slots — the CUDA backend's paged-policy ops against the CPU backend, the
 * reference (worker/backend/backend_cuda.c): attn_decode_slots (split-K flash decoding over per-head
 * slot lists and per-head token counts, odd heads reading about half of what even heads read)
 * equals the CPU's attn_decode_heads over the same pages, for a partial and a full
 * last page, G = 1 and G > 1, unsplit and split launches, pages too large for the kernel (the
 * span fallback) and list entries past the last page that must not be read; its bad arguments
 * are refused before anything is queued; attn_decode_batch (slot and dense items of several
 * sequences in one call) equals the CPU's single calls; its staged lists survive the ring's
 * reuse and growth while the device lags behind. recall_units runs on the backend's own recall streams: compute
 * ops queued before a recall and after it see it in order (slots and attention equal the
 * CPU's, bit for bit where no summation order differs), from pageable and from page-locked
 * units overwritten right after each call returns, into one slot buffer or two, through the
 * growth of used staging sets while their scatters are queued, and from a second thread while
 * the first queues compute ops on other slots. store_rows (the offload stream) writes a
 * registered host buffer with exactly the CPU backend's bytes, reading rows after the op that
 * made them and before the op that overwrites them, and refuses blocks it cannot reach
 * (-EOPNOTSUPP, nothing written); round_to equals the CPU's bit for bit. Outputs start
 * poisoned (NaN). Skips (77) without a CUDA device. */
#include "gpu_test.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "backend.h"
#include "gpu_backend_test.h"

static uint64_t rng = 0x5107d1ce;

#define ATTN_BOUND 2e-5

/* A slot buffer's geometry. */
struct sgeom {
	int n_kv, p, d;
};

static size_t slot_elems(const struct sgeom *g)
{
	return (size_t)2 * g->p * g->n_kv * g->d;
}

/* Reference: attn_decode_heads on be over the pages that list names, the span of page i of
 * KV head h being the rows of slot list[h * max_pages + i], n_tok[h] rows in all. */
static void ref_heads(struct backend *be, float *dout, const float *dq, const float *dslots,
		      const int32_t *list, int max_pages, const int32_t *n_tok,
		      const struct sgeom *g, const struct backend_attn *a)
{
	struct backend_kv_span *spans = calloc((size_t)g->n_kv * max_pages, sizeof *spans);
	int *first = calloc((size_t)g->n_kv + 1, sizeof *first);
	assert_non_null(spans);
	assert_non_null(first);
	const size_t half = (size_t)g->p * g->n_kv * g->d;
	int ns = 0;
	for (int h = 0; h < g->n_kv; h++) {
		const int pages = (n_tok[h] + g->p - 1) / g->p;
		first[h] = ns;
		for (int i = 0; i < pages; i++) {
			const float *k = dslots + (size_t)list[h * max_pages + i] * slot_elems(g);
			int64_t n = i < pages - 1 ? g->p : n_tok[h] - (int64_t)(pages - 1) * g->p;
			spans[ns++] = (struct backend_kv_span){ k, k + half, n,
								(int64_t)g->n_kv * g->d };
		}
	}
	first[g->n_kv] = ns;
	assert_int_equal(be->ops->attn_decode_heads(be->ctx, dout, dq, spans, first, a), 0);
	free(spans);
	free(first);
}

/* (n_kv) counts: n on even heads, about half of it on odd ones. */
static int32_t *head_counts(int n_kv, int64_t n)
{
	int32_t *c = malloc((size_t)n_kv * sizeof *c);
	assert_non_null(c);
	for (int h = 0; h < n_kv; h++)
		c[h] = (int32_t)(h % 2 ? 1 + (n - 1) / 2 : n);
	return c;
}

/* (n_kv, max_pages) lists: each head a different random order of distinct slots, entries past
 * the last page valid too (they must not be read, so they must not matter). */
static int32_t *rand_list(int n_kv, int max_pages, int n_slots)
{
	int32_t *list = malloc((size_t)n_kv * max_pages * sizeof *list);
	int32_t *perm = malloc((size_t)n_slots * sizeof *perm);
	assert_non_null(list);
	assert_non_null(perm);
	for (int h = 0; h < n_kv; h++) {
		for (int i = 0; i < n_slots; i++)
			perm[i] = i;
		for (int i = n_slots - 1; i > 0; i--) {
			int j = (int)(test_rand(&rng) % (uint64_t)(i + 1));
			int32_t t = perm[i];
			perm[i] = perm[j];
			perm[j] = t;
		}
		for (int i = 0; i < max_pages; i++)
			list[h * max_pages + i] = perm[i % n_slots];
	}
	free(perm);
	return list;
}

/* Busy work on the compute stream of the GPU backend (adds over a 64 MiB scratch buffer), so
 * that the device runs well behind the host: what the calls under test queued (a recall's
 * scatter, which waits for the compute stream; an attention's staged list) is then still
 * pending when later calls reuse or grow its staging (recall sets, the stage ring, the split-K
 * workspace), and a missing wait reads or lands the wrong data instead of racing benignly.
 * Nothing on the CPU backend, whose results it could not change. */
#define LAG_FLOATS ((size_t)1 << 24)
#define LAG_ADDS 16

static float *lag_alloc(struct backend *be)
{
	if (be != gpu)
		return NULL;
	float *z = calloc(LAG_FLOATS, sizeof *z);
	assert_non_null(z);
	float *d = put(be, z, LAG_FLOATS * sizeof *z);
	free(z);
	return d;
}

static void lag(struct backend *be, float *z)
{
	for (int i = 0; be == gpu && z && i < LAG_ADDS; i++)
		assert_int_equal(be->ops->add(be->ctx, z, z, (int64_t)LAG_FLOATS), 0);
}

static void test_attn_decode_slots(void **state)
{
	(void)state;
	/* kernel splits = min(ceil(256 / n_kv), ceil(max_pages / 2)): 1, 2, 32, 8, 4, 32 (27
	 * launched: 5 pages a chunk), none (a block would need 265 KB of shared memory). */
	const struct { int H, KV, d, p, n_slots, max_pages; int64_t n_tok; } cases[] = {
		{ 4, 4, 64, 16, 8, 1, 9 },	    /* G = 1, one partial page, unsplit */
		{ 8, 2, 128, 32, 40, 3, 70 },	    /* G = 4, split in 2, partial last page */
		{ 32, 8, 128, 32, 96, 64, 2040 },   /* llama-3.1-8b heads, budget 2048 */
		{ 8, 1, 32, 8, 20, 16, 30 },	    /* G = 8, 4 of 16 pages used */
		{ 6, 3, 80, 5, 12, 7, 35 },	    /* odd sizes, last page full */
		{ 64, 8, 128, 16, 140, 132, 2100 }, /* G = 8, d = 128 (70b heads), uneven chunks */
		{ 2, 2, 128, 256, 6, 4, 700 },	    /* pages past the kernel's shared memory: spans */
	};
	for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
		const int H = cases[ci].H, KV = cases[ci].KV, d = cases[ci].d;
		const int n_slots = cases[ci].n_slots, max_pages = cases[ci].max_pages;
		int32_t *n_tok = head_counts(KV, cases[ci].n_tok);
		const struct sgeom g = { KV, cases[ci].p, d };
		const struct backend_attn a = { H, KV, d, FKV_F32, 1.0f / sqrtf((float)d), 0 };
		const size_t ns = (size_t)n_slots * slot_elems(&g), nq = (size_t)H * d;
		float *slots = rand_f32(ns, 2.0f), *q = rand_f32(nq, 1.0f);
		int32_t *list = rand_list(KV, max_pages, n_slots);
		float *ref = malloc(nq * 4), *got = malloc(nq * 4), *cpu_own = malloc(nq * 4);

		float *cs = put(cpu, slots, ns * 4), *cq = put(cpu, q, nq * 4);
		float *co = poisoned(cpu, nq * 4);
		ref_heads(cpu, co, cq, cs, list, max_pages, n_tok, &g, &a);
		get(cpu, ref, co, nq * 4);
		/* The CPU backend's own attn_decode_slots, where it has one, agrees too. */
		if (cpu->ops->attn_decode_slots) {
			float *co2 = poisoned(cpu, nq * 4);
			assert_int_equal(cpu->ops->attn_decode_slots(cpu->ctx, co2, cq, cs, n_slots,
								     list, max_pages, n_tok,
								     g.p, &a), 0);
			get(cpu, cpu_own, co2, nq * 4);
			GPU_TEST_CHECK_ERR(gpu_test_err(cpu_own, ref, nq), ATTN_BOUND,
					   "cpu attn_decode_slots");
			drop(cpu, co2);
		}

		float *gs = put(gpu, slots, ns * 4), *gq = put(gpu, q, nq * 4);
		/* Twice, the list changed in place between the calls: the first call's list was
		 * staged, so the second reads its own. */
		for (int rep = 0; rep < 2; rep++) {
			float *go = poisoned(gpu, nq * 4);
			assert_int_equal(gpu->ops->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots,
								     list, max_pages, n_tok, g.p,
								     &a), 0);
			if (rep == 0) {
				int32_t *other = rand_list(KV, max_pages, n_slots);
				memcpy(list, other, (size_t)KV * max_pages * sizeof *list);
				free(other);
				get(gpu, got, go, nq * 4);
				char what[96];
				snprintf(what, sizeof what, "attn_decode_slots case %zu", ci);
				GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, nq), ATTN_BOUND, what);
				/* The new list's reference, for the second call. */
				ref_heads(cpu, co, cq, cs, list, max_pages, n_tok, &g, &a);
				get(cpu, ref, co, nq * 4);
			} else {
				/* Also the GPU's span path over the same pages. */
				float *gh = poisoned(gpu, nq * 4);
				ref_heads(gpu, gh, gq, gs, list, max_pages, n_tok, &g, &a);
				float *heads = malloc(nq * 4);
				get(gpu, heads, gh, nq * 4);
				get(gpu, got, go, nq * 4);
				char what[96];
				snprintf(what, sizeof what, "attn_decode_slots case %zu (list 2)", ci);
				GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, nq), ATTN_BOUND, what);
				GPU_TEST_CHECK_ERR(gpu_test_err(heads, ref, nq), ATTN_BOUND,
						   "cuda attn_decode_heads over slots");
				free(heads);
				drop(gpu, gh);
			}
			drop(gpu, go);
		}
		drop(cpu, cs);
		drop(cpu, cq);
		drop(cpu, co);
		drop(gpu, gs);
		drop(gpu, gq);
		free(slots);
		free(q);
		free(list);
		free(ref);
		free(got);
		free(cpu_own);
		free(n_tok);
	}
}

/* attn_decode_batch, one call for a decode batch of mixed items, on each backend: four slot
 * items of their own slot buffers (three of one geometry: one decode_attention_seqs launch;
 * one with another page size: alone), four dense items (three of one row stride, n = 1, 300
 * and 5000: one flash_decode_batch launch; one with a wider row stride: alone), their rows of
 * q and out in scrambled order, in every KV dtype. The GPU's outputs equal the CPU's (which
 * runs the single calls) within the attention bound, every row written. A bad slot index in the
 * first item: -EINVAL on both, nothing written. */
static void test_attn_decode_batch(void **state)
{
	(void)state;
	enum { H = 8, KV = 2, D = 128, NI = 8, MP = 6, NSL = 12 };
	const struct sgeom gs[2] = { { KV, 16, D }, { KV, 8, D } };
	const int64_t slot_tok[4] = { 90, 40, 7, 45 };
	const int64_t dense_n[4] = { 1, 300, 5000, 77 };
	const int rows[NI] = { 5, 0, 7, 2, 6, 1, 3, 4 };
	const size_t nq = (size_t)NI * H * D;
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++) {
		const enum fkv_dtype dt = gpu_test_dtypes[di];
		const size_t es = dtype_size(dt);
		const struct backend_attn a = { H, KV, D, dt, 1.0f / sqrtf((float)D), 0 };
		float *q = rand_f32(nq, 1.0f);
		void *host[NI];
		size_t bytes[NI];
		int32_t *list[4], *n_tok[4];
		for (int i = 0; i < 4; i++) {
			const struct sgeom *g = &gs[i == 3];
			bytes[i] = (size_t)NSL * slot_elems(g);
			list[i] = rand_list(KV, MP, NSL);
			n_tok[i] = head_counts(KV, slot_tok[i]);
		}
		for (int i = 4; i < NI; i++) {
			const int64_t stride = (int64_t)(i == 7 ? 2 : 1) * KV * D;
			bytes[i] = (size_t)dense_n[i - 4] * stride * 2; /* K rows, then V rows */
		}
		for (int i = 0; i < NI; i++) {
			float *f = rand_f32(bytes[i], 2.0f);
			host[i] = gpu_test_to_dtype(f, dt, bytes[i]);
			free(f);
		}
		float *out[2];
		struct backend *bes[2] = { cpu, gpu };
		for (int b = 0; b < 2; b++) {
			struct backend *be = bes[b];
			char *dev[NI];
			struct backend_attn_item it[NI];
			for (int i = 0; i < NI; i++) {
				dev[i] = put(be, host[i], bytes[i] * es);
				it[i] = (struct backend_attn_item){ .row = rows[i], .a = a };
				if (i < 4) {
					it[i].slots = dev[i];
					it[i].n_slots = NSL;
					it[i].max_pages = MP;
					it[i].p = gs[i == 3].p;
					it[i].list = list[i];
					it[i].n_tok = n_tok[i];
				} else {
					const int64_t stride = (int64_t)(i == 7 ? 2 : 1) * KV * D;
					const int64_t n = dense_n[i - 4];
					it[i].span = (struct backend_kv_span){
						dev[i], dev[i] + (size_t)n * stride * es, n, stride };
				}
			}
			float *dq = put(be, q, nq * 4), *dout = poisoned(be, nq * 4);
			/* a bad slot index in a page item 0 reads (its 90 tokens fill all six of
			 * head 0's pages): refused, nothing written */
			const int32_t keep = list[0][1];
			list[0][1] = NSL;
			assert_int_equal(be->ops->attn_decode_batch(be->ctx, dout, dq, it, NI),
					 -EINVAL);
			list[0][1] = keep;
			{
				float *chk = malloc(nq * 4);
				get(be, chk, dout, nq * 4);
				for (size_t e = 0; e < nq; e++)
					assert_true(isnan(chk[e]));
				free(chk);
			}
			assert_int_equal(be->ops->attn_decode_batch(be->ctx, dout, dq, it, NI), 0);
			out[b] = malloc(nq * 4);
			get(be, out[b], dout, nq * 4);
			for (int i = 0; i < NI; i++)
				drop(be, dev[i]);
			drop(be, dq);
			drop(be, dout);
		}
		for (int i = 0; i < NI; i++) {
			char what[96];
			snprintf(what, sizeof what, "attn_decode_batch %s item %d", dtype_name(dt), i);
			const size_t off = (size_t)rows[i] * H * D;
			GPU_TEST_CHECK_ERR(gpu_test_err(out[1] + off, out[0] + off, (size_t)H * D),
					   ATTN_BOUND, what);
		}
		for (int i = 0; i < NI; i++)
			free(host[i]);
		for (int i = 0; i < 4; i++) {
			free(list[i]);
			free(n_tok[i]);
		}
		free(out[0]);
		free(out[1]);
		free(q);
	}
}

/* Bad arguments: -EINVAL, and the output stays untouched (nothing was queued). */
static void test_attn_decode_slots_rejects(void **state)
{
	(void)state;
	const int H = 8, KV = 2, d = 64, p = 16, n_slots = 6, max_pages = 4;
	const struct sgeom g = { KV, p, d };
	const size_t ns = (size_t)n_slots * slot_elems(&g), nq = (size_t)H * d;
	float *slots = rand_f32(ns, 1.0f), *q = rand_f32(nq, 1.0f);
	float *gs = put(gpu, slots, ns * 4), *gq = put(gpu, q, nq * 4);
	float *go = poisoned(gpu, nq * 4);
	int32_t list[2 * 4] = { 0, 1, 2, 3, 5, 4, 3, 2 };
	const struct backend_attn ok = { H, KV, d, FKV_F32, 0.125f, 0 };
	int32_t n_tok[2] = { 50, 40 }; /* 4 pages, the last with 2 tokens; 3 pages, 8 tokens */
	struct backend_attn a;
	const struct backend_ops *o = gpu->ops;
	/* The valid call succeeds; the rest are variations of it. */
	float *gv = poisoned(gpu, nq * 4);
	assert_int_equal(o->attn_decode_slots(gpu->ctx, gv, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &ok), 0);
	drop(gpu, gv);

	list[6] = n_slots; /* head 1, page 2: out of range */
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &ok), -EINVAL);
	list[6] = -1;
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &ok), -EINVAL);
	list[6] = 3;
	list[3] = 99; /* head 0, last page */
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &ok), -EINVAL);
	list[3] = 3;
	const int32_t bad_tok[] = { 0, -5, max_pages * p + 1 };
	for (size_t i = 0; i < sizeof bad_tok / sizeof *bad_tok; i++)
		for (int h = 0; h < 2; h++) {
			int32_t was = n_tok[h];
			n_tok[h] = bad_tok[i];
			assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list,
							      max_pages, n_tok, p, &ok), -EINVAL);
			n_tok[h] = was;
		}
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      NULL, p, &ok), -EINVAL);
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, 0, &ok), -EINVAL);
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, 0, n_tok, p,
					      &ok), -EINVAL);
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, 0, list, max_pages, n_tok, p,
					      &ok), -EINVAL);
	a = ok;
	a.kv_dtype = (enum fkv_dtype)3; /* no such type (16-bit slots are valid: slots16) */
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &a), -EINVAL);
	a = ok;
	a.n_heads = 7;
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &a), -EINVAL);
	a = ok;
	a.head_dim = 0;
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &a), -EINVAL);
	a = ok;
	a.n_kv_heads = 0;
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &a), -EINVAL);
	a = ok;
	a.n_heads = a.n_kv_heads = 65536; /* past the kernel's grid */
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, max_pages,
					      n_tok, p, &a), -EINVAL);
	/* max_pages * p past int32 (the kernel's token count): refused before list is read */
	assert_int_equal(o->attn_decode_slots(gpu->ctx, go, gq, gs, n_slots, list, 1 << 20, n_tok,
					      1 << 12, &ok), -EINVAL);
	assert_int_equal(o->sync(gpu->ctx), 0);
	uint8_t *back = malloc(nq * 4);
	get(gpu, back, go, nq * 4);
	for (size_t i = 0; i < nq * 4; i++)
		assert_int_equal(back[i], 0xff);
	free(back);
	drop(gpu, gs);
	drop(gpu, gq);
	drop(gpu, go);
	free(slots);
	free(q);
}

/* The staging ring: with the device held back by the lag, more calls than the ring has slots,
 * each with its own list (scribbled over on return) and output, the later ones with a list
 * large enough to grow ring slots and the split-K workspace while earlier calls still wait to
 * read theirs; every output equals the CPU's over its own list. */
static void test_attn_decode_slots_ring(void **state)
{
	(void)state;
	enum { CALLS = 20, SMALL = 10, LARGE = 600 };
	const int H = 8, KV = 2, d = 64, n_slots = 24;
	/* 10 and 7 pages of 16: the rest of a large list is never read */
	const int32_t n_tok[2] = { 150, 100 };
	const struct sgeom g = { KV, 16, d };
	const struct backend_attn a = { H, KV, d, FKV_F32, 1.0f / sqrtf((float)d), 0 };
	const size_t ns = (size_t)n_slots * slot_elems(&g), nq = (size_t)H * d;
	float *slots = rand_f32(ns, 2.0f), *q = rand_f32(nq, 1.0f);
	float *cs = put(cpu, slots, ns * 4), *cq = put(cpu, q, nq * 4), *co = poisoned(cpu, nq * 4);
	float *gs = put(gpu, slots, ns * 4), *gq = put(gpu, q, nq * 4);
	float *go[CALLS];
	int32_t *lists[CALLS];
	float *Z = lag_alloc(gpu);
	for (int i = 0; i < CALLS; i++) {
		const int mp = i < CALLS / 2 ? SMALL : LARGE;
		lag(gpu, Z);
		lists[i] = rand_list(KV, mp, n_slots);
		int32_t *scratch = malloc((size_t)KV * mp * sizeof *scratch);
		assert_non_null(scratch);
		memcpy(scratch, lists[i], (size_t)KV * mp * sizeof *scratch);
		go[i] = poisoned(gpu, nq * 4);
		assert_int_equal(gpu->ops->attn_decode_slots(gpu->ctx, go[i], gq, gs, n_slots, scratch,
							     mp, n_tok, g.p, &a), 0);
		for (int j = 0; j < KV * mp; j++)
			scratch[j] = n_slots - 1 - scratch[j]; /* valid, other pages: must not be read */
		free(scratch);
	}
	float *ref = malloc(nq * 4), *got = malloc(nq * 4);
	for (int i = 0; i < CALLS; i++) {
		const int mp = i < CALLS / 2 ? SMALL : LARGE;
		ref_heads(cpu, co, cq, cs, lists[i], mp, n_tok, &g, &a);
		get(cpu, ref, co, nq * 4);
		get(gpu, got, go[i], nq * 4);
		char what[96];
		snprintf(what, sizeof what, "attn_decode_slots ring call %d", i);
		GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, nq), ATTN_BOUND, what);
		drop(gpu, go[i]);
		free(lists[i]);
	}
	free(ref);
	free(got);
	drop(gpu, Z);
	drop(cpu, cs);
	drop(cpu, cq);
	drop(cpu, co);
	drop(gpu, gs);
	drop(gpu, gq);
	free(slots);
	free(q);
}

/* ---- recall_units ordering ---- */

/* A host buffer of bytes for recall units: malloc'd (pageable) or page-locked through the
 * backend's host_register when locked (then unlocked by units_free). */
static void *units_alloc(struct backend *be, size_t bytes, bool locked)
{
	void *p = NULL;
	assert_int_equal(posix_memalign(&p, 4096, bytes), 0);
	if (locked) {
		char err[256];
		if (be->ops->host_register(be->ctx, p, bytes, err, sizeof err))
			fail_msg("host_register: %s", err);
	}
	return p;
}

static void units_free(struct backend *be, void *p, bool locked)
{
	if (locked)
		assert_int_equal(be->ops->host_unregister(be->ctx, p), 0);
	free(p);
}

/* n random distinct (slot, head) pairs of n_slots slots. */
static void rand_pairs(int *slot, int *head, int n, int n_slots, int n_kv)
{
	int total = n_slots * n_kv;
	int *perm = malloc((size_t)total * sizeof *perm);
	assert_non_null(perm);
	for (int i = 0; i < total; i++)
		perm[i] = i;
	for (int i = 0; i < n; i++) {
		int j = i + (int)(test_rand(&rng) % (uint64_t)(total - i));
		int t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
		slot[i] = perm[i] / n_kv;
		head[i] = perm[i] % n_kv;
	}
	free(perm);
}

#define ROUNDS 3
#define ADDS_BEFORE 200 /* compute ops queued before each recall: the scatter must wait */

/* On be: two slot buffers A and B start from the same data; each round queues ADDS_BEFORE adds
 * of x to A and B, recalls n units (round 2: some into B, so the slots do not share one base),
 * overwrites the units with NaN on return, adds y to A. Then attention over A's pages. A and
 * B and the attention output go to the host. */
static void recall_run(struct backend *be, enum fkv_dtype dt, bool locked, int n,
		       const struct sgeom *g, int n_slots, const float *init, const float *x,
		       const float *y, void *const *units_in, int (*pairs)[2][64], float *out_a,
		       float *out_b, float *out_attn)
{
	const size_t ns = (size_t)n_slots * slot_elems(g);
	const size_t ub = (size_t)2 * g->p * g->d * dtype_size(dt);
	/* B 16 bytes into its allocation: its slots lie no whole number of slots from A's, so
	 * round 2's recall cannot use one base for all of its units. */
	float *A = put(be, init, ns * 4), *Bbuf = be->ops->buf_alloc(be->ctx, ns * 4 + 16);
	assert_non_null(Bbuf);
	float *B = Bbuf + 4;
	assert_int_equal(be->ops->upload(be->ctx, B, init, ns * 4), 0);
	float *X = put(be, x, ns * 4), *Y = put(be, y, ns * 4);
	void *units = units_alloc(be, (size_t)n * ub, locked);
	void **slots = malloc((size_t)n * sizeof *slots);
	assert_non_null(slots);
	float *Z = lag_alloc(be);
	for (int r = 0; r < ROUNDS; r++) {
		lag(be, Z);
		for (int i = 0; i < ADDS_BEFORE; i++) {
			assert_int_equal(be->ops->add(be->ctx, A, X, (int64_t)ns), 0);
			assert_int_equal(be->ops->add(be->ctx, B, X, (int64_t)ns), 0);
		}
		for (int i = 0; i < n; i++) {
			float *base = r == 2 && i % 3 == 0 ? B : A;
			slots[i] = base + (size_t)pairs[r][0][i] * slot_elems(g);
		}
		memcpy(units, units_in[r], (size_t)n * ub);
		assert_int_equal(be->ops->recall_units(be->ctx, slots, pairs[r][1], units, n, g->p,
						       g->n_kv, g->d, dt, FKV_F32, NULL), 0);
		memset(units, 0xff, (size_t)n * ub); /* consumed on return: must not land */
		assert_int_equal(be->ops->add(be->ctx, A, Y, (int64_t)ns), 0);
	}
	/* A later op reads the recalled slots: attention of every KV head over all slots. */
	const int H = 2 * g->n_kv;
	const struct backend_attn a = { H, g->n_kv, g->d, FKV_F32, 1.0f / sqrtf((float)g->d), 0 };
	uint64_t keep = rng; /* both backends draw the same q */
	float *q = rand_f32((size_t)H * g->d, 1.0f);
	int32_t *list = malloc((size_t)g->n_kv * n_slots * sizeof *list);
	assert_non_null(list);
	for (int h = 0; h < g->n_kv; h++)
		for (int i = 0; i < n_slots; i++)
			list[h * n_slots + i] = (i + h) % n_slots;
	float *dq = put(be, q, (size_t)H * g->d * 4), *dy = poisoned(be, (size_t)H * g->d * 4);
	int32_t *n_tok = head_counts(g->n_kv, (int64_t)n_slots * g->p - 3);
	ref_heads(be, dy, dq, A, list, n_slots, n_tok, g, &a);
	free(n_tok);
	get(be, out_attn, dy, (size_t)H * g->d * 4);
	get(be, out_a, A, ns * 4);
	get(be, out_b, B, ns * 4);
	rng = keep;
	free(q);
	free(list);
	free(slots);
	units_free(be, units, locked);
	drop(be, dq);
	drop(be, dy);
	drop(be, A);
	drop(be, Bbuf);
	drop(be, X);
	drop(be, Y);
	if (Z)
		drop(be, Z);
}

/* Every compute op before a recall is done before its scatter, and every op after sees it:
 * A, B and the attention equal the CPU backend's; pageable and page-locked units, each unit
 * dtype. */
static void test_recall_ordering(void **state)
{
	(void)state;
	const struct sgeom g = { 4, 16, 64 };
	const int n_slots = 8, n = 12;
	const size_t ns = (size_t)n_slots * slot_elems(&g);
	static int pairs[ROUNDS][2][64];
	for (int di = 0; di < GPU_TEST_N_DTYPES; di++)
		for (int locked = 0; locked < 2; locked++) {
			enum fkv_dtype dt = gpu_test_dtypes[di];
			const size_t nu = (size_t)n * 2 * g.p * g.d;
			float *init = rand_f32(ns, 1.0f), *x = rand_f32(ns, 0.01f);
			float *y = rand_f32(ns, 0.5f);
			void *units[ROUNDS];
			for (int r = 0; r < ROUNDS; r++) {
				float *f = rand_f32(nu, 3.0f);
				units[r] = gpu_test_to_dtype(f, dt, nu);
				free(f);
				rand_pairs(pairs[r][0], pairs[r][1], n, n_slots, g.n_kv);
			}
			float *a[2], *b[2], *at[2];
			struct backend *bes[2] = { cpu, gpu };
			for (int k = 0; k < 2; k++) {
				a[k] = malloc(ns * 4);
				b[k] = malloc(ns * 4);
				at[k] = malloc((size_t)2 * g.n_kv * g.d * 4);
				/* the CPU backend has no host_register: its recall is a memcpy */
				recall_run(bes[k], dt, locked && k == 1, n, &g, n_slots, init, x, y,
					   units, pairs, a[k], b[k], at[k]);
			}
			char what[96];
			snprintf(what, sizeof what, "recall %s %s: slots A", dtype_name(dt),
				 locked ? "page-locked" : "pageable");
			GPU_TEST_CHECK_ERR(gpu_test_err(a[1], a[0], ns), 0.0, what);
			snprintf(what, sizeof what, "recall %s %s: slots B", dtype_name(dt),
				 locked ? "page-locked" : "pageable");
			GPU_TEST_CHECK_ERR(gpu_test_err(b[1], b[0], ns), 0.0, what);
			snprintf(what, sizeof what, "recall %s %s: attention after", dtype_name(dt),
				 locked ? "page-locked" : "pageable");
			GPU_TEST_CHECK_ERR(gpu_test_err(at[1], at[0], (size_t)2 * g.n_kv * g.d),
					   ATTN_BOUND, what);
			for (int k = 0; k < 2; k++) {
				free(a[k]);
				free(b[k]);
				free(at[k]);
			}
			for (int r = 0; r < ROUNDS; r++)
				free(units[r]);
			free(init);
			free(x);
			free(y);
		}
}

/* More units than the staging holds, then few again: slots equal the CPU's. The calls alternate
 * between the two staging sets, so each set is used, then grown (250, 256 units of 16 KiB
 * against 1 MiB) while the scatter of its previous use is still queued behind the lag, then
 * reused at its new size. */
static void test_recall_growth(void **state)
{
	(void)state;
	const struct sgeom g = { 4, 32, 128 };
	const int n_slots = 64;
	const int counts[] = { 5, 3, 250, 256, 4, 7 };
	const size_t ns = (size_t)n_slots * slot_elems(&g), ub = (size_t)2 * g.p * g.d * 2;
	float *init = rand_f32(ns, 1.0f);
	float *out[2];
	struct backend *bes[2] = { cpu, gpu };
	float *S[2];
	for (int k = 0; k < 2; k++)
		S[k] = put(bes[k], init, ns * 4);
	int *slot = malloc(256 * sizeof *slot), *head = malloc(256 * sizeof *head);
	void **ptrs = malloc(256 * sizeof *ptrs);
	float *Z = lag_alloc(gpu);
	for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
		const int n = counts[c];
		float *f = rand_f32((size_t)n * ub / 2, 2.0f);
		void *units = gpu_test_to_dtype(f, FKV_F16, (size_t)n * ub / 2);
		void *copy = malloc((size_t)n * ub);
		rand_pairs(slot, head, n, n_slots, g.n_kv);
		for (int k = 0; k < 2; k++) {
			for (int i = 0; i < n; i++)
				ptrs[i] = S[k] + (size_t)slot[i] * slot_elems(&g);
			memcpy(copy, units, (size_t)n * ub);
			lag(bes[k], Z);
			assert_int_equal(bes[k]->ops->recall_units(bes[k]->ctx, ptrs, head, copy, n,
								   g.p, g.n_kv, g.d, FKV_F16,
								   FKV_F32, NULL), 0);
			memset(copy, 0xff, (size_t)n * ub);
		}
		free(f);
		free(units);
		free(copy);
	}
	for (int k = 0; k < 2; k++) {
		out[k] = malloc(ns * 4);
		get(bes[k], out[k], S[k], ns * 4);
		drop(bes[k], S[k]);
	}
	GPU_TEST_CHECK_ERR(gpu_test_err(out[1], out[0], ns), 0.0, "recall through growth");
	drop(gpu, Z);
	free(out[0]);
	free(out[1]);
	free(init);
	free(slot);
	free(head);
	free(ptrs);
}

/* A recall thread recalls into slots [0, half) while this thread queues adds on slots
 * [half, n_slots) of the same buffer; afterwards the first half holds the last round's units
 * and the second half init plus the adds, computed on the host. */
struct recall_thread {
	float *slots;
	const struct sgeom *g;
	int half, rounds;
	void *const *units; /* (rounds) f32 units, (half * n_kv, 2, p, d) each */
	int ret;
};

static void *recall_thread_main(void *arg)
{
	struct recall_thread *t = arg;
	const int n = t->half * t->g->n_kv;
	const size_t bytes = (size_t)n * 2 * t->g->p * t->g->d * sizeof(float);
	void **ptrs = malloc((size_t)n * sizeof *ptrs);
	int *heads = malloc((size_t)n * sizeof *heads);
	void *buf = malloc(bytes);
	if (!ptrs || !heads || !buf) {
		t->ret = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		ptrs[i] = t->slots + (size_t)(i / t->g->n_kv) * slot_elems(t->g);
		heads[i] = i % t->g->n_kv;
	}
	for (int r = 0; r < t->rounds && !t->ret; r++) {
		memcpy(buf, t->units[r], bytes);
		t->ret = gpu->ops->recall_units(gpu->ctx, ptrs, heads, buf, n, t->g->p, t->g->n_kv,
						t->g->d, FKV_F32, FKV_F32, NULL);
		memset(buf, 0xff, bytes);
	}
out:
	free(ptrs);
	free(heads);
	free(buf);
	return NULL;
}

static void test_recall_from_thread(void **state)
{
	(void)state;
	const struct sgeom g = { 2, 16, 64 };
	const int n_slots = 8, half = 4, rounds = 20, adds = 300;
	const size_t se = slot_elems(&g), ns = (size_t)n_slots * se, hs = (size_t)half * se;
	float *init = rand_f32(ns, 1.0f), *x = rand_f32(hs, 0.01f);
	void *units[20];
	for (int r = 0; r < rounds; r++)
		units[r] = rand_f32(hs, 2.0f); /* half * n_kv units of (2, p, d): hs floats */
	float *S = put(gpu, init, ns * 4), *X = put(gpu, x, hs * 4);
	struct recall_thread t = { S, &g, half, rounds, units, 0 };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, recall_thread_main, &t), 0);
	for (int i = 0; i < adds; i++)
		assert_int_equal(gpu->ops->add(gpu->ctx, S + hs, X, (int64_t)hs), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(t.ret, 0);
	assert_int_equal(gpu->ops->sync(gpu->ctx), 0);
	float *got = malloc(ns * 4), *want = malloc(ns * 4);
	get(gpu, got, S, ns * 4);
	/* First half: the last round's units scattered NHD; second half: init + adds * x. */
	const float *u = units[rounds - 1];
	for (int s = 0; s < half; s++)
		for (int h = 0; h < g.n_kv; h++)
			for (int kv = 0; kv < 2; kv++)
				for (int tk = 0; tk < g.p; tk++)
					for (int c = 0; c < g.d; c++)
						want[(size_t)s * se +
						     (((size_t)kv * g.p + tk) * g.n_kv + h) * g.d + c] =
							u[((((size_t)s * g.n_kv + h) * 2 + kv) * g.p +
							   tk) * g.d + c];
	for (size_t i = 0; i < hs; i++) {
		float v = init[hs + i];
		for (int k = 0; k < adds; k++)
			v += x[i];
		want[hs + i] = v;
	}
	GPU_TEST_CHECK_ERR(gpu_test_err(got, want, ns), 0.0, "recall from a second thread");
	free(got);
	free(want);
	for (int r = 0; r < rounds; r++)
		free(units[r]);
	free(init);
	free(x);
	drop(gpu, S);
	drop(gpu, X);
}

/* ---- store_rows: the offload stream ---- */

/* One store_rows call on be: rows k, v (n, n_kv, d) made by a compute op (an add onto zeros,
 * after the device was made to lag), stored into nb blocks of blk (host memory, block b at
 * blk + perm[b] block sizes), then overwritten with NaN by the next compute op; sync() is the
 * fence. */
static void store_run(struct backend *be, enum fkv_dtype dt, const struct sgeom *g, int t0,
		      int n, const float *k, const float *v, char *blk, const int *perm, int nb)
{
	const size_t rows = (size_t)(n ? n : 1) * g->n_kv * g->d;
	const size_t bb = (size_t)g->n_kv * 2 * g->p * g->d * dtype_size(dt);
	float *z = calloc(rows, sizeof *z);
	assert_non_null(z);
	float *dk = put(be, z, rows * 4), *dv = put(be, z, rows * 4);
	float *xk = put(be, k, rows * 4), *xv = put(be, v, rows * 4);
	float *nan = poisoned(be, rows * 4), *Z = lag_alloc(be);
	void *blocks[64];
	assert_true(nb <= 64);
	for (int b = 0; b < nb; b++)
		blocks[b] = blk + (size_t)perm[b] * bb;
	lag(be, Z);
	assert_int_equal(be->ops->add(be->ctx, dk, xk, (int64_t)rows), 0);
	assert_int_equal(be->ops->add(be->ctx, dv, xv, (int64_t)rows), 0);
	/* rows: (n, n_kv, d) f32 */
	assert_int_equal(be->ops->store_rows(be->ctx, blocks, t0, dk, dv, n, g->p, g->n_kv, g->d,
					     dt), 0);
	assert_int_equal(be->ops->add(be->ctx, dk, nan, (int64_t)rows), 0);
	assert_int_equal(be->ops->add(be->ctx, dv, nan, (int64_t)rows), 0);
	assert_int_equal(be->ops->sync ? be->ops->sync(be->ctx) : 0, 0);
	free(z);
	drop(be, dk);
	drop(be, dv);
	drop(be, xk);
	drop(be, xv);
	drop(be, nan);
	if (Z)
		drop(be, Z);
}

/* store_rows into a registered host buffer equals the CPU backend's bytes (layout_store_tokens)
 * exactly, every dtype: runs starting mid-page, crossing pages, longer than one offload slot
 * (pieces), blocks in shuffled order (offsets below the first block's); the rows were produced
 * by the op just before and overwritten by the op just after (neither may leak), and bytes the
 * call must not touch keep their contents. */
static void test_store_rows(void **state)
{
	(void)state;
	const struct sgeom g = { 4, 16, 64 };
	const int runs[][2] = { { 0, 1 }, { 15, 1 }, { 5, 40 }, { 7, 600 }, { 3, 0 } };
	for (size_t t = 0; t < 3; t++) {
		const enum fkv_dtype dt = gpu_test_dtypes[t];
		const size_t bb = (size_t)g.n_kv * 2 * g.p * g.d * dtype_size(dt);
		for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
			const int t0 = runs[r][0], n = runs[r][1], nb = (t0 + n + g.p - 1) / g.p;
			const int cap = nb + 2;
			const size_t rows = (size_t)(n ? n : 1) * g.n_kv * g.d;
			float *k = rand_f32(rows, 2.0f), *v = rand_f32(rows, 2.0f);
			char *want = malloc((size_t)cap * bb);
			char *got = units_alloc(gpu, (size_t)cap * bb, true);
			assert_non_null(want);
			for (size_t i = 0; i < (size_t)cap * bb; i++)
				want[i] = got[i] = (char)test_rand(&rng);
			int perm[64]; /* reversed, one block in: the others lie below the first */
			for (int b = 0; b < nb; b++)
				perm[b] = nb - b;
			store_run(cpu, dt, &g, t0, n, k, v, want, perm, nb);
			store_run(gpu, dt, &g, t0, n, k, v, got, perm, nb);
			if (memcmp(got, want, (size_t)cap * bb))
				fail_msg("store_rows %s t0 %d n %d: bytes differ from the CPU backend's",
					 dtype_name(dt), t0, n);
			units_free(gpu, got, true);
			free(want);
			free(k);
			free(v);
		}
	}
}

/* Blocks store_rows cannot reach: pageable memory, a block running past the end of a
 * registration, a registration undone. -EOPNOTSUPP, and nothing written. */
static void test_store_rows_unreachable(void **state)
{
	(void)state;
	const struct sgeom g = { 2, 8, 32 };
	const size_t bb = (size_t)g.n_kv * 2 * g.p * g.d * sizeof(float), rows = 3 * 2 * 32;
	float *k = rand_f32(rows, 1.0f);
	float *dk = put(gpu, k, rows * 4);
	char *pageable = malloc(2 * bb), *locked = units_alloc(gpu, 2 * bb, true);
	char *copy = malloc(2 * bb);
	assert_true(pageable && copy);
	memset(pageable, 0x5a, 2 * bb);
	memset(locked, 0x5a, 2 * bb);
	void *bl[2] = { pageable, pageable + bb };
	assert_int_equal(gpu->ops->store_rows(gpu->ctx, bl, 6, dk, dk, 3, g.p, g.n_kv, g.d, FKV_F32),
			 -EOPNOTSUPP);
	void *mixed[2] = { locked, pageable }; /* the second block is not registered */
	assert_int_equal(gpu->ops->store_rows(gpu->ctx, mixed, 6, dk, dk, 3, g.p, g.n_kv, g.d,
					      FKV_F32), -EOPNOTSUPP);
	void *past[1] = { locked + bb + 64 }; /* runs 64 bytes past the registration */
	assert_int_equal(gpu->ops->store_rows(gpu->ctx, past, 0, dk, dk, 1, g.p, g.n_kv, g.d,
					      FKV_F32), -EOPNOTSUPP);
	assert_int_equal(gpu->ops->store_rows(gpu->ctx, bl, g.p, dk, dk, 1, g.p, g.n_kv, g.d,
					      FKV_F32), -EINVAL);
	assert_int_equal(gpu->ops->sync(gpu->ctx), 0);
	memset(copy, 0x5a, 2 * bb);
	assert_memory_equal(pageable, copy, 2 * bb);
	assert_memory_equal(locked, copy, 2 * bb);
	assert_int_equal(gpu->ops->host_unregister(gpu->ctx, locked), 0);
	void *gone[1] = { locked };
	assert_int_equal(gpu->ops->store_rows(gpu->ctx, gone, 0, dk, dk, 1, g.p, g.n_kv, g.d,
					      FKV_F32), -EOPNOTSUPP);
	free(locked);
	free(pageable);
	free(copy);
	free(k);
	drop(gpu, dk);
}

/* round_to on the device equals the CPU's bit for bit, special values included. */
static void test_round_to(void **state)
{
	(void)state;
	const size_t n = 100003;
	const float special[] = { 0.0f, -0.0f, 1e-8f, -3e-41f, 65504.0f, 65520.0f, 1e30f, -1e38f,
				  INFINITY, -INFINITY, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f };
	for (size_t t = 0; t < 3; t++) {
		float *x = rand_f32(n, 1.0f), *a = malloc(n * 4), *b = malloc(n * 4);
		assert_true(a && b);
		for (size_t i = 0; i < n; i++)
			x[i] = ldexpf(x[i], (int)(test_rand(&rng) % 80) - 40);
		memcpy(x, special, sizeof special);
		float *dc = put(cpu, x, n * 4), *dg = put(gpu, x, n * 4);
		assert_int_equal(cpu->ops->round_to(cpu->ctx, dc, (int64_t)n, gpu_test_dtypes[t]), 0);
		assert_int_equal(gpu->ops->round_to(gpu->ctx, dg, (int64_t)n, gpu_test_dtypes[t]), 0);
		get(cpu, a, dc, n * 4);
		get(gpu, b, dg, n * 4);
		if (memcmp(a, b, n * 4))
			fail_msg("round_to %s differs from the CPU backend", dtype_name(gpu_test_dtypes[t]));
		drop(cpu, dc);
		drop(gpu, dg);
		free(x);
		free(a);
		free(b);
	}
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attn_decode_slots),
		cmocka_unit_test(test_attn_decode_slots_rejects),
		cmocka_unit_test(test_attn_decode_batch),
		cmocka_unit_test(test_attn_decode_slots_ring),
		cmocka_unit_test(test_recall_ordering),
		cmocka_unit_test(test_recall_growth),
		cmocka_unit_test(test_recall_from_thread),
		cmocka_unit_test(test_store_rows),
		cmocka_unit_test(test_store_rows_unreachable),
		cmocka_unit_test(test_round_to),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
