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

extern "C" cudaError_t recall_scatter(void *slots, enum fkv_dtype slot_dt, const void *units,
				      enum fkv_dtype unit_dt, const int32_t *dst, int n_units,
				      int n_kv, int p, int d, cudaStream_t stream)
{
	if (n_kv <= 0 || p <= 0 || d <= 0)
		return cudaErrorInvalidValue;
	if (n_units <= 0)
		return cudaSuccess;
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
