/* backend_cpu_xfer — the CPU backend's KV transfers (backend.h): recall units scattered into
 * host slots (the reference of the recall_scatter kernel), from a staging buffer (recall_units)
 * or read where they lie (recall_direct); the write-through of backend rows into host blocks
 * (store_rows); rounding to a KV dtype (round_to). Backend memory is host memory here, so each
 * op is done when it returns. */
#include "backend_cpu_priv.h"

#include <errno.h>
#include <stddef.h>

#include "layout.h"

/* Recall units land in host slots: layout_scatter_unit (f32 slots), the reference of the
 * recall_scatter kernel, or row by row through f32 into slots of another dtype (exact: the
 * slots of a sequence hold its KV dtype). Unit i is at units + i * unit bytes (recall_units)
 * or at srcs[i] (recall_direct, read where it lies). */
static int cpu_scatter_units(void *const *slots, const int *heads, const void *units,
			     const void *const *srcs, int n, int p, int n_kv, int d,
			     enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, bool by_row)
{
	if (!cpu_kv_dtype_ok(unit_dt) || !cpu_kv_dtype_ok(slot_dt) || d > CPU_MAX_HEAD_DIM)
		return -EINVAL;
	const struct kv_geom g = { .n_kv = n_kv, .p = p, .d = d, .dtype = unit_dt };
	const size_t ub = layout_unit_bytes(&g), ue = dtype_size(unit_dt);
	const size_t se = dtype_size(slot_dt);
	float tmp[CPU_MAX_HEAD_DIM];
	for (int i = 0; i < n; i++) {
		const char *unit = srcs ? srcs[i] : (const char *)units + (size_t)i * ub;
		if (slot_dt == FKV_F32 && !by_row) {
			layout_scatter_unit(&g, slots[i], heads[i], unit);
			continue;
		}
		for (size_t r = 0; r < (size_t)2 * p; r++) {
			char *dst = (char *)slots[i] + ((r * n_kv + heads[i]) * d) * se;
			dtype_to_f32(tmp, unit + r * d * ue, unit_dt, (size_t)d);
			dtype_from_f32(dst, tmp, slot_dt, (size_t)d);
		}
	}
	return 0;
}

int cpu_recall_units(void *ctx, void *const *slots, const int *heads, const void *units,
			    int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
			    enum fkv_dtype slot_dt, void *done)
{
	(void)ctx;
	(void)done; /* done on return: nothing to mark */
	return cpu_scatter_units(slots, heads, units, NULL, n, p, n_kv, d, unit_dt, slot_dt, false);
}

int cpu_recall_direct(void *ctx, void *const *slots, const int *heads,
			     const void *const *srcs, int n, int p, int n_kv, int d,
			     enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done)
{
	(void)ctx;
	(void)done;
	return cpu_scatter_units(slots, heads, NULL, srcs, n, p, n_kv, d, unit_dt, slot_dt, false);
}

int cpu_recall_fragmented(void *ctx, void *const *slots, const int *heads,
			  const void *const *srcs, int n, int p, int n_kv, int d,
			  enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done)
{
	(void)ctx;
	(void)done;
	return cpu_scatter_units(slots, heads, NULL, srcs, n, p, n_kv, d, unit_dt, slot_dt, true);
}

/* Backend rows are host memory, so the write-through is layout_store_tokens block by block:
 * the same bytes as a download followed by a host store. */
int cpu_store_rows(void *ctx, void *const *blocks, int t0, const float *k, const float *v,
			  int n_tok, int p, int n_kv, int d, enum fkv_dtype dt)
{
	(void)ctx;
	if (t0 < 0 || t0 >= p || n_tok < 0 || n_kv <= 0 || d <= 0 || !cpu_kv_dtype_ok(dt))
		return -EINVAL;
	const struct kv_geom g = { .n_kv = n_kv, .p = p, .d = d, .dtype = dt };
	const size_t row = (size_t)n_kv * d;
	for (int i = 0, b = 0; i < n_tok; b++) {
		int r0 = b ? 0 : t0, r1 = r0 + (n_tok - i) < p ? r0 + (n_tok - i) : p;
		layout_store_tokens(&g, blocks[b], r0, r1, k + (size_t)i * row, v + (size_t)i * row);
		i += r1 - r0;
	}
	return 0;
}

int cpu_round_to(void *ctx, float *x, int64_t n, enum fkv_dtype dt)
{
	(void)ctx;
	if (!cpu_kv_dtype_ok(dt) || n < 0)
		return -EINVAL;
	dtype_round(x, dt, (size_t)n);
	return 0;
}
