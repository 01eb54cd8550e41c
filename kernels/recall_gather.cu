// recall_gather — see recall_gather.cuh.
#include "kv_dtype.cuh"
#include "recall_gather.cuh"

// One block per unit; the unit is read contiguously from host memory over the bus (each
// (kv01, t) row of d elements lands contiguously in the slot), converting dtype.
template <typename U, typename S>
static __global__ void recall_gather_kernel(S *__restrict__ slots,	      // (n_slots, 2, p, n_kv, d)
					    const void *const *__restrict__ srcs, // (n_units)
					    const int32_t *__restrict__ dst,  // (n_units, 2)
					    int n_kv, int p, int d)
{
	const int u = blockIdx.x;
	const int slot = dst[2 * u], h = dst[2 * u + 1];
	const int n = 2 * p * d;
	const U *src = (const U *)srcs[u]; // (2, p, d)
	S *base = slots + (size_t)slot * 2 * p * n_kv * d + (size_t)h * d;
	for (int e = threadIdx.x; e < n; e += blockDim.x) {
		const int row = e / d, c = e - row * d; // row = kv01 * p + t
		base[(size_t)row * n_kv * d + c] = kv_from_f32<S>(kv_to_f32(src[e]));
	}
}

// Same dtype on both sides, 16-byte aligned rows: 16 bytes a thread, so each PCIe read is a
// full 16-byte request. rowv: uint4s per row of d.
static __global__ void recall_gather16_kernel(uint4 *__restrict__ slots, // (n_slots, 2, p, n_kv, rowv)
					      const void *const *__restrict__ srcs, // (n_units)
					      const int32_t *__restrict__ dst,	// (n_units, 2)
					      int n_kv, int p, int rowv)
{
	const int u = blockIdx.x;
	const int slot = dst[2 * u], h = dst[2 * u + 1];
	const int n = 2 * p * rowv;
	const uint4 *src = (const uint4 *)srcs[u]; // (2, p, rowv)
	uint4 *base = slots + (size_t)slot * 2 * p * n_kv * rowv + (size_t)h * rowv;
	for (int e = threadIdx.x; e < n; e += blockDim.x) {
		const int row = e / rowv, c = e - row * rowv;
		base[(size_t)row * n_kv * rowv + c] = src[e];
	}
}

extern "C" cudaError_t recall_gather(void *slots, enum fkv_dtype slot_dt, const void *const *srcs,
				     int aligned16, enum fkv_dtype unit_dt, const int32_t *dst,
				     int n_units, int n_kv, int p, int d, cudaStream_t stream)
{
	if (n_kv <= 0 || p <= 0 || d <= 0 || (unsigned)slot_dt > FKV_BF16 ||
	    (unsigned)unit_dt > FKV_BF16)
		return cudaErrorInvalidValue;
	if (n_units <= 0)
		return cudaSuccess;
	const size_t es = slot_dt == FKV_F32 ? 4 : 2;
	if (slot_dt == unit_dt && aligned16 && kv_vec_ok(slots, d, es)) {
		const int rowv = (int)((size_t)d * es / 16);
		recall_gather16_kernel<<<n_units, 256, 0, stream>>>((uint4 *)slots, srcs, dst, n_kv,
								     p, rowv);
		return cudaGetLastError();
	}
	cudaError_t inner = cudaSuccess;
	cudaError_t e = kv_dispatch(unit_dt, [&](auto utag) {
		inner = kv_dispatch(slot_dt, [&](auto stag) {
			using U = decltype(utag);
			using S = decltype(stag);
			recall_gather_kernel<U, S><<<n_units, 256, 0, stream>>>((S *)slots, srcs, dst,
										n_kv, p, d);
		});
	});
	if (e != cudaSuccess)
		return e;
	if (inner != cudaSuccess)
		return inner;
	return cudaGetLastError();
}
