/* backend_cpu_priv — the ops of the CPU backend that live outside backend_cpu.c, for its ops
 * table: the selection ops and the fences of download_async (backend_cpu_select.c). They keep
 * no state in the CPU context, so any thread may call them. */
#ifndef FREEKV_BACKEND_CPU_PRIV_H
#define FREEKV_BACKEND_CPU_PRIV_H

#include "backend.h"

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

#endif
