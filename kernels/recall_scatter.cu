// recall_scatter — see recall_scatter.cuh.
#include "kv_dtype.cuh"
#include "recall_scatter.cuh"

// One block per unit; the unit is read contiguously, each (kv01, t) row lands as d contiguous
// elements of the slot.
template <typename U, typename S>
static __global__ void recall_scatter_kernel(S *__restrict__ slots,	     // (n_slots, 2, p, n_kv, d)
					     const U *__restrict__ units,    // (n_units, 2, p, d)
					     const int32_t *__restrict__ dst, // (n_units, 2)
					     int n_kv, int p, int d)
{
	const int u = blockIdx.x;
	const int slot = dst[2 * u], h = dst[2 * u + 1];
	const int n = 2 * p * d;
	const U *src = units + (size_t)u * n;
	S *base = slots + (size_t)slot * 2 * p * n_kv * d + (size_t)h * d;
	for (int e = threadIdx.x; e < n; e += blockDim.x) {
		const int row = e / d, c = e - row * d; // row = kv01 * p + t
		base[(size_t)row * n_kv * d + c] = kv_from_f32<S>(kv_to_f32(src[e]));
	}
}

// Same dtype on both sides: a plain copy, 16 bytes per thread. rowv: uint4s per row of d.
static __global__ void recall_copy16_kernel(uint4 *__restrict__ slots,	       // (n_slots, 2, p, n_kv, rowv)
					    const uint4 *__restrict__ units,   // (n_units, 2, p, rowv)
					    const int32_t *__restrict__ dst,   // (n_units, 2)
					    int n_kv, int p, int rowv)
{
	const int u = blockIdx.x;
	const int slot = dst[2 * u], h = dst[2 * u + 1];
	const int n = 2 * p * rowv;
	const uint4 *src = units + (size_t)u * n;
	uint4 *base = slots + (size_t)slot * 2 * p * n_kv * rowv + (size_t)h * rowv;
	for (int e = threadIdx.x; e < n; e += blockDim.x) {
		const int row = e / rowv, c = e - row * rowv;
		base[(size_t)row * n_kv * rowv + c] = src[e];
	}
}

extern "C" cudaError_t recall_scatter(void *slots, enum fkv_dtype slot_dt, const void *units,
				      enum fkv_dtype unit_dt, const int32_t *dst, int n_units,
				      int n_kv, int p, int d, cudaStream_t stream)
{
	if (n_kv <= 0 || p <= 0 || d <= 0 || (unsigned)slot_dt > FKV_BF16 ||
	    (unsigned)unit_dt > FKV_BF16)
		return cudaErrorInvalidValue;
	if (n_units <= 0)
		return cudaSuccess;
	const size_t es = slot_dt == FKV_F32 ? 4 : 2;
	if (slot_dt == unit_dt && kv_vec_ok(slots, d, es) && kv_vec_ok(units, d, es)) {
		const int rowv = (int)((size_t)d * es / 16);
		recall_copy16_kernel<<<n_units, 256, 0, stream>>>((uint4 *)slots, (const uint4 *)units,
								   dst, n_kv, p, rowv);
		return cudaGetLastError();
	}
	cudaError_t inner = cudaSuccess;
	cudaError_t e = kv_dispatch(unit_dt, [&](auto utag) {
		inner = kv_dispatch(slot_dt, [&](auto stag) {
			using U = decltype(utag);
			using S = decltype(stag);
			recall_scatter_kernel<U, S><<<n_units, 256, 0, stream>>>(
				(S *)slots, (const U *)units, dst, n_kv, p, d);
		});
	});
	if (e != cudaSuccess)
		return e;
	if (inner != cudaSuccess)
		return inner;
	return cudaGetLastError();
}
