/* backend_cpu_priv — the ops of the CPU backend that live outside backend_cpu.c, for its ops
 * table: the selection ops and the fences of download_async (backend_cpu_select.c), and the KV
 * transfers: recall, offload, rounding (backend_cpu_xfer.c). They keep no state in the CPU
 * context, so any thread may call them. */
#ifndef FREEKV_BACKEND_CPU_PRIV_H
#define FREEKV_BACKEND_CPU_PRIV_H

#include <stdbool.h>

#include "backend.h"

/* Largest head_dim the stack buffers accept. */
#define CPU_MAX_HEAD_DIM 1024

static inline bool cpu_kv_dtype_ok(enum fkv_dtype dt)
{
	return dt == FKV_F32 || dt == FKV_F16 || dt == FKV_BF16;
}

int cpu_page_summary(void *ctx, float *kmin, float *kmax, int page_stride, int page,
		     const void *slot, enum fkv_dtype slot_dt, int p, int n_kv, int d);
int cpu_select_pages(void *ctx, const struct backend_select *g, const float *q,
		     const float *kmin, const float *kmax, const uint8_t *resident, int32_t *pages,
		     int32_t *changed, int32_t *n_changed);
int cpu_group_cosine(void *ctx, float *out, const float *q_t, const float *q_prev, int n_q,
		     int n_kv, int d);
void *cpu_host_alloc(void *ctx, size_t bytes);
void cpu_host_free(void *ctx, void *p);
int cpu_fence_new(void *ctx, void **fence);
void cpu_fence_free(void *ctx, void *fence);
int cpu_download_async(void *ctx, void *host_dst, const void *src, size_t bytes, void *fence);
int cpu_fence_wait(void *ctx, void *fence);

int cpu_recall_units(void *ctx, void *const *slots, const int *heads, const void *units, int n,
		     int p, int n_kv, int d, enum fkv_dtype unit_dt, enum fkv_dtype slot_dt,
		     void *done);
int cpu_recall_direct(void *ctx, void *const *slots, const int *heads, const void *const *srcs,
		      int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
		      enum fkv_dtype slot_dt, void *done);
int cpu_fence_stream_wait(void *ctx, void *fence);
int cpu_store_rows(void *ctx, void *const *blocks, int t0, const float *k, const float *v,
		   int n_tok, int p, int n_kv, int d, enum fkv_dtype dt);
int cpu_round_to(void *ctx, float *x, int64_t n, enum fkv_dtype dt);

#endif
