/* layout — see layout.h. */
#include "layout.h"

#include <stdint.h>

size_t layout_unit_bytes(const struct kv_geom *g)
{
	return (size_t)2 * g->p * g->d * dtype_size(g->dtype);
}

size_t layout_block_bytes(const struct kv_geom *g)
{
	return (size_t)g->n_kv * layout_unit_bytes(g);
}

/* Element offset of (h, kv01, t, i) in an HND block. */
static inline size_t hnd_index(const struct kv_geom *g, int h, int kv01, int t, int i)
{
	return (((size_t)h * 2 + kv01) * g->p + t) * g->d + i;
}

void layout_store_tokens(const struct kv_geom *g, void *block, int t0, int t1, const float *k,
			 const float *v)
{
	size_t es = dtype_size(g->dtype);
	for (int t = t0; t < t1; t++)
		for (int h = 0; h < g->n_kv; h++) {
			const float *krow = k + ((size_t)(t - t0) * g->n_kv + h) * g->d;
			const float *vrow = v + ((size_t)(t - t0) * g->n_kv + h) * g->d;
			dtype_from_f32((uint8_t *)block + hnd_index(g, h, 0, t, 0) * es, krow, g->dtype, g->d);
			dtype_from_f32((uint8_t *)block + hnd_index(g, h, 1, t, 0) * es, vrow, g->dtype, g->d);
		}
}

void layout_load_head(const struct kv_geom *g, const void *block, int h, int t0, int t1,
		      float *k, float *v)
{
	size_t es = dtype_size(g->dtype);
	int n = t1 - t0;
	dtype_to_f32(k, (const uint8_t *)block + hnd_index(g, h, 0, t0, 0) * es, g->dtype,
		     (size_t)n * g->d);
	dtype_to_f32(v, (const uint8_t *)block + hnd_index(g, h, 1, t0, 0) * es, g->dtype,
		     (size_t)n * g->d);
}

void layout_scatter_unit(const struct kv_geom *g, float *slot, int h, const void *unit)
{
	size_t es = dtype_size(g->dtype);
	for (int kv01 = 0; kv01 < 2; kv01++)
		for (int t = 0; t < g->p; t++) {
			const uint8_t *src = (const uint8_t *)unit + ((size_t)kv01 * g->p + t) * g->d * es;
			float *dst = slot + (((size_t)kv01 * g->p + t) * g->n_kv + h) * g->d;
			dtype_to_f32(dst, src, g->dtype, g->d);
		}
}

void layout_gather_unit(const struct kv_geom *g, void *unit, int h, const float *slot)
{
	size_t es = dtype_size(g->dtype);
	for (int kv01 = 0; kv01 < 2; kv01++)
		for (int t = 0; t < g->p; t++) {
			uint8_t *dst = (uint8_t *)unit + ((size_t)kv01 * g->p + t) * g->d * es;
			const float *src = slot + (((size_t)kv01 * g->p + t) * g->n_kv + h) * g->d;
			dtype_from_f32(dst, src, g->dtype, g->d);
		}
}
