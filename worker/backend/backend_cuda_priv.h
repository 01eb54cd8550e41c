/* backend_cuda_priv — the state the CUDA backend's files share (backend_cuda.c: the ops
 * table, compute and attention; backend_cuda_xfer.c: recall, offload, pool registration;
 * backend_cuda_select.c: selection and download fences; backend_cuda_kivi.c: the KIVI ops of
 * specache). One struct cuda_ctx per backend, owned by backend_cuda.c (made by backend_cuda_new, freed by its
 * free op, which calls cuda_xfer_free for the transfer state). Only built with CUDA. */
#ifndef FREEKV_BACKEND_CUDA_PRIV_H
#define FREEKV_BACKEND_CUDA_PRIV_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend.h"

/* Pinned staging buffers of the compute stream in flight at once (attention calls between
 * reuses of one). */
#define CUDA_STAGE_RING 8
/* Workspaces graph_run keeps track of by address (struct cuda_ctx graph_ws). */
#define CUDA_GRAPH_WS 8
/* cuBLAS workspace bytes (cublasSetWorkspace). */
#define CUDA_BLAS_WS_BYTES (32u << 20)
/* Bytes page-locked per cudaHostRegister call. */
#define CUDA_REGISTER_CHUNK ((size_t)1 << 30)
/* Recall staging sets (double buffering) and the alignment of the table after the units. */
#define CUDA_RECALL_SETS 2
#define CUDA_RECALL_ALIGN ((size_t)256)
/* Offload slots in flight at once (store_rows calls between reuses of one). */
#define CUDA_OFFLOAD_RING 8
/* Tokens per offload slot use; longer store_rows calls (a prefill) go in pieces. */
#define CUDA_OFFLOAD_TOKENS 256

/* One staging slot for the small host tables of an attention call (span descriptors, slot
 * lists): the host copy is rewritten once `done` fired; the device copy is only read by ops
 * queued on the compute stream before the next copy into it, so stream order protects it. */
struct stage_slot {
	void *host;		/* pinned, cap bytes */
	void *dev;		/* device copy of the same bytes */
	size_t cap;
	cudaEvent_t done;	/* recorded after the copy; the host copy is free once it fired */
	int used;
};

/* One recall staging set: [units (n, 2, p, d) in their dtype][(n, 2) int32 (slot, head)],
 * the units part aligned to CUDA_RECALL_ALIGN. */
struct recall_set {
	char *host;		/* pinned, cap bytes; the units part unused for page-locked units */
	char *dev;		/* device twin, cap bytes */
	size_t cap;
	cudaEvent_t copied;	/* copy stream: after the H2D copies into dev */
	cudaEvent_t scattered;	/* recall stream: after the scatter that read dev */
	int used;
};

/* One offload slot (store_rows): dev is [k rows][v rows][block offsets (int64)], the rows
 * part aligned to CUDA_RECALL_ALIGN; host the pinned twin of the offsets. Both are rewritten only
 * after `done` fired: the kernel that read dev and the copy that read host ran before it. */
struct offload_slot {
	int64_t *host;		/* pinned, host_cap entries */
	char *dev;		/* device, dev_cap bytes */
	size_t host_cap, dev_cap;
	cudaEvent_t copied;	/* compute stream: after the row copies into dev */
	cudaEvent_t done;	/* offload stream: after the store kernel */
	int used;
};

/* A page-locked host range, registered in chunks, with each chunk's device alias (NULL when
 * the device cannot map it). */
struct host_reg {
	char *ptr;
	size_t bytes;
	char **alias;		/* (chunks) */
};

struct cuda_ctx {
	int device;
	/* FREEKV_CUDA_RECALL_LAG_CYCLES (tests): a spin kernel of that many cycles before every
	 * recall scatter or gather, so that an op not ordered after its recall reads stale slots */
	long long recall_lag;
	bool pools;		/* stream-ordered allocation (cudaMallocAsync) available */
	cudaStream_t stream;	/* compute: every op of the table */
	cudaStream_t rc_copy;	/* recall: H2D copies of units into the staging */
	cudaStream_t rc_stream;	/* recall: scatter of the staged units into the slots */
	cudaStream_t off_stream; /* offload: store_rows into the registered pool */
	cublasHandle_t blas;
	void *gemm_ws;
	size_t gemm_ws_bytes;
	void *dec_ws;		/* split-K partials of attn_decode_slots */
	size_t dec_ws_bytes;
	void *sel_ws;		/* select_pages: group scores and per-head raw scores */
	size_t sel_ws_bytes;
	void *fd_ws;		/* flash-decoding partials of attn_decode over one span */
	size_t fd_ws_bytes;
	void *pool_ws;		/* pool_topk: pooled scores, then positions and their scores */
	size_t pool_ws_bytes;
	void **bufs;		/* live buf_alloc/weight_load allocations */
	size_t n_bufs, cap_bufs;
	struct stage_slot ring[CUDA_STAGE_RING];
	int ring_next;
	struct host_reg *regs;
	size_t n_regs;
	/* Recall state, guarded by recall_mu. */
	pthread_mutex_t recall_mu;
	struct recall_set rc[CUDA_RECALL_SETS];
	int rc_next;
	cudaEvent_t rc_entry;	/* compute stream: where a recall call began */
	struct offload_slot off[CUDA_OFFLOAD_RING];
	int off_next;
	void *kivi_ws;		/* attn_kivi's rows (f32) and probability scratch */
	size_t kivi_ws_bytes;
	bool *batch_in;		/* attn_decode_batch: which items a batched launch took */
	size_t batch_in_len;
	/* Graphs (backend_cuda_graph.c): whether graph_run is capturing the compute stream; the
	 * workspaces ops reserved while capturing (a graph may hold their addresses; past
	 * CUDA_GRAPH_WS of them, any workspace counts); a count bumped whenever one of those
	 * moves (the graphs recorded before are stale) */
	bool capturing;
	void **graph_ws[CUDA_GRAPH_WS];
	int n_graph_ws;
	uint64_t ws_gen;
	void *blas_ws;		/* cuBLAS's workspace, ours so that capture allocates nothing */
};

static inline void cuda_event_destroy(cudaEvent_t e)
{
	if (e)
		cudaEventDestroy(e);
}

/* backend_cuda_graph.c: the graph_run and graph_free ops (backend.h). */
int cuda_graph_run(void *ctx, struct backend_graph **g, int (*fn)(void *arg), void *arg);
void cuda_graph_free(void *ctx, struct backend_graph *g);

/* backend_cuda.c: waits for every stream the backend owns. */
int cuda_drain(struct cuda_ctx *c);
/* backend_cuda.c: grows a workspace of the compute stream to at least bytes, in stream order. */
int cuda_ws_reserve(struct cuda_ctx *c, void **ws, size_t *cap, size_t bytes);
/* backend_cuda.c: the next slot of the staging ring with room for bytes; the caller fills its
 * host copy, then cuda_stage_push queues the copy to its device twin on the compute stream. */
int cuda_stage_take(struct cuda_ctx *c, size_t bytes, struct stage_slot **out);
int cuda_stage_push(struct cuda_ctx *c, struct stage_slot *s, size_t bytes);

/* backend_cuda_select.c: the selection ops and download_async's fences (backend.h). */
int cuda_page_summary(void *ctx, float *kmin, float *kmax, int page_stride, int page,
		      const void *slot, enum fkv_dtype slot_dt, int p, int n_kv, int d);
int cuda_select_pages(void *ctx, const struct backend_select *g, const float *q,
		      const float *kmin, const float *kmax, const uint8_t *resident,
		      int32_t *pages, int32_t *changed, int32_t *n_changed);
int cuda_group_cosine(void *ctx, float *out, const float *q_t, const float *q_prev, int n_q,
		      int n_kv, int d);
void *cuda_host_alloc(void *ctx, size_t bytes);
void cuda_host_free(void *ctx, void *p);
int cuda_fence_new(void *ctx, void **fence);
void cuda_fence_free(void *ctx, void *fence);
int cuda_download_async(void *ctx, void *host_dst, const void *src, size_t bytes, void *fence);
int cuda_fence_wait(void *ctx, void *fence);
int cuda_fence_stream_wait(void *ctx, void *fence);

/* backend_cuda_kivi.c: the KIVI ops of the table (docs/design.md §5 specache). */
int cuda_kivi_quant(void *ctx, const struct backend_kivi *q, int64_t t0, const void *k,
		    const void *v, int64_t n, enum fkv_dtype dt);
int cuda_kivi_dequant(void *ctx, float *k, float *v, const struct backend_kivi *q, int64_t t0,
		      int64_t n);
int cuda_attn_kivi(void *ctx, float *out, const float *q, int n_q,
		   const struct backend_kivi_attn *ka, const struct backend_attn *a);

/* backend_cuda_xfer.c: the ops of the table that move data between host and device. */
int cuda_recall_units(void *ctx, void *const *slots, const int *heads, const void *units, int n,
		      int p, int n_kv, int d, enum fkv_dtype unit_dt, enum fkv_dtype slot_dt,
		      void *done);
int cuda_recall_direct(void *ctx, void *const *slots, const int *heads, const void *const *srcs,
		       int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
		       enum fkv_dtype slot_dt, void *done);
int cuda_recall_mapped(void *ctx, void *const *slots, const int *heads, const void *const *srcs,
		       int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
		       enum fkv_dtype slot_dt, void *done);
int cuda_recall_fragmented(void *ctx, void *const *slots, const int *heads,
			   const void *const *srcs, int n, int p, int n_kv, int d,
			   enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done);
int cuda_store_rows(void *ctx, void *const *blocks, int t0, const float *k, const float *v,
		    int n_tok, int p, int n_kv, int d, enum fkv_dtype dt);
int cuda_host_register(void *ctx, void *ptr, size_t bytes, char *err, size_t errlen);
int cuda_host_unregister(void *ctx, void *ptr);
/* Frees the recall sets, the offload slots and every registration; streams already drained. */
void cuda_xfer_free(struct cuda_ctx *c);

#endif
