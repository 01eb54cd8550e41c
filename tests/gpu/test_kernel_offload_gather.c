/* Tests kernels/offload_gather.cu against common/layout.c: NHD slots to HND blocks (full pages
 * vs layout_gather_unit, a token range vs layout_store_tokens) and f32 rows to blocks (vs
 * layout_store_tokens), at permuted block offsets, every dtype pair used. Rounding is RNE on
 * both sides, so the bound is byte equality; rows outside the range keep their prior bytes. */
#include "gpu_test.h"

#include "layout.h"
#include "offload_gather.cuh"

#define NB 4

static void check_slots(enum fkv_dtype slot_dt, enum fkv_dtype block_dt, int t0, int t1,
			uint64_t *rng)
{
	const int n_slots = 6, n_kv = 8, p = 32, d = 64;
	const struct kv_geom g = { n_kv, p, d, block_dt };
	const size_t hd = (size_t)n_kv * d, slot_elems = 2 * (size_t)p * hd;
	const size_t blk_elems = slot_elems, es = dtype_size(block_dt);
	const int32_t src[NB] = { 4, 0, 5, 2 };
	const int64_t off[NB] = { 2 * blk_elems, 0, 3 * blk_elems, blk_elems };
	float *slots = malloc(n_slots * slot_elems * 4), *prior = malloc(NB * blk_elems * 4);
	gpu_test_fill(slots, n_slots * slot_elems, 3.0f, rng);
	gpu_test_round(slots, slot_dt, n_slots * slot_elems);
	gpu_test_fill(prior, NB * blk_elems, 3.0f, rng);
	uint8_t *ref = gpu_test_to_dtype(prior, block_dt, NB * blk_elems);
	float *k = malloc(p * hd * 4), *v = malloc(p * hd * 4);
	for (int i = 0; i < NB; i++) {
		uint8_t *blk = ref + off[i] * es;
		const float *s = slots + src[i] * slot_elems;
		if (t0 == 0 && t1 == p) {
			for (int h = 0; h < n_kv; h++)
				layout_gather_unit(&g, blk + (size_t)h * 2 * p * d * es, h, s);
		} else {
			memcpy(k, s + t0 * hd, (t1 - t0) * hd * 4);
			memcpy(v, s + (p + t0) * hd, (t1 - t0) * hd * 4);
			layout_store_tokens(&g, blk, t0, t1, k, v);
		}
	}
	void *hslots = gpu_test_to_dtype(slots, slot_dt, n_slots * slot_elems);
	void *hblk = gpu_test_to_dtype(prior, block_dt, NB * blk_elems);
	void *dslots = gpu_test_put(hslots, n_slots * slot_elems * dtype_size(slot_dt));
	void *dblk = gpu_test_put(hblk, NB * blk_elems * es);
	int32_t *dsrc = gpu_test_put(src, sizeof src);
	int64_t *doff = gpu_test_put(off, sizeof off);
	CU(offload_gather_slots(dblk, block_dt, doff, dslots, slot_dt, dsrc, NB, t0, t1, n_kv, p, d,
				0));
	gpu_test_get(hblk, dblk, NB * blk_elems * es);
	assert_memory_equal(hblk, ref, NB * blk_elems * es);
	cudaFree(dslots);
	cudaFree(dblk);
	cudaFree(dsrc);
	cudaFree(doff);
	free(slots);
	free(prior);
	free(ref);
	free(k);
	free(v);
	free(hslots);
	free(hblk);
}

static void test_offload_gather_slots(void **state)
{
	(void)state;
	const enum fkv_dtype pairs[][2] = {
		{ FKV_F32, FKV_F32 }, { FKV_F16, FKV_F16 }, { FKV_BF16, FKV_BF16 },
		{ FKV_F32, FKV_BF16 }, { FKV_F32, FKV_F16 },
	};
	uint64_t rng = 41;
	for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
		check_slots(pairs[i][0], pairs[i][1], 0, 32, &rng);
		check_slots(pairs[i][0], pairs[i][1], 5, 19, &rng);
		check_slots(pairs[i][0], pairs[i][1], 31, 32, &rng);
	}
}

static void test_offload_store_rows(void **state)
{
	(void)state;
	const int n_kv = 4, p = 32, d = 128, t0 = 13, n_tok = 70;
	const int nb = (t0 + n_tok + p - 1) / p; /* 3 */
	const size_t hd = (size_t)n_kv * d, blk_elems = 2 * (size_t)p * hd;
	const int64_t off[3] = { blk_elems, 2 * blk_elems, 0 };
	uint64_t rng = 43;
	float *k = malloc(n_tok * hd * 4), *v = malloc(n_tok * hd * 4);
	float *prior = malloc(nb * blk_elems * 4);
	for (int t = 0; t < GPU_TEST_N_DTYPES; t++) {
		enum fkv_dtype dt = gpu_test_dtypes[t];
		const struct kv_geom g = { n_kv, p, d, dt };
		const size_t es = dtype_size(dt);
		gpu_test_fill(k, n_tok * hd, 3.0f, &rng);
		gpu_test_fill(v, n_tok * hd, 3.0f, &rng);
		gpu_test_fill(prior, nb * blk_elems, 3.0f, &rng);
		uint8_t *ref = gpu_test_to_dtype(prior, dt, nb * blk_elems);
		for (int pos = t0, i = 0; i < n_tok;) {
			int b = pos / p, r0 = pos % p, m = p - r0 < n_tok - i ? p - r0 : n_tok - i;
			layout_store_tokens(&g, ref + off[b] * es, r0, r0 + m, k + i * hd, v + i * hd);
			pos += m;
			i += m;
		}
		void *hblk = gpu_test_to_dtype(prior, dt, nb * blk_elems);
		void *dblk = gpu_test_put(hblk, nb * blk_elems * es);
		float *dk = gpu_test_put(k, n_tok * hd * 4), *dv = gpu_test_put(v, n_tok * hd * 4);
		int64_t *doff = gpu_test_put(off, sizeof off);
		CU(offload_store_rows(dblk, dt, doff, dk, dv, n_tok, t0, n_kv, p, d, 0));
		gpu_test_get(hblk, dblk, nb * blk_elems * es);
		assert_memory_equal(hblk, ref, nb * blk_elems * es);
		cudaFree(dblk);
		cudaFree(dk);
		cudaFree(dv);
		cudaFree(doff);
		free(ref);
		free(hblk);
	}
	free(k);
	free(v);
	free(prior);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_offload_gather_slots),
		cmocka_unit_test(test_offload_store_rows),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
