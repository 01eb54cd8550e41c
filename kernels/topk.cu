// topk — see topk.cuh. One block per KV head.
#include "kv_dtype.cuh"
#include "topk.cuh"

#define TOPK_THREADS 512

// Order-preserving map of a float to an unsigned key (larger float, larger key); -0 == +0.
static __device__ __forceinline__ unsigned score_key(float f)
{
	unsigned b = __float_as_uint(f == 0.0f ? 0.0f : f);
	return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum of v over the block in thread order; *total gets the block sum.
// All threads must call it. ws: 32 ints of shared memory.
static __device__ int block_excl_scan(int v, int *ws, int *total)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	int x = v;
	for (int off = 1; off < 32; off <<= 1) {
		int y = __shfl_up_sync(0xffffffffu, x, off);
		if (lane >= off)
			x += y;
	}
	if (lane == 31)
		ws[w] = x;
	__syncthreads();
	if (w == 0) {
		int s = lane < nw ? ws[lane] : 0;
		for (int off = 1; off < 32; off <<= 1) {
			int y = __shfl_up_sync(0xffffffffu, s, off);
			if (lane >= off)
				s += y;
		}
		if (lane < nw)
			ws[lane] = s;
	}
	__syncthreads();
	const int before = w > 0 ? ws[w - 1] : 0;
	*total = ws[nw - 1];
	__syncthreads(); // ws is reused by the next call
	return before + x - v;
}

template <bool Changed>
static __global__ void topk_kernel(int32_t *__restrict__ pages,	       // (n_kv, k)
				   int32_t *__restrict__ changed,      // (n_kv, k) or NULL
				   int32_t *__restrict__ n_changed,    // (n_kv) or NULL
				   const float *__restrict__ scores,   // (n_kv, n_cand)
				   const uint8_t *__restrict__ resident, // (n_kv, mask_stride) or NULL
				   int mask_stride, int n_cand, int cand_begin, int k)
{
	__shared__ unsigned hist[256];
	__shared__ int ws[32];
	__shared__ unsigned s_prefix;
	__shared__ int s_remaining;
	const int kv = blockIdx.x, tid = threadIdx.x;
	const float *s = scores + (size_t)kv * n_cand;

	// Radix select of the k-th largest key, most significant byte first.
	unsigned prefix = 0, mask = 0;
	int remaining = k;
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int i = tid; i < 256; i += blockDim.x)
			hist[i] = 0;
		__syncthreads();
		for (int j = tid; j < n_cand; j += blockDim.x) {
			unsigned key = score_key(s[j]);
			if ((key & mask) == prefix)
				atomicAdd(&hist[(key >> shift) & 255u], 1u);
		}
		__syncthreads();
		if (tid == 0) {
			int cum = 0, dg = 255;
			for (; dg > 0; dg--) {
				if (cum + (int)hist[dg] >= remaining)
					break;
				cum += (int)hist[dg];
			}
			s_prefix = prefix | ((unsigned)dg << shift);
			s_remaining = remaining - cum;
		}
		__syncthreads();
		prefix = s_prefix;
		remaining = s_remaining;
		mask |= 255u << shift;
		__syncthreads(); // s_prefix is rewritten by the next pass
	}
	const unsigned thr = prefix;  // key of the k-th largest score
	const int need_eq = remaining; // how many pages scoring exactly thr are taken

	int eq_base = 0, sel_base = 0, ch_base = 0;
	for (int base = 0; base < n_cand; base += blockDim.x) {
		const int j = base + tid;
		const bool valid = j < n_cand;
		const unsigned key = valid ? score_key(s[j]) : 0u;
		int tot;
		const int eq = valid && key == thr;
		const int eq_before = block_excl_scan(eq, ws, &tot);
		const int sel = valid && (key > thr || (eq && eq_base + eq_before < need_eq));
		eq_base += tot;
		const int pos = block_excl_scan(sel, ws, &tot);
		if (sel)
			pages[(size_t)kv * k + sel_base + pos] = cand_begin + j;
		sel_base += tot;
		if (Changed) {
			const int ch = sel && !resident[(size_t)kv * mask_stride + cand_begin + j];
			const int cpos = block_excl_scan(ch, ws, &tot);
			if (ch)
				changed[(size_t)kv * k + ch_base + cpos] = cand_begin + j;
			ch_base += tot;
		}
	}
	if (Changed) {
		for (int i = ch_base + tid; i < k; i += blockDim.x)
			changed[(size_t)kv * k + i] = -1;
		if (tid == 0)
			n_changed[kv] = ch_base;
	}
}

static cudaError_t topk_check(int n_kv, int n_cand, int cand_begin, int k)
{
	if (n_kv <= 0 || n_cand < 0 || cand_begin < 0 || k < 0 || k > n_cand)
		return cudaErrorInvalidValue;
	return cudaSuccess;
}

extern "C" cudaError_t topk_pages(int32_t *pages, const float *scores, int n_kv, int n_cand,
				  int cand_begin, int k, cudaStream_t stream)
{
	cudaError_t e = topk_check(n_kv, n_cand, cand_begin, k);
	if (e != cudaSuccess || k == 0)
		return e;
	topk_kernel<false><<<n_kv, TOPK_THREADS, 0, stream>>>(pages, NULL, NULL, scores, NULL, 0,
							      n_cand, cand_begin, k);
	return cudaGetLastError();
}

extern "C" cudaError_t topk_pages_changed(int32_t *pages, int32_t *changed, int32_t *n_changed,
					  const float *scores, const uint8_t *resident,
					  int mask_stride, int n_kv, int n_cand, int cand_begin,
					  int k, cudaStream_t stream)
{
	cudaError_t e = topk_check(n_kv, n_cand, cand_begin, k);
	if (e == cudaSuccess && cand_begin + n_cand > mask_stride)
		e = cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return e;
	if (k == 0)
		return cudaMemsetAsync(n_changed, 0, (size_t)n_kv * sizeof(int32_t), stream);
	topk_kernel<true><<<n_kv, TOPK_THREADS, 0, stream>>>(
		pages, changed, n_changed, scores, resident, mask_stride, n_cand, cand_begin, k);
	return cudaGetLastError();
}
