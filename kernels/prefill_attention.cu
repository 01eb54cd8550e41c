// prefill_attention — see prefill_attention.cuh. CUDA-core f32 tiles: the path for f32 K/V and
// the reference of the tensor-core kernel (prefill_attention_mma.cu) for 16-bit K/V.
#include <math.h>

#include "kv_dtype.cuh"
#include "prefill_attention.cuh"

#define PF_BQ 16	// queries per block
#define PF_BK 32	// keys per tile: one lane per key in the softmax step
#define PF_THREADS 128	// 4 warps, 4 query rows each

// Shared floats: Q (BQ, d), K (BK, d + 1) padded, V (BK, d), P (BQ, BK), acc (BQ, d), max, sum,
// correction (BQ).
static size_t pf_smem_floats(int d)
{
	return (size_t)PF_BQ * d * 2 + (size_t)PF_BK * (2 * d + 1) + PF_BQ * PF_BK + 3 * PF_BQ;
}

// Block (query tile, query head).
template <typename T>
static __global__ void __launch_bounds__(PF_THREADS)
prefill_kernel(float *__restrict__ out,		// (n_q, n_heads, d)
	       const float *__restrict__ q,	// (n_q, n_heads, d)
	       const T *__restrict__ k,		// (n_ctx, n_kv, d)
	       const T *__restrict__ v,		// (n_ctx, n_kv, d)
	       int n_q, int n_ctx, int n_heads, int n_kv, int d, float scale, int window)
{
	extern __shared__ float sm[];
	const int h = blockIdx.y, kvh = h / (n_heads / n_kv), tid = threadIdx.x;
	const int q0 = blockIdx.x * PF_BQ, nq = min(PF_BQ, n_q - q0);
	const int off = n_ctx - n_q; // query i sits at position off + i
	const int dk = d + 1;
	float *qs = sm, *ks = qs + PF_BQ * d, *vs = ks + PF_BK * dk, *ps = vs + PF_BK * d;
	float *acc = ps + PF_BQ * PF_BK, *mx = acc + PF_BQ * d, *sum = mx + PF_BQ;
	float *corr = sum + PF_BQ;

	for (int e = tid; e < PF_BQ * d; e += blockDim.x) {
		const int r = e / d, c = e - r * d;
		qs[e] = r < nq ? q[((size_t)(q0 + r) * n_heads + h) * d + c] : 0.0f;
		acc[e] = 0.0f;
	}
	for (int r = tid; r < PF_BQ; r += blockDim.x) {
		mx[r] = -INFINITY;
		sum[r] = 0.0f;
	}
	const size_t row = (size_t)n_kv * d;
	// Keys [k_begin, k_end) are visible to some query of the tile; tiles stay BK-aligned.
	const int k_end = off + q0 + nq;
	int k_begin = window > 0 ? off + q0 + 1 - window : 0;
	k_begin = k_begin > 0 ? k_begin / PF_BK * PF_BK : 0;
	for (int k0 = k_begin; k0 < k_end; k0 += PF_BK) {
		const int nk = min(PF_BK, k_end - k0);
		__syncthreads(); // the previous tile is no longer read
		for (int e = tid; e < nk * d; e += blockDim.x) {
			const int t = e / d, c = e - t * d;
			const size_t src = (size_t)(k0 + t) * row + (size_t)kvh * d + c;
			ks[t * dk + c] = kv_to_f32(k[src]);
			vs[t * d + c] = kv_to_f32(v[src]);
		}
		__syncthreads();
		for (int e = tid; e < PF_BQ * PF_BK; e += blockDim.x) {
			const int r = e / PF_BK, t = e - r * PF_BK;
			float s = -INFINITY;
			const int pos = off + q0 + r, key = k0 + t;
			if (r < nq && t < nk && key <= pos && (window <= 0 || key > pos - window)) {
				const float *qr = qs + r * d, *kt = ks + t * dk;
				float a = 0.0f;
				for (int c = 0; c < d; c++)
					a += qr[c] * kt[c];
				s = a * scale;
			}
			ps[e] = s;
		}
		__syncthreads();
		// Warp w updates rows w, w + 4, ...: lane t owns key t of the tile.
		const int lane = tid & 31;
		for (int r = tid >> 5; r < PF_BQ; r += PF_THREADS / 32) {
			const float s = ps[r * PF_BK + lane];
			float m = s;
			for (int o = 16; o > 0; o >>= 1)
				m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
			const float m_new = fmaxf(mx[r], m);
			// A row with nothing visible yet (or a padding row) keeps its state.
			const float e = m_new == -INFINITY ? 0.0f : expf(s - m_new);
			float l = e;
			for (int o = 16; o > 0; o >>= 1)
				l += __shfl_xor_sync(0xffffffffu, l, o);
			ps[r * PF_BK + lane] = e;
			__syncwarp(); // every lane has read mx[r] before lane 0 updates it
			if (lane == 0) {
				const float c = m_new == -INFINITY ? 1.0f : expf(mx[r] - m_new);
				corr[r] = c;
				sum[r] = sum[r] * c + l;
				mx[r] = m_new;
			}
		}
		__syncthreads();
		for (int e = tid; e < PF_BQ * d; e += blockDim.x) {
			const int r = e / d, c = e - r * d;
			const float *pr = ps + r * PF_BK;
			float a = acc[e] * corr[r];
			for (int t = 0; t < nk; t++)
				a += pr[t] * vs[t * d + c];
			acc[e] = a;
		}
	}
	__syncthreads();
	for (int e = tid; e < nq * d; e += blockDim.x) {
		const int r = e / d, c = e - r * d;
		const float l = sum[r];
		out[((size_t)(q0 + r) * n_heads + h) * d + c] = l > 0.0f ? acc[e] / l : 0.0f;
	}
}

extern "C" cudaError_t prefill_attention(float *out, const float *q, const void *k, const void *v,
					 enum fkv_dtype dt, int n_q, int n_ctx, int n_heads,
					 int n_kv, int d, float scale, int window, cudaStream_t stream)
{
	if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv || d <= 0 || n_q < 0 || n_q > n_ctx ||
	    n_heads > 65535 || window < 0)
		return cudaErrorInvalidValue;
	if (n_q == 0)
		return cudaSuccess;
	const size_t smem = pf_smem_floats(d) * sizeof(float);
	int dev = 0, smem_max = 0;
	cudaError_t e = cudaGetDevice(&dev);
	if (e == cudaSuccess)
		e = cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
	if (e != cudaSuccess)
		return e;
	if (smem > (size_t)smem_max)
		return cudaErrorInvalidValue;
	const dim3 grid((n_q + PF_BQ - 1) / PF_BQ, n_heads);
	cudaError_t inner = cudaSuccess;
	e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		if (smem > 48 * 1024)
			inner = cudaFuncSetAttribute(prefill_kernel<T>,
						     cudaFuncAttributeMaxDynamicSharedMemorySize,
						     (int)smem);
		if (inner == cudaSuccess)
			prefill_kernel<T><<<grid, PF_THREADS, smem, stream>>>(
				out, q, (const T *)k, (const T *)v, n_q, n_ctx, n_heads, n_kv, d,
				scale, window);
	});
	if (e != cudaSuccess)
		return e;
	return inner != cudaSuccess ? inner : cudaGetLastError();
}
