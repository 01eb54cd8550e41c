/* backend_cuda — the backend ops table on one CUDA device: every op is a kernel of kernels/ (or a
 * cuBLAS GEMM) queued on the backend's compute stream, so ops run in order without host waits;
 * only download(), sync() and an upload from page-locked memory wait.
 *
 * Buffers are device allocations (cudaMalloc), tracked so that backend_free() releases whatever
 * the caller left. Weights are copied to the device in their file dtype. Linear layers go
 * through gemm_xwt (cublasGemmEx, f32 accumulation) with a workspace grown on demand; the
 * workspaces of the compute stream (GEMM, split-K decode attention) are replaced in stream
 * order (cudaFreeAsync/cudaMallocAsync where the device has memory pools, else after the
 * compute stream drained), never by waiting for the device. Decode attention over one dense
 * span (the `full` policy's cache) is kernels/flash_decode, split-K over the whole context;
 * over span lists and over slot lists (attn_decode_slots, the paged
 * policies: kernels/decode_attention, split-K flash decoding with per-head slot indirection;
 * pages too large for its shared memory go to the span kernel as spans) stages its small host
 * tables in a ring of pinned buffers, each reused only after the event of its last copy, so a
 * decode step never waits on the device. host_register page-locks host memory (the kvstored
 * pool mapping) in chunks for DMA. refreshkv's full step has its ops here too: attn_scores and
 * attn_accum over staged span lists, pool_topk (its sets come back as positions, not as the
 * probabilities), gather_heads with a staged map.
 *
 * Recall, offload and the pool registration: backend_cuda_xfer.c; selection (page summaries,
 * scores + top-k, the correction check) and the fences of download_async:
 * backend_cuda_select.c. The shared state is in backend_cuda_priv.h.
 *
 * Without FREEKV_HAVE_CUDA only the constructor is built, and it reports that no device is
 * available. */
#include "backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FREEKV_HAVE_CUDA

#include "add.cuh"
#include "attn_accum.cuh"
#include "attn_scores.cuh"
#include "convert.cuh"
#include "cuda_check.h"
#include "decode_attention.cuh"
#include "embedding.cuh"
#include "flash_decode.cuh"
#include "gather_heads.cuh"
#include "gather_rows.cuh"
#include "gemm.cuh"
#include "pool_topk.cuh"
#include "prefill_attention.cuh"
#include "prefill_attention_mma.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "silu_mul.cuh"
#include "softmax.cuh"
#include "span_attention.cuh"

#include "backend_cuda_priv.h"
#include "cpu_switch.h"



static int track_add(struct cuda_ctx *c, void *p)
{
	if (c->n_bufs == c->cap_bufs) {
		size_t cap = c->cap_bufs ? 2 * c->cap_bufs : 64;
		void **nb = realloc(c->bufs, cap * sizeof *nb);
		if (!nb)
			return -ENOMEM;
		c->bufs = nb;
		c->cap_bufs = cap;
	}
	c->bufs[c->n_bufs++] = p;
	return 0;
}

/* Forgets p; false when it was not ours. */
static bool track_del(struct cuda_ctx *c, void *p)
{
	for (size_t i = c->n_bufs; i-- > 0;)
		if (c->bufs[i] == p) {
			c->bufs[i] = c->bufs[--c->n_bufs];
			return true;
		}
	return false;
}

static void *dev_alloc(struct cuda_ctx *c, size_t bytes)
{
	void *p = NULL;
	if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	if (track_add(c, p)) {
		cudaFree(p);
		return NULL;
	}
	return p;
}


/* Grows a workspace of the compute stream to at least bytes. Ops queued before may still read
 * the old one, so it is freed in stream order, or after the compute stream drained where the
 * device has no memory pools. While graph_run captures, growing is refused (-EBUSY: the
 * capture is abandoned and the ops run plain); a move makes every recorded graph stale. */
static int ws_grow(struct cuda_ctx *c, void **ws, size_t *cap, size_t bytes)
{
	if (bytes <= *cap)
		return 0;
	if (c->capturing)
		return -EBUSY;
	if (c->pools) {
		if (*ws)
			CUDA_CHECK(cudaFreeAsync(*ws, c->stream));
		*ws = NULL;
		*cap = 0;
		CUDA_CHECK(cudaMallocAsync(ws, bytes, c->stream));
	} else {
		CUDA_CHECK(cudaStreamSynchronize(c->stream));
		cudaFree(*ws);
		*ws = NULL;
		*cap = 0;
		CUDA_CHECK(cudaMalloc(ws, bytes));
	}
	*cap = bytes;
	return 0;
}

/* Whether a graph may hold workspace ws: one an op reserved while graph_run captured. */
static bool graph_holds(const struct cuda_ctx *c, void **ws)
{
	if (c->n_graph_ws > CUDA_GRAPH_WS)
		return true; /* more than it keeps track of: any */
	for (int i = 0; i < c->n_graph_ws; i++)
		if (c->graph_ws[i] == ws)
			return true;
	return false;
}

int cuda_ws_reserve(struct cuda_ctx *c, void **ws, size_t *cap, size_t bytes)
{
	if (c->capturing && !graph_holds(c, ws)) {
		if (c->n_graph_ws < CUDA_GRAPH_WS)
			c->graph_ws[c->n_graph_ws] = ws;
		c->n_graph_ws++;
	}
	if (bytes > *cap && !c->capturing && graph_holds(c, ws))
		c->ws_gen++; /* the graphs holding its address are stale */
	return ws_grow(c, ws, cap, bytes);
}

/* With every stream drained. */
static void ws_release(struct cuda_ctx *c, void **ws, size_t *cap)
{
	if (graph_holds(c, ws))
		c->ws_gen++;
	if (*ws && c->pools && cudaFreeAsync(*ws, c->stream) == cudaSuccess)
		cudaStreamSynchronize(c->stream);
	else if (*ws)
		cudaFree(*ws);
	*ws = NULL;
	*cap = 0;
}


/* Waits for every stream the backend owns: compute first (it may wait on recall events), then
 * the recall streams (work queued there after the compute stream's last wait) and the offload
 * stream (which waits on compute events only). */
int cuda_drain(struct cuda_ctx *c)
{
	cudaStream_t all[] = { c->stream, c->rc_stream, c->rc_copy, c->off_stream };
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		if (all[i])
			CUDA_CHECK(cudaStreamSynchronize(all[i]));
	return 0;
}

static void cuda_free(void *ctx)
{
	struct cuda_ctx *c = ctx;
	cudaSetDevice(c->device);
	(void)cuda_drain(c);
	ws_release(c, &c->gemm_ws, &c->gemm_ws_bytes);
	ws_release(c, &c->dec_ws, &c->dec_ws_bytes);
	ws_release(c, &c->sel_ws, &c->sel_ws_bytes);
	ws_release(c, &c->fd_ws, &c->fd_ws_bytes);
	ws_release(c, &c->pool_ws, &c->pool_ws_bytes);
	ws_release(c, &c->kivi_ws, &c->kivi_ws_bytes);
	for (size_t i = 0; i < c->n_bufs; i++)
		cudaFree(c->bufs[i]);
	free(c->bufs);
	free(c->batch_in);
	for (int i = 0; i < CUDA_STAGE_RING; i++) {
		size_t cap = c->ring[i].cap;
		cudaFreeHost(c->ring[i].host);
		ws_release(c, &c->ring[i].dev, &cap);
		cuda_event_destroy(c->ring[i].done);
	}
	cuda_xfer_free(c);
	pthread_mutex_destroy(&c->recall_mu);
	if (c->blas)
		cublasDestroy(c->blas);
	cudaFree(c->blas_ws);
	cudaStream_t all[] = { c->stream, c->rc_stream, c->rc_copy, c->off_stream };
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		if (all[i])
			cudaStreamDestroy(all[i]);
	(void)cudaGetLastError();
	free(c);
}

static void *cuda_buf_alloc(void *ctx, size_t bytes)
{
	return dev_alloc(ctx, bytes);
}

static void cuda_buf_free(void *ctx, void *buf)
{
	struct cuda_ctx *c = ctx;
	if (buf && track_del(c, buf))
		cudaFree(buf);
}

static int cuda_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
	struct cuda_ctx *c = ctx;
	/* From pageable memory the call returns once src has been staged, so the caller may
	 * reuse it at once; from page-locked memory (a registered pool) the DMA runs later, so
	 * the upload waits for it to keep that promise. */
	struct cudaPointerAttributes at;
	bool locked = cudaPointerGetAttributes(&at, src) == cudaSuccess &&
		      at.type == cudaMemoryTypeHost;
	(void)cudaGetLastError();
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
	if (locked)
		CUDA_CHECK(cudaStreamSynchronize(c->stream));
	return 0;
}

static int cuda_download(void *ctx, void *dst, const void *src, size_t bytes)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
	CUDA_CHECK(cudaStreamSynchronize(c->stream));
	return 0;
}

static int cuda_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
	return 0;
}

static int cuda_convert(void *ctx, void *dst, enum fkv_dtype t, const float *src, int64_t n)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(convert_f32(dst, t, src, n, c->stream));
	return 0;
}

static int cuda_gather_rows(void *ctx, float *dst, const float *src, int64_t cols,
			    const int32_t *idx, int64_t n)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(gather_rows_f32(dst, src, cols, idx, n, c->stream));
	return 0;
}

/* One strided copy per part on the compute stream (a 2-D copy: the part's columns of every
 * row), no kernel of its own. */
static int cuda_split_cols(void *ctx, float *const *dst, const int64_t *cols, int n,
			   const float *src, int64_t rows)
{
	struct cuda_ctx *c = ctx;
	int64_t all = 0;
	for (int i = 0; i < n; i++)
		all += cols[i];
	const size_t f = sizeof(float);
	int64_t off = 0;
	for (int i = 0; i < n; off += cols[i], i++)
		CUDA_CHECK(cudaMemcpy2DAsync(dst[i], (size_t)cols[i] * f, src + off, (size_t)all * f,
					     (size_t)cols[i] * f, (size_t)rows,
					     cudaMemcpyDeviceToDevice, c->stream));
	return 0;
}

static int cuda_weight_load(void *ctx, const struct fkv_tensor *src, struct backend_mat *dst)
{
	struct cuda_ctx *c = ctx;
	if (!src->data)
		return -EINVAL;
	if (src->quant) {
		fprintf(stderr, "cuda: weight of %s blocks: the CUDA backend has no kernels for quantized "
			"weights yet (use --backend cpu)\n", quant_name(src->quant));
		return -EOPNOTSUPP;
	}
	int64_t rows = src->shape[0], cols = src->n_dims == 2 ? src->shape[1] : 1;
	size_t bytes = (size_t)rows * (size_t)cols * dtype_size(src->dtype);
	void *p = dev_alloc(c, bytes);
	if (!p)
		return -ENOMEM;
	/* On the compute stream, not with cudaMemcpy: from pageable memory that returns once src is
	 * staged, before the DMA lands, and the non-blocking compute stream is not ordered after
	 * the legacy stream it ran on. The wait keeps src unread after return when it is
	 * page-locked. */
	cudaError_t e = cudaMemcpyAsync(p, src->data, bytes, cudaMemcpyHostToDevice, c->stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess) {
		track_del(c, p);
		cudaFree(p);
		return cuda_check_fail(e, "cudaMemcpyAsync(weight)", __func__, __FILE__, __LINE__);
	}
	dst->data = p;
	dst->dtype = src->dtype;
	dst->rows = rows;
	dst->cols = cols;
	dst->priv = p;
	return 0;
}

/* The parts copied back to back into one device allocation, in stream order, then waited
 * for (the parts may be page-locked: nothing of them is read after return). */
static int cuda_weight_concat(void *ctx, const struct fkv_tensor *const *parts, int n,
			      struct backend_mat *dst)
{
	struct cuda_ctx *c = ctx;
	if (n <= 0)
		return -EINVAL;
	const int64_t cols = parts[0]->n_dims == 2 ? parts[0]->shape[1] : 1;
	int64_t rows = 0;
	for (int i = 0; i < n; i++) {
		if (parts[i]->quant != FKV_QNONE)
			return -EOPNOTSUPP; /* as weight_load: no kernels for quantized weights */
		if (!parts[i]->data || parts[i]->dtype != parts[0]->dtype ||
		    (parts[i]->n_dims == 2 ? parts[i]->shape[1] : 1) != cols)
			return -EINVAL;
		rows += parts[i]->shape[0];
	}
	const size_t row_bytes = (size_t)cols * dtype_size(parts[0]->dtype);
	char *p = dev_alloc(c, (size_t)rows * row_bytes);
	if (!p)
		return -ENOMEM;
	cudaError_t e = cudaSuccess;
	size_t off = 0;
	for (int i = 0; i < n && e == cudaSuccess; i++) {
		size_t b = (size_t)parts[i]->shape[0] * row_bytes;
		e = cudaMemcpyAsync(p + off, parts[i]->data, b, cudaMemcpyHostToDevice, c->stream);
		off += b;
	}
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess) {
		track_del(c, p);
		cudaFree(p);
		return cuda_check_fail(e, "cudaMemcpyAsync(weight part)", __func__, __FILE__,
				       __LINE__);
	}
	*dst = (struct backend_mat){ .data = p, .dtype = parts[0]->dtype, .rows = rows,
				     .cols = cols, .priv = p };
	return 0;
}

static void cuda_weight_release(void *ctx, struct backend_mat *w)
{
	struct cuda_ctx *c = ctx;
	if (w->priv && track_del(c, w->priv))
		cudaFree(w->priv);
	memset(w, 0, sizeof *w);
}

static int cuda_matmul(void *ctx, float *y, const float *x, const struct backend_mat *w, int64_t n)
{
	struct cuda_ctx *c = ctx;
	int ret = cuda_ws_reserve(c, &c->gemm_ws, &c->gemm_ws_bytes,
			     gemm_workspace_bytes(w->dtype, n, w->cols));
	if (ret)
		return ret;
	return gemm_xwt(c->blas, y, x, w->data, w->dtype, n, w->rows, w->cols, c->gemm_ws,
			c->gemm_ws_bytes, c->stream);
}

static int cuda_rmsnorm(void *ctx, float *y, const float *x, const struct backend_mat *w,
			int64_t n, int64_t dim, float eps)
{
	struct cuda_ctx *c = ctx;
	if (n > INT32_MAX || dim > INT32_MAX)
		return -EINVAL;
	CUDA_CHECK(rmsnorm_rows(y, x, w->data, w->dtype, (int)n, (int)dim, eps, c->stream));
	return 0;
}

static int cuda_rope(void *ctx, float *x, int64_t n, int n_heads, int head_dim, const int32_t *pos,
		     const struct backend_rope *r)
{
	struct cuda_ctx *c = ctx;
	if (n > INT32_MAX)
		return -EINVAL;
	struct rope_cfg cfg = {
		.pairing = r->style == FKV_ROPE_HALVES ? ROPE_PAIR_HALVES : ROPE_PAIR_INTERLEAVED,
		.theta = r->theta,
		.scaling_factor = r->scaling_factor,
		.low_freq_factor = r->low_freq_factor,
		.high_freq_factor = r->high_freq_factor,
		.original_ctx = r->original_ctx,
	};
	CUDA_CHECK(rope_f32(x, pos, (int)n, n_heads, head_dim, cfg, c->stream));
	return 0;
}

static int cuda_silu_mul(void *ctx, float *out, const float *gate, const float *up, int64_t n)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(silu_mul_f32(out, gate, up, n, c->stream));
	return 0;
}

static int cuda_add(void *ctx, float *y, const float *x, int64_t n)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(add_f32(y, x, n, c->stream));
	return 0;
}

static int cuda_add_bias(void *ctx, float *y, const struct backend_mat *b, int64_t n)
{
	struct cuda_ctx *c = ctx;
	if (b->rows > INT32_MAX)
		return -EINVAL;
	CUDA_CHECK(add_bias_rows(y, b->data, b->dtype, n, (int)b->rows, c->stream));
	return 0;
}

static int cuda_embed(void *ctx, float *out, const struct backend_mat *table, const int32_t *ids,
		      int64_t n)
{
	struct cuda_ctx *c = ctx;
	if (n > INT32_MAX || table->cols > INT32_MAX || table->rows > INT32_MAX)
		return -EINVAL;
	CUDA_CHECK(embedding_rows(out, table->data, table->dtype, ids, (int)n, (int)table->cols,
				  (int)table->rows, c->stream));
	return 0;
}

static int cuda_softmax(void *ctx, float *x, int64_t rows, int64_t cols)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(softmax_rows(x, rows, cols, c->stream));
	return 0;
}

static int check_attn(const struct backend_attn *a)
{
	if (a->head_dim <= 0 || a->head_dim > SPAN_ATTN_MAX_D || a->n_kv_heads <= 0 ||
	    a->n_heads % a->n_kv_heads || a->window < 0 ||
	    (a->kv_dtype != FKV_F32 && a->kv_dtype != FKV_F16 && a->kv_dtype != FKV_BF16))
		return -EINVAL;
	return 0;
}

/* Prefill attention over 16-bit K/V on tensor cores (kernels/prefill_attention_mma) unless
 * FREEKV_CUDA_PREFILL_MMA=0 (read once, cpu_switch.h's rule): then the CUDA-core tiles, its
 * reference. */
static bool prefill_mma_on(void)
{
	static int on = -1;
	return cpu_switch_on(&on, "FREEKV_CUDA_PREFILL_MMA");
}

static int cuda_attn_prefill(void *ctx, float *out, const float *q, int64_t n_q, const void *k,
			     const void *v, int64_t n_ctx, const struct backend_attn *a)
{
	struct cuda_ctx *c = ctx;
	int ret = check_attn(a);
	if (ret)
		return ret;
	if (n_q > n_ctx || n_ctx > INT32_MAX || a->window > INT32_MAX)
		return -EINVAL;
	if (prefill_mma_on() && prefill_attention_mma_takes(a->kv_dtype, a->head_dim)) {
		CUDA_CHECK(prefill_attention_mma(out, q, k, v, a->kv_dtype, (int)n_q, (int)n_ctx,
						 a->n_heads, a->n_kv_heads, a->head_dim, a->scale,
						 (int)a->window, c->stream));
		return 0;
	}
	CUDA_CHECK(prefill_attention(out, q, k, v, a->kv_dtype, (int)n_q, (int)n_ctx, a->n_heads,
				     a->n_kv_heads, a->head_dim, a->scale, (int)a->window,
				     c->stream));
	return 0;
}

/* Takes the next ring slot, with room for bytes; the caller fills its host copy, then
 * cuda_stage_push() queues the copy to the device. */
int cuda_stage_take(struct cuda_ctx *c, size_t bytes, struct stage_slot **out)
{
	struct stage_slot *s = &c->ring[c->ring_next];
	c->ring_next = (c->ring_next + 1) % CUDA_STAGE_RING;
	if (!s->done)
		CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
	if (s->used)
		CUDA_CHECK(cudaEventSynchronize(s->done));
	if (bytes > s->cap) {
		size_t cap = bytes < 4096 ? 4096 : 2 * bytes, dcap = s->cap;
		cudaFreeHost(s->host); /* its last copy has run */
		s->host = NULL;
		s->cap = 0;
		/* staging is never read inside a graph: no graph goes stale */
		int ret = ws_grow(c, &s->dev, &dcap, cap);
		if (ret)
			return ret;
		CUDA_CHECK(cudaMallocHost(&s->host, cap));
		s->cap = cap;
	}
	*out = s;
	return 0;
}

int cuda_stage_push(struct cuda_ctx *c, struct stage_slot *s, size_t bytes)
{
	CUDA_CHECK(cudaMemcpyAsync(s->dev, s->host, bytes, cudaMemcpyHostToDevice, c->stream));
	s->used = 1;
	CUDA_CHECK(cudaEventRecord(s->done, c->stream));
	return 0;
}

/* Stages n_spans descriptors and the first[] table (n_kv + 1) and queues their copy to the
 * device; *dspans / *dfirst are the device addresses. first == NULL: every KV head reads all
 * n_spans spans, staged as n_kv copies of the list (the kernels read KV head h's spans from
 * first[h] to first[h + 1]). */
static int stage_spans(struct cuda_ctx *c, const struct backend_kv_span *spans, int n_spans,
		       const int *first, int n_kv, const struct span_desc **dspans,
		       const int32_t **dfirst)
{
	int copies = first ? 1 : n_kv;
	size_t span_bytes = (size_t)copies * n_spans * sizeof(struct span_desc);
	size_t bytes = span_bytes + (size_t)(n_kv + 1) * sizeof(int32_t);
	struct stage_slot *s;
	int ret = cuda_stage_take(c, bytes, &s);
	if (ret)
		return ret;
	struct span_desc *hs = s->host;
	for (int r = 0; r < copies; r++)
		for (int i = 0; i < n_spans; i++)
			hs[r * n_spans + i] = (struct span_desc){ spans[i].k, spans[i].v,
								  spans[i].n, spans[i].row_stride };
	int32_t *hf = (int32_t *)((char *)s->host + span_bytes);
	for (int i = 0; i <= n_kv; i++)
		hf[i] = first ? first[i] : i * n_spans;
	if ((ret = cuda_stage_push(c, s, bytes)))
		return ret;
	*dspans = s->dev;
	*dfirst = (const int32_t *)((char *)s->dev + span_bytes);
	return 0;
}

/* first == NULL: every KV head reads all n_spans spans. */
static int attn_spans(struct cuda_ctx *c, float *out, const float *q,
		      const struct backend_kv_span *spans, int n_spans, const int *first,
		      const struct backend_attn *a)
{
	int ret = check_attn(a);
	if (ret)
		return ret;
	for (int h = 0; h < a->n_kv_heads; h++) {
		int s0 = first ? first[h] : 0, s1 = first ? first[h + 1] : n_spans;
		int64_t n = 0;
		if (s1 < s0)
			return -EINVAL;
		for (int s = s0; s < s1; s++)
			n += spans[s].n;
		if (n <= 0)
			return -EINVAL;
	}
	const struct span_desc *ds;
	const int32_t *df;
	if ((ret = stage_spans(c, spans, n_spans, first, a->n_kv_heads, &ds, &df)))
		return ret;
	CUDA_CHECK(span_attention(out, q, ds, df, a->kv_dtype, a->n_heads, a->n_kv_heads,
				  a->head_dim, a->scale, c->stream));
	return 0;
}

/* One dense span (the `full` policy's cache) goes to the flash-decoding kernel, split-K over
 * the whole context with a fixed-size workspace; span lists, and geometries past that kernel's
 * limits, to the span kernel. */
static int cuda_attn_decode(void *ctx, float *out, const float *q,
			    const struct backend_kv_span *spans, int n_spans,
			    const struct backend_attn *a)
{
	struct cuda_ctx *c = ctx;
	int ret = check_attn(a);
	if (ret)
		return ret;
	if (n_spans == 1 && spans[0].n > 0 && a->head_dim <= FLASH_DECODE_MAX_D &&
	    a->n_heads / a->n_kv_heads <= FLASH_DECODE_MAX_GROUP &&
	    spans[0].row_stride >= (int64_t)a->n_kv_heads * a->head_dim) {
		ret = cuda_ws_reserve(c, &c->fd_ws, &c->fd_ws_bytes,
				      flash_decode_workspace_bytes(a->n_heads, a->head_dim));
		if (ret)
			return ret;
		CUDA_CHECK(flash_decode(out, q, spans[0].k, spans[0].v, a->kv_dtype, spans[0].n,
					spans[0].row_stride, a->n_heads, a->n_kv_heads,
					a->head_dim, a->scale, c->fd_ws, c->fd_ws_bytes,
					c->stream));
		return 0;
	}
	return attn_spans(c, out, q, spans, n_spans, NULL, a);
}

static int cuda_attn_decode_heads(void *ctx, float *out, const float *q,
				  const struct backend_kv_span *spans, const int *first,
				  const struct backend_attn *a)
{
	if (a->n_kv_heads <= 0 || first[0] < 0)
		return -EINVAL;
	return attn_spans(ctx, out, q, spans, first[a->n_kv_heads], first, a);
}

/* refreshkv's full step (docs/design.md §5): the two passes of decode attention apart, over span
 * lists staged as for attn_decode_heads; *max_keys gets the most keys a KV head has. */
static int split_spans(struct cuda_ctx *c, const struct backend_kv_span *spans,
		       const int *first, const struct backend_attn *a,
		       const struct span_desc **ds, const int32_t **df, int64_t *max_keys)
{
	int ret = check_attn(a);
	if (ret)
		return ret;
	if (first[0] < 0)
		return -EINVAL;
	*max_keys = 0;
	for (int h = 0; h < a->n_kv_heads; h++) {
		int64_t n = 0;
		if (first[h + 1] < first[h])
			return -EINVAL;
		for (int s = first[h]; s < first[h + 1]; s++)
			n += spans[s].n;
		*max_keys = n > *max_keys ? n : *max_keys;
	}
	return stage_spans(c, spans, first[a->n_kv_heads], first, a->n_kv_heads, ds, df);
}

static int cuda_attn_scores(void *ctx, float *s, int64_t ld, const float *q,
			    const struct backend_kv_span *spans, const int *first,
			    const struct backend_attn *a)
{
	struct cuda_ctx *c = ctx;
	const struct span_desc *ds;
	const int32_t *df;
	int64_t n;
	int ret = split_spans(c, spans, first, a, &ds, &df, &n);
	if (ret)
		return ret;
	CUDA_CHECK(attn_scores(s, ld, q, ds, df, n, a->kv_dtype, a->n_heads, a->n_kv_heads,
			       a->head_dim, a->scale, c->stream));
	return 0;
}

static int cuda_attn_accum(void *ctx, float *out, const float *p, int64_t ld,
			   const struct backend_kv_span *spans, const int *first, bool accumulate,
			   const struct backend_attn *a)
{
	struct cuda_ctx *c = ctx;
	const struct span_desc *ds;
	const int32_t *df;
	int64_t n;
	int ret = split_spans(c, spans, first, a, &ds, &df, &n);
	if (ret)
		return ret;
	CUDA_CHECK(attn_accum(out, p, ld, ds, df, accumulate, a->kv_dtype, a->n_heads,
			      a->n_kv_heads, a->head_dim, c->stream));
	return 0;
}

/* The sets come back as n_kv * B positions and scores: a download of 8 bytes per member
 * instead of the n_q * T probabilities. */
static int cuda_pool_topk(void *ctx, int32_t *pos, float *uval, const float *probs, int64_t ld,
			  int n_q, int n_kv, int64_t T, int B)
{
	struct cuda_ctx *c = ctx;
	if (T <= 0 || T > INT32_MAX || B < 1 || B > T || n_kv <= 0)
		return -EINVAL;
	const size_t u_bytes = ((size_t)n_kv * (size_t)T * sizeof(float) + 255) & ~(size_t)255;
	const size_t set_bytes = (size_t)n_kv * B * sizeof(int32_t);
	int ret = cuda_ws_reserve(c, &c->pool_ws, &c->pool_ws_bytes, u_bytes + 2 * set_bytes);
	if (ret)
		return ret;
	char *ws = c->pool_ws;
	int32_t *dpos = (int32_t *)(ws + u_bytes);
	float *duv = (float *)(ws + u_bytes + set_bytes);
	CUDA_CHECK(pool_topk(dpos, duv, (float *)ws, probs, ld, n_q, n_kv, (int)T, B, c->stream));
	CUDA_CHECK(cudaMemcpyAsync(pos, dpos, set_bytes, cudaMemcpyDeviceToHost, c->stream));
	CUDA_CHECK(cudaMemcpyAsync(uval, duv, set_bytes, cudaMemcpyDeviceToHost, c->stream));
	CUDA_CHECK(cudaStreamSynchronize(c->stream));
	return 0;
}

/* The map is staged like the span tables: pinned host copy, device copy in stream order. */
static int cuda_gather_heads(void *ctx, float *dst, const float *src, const int32_t *map, int n,
			     int n_kv, int d)
{
	struct cuda_ctx *c = ctx;
	if (n < 0 || n_kv <= 0 || d <= 0)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (map[3 * i] < 0 || map[3 * i + 1] < 0 || map[3 * i + 2] < 0 ||
		    map[3 * i + 2] >= n_kv)
			return -EINVAL;
	if (!n)
		return 0;
	struct stage_slot *s;
	size_t bytes = (size_t)n * 3 * sizeof(int32_t);
	int ret = cuda_stage_take(c, bytes, &s);
	if (ret)
		return ret;
	memcpy(s->host, map, bytes);
	if ((ret = cuda_stage_push(c, s, bytes)))
		return ret;
	CUDA_CHECK(gather_heads(dst, src, s->dev, n, n_kv, d, c->stream));
	return 0;
}

/* The arguments of attn_decode_slots, checked on the host before anything is queued: the
 * geometry (what the kernel takes, in int), every head's token count and every slot index it
 * reads. */
static int check_slots(const void *slots, int n_slots, const int32_t *list, int max_pages,
		       const int32_t *n_tok, int p, const struct backend_attn *a)
{
	const int n_kv = a->n_kv_heads;
	const enum fkv_dtype dt = a->kv_dtype;
	if (!slots || !list || !n_tok || a->n_heads <= 0 || n_kv <= 0 || n_kv > 65535 ||
	    a->n_heads % n_kv || a->head_dim <= 0 || a->window < 0 ||
	    (dt != FKV_F32 && dt != FKV_F16 && dt != FKV_BF16) ||
	    n_slots <= 0 || max_pages <= 0 || p <= 0 || (int64_t)max_pages * p > INT32_MAX ||
	    (int64_t)n_kv * max_pages > INT32_MAX - n_kv)
		return -EINVAL;
	for (int h = 0; h < n_kv; h++) {
		if (n_tok[h] <= 0 || n_tok[h] > (int64_t)max_pages * p)
			return -EINVAL;
		const int pages = (n_tok[h] + p - 1) / p;
		for (int i = 0; i < pages; i++) {
			int32_t sl = list[(size_t)h * max_pages + i];
			if (sl < 0 || sl >= n_slots)
				return -EINVAL;
		}
	}
	return 0;
}

/* attn_decode_slots as what it equals, attn_decode_heads over the same rows (one span per page,
 * as the CPU backend builds them): for pages too large for the split-K kernel's shared memory
 * (p * (2d + 1) floats a block, so p > ~220 at d = 128), which span_attention walks in tiles. */
static int slots_as_spans(struct cuda_ctx *c, float *out, const float *q, const void *slots,
			  const int32_t *list, int max_pages, const int32_t *n_tok, int p,
			  const struct backend_attn *a)
{
	const int n_kv = a->n_kv_heads;
	const size_t es = dtype_size(a->kv_dtype), row = (size_t)n_kv * a->head_dim;
	const size_t slot_bytes = 2 * (size_t)p * row * es;
	struct backend_kv_span *spans = malloc((size_t)n_kv * max_pages * sizeof *spans);
	int *first = malloc((size_t)(n_kv + 1) * sizeof *first);
	int ret = -ENOMEM;
	if (spans && first) {
		int ns = 0;
		for (int h = 0; h < n_kv; h++) {
			const int pages = (n_tok[h] + p - 1) / p;
			first[h] = ns;
			for (int i = 0; i < pages; i++) {
				const char *k = (const char *)slots +
						(size_t)list[(size_t)h * max_pages + i] * slot_bytes;
				spans[ns++] = (struct backend_kv_span){
					.k = k, .v = k + (size_t)p * row * es,
					.n = i + 1 < pages ? p : n_tok[h] - (int64_t)(pages - 1) * p,
					.row_stride = (int64_t)row,
				};
			}
		}
		first[n_kv] = ns;
		/* attn_spans stages the descriptors before it returns */
		ret = attn_spans(c, out, q, spans, ns, first, a);
	}
	free(spans);
	free(first);
	return ret;
}

/* Batch 1 of kernels/decode_attention: the list and the per-head counts go through the staging
 * ring (one copy), the split-K partials into dec_ws, sized for max_pages so that it settles
 * after the first steps of a run. */
static int cuda_attn_decode_slots(void *ctx, float *out, const float *q, const void *slots,
				  int n_slots, const int32_t *list, int max_pages,
				  const int32_t *n_tok, int p, const struct backend_attn *a)
{
	struct cuda_ctx *c = ctx;
	int ret = check_slots(slots, n_slots, list, max_pages, n_tok, p, a);
	if (ret)
		return ret;
	const int n_kv = a->n_kv_heads;
	const size_t n_list = (size_t)n_kv * max_pages;
	ret = cuda_ws_reserve(c, &c->dec_ws, &c->dec_ws_bytes,
			 decode_attention_workspace_bytes(1, a->n_heads, n_kv, a->head_dim,
							  max_pages));
	if (ret)
		return ret;
	struct stage_slot *s;
	const size_t bytes = (n_list + (size_t)n_kv) * sizeof(int32_t);
	if ((ret = cuda_stage_take(c, bytes, &s)))
		return ret;
	int32_t *hl = s->host;
	memcpy(hl, list, n_list * sizeof *hl);
	memcpy(hl + n_list, n_tok, (size_t)n_kv * sizeof *hl);
	if ((ret = cuda_stage_push(c, s, bytes)))
		return ret;
	const int32_t *dl = s->dev;
	cudaError_t e = decode_attention(out, q, slots, a->kv_dtype, dl, dl + n_list, 1, a->n_heads,
					 n_kv, a->head_dim, p, max_pages, a->scale, c->dec_ws,
					 c->dec_ws_bytes, c->stream);
	/* check_slots ruled out every other cause of an invalid value (geometry, workspace), so
	 * this one is the block's shared memory, checked before anything was launched. */
	if (e == cudaErrorInvalidValue)
		return slots_as_spans(c, out, q, slots, list, max_pages, n_tok, p, a);
	if (e != cudaSuccess)
		return cuda_check_fail(e, "decode_attention", __func__, __FILE__, __LINE__);
	return 0;
}




/* Whether two items' attention can share a launch: the same heads, dtype and scale. */
static bool same_attn(const struct backend_attn *x, const struct backend_attn *y)
{
	return x->n_heads == y->n_heads && x->n_kv_heads == y->n_kv_heads &&
	       x->head_dim == y->head_dim && x->kv_dtype == y->kv_dtype && x->scale == y->scale;
}

/* Whether a dense item is one the flash-decoding kernel takes (cuda_attn_decode's test). */
static bool fd_takes(const struct backend_attn_item *it)
{
	const struct backend_attn *a = &it->a;
	return a->head_dim <= FLASH_DECODE_MAX_D &&
	       a->n_heads / a->n_kv_heads <= FLASH_DECODE_MAX_GROUP &&
	       it->span.row_stride >= (int64_t)a->n_kv_heads * a->head_dim;
}

/* The dense items that join the first flash-decoding one (same geometry and row stride) in one
 * flash_decode_batch launch; marks them in in[]. */
static int batch_dense(struct cuda_ctx *c, float *out, const float *q,
		       const struct backend_attn_item *items, int n, bool *in)
{
	const struct backend_attn_item *ref = NULL;
	int nb = 0;
	long long max_n = 0;
	for (int i = 0; i < n; i++) {
		const struct backend_attn_item *it = &items[i];
		if (it->slots || !fd_takes(it) ||
		    (ref && (!same_attn(&it->a, &ref->a) ||
			     it->span.row_stride != ref->span.row_stride)))
			continue;
		ref = ref ? ref : it;
		in[i] = true;
		nb++;
		max_n = it->span.n > max_n ? it->span.n : max_n;
	}
	if (!nb)
		return 0;
	const struct backend_attn *a = &ref->a;
	struct stage_slot *s;
	const size_t bytes = (size_t)nb * sizeof(struct flash_decode_item);
	int ret = cuda_ws_reserve(c, &c->fd_ws, &c->fd_ws_bytes,
				  flash_decode_batch_workspace_bytes(nb, a->n_heads, a->n_kv_heads,
								     a->head_dim))
	       ?: cuda_stage_take(c, bytes, &s);
	if (ret)
		return ret;
	struct flash_decode_item *hi = s->host;
	for (int i = 0, j = 0; i < n; i++)
		if (in[i])
			hi[j++] = (struct flash_decode_item){ items[i].span.k, items[i].span.v,
							      items[i].span.n, items[i].row };
	if ((ret = cuda_stage_push(c, s, bytes)))
		return ret;
	CUDA_CHECK(flash_decode_batch(out, q, s->dev, nb, max_n, a->kv_dtype,
				      ref->span.row_stride, a->n_heads, a->n_kv_heads, a->head_dim,
				      a->scale, c->fd_ws, c->fd_ws_bytes, c->stream));
	return 0;
}

/* Whether slot item it joins the launch of slot item ref: the same heads, dtype, page size and
 * list width. */
static bool slot_joins(const struct backend_attn_item *it, const struct backend_attn_item *ref)
{
	return it->slots && same_attn(&it->a, &ref->a) && it->p == ref->p &&
	       it->max_pages == ref->max_pages;
}

/* The slot items that share the first one's geometry in one decode_attention_seqs launch:
 * staged as [slot buffer pointers][rows][lists][n_tok]. Marks them in in[] unless the kernel
 * cannot take the geometry (its shared memory), when they go alone (and through
 * slots_as_spans). */
static int batch_slots(struct cuda_ctx *c, float *out, const float *q,
		       const struct backend_attn_item *items, int n, bool *in)
{
	const struct backend_attn_item *ref = NULL;
	int nb = 0;
	bool aligned = true;
	for (int i = 0; i < n; i++) {
		ref = ref || !items[i].slots ? ref : &items[i];
		if (ref && slot_joins(&items[i], ref)) {
			nb++;
			aligned = aligned && (uintptr_t)items[i].slots % 16 == 0;
		}
	}
	if (!nb)
		return 0;
	const struct backend_attn *a = &ref->a;
	const int n_kv = a->n_kv_heads, mp = ref->max_pages;
	const size_t per = (size_t)n_kv * mp + (size_t)n_kv;
	const size_t bytes = (size_t)nb * (sizeof(void *) + sizeof(int32_t) * (1 + per));
	struct stage_slot *s;
	int ret = cuda_ws_reserve(c, &c->dec_ws, &c->dec_ws_bytes,
				  decode_attention_workspace_bytes(nb, a->n_heads, n_kv, a->head_dim,
								   mp))
	       ?: cuda_stage_take(c, bytes, &s);
	if (ret)
		return ret;
	const void **hp = s->host;
	int32_t *hr = (int32_t *)(hp + nb), *hl = hr + nb, *ht = hl + (size_t)nb * n_kv * mp;
	for (int i = 0, j = 0; i < n; i++) {
		const struct backend_attn_item *it = &items[i];
		if (!slot_joins(it, ref))
			continue;
		hp[j] = it->slots;
		hr[j] = (int32_t)it->row;
		memcpy(hl + (size_t)j * n_kv * mp, it->list, (size_t)n_kv * mp * sizeof *hl);
		memcpy(ht + (size_t)j * n_kv, it->n_tok, (size_t)n_kv * sizeof *ht);
		j++;
	}
	if ((ret = cuda_stage_push(c, s, bytes)))
		return ret;
	const char *d = s->dev;
	const size_t ptrs = (size_t)nb * sizeof(void *);
	const int32_t *dr = (const int32_t *)(d + ptrs), *dl = dr + nb,
		      *dt = dl + (size_t)nb * n_kv * mp;
	cudaError_t e = decode_attention_seqs(out, q, dr, (const void *const *)d, aligned,
					      a->kv_dtype, dl, dt, nb, a->n_heads, n_kv,
					      a->head_dim, ref->p, mp, a->scale, c->dec_ws,
					      c->dec_ws_bytes, c->stream);
	if (e == cudaErrorInvalidValue) /* the block's shared memory: checked before launch */
		return 0;
	if (e != cudaSuccess)
		return cuda_check_fail(e, "decode_attention_seqs", __func__, __FILE__, __LINE__);
	for (int i = 0; i < n; i++)
		in[i] = in[i] || slot_joins(&items[i], ref);
	return 0;
}

/* Checks every item as its single call would, then one flash_decode_batch launch for the
 * dense items, one decode_attention_seqs launch for the slot items, and single calls for the
 * rest (other geometries, spans past the kernels' limits). */
static int cuda_attn_decode_batch(void *ctx, float *out, const float *q,
				  const struct backend_attn_item *items, int n)
{
	struct cuda_ctx *c = ctx;
	if (n <= 0)
		return n < 0 ? -EINVAL : 0;
	for (int i = 0; i < n; i++) {
		const struct backend_attn_item *it = &items[i];
		int ret = check_attn(&it->a);
		if (!ret && it->slots)
			ret = check_slots(it->slots, it->n_slots, it->list, it->max_pages,
					  it->n_tok, it->p, &it->a);
		else if (!ret && (it->span.n <= 0 || it->row < 0 || it->row > INT32_MAX))
			ret = -EINVAL;
		if (ret)
			return ret;
	}
	if ((size_t)n > c->batch_in_len) {
		bool *p = realloc(c->batch_in, (size_t)n * sizeof *p);
		if (!p)
			return -ENOMEM;
		c->batch_in = p;
		c->batch_in_len = (size_t)n;
	}
	bool *in = c->batch_in;
	memset(in, 0, (size_t)n * sizeof *in);
	int ret = batch_dense(c, out, q, items, n, in) ?: batch_slots(c, out, q, items, n, in);
	for (int i = 0; i < n && !ret; i++) {
		const struct backend_attn_item *it = &items[i];
		const int64_t qd = (int64_t)it->a.n_heads * it->a.head_dim;
		if (in[i])
			continue;
		ret = it->slots ? cuda_attn_decode_slots(c, out + it->row * qd, q + it->row * qd,
							 it->slots, it->n_slots, it->list,
							 it->max_pages, it->n_tok, it->p, &it->a)
				: cuda_attn_decode(c, out + it->row * qd, q + it->row * qd,
						   &it->span, 1, &it->a);
	}
	return ret;
}

/* Slots in the KV dtype (docs/design.md §3 "Device slots"): 16-bit K/V in slot memory, recall
 * scatter and attention, which accumulates in f32. */
static enum fkv_dtype cuda_slot_dtype(void *ctx, enum fkv_dtype kv)
{
	(void)ctx;
	return kv;
}

static int cuda_round_to(void *ctx, float *x, int64_t n, enum fkv_dtype dt)
{
	struct cuda_ctx *c = ctx;
	CUDA_CHECK(round_f32(x, dt, n, c->stream));
	return 0;
}





static int cuda_sync(void *ctx)
{
	return cuda_drain(ctx);
}



static const struct backend_ops cuda_ops = {
	.name = "cuda",
	.free = cuda_free,
	.buf_alloc = cuda_buf_alloc,
	.buf_free = cuda_buf_free,
	.upload = cuda_upload,
	.download = cuda_download,
	.copy = cuda_copy,
	.convert = cuda_convert,
	.gather_rows = cuda_gather_rows,
	.split_cols = cuda_split_cols,
	.weight_load = cuda_weight_load,
	.weight_release = cuda_weight_release,
	.weight_concat = cuda_weight_concat,
	.matmul = cuda_matmul,
	.rmsnorm = cuda_rmsnorm,
	.rope = cuda_rope,
	.silu_mul = cuda_silu_mul,
	.add = cuda_add,
	.add_bias = cuda_add_bias,
	.embed = cuda_embed,
	.softmax = cuda_softmax,
	.attn_prefill = cuda_attn_prefill,
	.attn_decode = cuda_attn_decode,
	.attn_decode_heads = cuda_attn_decode_heads,
	.attn_decode_slots = cuda_attn_decode_slots,
	.attn_decode_batch = cuda_attn_decode_batch,
	.attn_scores = cuda_attn_scores,
	.attn_accum = cuda_attn_accum,
	.pool_topk = cuda_pool_topk,
	.gather_heads = cuda_gather_heads,
	.recall_units = cuda_recall_units,
	.recall_direct = cuda_recall_direct,
	.recall_mapped = cuda_recall_mapped,
	.recall_fragmented = cuda_recall_fragmented,
	.store_rows = cuda_store_rows,
	.round_to = cuda_round_to,
	.slot_dtype = cuda_slot_dtype,
	.page_summary = cuda_page_summary,
	.select_pages = cuda_select_pages,
	.group_cosine = cuda_group_cosine,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.fence_new = cuda_fence_new,
	.fence_free = cuda_fence_free,
	.download_async = cuda_download_async,
	.fence_wait = cuda_fence_wait,
	.fence_stream_wait = cuda_fence_stream_wait,
	.kivi_quant = cuda_kivi_quant,
	.kivi_dequant = cuda_kivi_dequant,
	.attn_kivi = cuda_attn_kivi,
	.graph_run = cuda_graph_run,
	.graph_free = cuda_graph_free,
	.sync = cuda_sync,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
};

int backend_cuda_devices(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return n;
}

/* Creates the streams, events and cuBLAS handle; the caller frees c on failure. */
static int cuda_init(struct cuda_ctx *c)
{
	CUDA_CHECK(cudaSetDevice(c->device));
	int pools = 0;
	CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, c->device));
	c->pools = pools != 0;
	CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
	CUDA_CHECK(cudaStreamCreateWithFlags(&c->rc_copy, cudaStreamNonBlocking));
	CUDA_CHECK(cudaStreamCreateWithFlags(&c->rc_stream, cudaStreamNonBlocking));
	CUDA_CHECK(cudaStreamCreateWithFlags(&c->off_stream, cudaStreamNonBlocking));
	CUDA_CHECK(cudaEventCreateWithFlags(&c->rc_entry, cudaEventDisableTiming));
	for (int i = 0; i < CUDA_OFFLOAD_RING; i++) {
		CUDA_CHECK(cudaEventCreateWithFlags(&c->off[i].copied, cudaEventDisableTiming));
		CUDA_CHECK(cudaEventCreateWithFlags(&c->off[i].done, cudaEventDisableTiming));
	}
	for (int i = 0; i < CUDA_RECALL_SETS; i++) {
		CUDA_CHECK(cudaEventCreateWithFlags(&c->rc[i].copied, cudaEventDisableTiming));
		CUDA_CHECK(cudaEventCreateWithFlags(&c->rc[i].scattered, cudaEventDisableTiming));
	}
	CUBLAS_CHECK(cublasCreate(&c->blas));
	CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
	/* A workspace of our own (after SetStream, which resets it; gemm_xwt sets the stream
	 * only when it differs): cuBLAS then allocates nothing inside a graph capture. 32 MiB is
	 * what cuBLAS documents for Hopper. */
	CUDA_CHECK(cudaMalloc(&c->blas_ws, CUDA_BLAS_WS_BYTES));
	CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, CUDA_BLAS_WS_BYTES));
	return 0;
}

int backend_cuda_new(struct backend **out, int device)
{
	int n = backend_cuda_devices();
	if (device < 0 || device >= n)
		return -ENODEV;
	struct backend *be = calloc(1, sizeof *be);
	struct cuda_ctx *c = calloc(1, sizeof *c);
	if (!be || !c) {
		free(be);
		free(c);
		return -ENOMEM;
	}
	c->device = device;
	const char *lag = getenv("FREEKV_CUDA_RECALL_LAG_CYCLES");
	c->recall_lag = lag ? strtoll(lag, NULL, 10) : 0;
	pthread_mutex_init(&c->recall_mu, NULL);
	int ret = cuda_init(c);
	if (ret) {
		cuda_free(c);
		free(be);
		return ret;
	}
	be->ops = &cuda_ops;
	be->ctx = c;
	*out = be;
	return 0;
}

#else /* !FREEKV_HAVE_CUDA */

int backend_cuda_devices(void)
{
	return 0;
}

int backend_cuda_new(struct backend **out, int device)
{
	(void)out;
	(void)device;
	return -ENODEV;
}

#endif

int backend_open(const char *name, int threads, struct backend **out, char *err, size_t errlen)
{
	bool have = backend_cuda_devices() > 0;
	if (!name || !strcmp(name, "auto"))
		name = have ? "cuda" : "cpu";
	int ret;
	if (!strcmp(name, "cpu")) {
		if ((ret = backend_cpu_new(out, threads)))
			snprintf(err, errlen, "cannot create the CPU backend: %s", strerror(-ret));
		return ret;
	}
	if (strcmp(name, "cuda")) {
		snprintf(err, errlen, "unknown backend '%s' (cuda, cpu or auto)", name);
		return -EINVAL;
	}
	if (!have) {
		snprintf(err, errlen,
#ifdef FREEKV_HAVE_CUDA
			 "--backend cuda: no CUDA device is available (use --backend cpu)"
#else
			 "--backend cuda: this build has no CUDA support (use --backend cpu)"
#endif
		);
		return -ENODEV;
	}
	if ((ret = backend_cuda_new(out, 0)))
		snprintf(err, errlen, "cannot create the CUDA backend: %s", strerror(-ret));
	return ret;
}
