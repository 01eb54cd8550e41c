// recall_gather — the zero-copy recall (docs/design.md "The GPU decode step"): the kernel reads
// each recall unit itself from the kvstored pool's mapped, page-locked host memory (its device
// alias) and scatters it into the NHD head slice of a device slot, converting dtype on the
// way — no host copy and no DMA into a staging buffer. recall_scatter's twin with one source
// pointer per unit.
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// srcs: (n_units) device array of device-visible pointers, unit i (2, p, d) in unit_dt at
// srcs[i]; slots: (n_slots, 2, p, n_kv, d) in slot_dt; dst: (n_units, 2) device int32, (slot,
// head) receiving each unit; two units must not name the same (slot, head). aligned16: non-zero
// when every srcs[i] is 16-byte aligned (the launcher cannot read the device array), which
// allows 16-byte reads. Returns cudaErrorInvalidValue for a bad geometry, else the launch
// error.
cudaError_t recall_gather(void *slots, enum fkv_dtype slot_dt, const void *const *srcs,
			  int aligned16, enum fkv_dtype unit_dt, const int32_t *dst, int n_units,
			  int n_kv, int p, int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
