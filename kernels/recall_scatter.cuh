// recall_scatter — the device half of a recall (docs/design.md §3): head units copied from the host pool
// into a staging buffer in HND order are scattered into the NHD head slices of device slots,
// converting dtype on the way. The device twin of layout_scatter_unit (common/layout.c).
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// units: (n_units, 2, p, d) in unit_dt, each a recall unit (one head's K rows, then V rows);
// slots: (n_slots, 2, p, n_kv, d) in slot_dt; dst: (n_units, 2) device int32, (slot, head)
// receiving each unit. Every row of a unit is copied, like layout_scatter_unit. Two units must
// not name the same (slot, head). Returns cudaSuccess or the launch error.
cudaError_t recall_scatter(void *slots, enum fkv_dtype slot_dt, const void *units,
			   enum fkv_dtype unit_dt, const int32_t *dst, int n_units, int n_kv, int p,
			   int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
