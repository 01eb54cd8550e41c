/* backend_cuda_select — the CUDA backend's selection ops (backend.h; docs/design.md §5
 * "Selection", "The GPU decode step"): page summaries built on the device from a slot when a
 * page fills (kernels/page_summary), group-mean softmaxed Quest scores and the top-k with the
 * "already resident" exclusion producing per-head changed-page lists (kernels/page_score,
 * topk_pages_changed), and FreeKV's correction check (kernels/qcos). Every op is queued on
 * the compute stream, so it sees the query and the summaries the ops before it wrote, and
 * nothing here waits for the device but fence_wait, which the recall thread calls.
 * download_async copies into page-locked memory (host_alloc) and records an event (a fence). */
#include "backend.h"

#ifdef FREEKV_HAVE_CUDA

#include <errno.h>
#include <string.h>

#include "cuda_check.h"
#include "page_score.cuh"
#include "page_summary.cuh"
#include "qcos.cuh"
#include "topk.cuh"

#include "backend_cuda_priv.h"

int cuda_page_summary(void *ctx, float *kmin, float *kmax, int page_stride, int page,
		      const void *slot, enum fkv_dtype slot_dt, int p, int n_kv, int d)
{
	struct cuda_ctx *c = ctx;
	if (p <= 0 || n_kv <= 0 || d <= 0 || page < 0 || page >= page_stride ||
	    (slot_dt != FKV_F32 && slot_dt != FKV_F16 && slot_dt != FKV_BF16))
		return -EINVAL;
	/* One page: source page 0 of the slot, destination `page`; the kernel takes index
	 * arrays on the device, staged through the ring (no wait). */
	struct stage_slot *s;
	int ret = cuda_stage_take(c, 2 * sizeof(int32_t), &s);
	if (ret)
		return ret;
	int32_t *h = s->host;
	h[0] = 0;
	h[1] = page;
	if ((ret = cuda_stage_push(c, s, 2 * sizeof(int32_t))))
		return ret;
	const int32_t *dv = s->dev;
	CUDA_CHECK(page_summary(kmin, kmax, page_stride, slot, slot_dt,
				(long long)2 * p * n_kv * d, dv, dv + 1, 1, n_kv, p, d, c->stream));
	return 0;
}

int cuda_select_pages(void *ctx, const struct backend_select *g, const float *q,
		      const float *kmin, const float *kmax, const uint8_t *resident,
		      int32_t *pages, int32_t *changed, int32_t *n_changed)
{
	struct cuda_ctx *c = ctx;
	if (g->n_q <= 0 || g->n_kv <= 0 || g->n_q % g->n_kv || g->d <= 0 || g->cand_begin < 0 ||
	    g->n_cand < 0 || g->k < 0 || g->k > g->n_cand ||
	    g->cand_begin + g->n_cand > g->page_stride)
		return -EINVAL;
	if (!g->k)
		return 0;
	/* scores (n_kv, n_cand), then the raw per-query-head scores (n_q, n_cand) */
	const size_t n_sc = (size_t)g->n_kv * g->n_cand;
	int ret = cuda_ws_reserve(c, &c->sel_ws, &c->sel_ws_bytes,
				  (n_sc + (size_t)g->n_q * g->n_cand) * sizeof(float));
	if (ret)
		return ret;
	float *scores = c->sel_ws, *raw = scores + n_sc;
	/* The mask through the staging ring: no host wait (a pageable upload may synchronise). */
	const size_t mb = (size_t)g->n_kv * g->page_stride;
	struct stage_slot *st;
	if ((ret = cuda_stage_take(c, mb, &st)))
		return ret;
	memcpy(st->host, resident, mb);
	if ((ret = cuda_stage_push(c, st, mb)))
		return ret;
	CUDA_CHECK(page_score(scores, raw, q, kmin, kmax, g->page_stride, g->cand_begin,
			      g->n_cand, g->n_q, g->n_kv, g->d, c->stream));
	CUDA_CHECK(topk_pages_changed(pages, changed, n_changed, scores, (const uint8_t *)st->dev,
				      g->page_stride, g->n_kv, g->n_cand, g->cand_begin, g->k,
				      c->stream));
	return 0;
}

int cuda_group_cosine(void *ctx, float *out, const float *q_t, const float *q_prev, int n_q,
		      int n_kv, int d)
{
	struct cuda_ctx *c = ctx;
	if (n_q <= 0 || n_kv <= 0 || n_q % n_kv || d <= 0)
		return -EINVAL;
	CUDA_CHECK(qcos_group(out, q_t, q_prev, 1, n_q, n_kv, d, c->stream));
	return 0;
}

void *cuda_host_alloc(void *ctx, size_t bytes)
{
	struct cuda_ctx *c = ctx;
	void *p = NULL;
	if (cudaSetDevice(c->device) != cudaSuccess ||
	    cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	return p;
}

void cuda_host_free(void *ctx, void *p)
{
	(void)ctx;
	if (p)
		cudaFreeHost(p);
}

int cuda_fence_new(void *ctx, void **fence)
{
	struct cuda_ctx *c = ctx;
	cudaEvent_t e;
	CUDA_CHECK(cudaSetDevice(c->device));
	CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
	*fence = e;
	return 0;
}

void cuda_fence_free(void *ctx, void *fence)
{
	(void)ctx;
	cuda_event_destroy((cudaEvent_t)fence);
}

int cuda_download_async(void *ctx, void *host_dst, const void *src, size_t bytes, void *fence)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
	CUDA_CHECK(cudaEventRecord((cudaEvent_t)fence, c->stream));
	return 0;
}

/* The compute stream waits on the fence's event (a recall's per-layer "scattered"). */
int cuda_fence_stream_wait(void *ctx, void *fence)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(cudaStreamWaitEvent(c->stream, (cudaEvent_t)fence, 0));
	return 0;
}

/* The recall thread's wait: the device is made current on the calling thread first. */
int cuda_fence_wait(void *ctx, void *fence)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(cudaSetDevice(c->device));
	CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)fence));
	return 0;
}

#endif
