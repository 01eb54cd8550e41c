/* test_backend_cuda_recall — recall_direct (worker/backend/backend_cuda_xfer.c: each unit DMA'd
 * from where it lies, cudaMemcpyBatchAsync or a run of cudaMemcpyAsync, then recall_scatter)
 * and recall_fragmented (the same, each unit in 2p per-token DMAs: the layout ablation)
 * and recall_mapped (the zero-copy variant: kernels/recall_gather reads each unit through the
 * registered pool's device alias; a pool not registered is refused with -EOPNOTSUPP and
 * nothing written) against the CPU backend's recall_units over the same units, the reference: units scattered
 * from a pool-like host buffer (pageable, and page-locked with host_register as the kvstored
 * pool is), in a shuffled order, f16 and bf16 units into slots of the KV dtype and into f32
 * slots, with the compute stream kept busy first (adds over 64 MiB) so that the scatter is
 * queued behind it and the sources are read late; each source is poisoned right after the
 * call returns (the op promises they were read by then), and the download queued after the
 * call (compute stream) sees the recalled slots — for the registered DMA case ordered only by
 * the per-layer fence (`done`, then fence_stream_wait), as the paged policies' speculative
 * recalls are. Slots start poisoned; bytes must equal exactly. Skips (77) without
 * a CUDA device. */
#include "gpu_test.h"

#include <errno.h>
#include <string.h>

#include "backend.h"
#include "gpu_backend_test.h"

static uint64_t rng = 0xd12ec7;

#define LAG_FLOATS ((size_t)1 << 24)

static void test_recall_direct(void **state)
{
	(void)state;
	const int P = 32, KV = 8, d = 128, NS = 12, n = 40, POOL_UNITS = 64;
	const size_t unit_elems = (size_t)2 * P * d, slot_elems = unit_elems * KV;
	float *zero = calloc(LAG_FLOATS, sizeof *zero);
	float *lag = put(gpu, zero, LAG_FLOATS * 4);
	free(zero);
	void *fence;
	assert_int_equal(gpu->ops->fence_new(gpu->ctx, &fence), 0);
	/* mode 0 recall_direct, 1 recall_mapped, 2 recall_fragmented (per-token pieces) */
	for (int mode = 0; mode < 3; mode++)
	for (int locked = 0; locked < 2; locked++)
		for (int ut = 1; ut < 3; ut++)
			for (int st = 0; st < 2; st++) {
				const bool mapped = mode == 1;
				const enum fkv_dtype udt = gpu_test_dtypes[ut];
				const enum fkv_dtype sdt = st ? udt : FKV_F32;
				const size_t ub = unit_elems * dtype_size(udt);
				const size_t sb = slot_elems * dtype_size(sdt);
				float *vals = rand_f32((size_t)POOL_UNITS * unit_elems, 2.0f);
				void *typed = gpu_test_to_dtype(vals, udt, (size_t)POOL_UNITS * unit_elems);
				/* the pool: one aligned host range, page-locked in the second pass */
				char *pool = NULL;
				assert_int_equal(posix_memalign((void **)&pool, 4096,
								(size_t)POOL_UNITS * ub), 0);
				memcpy(pool, typed, (size_t)POOL_UNITS * ub);
				char err[256];
				if (locked && gpu->ops->host_register(gpu->ctx, pool, (size_t)POOL_UNITS * ub,
								      err, sizeof err))
					fail_msg("host_register: %s", err);
				const void *srcs[40];
				void *cslots[40], *gslots[40];
				int heads[40];
				char *cs = poisoned(cpu, NS * sb), *gs = poisoned(gpu, NS * sb);
				for (int i = 0; i < n; i++) {
					int u = (int)(test_rand(&rng) % (uint64_t)POOL_UNITS);
					srcs[i] = pool + (size_t)u * ub;
					int slot = i % NS, head = (i / NS + 5 * i) % KV;
					cslots[i] = cs + (size_t)slot * sb;
					gslots[i] = gs + (size_t)slot * sb;
					heads[i] = head;
				}
				/* the reference: the same units staged back to back */
				char *staged = malloc((size_t)n * ub);
				for (int i = 0; i < n; i++)
					memcpy(staged + (size_t)i * ub, srcs[i], ub);
				assert_int_equal(cpu->ops->recall_units(cpu->ctx, cslots, heads, staged, n,
									P, KV, d, udt, sdt, NULL), 0);
				for (int i = 0; i < 16; i++)
					assert_int_equal(gpu->ops->add(gpu->ctx, lag, lag,
								       (int64_t)LAG_FLOATS), 0);
				char *a = malloc(NS * sb), *b = malloc(NS * sb);
				if (mapped && !locked) {
					/* outside every mapping: refused, nothing written */
					assert_int_equal(gpu->ops->recall_mapped(gpu->ctx, gslots, heads,
										 srcs, n, P, KV, d,
										 udt, sdt, NULL),
							 -EOPNOTSUPP);
					get(gpu, b, gs, NS * sb);
					for (size_t i = 0; i < NS * sb; i++)
						assert_int_equal((unsigned char)b[i], 0xff);
					memset(a, 0xff, NS * sb);
				} else {
					int (*op)(void *, void *const *, const int *, const void *const *,
						  int, int, int, int, enum fkv_dtype, enum fkv_dtype,
						  void *) =
						mode == 1 ? gpu->ops->recall_mapped :
						mode == 2 ? gpu->ops->recall_fragmented :
							    gpu->ops->recall_direct;
					/* The registered DMA case through a per-layer fence: the
					 * compute stream is ordered after the scatter only by
					 * fence_stream_wait, before the download below. */
					void *done = locked && !mapped ? fence : NULL;
					assert_int_equal(op(gpu->ctx, gslots, heads, srcs, n, P, KV, d, udt,
							    sdt, done), 0);
					if (done)
						assert_int_equal(gpu->ops->fence_stream_wait(gpu->ctx,
											     done), 0);
					memset(pool, 0xff, (size_t)POOL_UNITS * ub); /* read by now */
					get(cpu, a, cs, NS * sb);
					get(gpu, b, gs, NS * sb);
				}
				if (memcmp(a, b, NS * sb))
					fail_msg("recall_%s (%s, %s units into %s slots) differs from "
						 "the CPU", mode == 1 ? "mapped" : mode == 2 ?
						 "fragmented" : "direct",
						 locked ? "page-locked" : "pageable",
						 dtype_name(udt), dtype_name(sdt));
				if (locked)
					assert_int_equal(gpu->ops->host_unregister(gpu->ctx, pool), 0);
				drop(cpu, cs);
				drop(gpu, gs);
				free(a);
				free(b);
				free(staged);
				free(pool);
				free(vals);
				free(typed);
			}
	gpu->ops->fence_free(gpu->ctx, fence);
	drop(gpu, lag);
}

int main(void)
{
	if (gpu_test_no_device())
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_recall_direct),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
