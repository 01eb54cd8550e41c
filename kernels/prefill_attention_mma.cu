// prefill_attention_mma — see prefill_attention_mma.cuh. The tensor-core tiles of the prefill
// attention for 16-bit K/V (docs/design.md "The GPU decode step": dense prefill on the device,
// bf16 in, f32 accumulate): WMMA 16x16x16 fragments for S = Q K^T and O += P V, the online
// softmax between them on CUDA cores in f32.
//
// Block (query tile of PM_BQ rows, query head), PM_WARPS warps, warp w owning query rows
// [16 w, 16 w + 16) of the tile. Per key tile of PM_BK keys: every thread loads K and V
// (16-bit, as stored; rows past the context zeroed so that no garbage reaches an MMA), then
// each warp computes its 16 x PM_BK scores into shared memory, masks and scales them, updates
// its rows' running max and sum, writes P in the K/V type, rescales its O rows (f32, shared
// memory) and adds P V into them through accumulator fragments loaded from and stored back to
// those rows. Q is rounded to the K/V type once, when the tile is loaded.
#include <math.h>
#include <mma.h>

#include "kv_dtype.cuh"
#include "prefill_attention_mma.cuh"

#define PM_WARPS 4
#define PM_BQ (16 * PM_WARPS) // query rows per block
#define PM_BK 64	      // keys per tile
#define PM_THREADS (32 * PM_WARPS)

using namespace nvcuda;

// Shared memory, in bytes, every section a multiple of 128: Q (BQ, d), K (BK, d), V (BK, d) in
// T; S (BQ, BK) f32; P (BQ, BK) in T; O (BQ, d) f32; max, sum, correction (BQ) f32.
static __host__ __device__ size_t pm_round(size_t b)
{
	return (b + 127) / 128 * 128;
}

// Where each section starts, and the bytes in all: one description for the launch's size and
// the kernel's pointers.
struct pm_layout {
	size_t q, k, v, s, p, o, mx, sum, corr, bytes;
};

static __host__ __device__ pm_layout pm_layout_of(int d)
{
	pm_layout l;
	size_t at = 0;
	l.q = at, at += pm_round((size_t)PM_BQ * d * 2);
	l.k = at, at += pm_round((size_t)PM_BK * d * 2);
	l.v = at, at += pm_round((size_t)PM_BK * d * 2);
	l.s = at, at += pm_round((size_t)PM_BQ * PM_BK * 4);
	l.p = at, at += pm_round((size_t)PM_BQ * PM_BK * 2);
	l.o = at, at += pm_round((size_t)PM_BQ * d * 4);
	l.mx = at, at += pm_round((size_t)PM_BQ * 4);
	l.sum = at, at += pm_round((size_t)PM_BQ * 4);
	l.corr = at, at += pm_round((size_t)PM_BQ * 4);
	l.bytes = at;
	return l;
}

static size_t pm_smem_bytes(int d)
{
	return pm_layout_of(d).bytes;
}

template <typename T>
static __global__ void __launch_bounds__(PM_THREADS)
prefill_mma_kernel(float *__restrict__ out,	// (n_q, n_heads, d)
		   const float *__restrict__ q,	// (n_q, n_heads, d)
		   const T *__restrict__ k,	// (n_ctx, n_kv, d)
		   const T *__restrict__ v,	// (n_ctx, n_kv, d)
		   int n_q, int n_ctx, int n_heads, int n_kv, int d, float scale, int window)
{
	extern __shared__ __align__(128) unsigned char pm_sm[];
	const int h = blockIdx.y, kvh = h / (n_heads / n_kv), tid = threadIdx.x;
	const int w = tid >> 5, lane = tid & 31;
	const int q0 = blockIdx.x * PM_BQ, nq = min(PM_BQ, n_q - q0);
	const int off = n_ctx - n_q; // query i sits at position off + i
	const pm_layout L = pm_layout_of(d);
	T *qs = (T *)(pm_sm + L.q), *ks = (T *)(pm_sm + L.k), *vs = (T *)(pm_sm + L.v);
	T *ps = (T *)(pm_sm + L.p);
	float *ss = (float *)(pm_sm + L.s), *os = (float *)(pm_sm + L.o);
	float *mx = (float *)(pm_sm + L.mx), *sum = (float *)(pm_sm + L.sum);
	float *corr = (float *)(pm_sm + L.corr);

	for (int e = tid; e < PM_BQ * d; e += PM_THREADS) {
		const int r = e / d, c = e - r * d;
		qs[e] = kv_from_f32<T>(r < nq ? q[((size_t)(q0 + r) * n_heads + h) * d + c] : 0.0f);
		os[e] = 0.0f;
	}
	for (int r = tid; r < PM_BQ; r += PM_THREADS) {
		mx[r] = -INFINITY;
		sum[r] = 0.0f;
	}
	const size_t row = (size_t)n_kv * d;
	const T zero = kv_from_f32<T>(0.0f);
	// Keys [k_begin, k_end) are visible to some query of the tile; tiles stay BK-aligned.
	const int k_end = off + q0 + nq;
	int k_begin = window > 0 ? off + q0 + 1 - window : 0;
	k_begin = k_begin > 0 ? k_begin / PM_BK * PM_BK : 0;
	const int r0 = 16 * w; // this warp's first row of the tile
	float *sw = ss + r0 * PM_BK, *ow = os + r0 * d;
	T *pw = ps + r0 * PM_BK;
	for (int k0 = k_begin; k0 < k_end; k0 += PM_BK) {
		const int nk = min(PM_BK, k_end - k0);
		__syncthreads(); // the previous tile's K and V are no longer read
		for (int e = tid; e < PM_BK * d; e += PM_THREADS) {
			const int t = e / d, c = e - t * d;
			const size_t src = (size_t)(k0 + t) * row + (size_t)kvh * d + c;
			ks[e] = t < nk ? k[src] : zero;
			vs[e] = t < nk ? v[src] : zero;
		}
		__syncthreads();
		// S_w (16, BK) = Q_w (16, d) K^T: K rows (key, d) row-major are K^T column-major.
		for (int nt = 0; nt < PM_BK / 16; nt++) {
			wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
			wmma::fill_fragment(acc, 0.0f);
			for (int kk = 0; kk < d / 16; kk++) {
				wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
				wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
				wmma::load_matrix_sync(a, qs + r0 * d + kk * 16, d);
				wmma::load_matrix_sync(b, ks + nt * 16 * d + kk * 16, d);
				wmma::mma_sync(acc, a, b, acc);
			}
			wmma::store_matrix_sync(sw + nt * 16, acc, PM_BK, wmma::mem_row_major);
		}
		__syncwarp();
		// Online softmax, a row at a time across the warp: lane owns keys lane, lane + 32.
		for (int r = 0; r < 16; r++) {
			const int pos = off + q0 + r0 + r;
			float s[PM_BK / 32], m = -INFINITY;
#pragma unroll
			for (int j = 0; j < PM_BK / 32; j++) {
				const int t = lane + 32 * j, key = k0 + t;
				const bool vis = r0 + r < nq && t < nk && key <= pos &&
						 (window <= 0 || key > pos - window);
				s[j] = vis ? sw[r * PM_BK + t] * scale : -INFINITY;
				m = fmaxf(m, s[j]);
			}
			for (int o = 16; o > 0; o >>= 1)
				m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
			const float m_old = mx[r0 + r], m_new = fmaxf(m_old, m);
			float l = 0.0f;
#pragma unroll
			for (int j = 0; j < PM_BK / 32; j++) {
				// A row with nothing visible yet (or a padding row) keeps it.
				const float e = m_new == -INFINITY ? 0.0f : expf(s[j] - m_new);
				pw[r * PM_BK + lane + 32 * j] = kv_from_f32<T>(e);
				l += e;
			}
			for (int o = 16; o > 0; o >>= 1)
				l += __shfl_xor_sync(0xffffffffu, l, o);
			__syncwarp(); // every lane has read mx before lane 0 updates it
			if (lane == 0) {
				const float c = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
				corr[r0 + r] = c;
				sum[r0 + r] = sum[r0 + r] * c + l;
				mx[r0 + r] = m_new;
			}
		}
		__syncwarp();
		for (int e = lane; e < 16 * d; e += 32)
			ow[e] *= corr[r0 + e / d];
		__syncwarp();
		// O_w (16, d) += P_w (16, BK) V (BK, d), a 16-column slice of O at a time.
		for (int nt = 0; nt < d / 16; nt++) {
			wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
			wmma::load_matrix_sync(acc, ow + nt * 16, d, wmma::mem_row_major);
			for (int kk = 0; kk < PM_BK / 16; kk++) {
				wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
				wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
				wmma::load_matrix_sync(a, pw + kk * 16, PM_BK);
				wmma::load_matrix_sync(b, vs + kk * 16 * d + nt * 16, d);
				wmma::mma_sync(acc, a, b, acc);
			}
			wmma::store_matrix_sync(ow + nt * 16, acc, d, wmma::mem_row_major);
		}
		__syncwarp();
	}
	__syncthreads();
	for (int e = tid; e < nq * d; e += PM_THREADS) {
		const int r = e / d, c = e - r * d;
		const float l = sum[r];
		out[((size_t)(q0 + r) * n_heads + h) * d + c] = l > 0.0f ? os[e] / l : 0.0f;
	}
}

template <typename T>
static cudaError_t pm_launch(float *out, const float *q, const void *k, const void *v, int n_q,
			     int n_ctx, int n_heads, int n_kv, int d, float scale, int window,
			     size_t smem, cudaStream_t stream)
{
	cudaError_t e = cudaSuccess;
	if (smem > 48 * 1024)
		e = cudaFuncSetAttribute(prefill_mma_kernel<T>,
					 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	if (e != cudaSuccess)
		return e;
	const dim3 grid((n_q + PM_BQ - 1) / PM_BQ, n_heads);
	prefill_mma_kernel<T><<<grid, PM_THREADS, smem, stream>>>(
		out, q, (const T *)k, (const T *)v, n_q, n_ctx, n_heads, n_kv, d, scale, window);
	return cudaGetLastError();
}

extern "C" bool prefill_attention_mma_takes(enum fkv_dtype dt, int d)
{
	if ((dt != FKV_F16 && dt != FKV_BF16) || d <= 0 || d % 16)
		return false;
	int dev = 0, smem_max = 0, major = 0;
	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
		    cudaSuccess ||
	    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
		return false;
	return major >= 8 && pm_smem_bytes(d) <= (size_t)smem_max;
}

extern "C" cudaError_t prefill_attention_mma(float *out, const float *q, const void *k,
					     const void *v, enum fkv_dtype dt, int n_q, int n_ctx,
					     int n_heads, int n_kv, int d, float scale, int window,
					     cudaStream_t stream)
{
	if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv || n_q < 0 || n_q > n_ctx ||
	    n_heads > 65535 || window < 0 || !prefill_attention_mma_takes(dt, d))
		return cudaErrorInvalidValue;
	if (n_q == 0)
		return cudaSuccess;
	const size_t smem = pm_smem_bytes(d);
	if (dt == FKV_BF16)
		return pm_launch<__nv_bfloat16>(out, q, k, v, n_q, n_ctx, n_heads, n_kv, d, scale,
						window, smem, stream);
	return pm_launch<__half>(out, q, k, v, n_q, n_ctx, n_heads, n_kv, d, scale, window, smem,
				 stream);
}
