/* layout — the two KV layouts of docs/design.md §3 and the conversions between them.
 *
 * Host page block (pool): HND [n_kv][2][p][d] in the sequence's KV dtype; one head's [2][p][d]
 * (its K rows, then its V rows) is contiguous — the recall unit. Device slot: NHD
 * [2][p][n_kv][d] in f32 on the CPU backend; each head's slice of a slot may hold a different
 * host page. Offload converts NHD rows to HND once per token (write-through of the tail page,
 * full page at once); recall copies HND head units and scatters them into NHD head slices.
 * Pure functions on caller-owned memory. */
#ifndef FREEKV_LAYOUT_H
#define FREEKV_LAYOUT_H

#include <stddef.h>

#include "dtype.h"

struct kv_geom {
	int n_kv;
	int p;
	int d;
	enum fkv_dtype dtype; /* of the host block */
};

/* Bytes of one host page block and of one head's recall unit. */
size_t layout_block_bytes(const struct kv_geom *g);
size_t layout_unit_bytes(const struct kv_geom *g);

/* Writes tokens [t0, t1) of a page into a host block, converting to the block dtype.
 * k, v: (t1 - t0, n_kv, d) f32, rows contiguous (the projection output after RoPE). */
void layout_store_tokens(const struct kv_geom *g, void *block, int t0, int t1, const float *k,
			 const float *v);

/* Reads tokens [t0, t1) of head h from a host block into f32 rows.
 * k, v: (t1 - t0, d) f32. */
void layout_load_head(const struct kv_geom *g, const void *block, int h, int t0, int t1,
		      float *k, float *v);

/* Scatters one head's recall unit (2, p, d) in the block dtype into head h of an NHD slot
 * (2, p, n_kv, d) f32. Only the first n_tok tokens are meaningful; the rest are copied too. */
void layout_scatter_unit(const struct kv_geom *g, float *slot, int h, const void *unit);

/* Gathers head h of an NHD slot (2, p, n_kv, d) f32 into a unit (2, p, d) of the block dtype:
 * the reverse of layout_scatter_unit, used for offload from slots and by tests. */
void layout_gather_unit(const struct kv_geom *g, void *unit, int h, const float *slot);

#endif
