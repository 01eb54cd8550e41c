/* test_devmem — the CPU backend behind buffer addresses the host cannot dereference: every
 * buffer it hands out has bit 62 set (non-canonical on x86-64, so a host load or store through
 * one faults) and every op translates its buffer arguments back before the real CPU op runs. A
 * policy that passes on it reaches its backend memory only through ops, as on a device; with
 * host_memory false it also takes the path it takes on a device. Header-only (static functions):
 * each test executable that includes it gets its own copy. */
#ifndef FREEKV_TEST_DEVMEM_H
#define FREEKV_TEST_DEVMEM_H

#include "test_util.h"

#include <stdbool.h>

#include "backend.h"
#define DEV_TAG ((uintptr_t)1 << 62)

static const struct backend_ops *dm_real;

static void *dv(const void *p)
{
	return p ? (void *)((uintptr_t)p ^ DEV_TAG) : NULL;
}

static void *dm_alloc(void *c, size_t bytes)
{
	return dv(dm_real->buf_alloc(c, bytes));
}

static void dm_free_buf(void *c, void *b)
{
	dm_real->buf_free(c, dv(b));
}

static int dm_upload(void *c, void *d, const void *s, size_t n)
{
	return dm_real->upload(c, dv(d), s, n);
}

static int dm_download(void *c, void *d, const void *s, size_t n)
{
	return dm_real->download(c, d, dv(s), n);
}

static int dm_copy(void *c, void *d, const void *s, size_t n)
{
	return dm_real->copy(c, dv(d), dv(s), n);
}

static int dm_convert(void *c, void *d, enum fkv_dtype t, const float *s, int64_t n)
{
	return dm_real->convert(c, dv(d), t, dv(s), n);
}

static int dm_gather_rows(void *c, float *d, const float *s, int64_t cols, const int32_t *idx,
			  int64_t n)
{
	return dm_real->gather_rows(c, dv(d), dv(s), cols, dv(idx), n);
}

static int dm_matmul(void *c, float *y, const float *x, const struct backend_mat *w, int64_t n)
{
	return dm_real->matmul(c, dv(y), dv(x), w, n);
}

static int dm_rmsnorm(void *c, float *y, const float *x, const struct backend_mat *w, int64_t n,
		      int64_t dim, float eps)
{
	return dm_real->rmsnorm(c, dv(y), dv(x), w, n, dim, eps);
}

static int dm_rope(void *c, float *x, int64_t n, int nh, int hd, const int32_t *pos,
		   const struct backend_rope *r)
{
	return dm_real->rope(c, dv(x), n, nh, hd, dv(pos), r);
}

static int dm_silu_mul(void *c, float *o, const float *g, const float *u, int64_t n)
{
	return dm_real->silu_mul(c, dv(o), dv(g), dv(u), n);
}

static int dm_add(void *c, float *y, const float *x, int64_t n)
{
	return dm_real->add(c, dv(y), dv(x), n);
}

static int dm_add_bias(void *c, float *y, const struct backend_mat *b, int64_t n)
{
	return dm_real->add_bias(c, dv(y), b, n);
}

static int dm_embed(void *c, float *o, const struct backend_mat *t, const int32_t *ids, int64_t n)
{
	return dm_real->embed(c, dv(o), t, dv(ids), n);
}

static int dm_softmax(void *c, float *x, int64_t rows, int64_t cols)
{
	return dm_real->softmax(c, dv(x), rows, cols);
}

static int dm_attn_prefill(void *c, float *o, const float *q, int64_t n_q, const void *k,
			   const void *v, int64_t n_ctx, const struct backend_attn *a)
{
	return dm_real->attn_prefill(c, dv(o), dv(q), n_q, dv(k), dv(v), n_ctx, a);
}

static struct backend_kv_span *dm_spans(const struct backend_kv_span *s, int n)
{
	struct backend_kv_span *t = malloc((size_t)(n ? n : 1) * sizeof *t);
	assert_non_null(t);
	for (int i = 0; i < n; i++)
		t[i] = (struct backend_kv_span){ dv(s[i].k), dv(s[i].v), s[i].n, s[i].row_stride };
	return t;
}

static int dm_attn_decode(void *c, float *o, const float *q, const struct backend_kv_span *s,
			  int n, const struct backend_attn *a)
{
	struct backend_kv_span *t = dm_spans(s, n);
	int ret = dm_real->attn_decode(c, dv(o), dv(q), t, n, a);
	free(t);
	return ret;
}

static int dm_attn_decode_heads(void *c, float *o, const float *q,
				const struct backend_kv_span *s, const int *first,
				const struct backend_attn *a)
{
	struct backend_kv_span *t = dm_spans(s, first[a->n_kv_heads]);
	int ret = dm_real->attn_decode_heads(c, dv(o), dv(q), t, first, a);
	free(t);
	return ret;
}

static int dm_attn_decode_slots(void *c, float *o, const float *q, const void *slots,
				int n_slots, const int32_t *list, int max_pages, const int32_t *n_tok,
				int p, const struct backend_attn *a)
{
	return dm_real->attn_decode_slots(c, dv(o), dv(q), dv(slots), n_slots, list, max_pages,
					   n_tok, p, a);
}

static int dm_attn_decode_batch(void *c, float *o, const float *q,
				const struct backend_attn_item *items, int n)
{
	struct backend_attn_item *t = malloc((size_t)(n ? n : 1) * sizeof *t);
	assert_non_null(t);
	for (int i = 0; i < n; i++) {
		t[i] = items[i];
		t[i].span.k = dv(items[i].span.k);
		t[i].span.v = dv(items[i].span.v);
		t[i].slots = dv(items[i].slots);
	}
	int ret = dm_real->attn_decode_batch(c, dv(o), dv(q), t, n);
	free(t);
	return ret;
}

static int dm_split_cols(void *c, float *const *dst, const int64_t *cols, int n,
			 const float *src, int64_t rows)
{
	float *t[8];
	assert_true(n <= 8);
	for (int i = 0; i < n; i++)
		t[i] = dv(dst[i]);
	return dm_real->split_cols(c, t, cols, n, dv(src), rows);
}

static void **dm_slot_ptrs(void *const *slots, int n)
{
	void **t = malloc((size_t)(n ? n : 1) * sizeof *t);
	assert_non_null(t);
	for (int i = 0; i < n; i++)
		t[i] = dv(slots[i]);
	return t;
}

static int dm_recall_units(void *c, void *const *slots, const int *heads, const void *units, int n,
			   int p, int n_kv, int d, enum fkv_dtype dt, enum fkv_dtype sdt, void *done)
{
	void **t = dm_slot_ptrs(slots, n);
	int ret = dm_real->recall_units(c, t, heads, units, n, p, n_kv, d, dt, sdt, done);
	free(t);
	return ret;
}

/* The units (srcs) lie in the host copy, host memory on a device too. */
static int dm_recall_direct(void *c, void *const *slots, const int *heads,
			    const void *const *srcs, int n, int p, int n_kv, int d, enum fkv_dtype dt,
			    enum fkv_dtype sdt, void *done)
{
	void **t = dm_slot_ptrs(slots, n);
	int ret = dm_real->recall_direct(c, t, heads, srcs, n, p, n_kv, d, dt, sdt, done);
	free(t);
	return ret;
}

static int dm_recall_mapped(void *c, void *const *slots, const int *heads,
			    const void *const *srcs, int n, int p, int n_kv, int d, enum fkv_dtype dt,
			    enum fkv_dtype sdt, void *done)
{
	void **t = dm_slot_ptrs(slots, n);
	int ret = dm_real->recall_mapped(c, t, heads, srcs, n, p, n_kv, d, dt, sdt, done);
	free(t);
	return ret;
}

static int dm_page_summary(void *c, float *mn, float *mx, int stride, int page,
			   const void *slot, enum fkv_dtype dt, int p, int n_kv, int d)
{
	return dm_real->page_summary(c, dv(mn), dv(mx), stride, page, dv(slot), dt, p, n_kv, d);
}

static int dm_select_pages(void *c, const struct backend_select *g, const float *q,
			   const float *mn, const float *mx, const uint8_t *res, int32_t *pages,
			   int32_t *chg, int32_t *nchg)
{
	return dm_real->select_pages(c, g, dv(q), dv(mn), dv(mx), res, dv(pages), dv(chg),
				     dv(nchg)); /* the resident mask is host memory */
}

static int dm_group_cosine(void *c, float *o, const float *a, const float *b, int n_q, int n_kv,
			   int d)
{
	return dm_real->group_cosine(c, dv(o), dv(a), dv(b), n_q, n_kv, d);
}

static int dm_download_async(void *c, void *d, const void *s, size_t n, void *f)
{
	return dm_real->download_async(c, d, dv(s), n, f);
}

static int dm_store_rows(void *c, void *const *blocks, int t0, const float *k, const float *v,
			 int n, int p, int n_kv, int d, enum fkv_dtype dt)
{
	return dm_real->store_rows(c, blocks, t0, dv(k), dv(v), n, p, n_kv, d, dt);
}

static int dm_round_to(void *c, float *x, int64_t n, enum fkv_dtype dt)
{
	return dm_real->round_to(c, dv(x), n, dt);
}

static int dm_attn_scores(void *c, float *s, int64_t ld, const float *q,
			  const struct backend_kv_span *sp, const int *first, const struct backend_attn *a)
{
	struct backend_kv_span *t = dm_spans(sp, first[a->n_kv_heads]);
	int ret = dm_real->attn_scores(c, dv(s), ld, dv(q), t, first, a);
	free(t);
	return ret;
}

static int dm_attn_accum(void *c, float *o, const float *p, int64_t ld,
			 const struct backend_kv_span *sp, const int *first, bool acc,
			 const struct backend_attn *a)
{
	struct backend_kv_span *t = dm_spans(sp, first[a->n_kv_heads]);
	int ret = dm_real->attn_accum(c, dv(o), dv(p), ld, t, first, acc, a);
	free(t);
	return ret;
}

static int dm_gather_heads(void *c, float *d, const float *s, const int32_t *map, int n, int n_kv,
			   int hd)
{
	return dm_real->gather_heads(c, dv(d), dv(s), map, n, n_kv, hd);
}

/* The devmem view of the CPU backend be (sharing its context); ops is filled here. */
static struct backend devmem_of(struct backend *cpu, struct backend_ops *ops)
{
	dm_real = cpu->ops;
	*ops = *cpu->ops;
	ops->name = "devmem";
	ops->buf_alloc = dm_alloc;
	ops->buf_free = dm_free_buf;
	ops->upload = dm_upload;
	ops->download = dm_download;
	ops->copy = dm_copy;
	ops->convert = dm_convert;
	ops->gather_rows = dm_gather_rows;
	ops->matmul = dm_matmul;
	ops->rmsnorm = dm_rmsnorm;
	ops->rope = dm_rope;
	ops->silu_mul = dm_silu_mul;
	ops->add = dm_add;
	ops->add_bias = dm_add_bias;
	ops->embed = dm_embed;
	ops->softmax = dm_softmax;
	ops->attn_prefill = dm_attn_prefill;
	ops->attn_decode = dm_attn_decode;
	ops->attn_decode_heads = dm_attn_decode_heads;
	ops->attn_decode_slots = dm_real->attn_decode_slots ? dm_attn_decode_slots : NULL;
	ops->attn_decode_batch = dm_real->attn_decode_batch ? dm_attn_decode_batch : NULL;
	ops->split_cols = dm_real->split_cols ? dm_split_cols : NULL;
	ops->recall_units = dm_recall_units;
	ops->recall_direct = dm_real->recall_direct ? dm_recall_direct : NULL;
	ops->recall_mapped = dm_real->recall_mapped ? dm_recall_mapped : NULL;
	ops->page_summary = dm_real->page_summary ? dm_page_summary : NULL;
	ops->select_pages = dm_real->select_pages ? dm_select_pages : NULL;
	ops->group_cosine = dm_real->group_cosine ? dm_group_cosine : NULL;
	ops->download_async = dm_real->download_async ? dm_download_async : NULL;
	ops->store_rows = dm_store_rows;
	ops->round_to = dm_round_to;
	ops->attn_scores = dm_real->attn_scores ? dm_attn_scores : NULL;
	ops->attn_accum = dm_real->attn_accum ? dm_attn_accum : NULL;
	ops->gather_heads = dm_real->gather_heads ? dm_gather_heads : NULL;
	ops->host_memory = false;
	return (struct backend){ .ops = ops, .ctx = cpu->ctx };
}

#endif
