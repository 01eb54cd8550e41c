// spin — a kernel that only keeps a stream busy for a number of clock cycles: the lag the
// ordering tests put in front of an op so that a missing event wait shows as a wrong result
// (docs/design.md §5: compute waits for a layer's recall only through its event).
#pragma once
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
// One thread spins for `cycles` SM clock cycles on stream. cudaSuccess or the launch error.
cudaError_t spin_cycles(long long cycles, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
