// flash_decode — see flash_decode.cuh.
#include <math.h>

#include "flash_decode.cuh"
#include "kv_dtype.cuh"

#define FD_PER_LANE (FLASH_DECODE_MAX_D / 32)
// Blocks a launch aims for: with 4-warp blocks (GQA 4), 31 warps an SM over the launch on a
// 132-SM H100/H200, so that `full` at long contexts has loads in flight on every SM
// (bench/RESULTS.md, 2026-11-27: full's 32K-token decode step went from 256 blocks of
// one key a round to this and 8 keys a round, 72 to 21 ms).
#define FD_TARGET_BLOCKS 1024
// Keys a warp loads before it uses any (see the kernel's loop): 8 for blocks of at most
// FD_WIDE_THREADS threads (GQA groups up to 8), whose registers allow it; 1 for the larger
// groups, whose 1024-thread blocks leave a thread 64 registers.
#define FD_KEYS 8
#define FD_WIDE_THREADS 256
// Fewest keys a chunk is given: below this the merge costs more than the split saves.
#define FD_MIN_CHUNK 64

static __device__ __forceinline__ float fd_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// grid (splits, n_kv), block (group * 32): warp w of block (s, g) runs query head g * group + w
// over keys [s * chunk, min(n, (s + 1) * chunk)). With one split it writes out directly;
// otherwise part (n_heads, splits, d + 2): the unnormalised accumulator, then m and l.
//
// Batched (items non-NULL, grid (splits, n_kv, batch)): block z runs items[z] — its own k, v
// and n, query and output row items[z].row of q, out (rows, n_heads, d), chunk
// ceil(n / splits), part (batch, n_heads, splits, d + 2).
template <typename T, int KEYS>
static __global__ void
__launch_bounds__(KEYS > 1 ? FD_WIDE_THREADS : FLASH_DECODE_MAX_GROUP * 32)
flash_decode_kernel(float *out,	      // (n_heads, d)
					   float *part,	      // (n_heads, splits, d + 2)
					   const float *q,    // (n_heads, d)
					   const T *k,	      // (n, n_kv, d), row stride row_stride
					   const T *v,	      // (n, n_kv, d), row stride row_stride
					   long long n, long long row_stride, int group, int d,
					   float scale, long long chunk, int splits,
					   const struct flash_decode_item *items)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const int kvh = blockIdx.y, split = blockIdx.x, h = kvh * group + w;
	if (items) {
		const struct flash_decode_item it = items[blockIdx.z];
		const long long n_heads = (long long)gridDim.y * group;
		k = (const T *)it.k;
		v = (const T *)it.v;
		n = it.n;
		chunk = (n + splits - 1) / splits;
		q += it.row * n_heads * d;
		out += it.row * n_heads * d;
		part += (long long)blockIdx.z * n_heads * splits * (d + 2);
	}
	float qr[FD_PER_LANE], acc[FD_PER_LANE];
#pragma unroll
	for (int j = 0; j < FD_PER_LANE; j++) {
		const int i = lane + 32 * j;
		qr[j] = i < d ? q[(long long)h * d + i] : 0.0f;
		acc[j] = 0.0f;
	}
	float m = -INFINITY, l = 0.0f;
	const long long t0 = (long long)split * chunk;
	const long long t1 = t0 + chunk < n ? t0 + chunk : n;
	// KEYS keys a round: their K and V rows are loaded before any is used, so a warp has
	// that many rows in flight instead of one (a key at a time waits out the memory latency
	// for every key); the running max and sum are rescaled once a round.
	for (long long t = t0; t < t1; t += KEYS) {
		float s[KEYS], vv[KEYS][FD_PER_LANE];
#pragma unroll
		for (int u = 0; u < KEYS; u++) {
			const bool in = t + u < t1;
			const T *kr = k + (t + u) * row_stride + (long long)kvh * d;
			const T *vr = v + (t + u) * row_stride + (long long)kvh * d;
			s[u] = 0.0f;
#pragma unroll
			for (int j = 0; j < FD_PER_LANE; j++) {
				const int i = lane + 32 * j;
				const bool ok = in && i < d;
				s[u] += ok ? qr[j] * kv_to_f32(kr[i]) : 0.0f;
				vv[u][j] = ok ? kv_to_f32(vr[i]) : 0.0f;
			}
		}
		float mn = m;
#pragma unroll
		for (int u = 0; u < KEYS; u++) {
			s[u] = fd_warp_sum(s[u]) * scale;
			if (t + u < t1)
				mn = fmaxf(mn, s[u]);
		}
		const float c = expf(m - mn); // 0 on the first round (m = -inf)
		l *= c;
#pragma unroll
		for (int j = 0; j < FD_PER_LANE; j++)
			acc[j] *= c;
#pragma unroll
		for (int u = 0; u < KEYS; u++) {
			const float p = t + u < t1 ? expf(s[u] - mn) : 0.0f;
			l += p;
#pragma unroll
			for (int j = 0; j < FD_PER_LANE; j++)
				acc[j] += p * vv[u][j];
		}
		m = mn;
	}
	if (splits == 1) {
		const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
		for (int j = 0; j < FD_PER_LANE; j++) {
			const int i = lane + 32 * j;
			if (i < d)
				out[(long long)h * d + i] = acc[j] * inv;
		}
		return;
	}
	float *pp = part + ((long long)h * splits + split) * (d + 2);
#pragma unroll
	for (int j = 0; j < FD_PER_LANE; j++) {
		const int i = lane + 32 * j;
		if (i < d)
			pp[i] = acc[j];
	}
	if (lane == 0) {
		pp[d] = m;
		pp[d + 1] = l;
	}
}

// grid n_heads, block 128: the chunks' partials of one query head merged (each rescaled to the
// largest running max); an empty chunk (m = -inf, l = 0) weighs nothing.
// Batched: grid (n_heads, batch), block y merges item y into its output row.
static __global__ void flash_decode_merge(float *out,	     // (n_heads, d)
					  const float *part, // (n_heads, splits, d + 2)
					  int splits, int d, const struct flash_decode_item *items)
{
	const int h = blockIdx.x;
	if (items) {
		out += items[blockIdx.y].row * gridDim.x * d;
		part += (long long)blockIdx.y * gridDim.x * splits * (d + 2);
	}
	const float *ph = part + (long long)h * splits * (d + 2);
	float M = -INFINITY;
	for (int s = 0; s < splits; s++)
		M = fmaxf(M, ph[(long long)s * (d + 2) + d]);
	float L = 0.0f;
	for (int s = 0; s < splits; s++) {
		const float *ps = ph + (long long)s * (d + 2);
		if (ps[d + 1] > 0.0f)
			L += ps[d + 1] * expf(ps[d] - M);
	}
	const float inv = L > 0.0f ? 1.0f / L : 0.0f;
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float o = 0.0f;
		for (int s = 0; s < splits; s++) {
			const float *ps = ph + (long long)s * (d + 2);
			if (ps[d + 1] > 0.0f)
				o += ps[i] * expf(ps[d] - M);
		}
		out[(long long)h * d + i] = o * inv;
	}
}

int flash_decode_splits(long long n, int n_kv)
{
	if (n <= 0 || n_kv <= 0)
		return 1;
	long long by_len = (n + FD_MIN_CHUNK - 1) / FD_MIN_CHUNK;
	long long by_grid = FD_TARGET_BLOCKS / n_kv > 1 ? FD_TARGET_BLOCKS / n_kv : 1;
	long long s = by_len < by_grid ? by_len : by_grid;
	return (int)(s < FLASH_DECODE_MAX_SPLITS ? s : FLASH_DECODE_MAX_SPLITS);
}

size_t flash_decode_workspace_bytes(int n_heads, int d)
{
	if (n_heads <= 0 || d <= 0)
		return 0;
	return (size_t)n_heads * FLASH_DECODE_MAX_SPLITS * (size_t)(d + 2) * sizeof(float);
}

cudaError_t flash_decode(float *out, const float *q, const void *k, const void *v,
			 enum fkv_dtype dt, long long n, long long row_stride, int n_heads,
			 int n_kv, int d, float scale, void *workspace, size_t workspace_bytes,
			 cudaStream_t stream)
{
	if (n <= 0 || n_kv <= 0 || n_kv > 65535 || n_heads <= 0 || n_heads % n_kv || d <= 0 ||
	    d > FLASH_DECODE_MAX_D || n_heads / n_kv > FLASH_DECODE_MAX_GROUP ||
	    row_stride < (long long)n_kv * d)
		return cudaErrorInvalidValue;
	const int group = n_heads / n_kv, splits = flash_decode_splits(n, n_kv);
	if (splits > 1 && workspace_bytes < flash_decode_workspace_bytes(n_heads, d))
		return cudaErrorInvalidValue;
	const long long chunk = (n + splits - 1) / splits;
	float *part = (float *)workspace;
	const dim3 grid((unsigned)splits, (unsigned)n_kv);
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		if (group * 32 <= FD_WIDE_THREADS)
			flash_decode_kernel<T, FD_KEYS><<<grid, group * 32, 0, stream>>>(
				out, part, q, (const T *)k, (const T *)v, n, row_stride, group, d,
				scale, chunk, splits, NULL);
		else
			flash_decode_kernel<T, 1><<<grid, group * 32, 0, stream>>>(
				out, part, q, (const T *)k, (const T *)v, n, row_stride, group, d,
				scale, chunk, splits, NULL);
	});
	if (e != cudaSuccess)
		return e;
	if ((e = cudaGetLastError()) != cudaSuccess || splits == 1)
		return e;
	flash_decode_merge<<<n_heads, 128, 0, stream>>>(out, part, splits, d, NULL);
	return cudaGetLastError();
}

int flash_decode_batch_splits(long long max_n, int n_kv, int batch)
{
	if (batch <= 0)
		return 1;
	long long s = flash_decode_splits(max_n, n_kv);
	long long by_grid = FD_TARGET_BLOCKS / ((long long)n_kv * batch);
	by_grid = by_grid > 1 ? by_grid : 1;
	return (int)(s < by_grid ? s : by_grid);
}

size_t flash_decode_batch_workspace_bytes(int batch, int n_heads, int n_kv, int d)
{
	if (batch <= 0 || n_heads <= 0 || n_kv <= 0 || d <= 0)
		return 0;
	long long by_grid = FD_TARGET_BLOCKS / ((long long)n_kv * batch);
	by_grid = by_grid > 1 ? by_grid : 1;
	if (by_grid > FLASH_DECODE_MAX_SPLITS)
		by_grid = FLASH_DECODE_MAX_SPLITS;
	return (size_t)batch * n_heads * (size_t)by_grid * (size_t)(d + 2) * sizeof(float);
}

cudaError_t flash_decode_batch(float *out, const float *q, const struct flash_decode_item *items,
			       int batch, long long max_n, enum fkv_dtype dt, long long row_stride,
			       int n_heads, int n_kv, int d, float scale, void *workspace,
			       size_t workspace_bytes, cudaStream_t stream)
{
	if (!items || batch <= 0 || batch > 65535 || max_n <= 0 || n_kv <= 0 || n_kv > 65535 ||
	    n_heads <= 0 || n_heads % n_kv || d <= 0 || d > FLASH_DECODE_MAX_D ||
	    n_heads / n_kv > FLASH_DECODE_MAX_GROUP || row_stride < (long long)n_kv * d)
		return cudaErrorInvalidValue;
	const int group = n_heads / n_kv, splits = flash_decode_batch_splits(max_n, n_kv, batch);
	if (splits > 1 &&
	    workspace_bytes < flash_decode_batch_workspace_bytes(batch, n_heads, n_kv, d))
		return cudaErrorInvalidValue;
	float *part = (float *)workspace;
	const dim3 grid((unsigned)splits, (unsigned)n_kv, (unsigned)batch);
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		if (group * 32 <= FD_WIDE_THREADS)
			flash_decode_kernel<T, FD_KEYS><<<grid, group * 32, 0, stream>>>(
				out, part, q, (const T *)NULL, (const T *)NULL, 0, row_stride, group,
				d, scale, 0, splits, items);
		else
			flash_decode_kernel<T, 1><<<grid, group * 32, 0, stream>>>(
				out, part, q, (const T *)NULL, (const T *)NULL, 0, row_stride, group,
				d, scale, 0, splits, items);
	});
	if (e != cudaSuccess)
		return e;
	if ((e = cudaGetLastError()) != cudaSuccess || splits == 1)
		return e;
	flash_decode_merge<<<dim3((unsigned)n_heads, (unsigned)batch), 128, 0, stream>>>(
		out, part, splits, d, items);
	return cudaGetLastError();
}
