/* Tests kernels/flash_decode.cu against the CPU backend's attn_decode over the same single span
 * (the `full` policy's dense cache), every KV dtype, random inputs, output poisoned: unsplit
 * (short contexts, one and seven keys), split-K with uneven chunks (Llama-3.1-8B heads at 32K
 * tokens, 1000 + 3 keys), G = 1, 4, 8 and 32 (the largest group), a head dim that is not a
 * multiple of 32 (80), and a row stride past n_kv * d (a cache read from a later position, as
 * a sliding window does). Bound 2e-5 (normalised): both sides read the same converted values
 * and differ only in f32 summation order and expf ulps. Also: the split count is a pure
 * function within its bounds, and bad geometries are refused before anything is launched.
 * flash_decode_batch (a decode batch's caches in one launch) against the same reference. */
#include "gpu_test.h"

#include "backend.h"
#include "flash_decode.cuh"

static uint64_t rng = 0xf1a5d;

struct fd_case {
	int n_heads, n_kv, d;
	long long n, extra_stride;
};

static void check(struct backend *cpu, const struct fd_case *c, enum fkv_dtype dt)
{
	const long long stride = (long long)c->n_kv * c->d + c->extra_stride;
	const size_t elems = (size_t)c->n * stride, nq = (size_t)c->n_heads * c->d;
	float *k = malloc(elems * 4), *v = malloc(elems * 4), *q = malloc(nq * 4);
	float *ref = malloc(nq * 4), *got = malloc(nq * 4);
	gpu_test_fill(k, elems, 2.0f, &rng);
	gpu_test_fill(v, elems, 2.0f, &rng);
	gpu_test_fill(q, nq, 1.0f, &rng);
	void *kt = gpu_test_to_dtype(k, dt, elems), *vt = gpu_test_to_dtype(v, dt, elems);
	const struct backend_attn a = { c->n_heads, c->n_kv, c->d, dt, 1.0f / sqrtf((float)c->d),
					0 };
	const struct backend_kv_span span = { kt, vt, c->n, stride };
	assert_int_equal(cpu->ops->attn_decode(cpu->ctx, ref, q, &span, 1, &a), 0);
	const size_t es = dtype_size(dt), wsb = flash_decode_workspace_bytes(c->n_heads, c->d);
	void *dk = gpu_test_put(kt, elems * es), *dv = gpu_test_put(vt, elems * es);
	float *dq = gpu_test_put(q, nq * 4), *dout = gpu_test_poisoned(nq * 4);
	void *ws = gpu_test_poisoned(wsb);
	CU(flash_decode(dout, dq, dk, dv, dt, c->n, stride, c->n_heads, c->n_kv, c->d, a.scale,
			ws, wsb, 0));
	gpu_test_get(got, dout, nq * 4);
	char what[128];
	snprintf(what, sizeof what, "flash_decode %s H=%d KV=%d d=%d n=%lld (%d splits)",
		 dtype_name(dt), c->n_heads, c->n_kv, c->d, c->n, flash_decode_splits(c->n, c->n_kv));
	GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, nq), 2e-5, what);
	CU(cudaFree(dk));
	CU(cudaFree(dv));
	CU(cudaFree(dq));
	CU(cudaFree(dout));
	CU(cudaFree(ws));
	free(k);
	free(v);
	free(q);
	free(kt);
	free(vt);
	free(ref);
	free(got);
}

static void test_flash_decode(void **state)
{
	(void)state;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 2), 0);
	const struct fd_case cases[] = {
		{ 4, 4, 64, 1, 0 },	   /* G = 1, one key */
		{ 8, 2, 128, 7, 0 },	   /* unsplit */
		{ 32, 8, 128, 32768, 0 },  /* llama-3.1-8b at 32K: 128 splits */
		{ 32, 8, 128, 1003, 0 },   /* uneven chunks */
		{ 64, 8, 128, 4000, 256 }, /* G = 8, a strided cache */
		{ 32, 1, 80, 700, 0 },	   /* the largest group, d not a multiple of 32 */
	};
	for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
		for (int t = 0; t < GPU_TEST_N_DTYPES; t++)
			check(cpu, &cases[ci], gpu_test_dtypes[t]);
	backend_free(cpu);
}

enum { FB_H = 32, FB_KV = 8, FB_D = 128, FB_MAXB = 40 };

/* One batch of B sequences in dtype dt: item i has its own cache of 6000 keys (i = 0) or
 * 1 + (997 i mod 1500), and query and output row B - 1 - i. */
static void check_batch(struct backend *cpu, enum fkv_dtype dt, int B)
{
	const size_t es = dtype_size(dt), nq = (size_t)FB_H * FB_D, row = (size_t)FB_KV * FB_D;
	const struct backend_attn a = { FB_H, FB_KV, FB_D, dt, 1.0f / sqrtf((float)FB_D), 0 };
	float *q = malloc((size_t)B * nq * 4), *ref = malloc((size_t)B * nq * 4);
	float *got = malloc((size_t)B * nq * 4);
	gpu_test_fill(q, (size_t)B * nq, 1.0f, &rng);
	struct flash_decode_item items[FB_MAXB];
	long long max_n = 0;
	for (int i = 0; i < B; i++) {
		const long long n = i == 0 ? 6000 : 1 + (i * 997) % 1500, r = B - 1 - i;
		const size_t elems = (size_t)n * row;
		float *k = malloc(elems * 4), *v = malloc(elems * 4);
		gpu_test_fill(k, elems, 2.0f, &rng);
		gpu_test_fill(v, elems, 2.0f, &rng);
		void *kt = gpu_test_to_dtype(k, dt, elems), *vt = gpu_test_to_dtype(v, dt, elems);
		const struct backend_kv_span span = { kt, vt, n, (int64_t)row };
		assert_int_equal(cpu->ops->attn_decode(cpu->ctx, ref + r * nq, q + r * nq, &span, 1,
						       &a),
				 0);
		items[i] = (struct flash_decode_item){ gpu_test_put(kt, elems * es),
						       gpu_test_put(vt, elems * es), n, r };
		max_n = n > max_n ? n : max_n;
		free(k);
		free(v);
		free(kt);
		free(vt);
	}
	const size_t wsb = flash_decode_batch_workspace_bytes(B, FB_H, FB_KV, FB_D);
	void *ws = gpu_test_poisoned(wsb);
	struct flash_decode_item *ditems = gpu_test_put(items, (size_t)B * sizeof *items);
	float *dq = gpu_test_put(q, (size_t)B * nq * 4);
	float *dout = gpu_test_poisoned((size_t)B * nq * 4);
	CU(flash_decode_batch(dout, dq, ditems, B, max_n, dt, (long long)row, FB_H, FB_KV, FB_D,
			      a.scale, ws, wsb, 0));
	gpu_test_get(got, dout, (size_t)B * nq * 4);
	for (int r = 0; r < B; r++) {
		char what[128];
		snprintf(what, sizeof what, "flash_decode_batch %s B=%d row %d (%d splits)",
			 dtype_name(dt), B, r, flash_decode_batch_splits(max_n, FB_KV, B));
		const size_t off = (size_t)r * nq;
		GPU_TEST_CHECK_ERR(gpu_test_err(got + off, ref + off, nq), 2e-5, what);
	}
	for (int i = 0; i < B; i++) {
		CU(cudaFree((void *)items[i].k));
		CU(cudaFree((void *)items[i].v));
	}
	CU(cudaFree(ws));
	CU(cudaFree(ditems));
	CU(cudaFree(dq));
	CU(cudaFree(dout));
	free(q);
	free(ref);
	free(got);
}

/* flash_decode_batch: batches of 1, 3 and 40 sequences of different lengths (1 to 6000 keys;
 * split and unsplit, as the batch fills the grid), each item's own K/V buffer, query and output
 * rows in reverse order, every KV dtype: each item within 2e-5 of the CPU's attn_decode over
 * its own cache, every row written. */
static void test_flash_decode_batch(void **state)
{
	(void)state;
	const int batches[] = { 1, 3, FB_MAXB };
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 2), 0);
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++)
		for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++)
			check_batch(cpu, gpu_test_dtypes[t], batches[bi]);
	backend_free(cpu);
}

static void test_flash_decode_bounds(void **state)
{
	(void)state;
	assert_int_equal(flash_decode_splits(1, 8), 1);
	assert_int_equal(flash_decode_splits(64, 8), 1);
	assert_int_equal(flash_decode_splits(65, 8), 2);
	assert_int_equal(flash_decode_splits(32768, 8), 128); /* 1024 blocks over 8 KV heads */
	assert_int_equal(flash_decode_splits(1 << 20, 1), FLASH_DECODE_MAX_SPLITS);
	float *p = gpu_test_poisoned(1 << 20);
	const size_t wsb = flash_decode_workspace_bytes(8, 64);
	/* n = 0, d too large, group too large, stride too short, workspace too short */
	assert_int_equal(flash_decode(p, p, p, p, FKV_F32, 0, 512, 8, 8, 64, 1, p, wsb, 0),
			 cudaErrorInvalidValue);
	assert_int_equal(flash_decode(p, p, p, p, FKV_F32, 9, 8 * 512, 8, 8, 512, 1, p, wsb, 0),
			 cudaErrorInvalidValue);
	assert_int_equal(flash_decode(p, p, p, p, FKV_F32, 9, 64, 64, 1, 64, 1, p, wsb, 0),
			 cudaErrorInvalidValue);
	assert_int_equal(flash_decode(p, p, p, p, FKV_F32, 9, 511, 8, 8, 64, 1, p, wsb, 0),
			 cudaErrorInvalidValue);
	assert_int_equal(flash_decode(p, p, p, p, FKV_F32, 9999, 512, 8, 8, 64, 1, p, 16, 0),
			 cudaErrorInvalidValue);
	CU(cudaFree(p));
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flash_decode),
		cmocka_unit_test(test_flash_decode_batch),
		cmocka_unit_test(test_flash_decode_bounds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
