// offload_gather — see offload_gather.cuh.
#include "kv_dtype.cuh"
#include "offload_gather.cuh"

// Block (i, t - t0): one token row of one block, all heads; reads the NHD row contiguously.
template <typename S, typename B>
static __global__ void gather_slots_kernel(B *__restrict__ blocks,		  // at dst_off: (n_kv, 2, p, d)
					   const int64_t *__restrict__ dst_off,   // (n)
					   const S *__restrict__ slots,		  // (n_slots, 2, p, n_kv, d)
					   const int32_t *__restrict__ src_slot,  // (n)
					   int t0, int n_kv, int p, int d)
{
	const int i = blockIdx.x, t = t0 + blockIdx.y;
	const size_t hd = (size_t)n_kv * d;
	const S *slot = slots + (size_t)src_slot[i] * 2 * p * hd;
	B *blk = blocks + dst_off[i];
	for (int kv01 = 0; kv01 < 2; kv01++) {
		const S *row = slot + ((size_t)kv01 * p + t) * hd;
		for (size_t e = threadIdx.x; e < hd; e += blockDim.x) {
			const size_t h = e / d, c = e - h * d;
			blk[((h * 2 + kv01) * p + t) * d + c] = kv_from_f32<B>(kv_to_f32(row[e]));
		}
	}
}

// Block per token.
template <typename B>
static __global__ void store_rows_kernel(B *__restrict__ blocks,		// at dst_off: (n_kv, 2, p, d)
					 const int64_t *__restrict__ dst_off,	// (n_blocks)
					 const float *__restrict__ k,		// (n_tok, n_kv, d)
					 const float *__restrict__ v,		// (n_tok, n_kv, d)
					 int t0, int n_kv, int p, int d)
{
	const int tok = blockIdx.x;
	const int pos = t0 + tok, b = pos / p, t = pos % p;
	const size_t hd = (size_t)n_kv * d;
	B *blk = blocks + dst_off[b];
	for (size_t e = threadIdx.x; e < hd; e += blockDim.x) {
		const size_t h = e / d, c = e - h * d;
		blk[((h * 2 + 0) * p + t) * d + c] = kv_from_f32<B>(k[tok * hd + e]);
		blk[((h * 2 + 1) * p + t) * d + c] = kv_from_f32<B>(v[tok * hd + e]);
	}
}

static int threads_for(int n_kv, int d)
{
	const int hd = n_kv * d;
	return hd >= 256 ? 256 : ((hd + 31) / 32) * 32;
}

extern "C" cudaError_t offload_gather_slots(void *blocks, enum fkv_dtype block_dt,
					    const int64_t *dst_off, const void *slots,
					    enum fkv_dtype slot_dt, const int32_t *src_slot, int n,
					    int t0, int t1, int n_kv, int p, int d,
					    cudaStream_t stream)
{
	if (n_kv <= 0 || p <= 0 || d <= 0 || t0 < 0 || t1 > p || t0 > t1 || p > 65535)
		return cudaErrorInvalidValue;
	if (n <= 0 || t0 == t1)
		return cudaSuccess;
	const dim3 grid(n, t1 - t0);
	cudaError_t inner = cudaSuccess;
	cudaError_t e = kv_dispatch(slot_dt, [&](auto stag) {
		inner = kv_dispatch(block_dt, [&](auto btag) {
			using S = decltype(stag);
			using B = decltype(btag);
			gather_slots_kernel<S, B><<<grid, threads_for(n_kv, d), 0, stream>>>(
				(B *)blocks, dst_off, (const S *)slots, src_slot, t0, n_kv, p, d);
		});
	});
	if (e != cudaSuccess)
		return e;
	if (inner != cudaSuccess)
		return inner;
	return cudaGetLastError();
}

extern "C" cudaError_t offload_store_rows(void *blocks, enum fkv_dtype block_dt,
					  const int64_t *dst_off, const float *k, const float *v,
					  int n_tok, int t0, int n_kv, int p, int d,
					  cudaStream_t stream)
{
	if (n_kv <= 0 || p <= 0 || d <= 0 || t0 < 0 || t0 >= p)
		return cudaErrorInvalidValue;
	if (n_tok <= 0)
		return cudaSuccess;
	cudaError_t e = kv_dispatch(block_dt, [&](auto btag) {
		using B = decltype(btag);
		store_rows_kernel<B><<<n_tok, threads_for(n_kv, d), 0, stream>>>(
			(B *)blocks, dst_off, k, v, t0, n_kv, p, d);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
