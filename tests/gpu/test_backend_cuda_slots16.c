/* test_backend_cuda_slots16 — slots in the KV dtype (docs/design.md §3 "Device slots"; the CUDA
 * backend's slot_dtype) against the CPU backend, the reference: recall_units scattering f16
 * and bf16 units into f16 and bf16 slots (and f32 units into 16-bit slots, rounded on the way)
 * gives the CPU's bytes exactly; attn_decode_slots over 16-bit slots (split-K, reading 16-bit
 * K/V, accumulating in f32) is within 2e-5 (normalised) of the CPU over the same slots, and
 * the CPU over 16-bit slots equals the CPU over f32 slots holding the same values (so the
 * policies' results do not depend on the slot dtype). Random inputs, poisoned outputs. Skips
 * (77) without a CUDA device. */
#include "gpu_test.h"

#include <string.h>

#include "backend.h"
#include "gpu_backend_test.h"

static uint64_t rng = 0x16b175;

static void test_recall_units16(void **state)
{
	(void)state;
	const int P = 32, KV = 8, d = 128, NS = 6, n = 10;
	const size_t slot_elems = (size_t)2 * P * KV * d, unit_elems = (size_t)2 * P * d;
	const enum fkv_dtype unit_dts[] = { FKV_F16, FKV_BF16, FKV_F32 };
	for (int st = 1; st < 3; st++)
		for (int ut = 0; ut < 3; ut++) {
			const enum fkv_dtype sdt = gpu_test_dtypes[st], udt = unit_dts[ut];
			float *u32 = rand_f32((size_t)n * unit_elems, 2.0f);
			void *units = gpu_test_to_dtype(u32, udt, (size_t)n * unit_elems);
			const size_t sb = slot_elems * dtype_size(sdt);
			void *out[2];
			struct backend *bes[2] = { cpu, gpu };
			for (int b = 0; b < 2; b++) {
				char *slots = poisoned(bes[b], NS * sb);
				void *ptrs[10];
				int heads[10];
				for (int i = 0; i < n; i++) { /* distinct (slot, head) pairs */
					ptrs[i] = slots + (size_t)(i % NS) * sb;
					heads[i] = (i / NS + 3 * i) % KV;
				}
				assert_int_equal(bes[b]->ops->recall_units(bes[b]->ctx, ptrs, heads,
									   units, n, P, KV, d, udt,
									   sdt, NULL), 0);
				out[b] = malloc(NS * sb);
				get(bes[b], out[b], slots, NS * sb);
				drop(bes[b], slots);
			}
			if (memcmp(out[0], out[1], NS * sb))
				fail_msg("recall_units %s units into %s slots differ from the CPU",
					 dtype_name(udt), dtype_name(sdt));
			free(out[0]);
			free(out[1]);
			free(u32);
			free(units);
		}
}

static void test_attn_decode_slots16(void **state)
{
	(void)state;
	const struct { int H, KV, d, p, n_slots, max_pages; int64_t n_tok; } cases[] = {
		{ 8, 2, 128, 32, 40, 3, 70 },
		{ 32, 8, 128, 32, 96, 64, 2040 },
		{ 64, 8, 128, 16, 140, 132, 2100 },
		{ 2, 2, 128, 256, 6, 4, 700 }, /* the span fallback */
	};
	for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
		for (int t = 1; t < 3; t++) {
			const enum fkv_dtype dt = gpu_test_dtypes[t];
			const int H = cases[ci].H, KV = cases[ci].KV, d = cases[ci].d;
			const int NS = cases[ci].n_slots, MP = cases[ci].max_pages, p = cases[ci].p;
			const size_t ns = (size_t)NS * 2 * p * KV * d, nq = (size_t)H * d;
			float *s32 = rand_f32(ns, 2.0f), *q = rand_f32(nq, 1.0f);
			gpu_test_round(s32, dt, ns);
			void *s16 = gpu_test_to_dtype(s32, dt, ns);
			int32_t *list = malloc((size_t)KV * MP * sizeof *list);
			for (int i = 0; i < KV * MP; i++)
				list[i] = (int32_t)(test_rand(&rng) % (uint64_t)NS);
			/* per-head counts, as hardkv's heads read different numbers of pages */
			int32_t *nt = malloc((size_t)KV * sizeof *nt);
			for (int h = 0; h < KV; h++) {
				int64_t c = cases[ci].n_tok - (int64_t)(h % 3) * p;
				nt[h] = (int32_t)(c > 0 ? c : 1);
			}
			struct backend_attn a = { H, KV, d, dt, 1.0f / sqrtf((float)d), 0 };
			struct backend_attn a32 = a;
			a32.kv_dtype = FKV_F32;
			float *ref = malloc(nq * 4), *r32 = malloc(nq * 4), *got = malloc(nq * 4);
			void *cs = put(cpu, s16, ns * dtype_size(dt)), *cq = put(cpu, q, nq * 4);
			void *c32 = put(cpu, s32, ns * 4), *co = poisoned(cpu, nq * 4);
			assert_int_equal(cpu->ops->attn_decode_slots(cpu->ctx, co, cq, cs, NS, list, MP,
								     nt, p, &a), 0);
			get(cpu, ref, co, nq * 4);
			assert_int_equal(cpu->ops->attn_decode_slots(cpu->ctx, co, cq, c32, NS, list, MP,
								     nt, p, &a32), 0);
			get(cpu, r32, co, nq * 4);
			assert_memory_equal(ref, r32, nq * 4);
			void *gs = put(gpu, s16, ns * dtype_size(dt)), *gq = put(gpu, q, nq * 4);
			void *go = poisoned(gpu, nq * 4);
			assert_int_equal(gpu->ops->attn_decode_slots(gpu->ctx, go, gq, gs, NS, list, MP,
								     nt, p, &a), 0);
			get(gpu, got, go, nq * 4);
			char what[96];
			snprintf(what, sizeof what, "attn_decode_slots %s case %zu", dtype_name(dt), ci);
			GPU_TEST_CHECK_ERR(gpu_test_err(got, ref, nq), 2e-5, what);
			drop(cpu, cs);
			drop(cpu, cq);
			drop(cpu, c32);
			drop(cpu, co);
			drop(gpu, gs);
			drop(gpu, gq);
			drop(gpu, go);
			free(s32);
			free(s16);
			free(q);
			free(list);
			free(nt);
			free(ref);
			free(r32);
			free(got);
		}
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_recall_units16),
		cmocka_unit_test(test_attn_decode_slots16),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
