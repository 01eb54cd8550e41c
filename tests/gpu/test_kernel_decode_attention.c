/* Tests kernels/decode_attention.cu against the CPU backend's attn_decode, run per (sequence,
 * KV head) over that head's own slot list and token count (one span per page, the tail page
 * partial; the odd heads of a sequence read another count than the even ones). Cases:
 * Llama-3.1-8B geometry at B=2048 with split-K (including chunks past a short sequence's last
 * page), an unsplit tiny-head batch with an empty sequence (zeros), and a 32-query-head group
 * that needs the opt-in shared-memory limit, and a head dim whose 16-bit rows cannot be read 16
 * bytes at a time (the scalar load path); every KV dtype. Bound 2e-5: both sides read the
 * same converted values and differ only in f32 summation order and expf ulps. */
#include "gpu_test.h"

#include "backend.h"
#include "decode_attention.cuh"

struct dec_case {
	const char *name;
	int batch, n_q, n_kv, d, p, max_pages, n_slots;
	int n_tok[3]; /* first sequences' even heads' counts; -1: random in [1, max_pages * p] */
};

static void check_case(struct backend *cpu, const struct dec_case *c, enum fkv_dtype dt,
		       uint64_t *rng)
{
	const int G = c->n_q / c->n_kv, B = c->batch, P = c->p;
	const size_t hd = (size_t)c->n_kv * c->d, slot_elems = 2 * (size_t)P * hd;
	const size_t total = c->n_slots * slot_elems, es = dtype_size(dt);
	const size_t q_elems = (size_t)B * c->n_q * c->d;
	const size_t list_len = (size_t)B * c->n_kv * c->max_pages;
	float *slots = malloc(total * 4), *q = malloc(q_elems * 4);
	float *ref = malloc(q_elems * 4), *got = malloc(q_elems * 4);
	int32_t *list = malloc(list_len * 4), *n_tok = malloc((size_t)B * c->n_kv * 4);
	gpu_test_fill(slots, total, 2.0f, rng);
	gpu_test_fill(q, q_elems, 2.0f, rng);
	uint8_t *hslots = gpu_test_to_dtype(slots, dt, total);
	for (size_t i = 0; i < list_len; i++)
		list[i] = (int32_t)(test_rand(rng) % c->n_slots);
	/* (batch, n_kv): an empty sequence stays empty on every head */
	for (int b = 0; b < B; b++)
		for (int h = 0; h < c->n_kv; h++) {
			int spec = b < 3 && (h % 2 == 0 || c->n_tok[b] == 0) ? c->n_tok[b] : -1;
			n_tok[b * c->n_kv + h] =
				spec >= 0 ? spec : 1 + (int)(test_rand(rng) % (c->max_pages * P));
		}
	struct backend_kv_span *spans = malloc(c->max_pages * sizeof *spans);
	const struct backend_attn a = { .n_heads = G, .n_kv_heads = 1, .head_dim = c->d,
					.kv_dtype = dt, .scale = 1.0f / sqrtf((float)c->d) };
	for (int b = 0; b < B; b++)
		for (int h = 0; h < c->n_kv; h++) {
			float *o = ref + ((size_t)b * c->n_q + (size_t)h * G) * c->d;
			const float *qh = q + ((size_t)b * c->n_q + (size_t)h * G) * c->d;
			const int nt = n_tok[b * c->n_kv + h];
			if (nt == 0) {
				memset(o, 0, (size_t)G * c->d * 4);
				continue;
			}
			int n_pages = (nt + P - 1) / P;
			for (int pg = 0; pg < n_pages; pg++) {
				const int32_t s = list[((size_t)b * c->n_kv + h) * c->max_pages + pg];
				const uint8_t *base = hslots + (s * slot_elems + (size_t)h * c->d) * es;
				spans[pg].k = base;
				spans[pg].v = base + (size_t)P * hd * es;
				spans[pg].n = pg < n_pages - 1 ? P : nt - pg * P;
				spans[pg].row_stride = (int64_t)hd;
			}
			assert_int_equal(cpu->ops->attn_decode(cpu->ctx, o, qh, spans, n_pages, &a), 0);
		}
	void *dslots = gpu_test_put(hslots, total * es);
	float *dq = gpu_test_put(q, q_elems * 4), *dout = gpu_test_poisoned(q_elems * 4);
	int32_t *dlist = gpu_test_put(list, list_len * 4);
	int32_t *dn = gpu_test_put(n_tok, (size_t)B * c->n_kv * 4);
	size_t ws = decode_attention_workspace_bytes(B, c->n_q, c->n_kv, c->d, c->max_pages);
	void *dws = ws ? gpu_test_poisoned(ws) : NULL;
	if (ws)
		assert_int_equal(decode_attention(dout, dq, dslots, dt, dlist, dn, B, c->n_q, c->n_kv,
						  c->d, P, c->max_pages, a.scale, dws, ws - 4, 0),
				 cudaErrorInvalidValue);
	CU(decode_attention(dout, dq, dslots, dt, dlist, dn, B, c->n_q, c->n_kv, c->d, P,
			    c->max_pages, a.scale, dws, ws, 0));
	gpu_test_get(got, dout, q_elems * 4);
	char what[96];
	snprintf(what, sizeof what, "%s %s (splits %d)", c->name, dtype_name(dt),
		 decode_attention_splits(B, c->n_kv, c->max_pages));
	GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, q_elems), 2e-5, what);
	cudaFree(dslots);
	cudaFree(dq);
	cudaFree(dout);
	cudaFree(dlist);
	cudaFree(dn);
	cudaFree(dws);
	free(slots);
	free(q);
	free(ref);
	free(got);
	free(list);
	free(n_tok);
	free(hslots);
	free(spans);
}

static void test_decode_attention_matches_cpu(void **state)
{
	(void)state;
	const struct dec_case cases[] = {
		{ "llama B=2048", 3, 32, 8, 128, 32, 64, 200, { 2048, 1000, 33 } },
		{ "tiny unsplit", 6, 8, 4, 8, 4, 1, 10, { 4, 0, 1 } },
		{ "tiny split", 5, 8, 4, 8, 4, 9, 30, { 36, 5, -1 } },
		{ "group of 32", 2, 64, 2, 128, 32, 16, 40, { 500, 512, -1 } },
		{ "d=12 (16-bit rows not 16-byte multiples)", 2, 6, 3, 12, 4, 5, 12, { 17, 20, -1 } },
	};
	uint64_t rng = 81;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 0), 0);
	assert_int_equal(decode_attention_splits(6, 4, 1), 1);
	assert_true(decode_attention_splits(3, 8, 64) > 1);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		for (int t = 0; t < GPU_TEST_N_DTYPES; t++)
			check_case(cpu, &cases[i], gpu_test_dtypes[t], &rng);
	backend_free(cpu);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_attention_matches_cpu),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
