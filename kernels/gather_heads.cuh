// gather_heads — head slices of token rows from one f32 buffer into another: refreshkv moves
// fetched token rows and each step's appended row into the slots of its partial sets
// (docs/design.md §5). Device twin of the backend's gather_heads op (worker/backend/backend.h;
// CPU: backend_cpu.c).
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
// dst, src: (rows, n_kv, d) f32; map: (n, 3) device int32 entries (dst_row, src_row, head),
// in range (the caller's invariant), no two writing one slice. Returns cudaErrorInvalidValue
// for a bad geometry, else the launch error.
cudaError_t gather_heads(float *dst, const float *src, const int32_t *map, int n, int n_kv, int d,
			 cudaStream_t stream);
#ifdef __cplusplus
}
#endif
