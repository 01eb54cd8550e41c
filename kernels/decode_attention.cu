// decode_attention — see decode_attention.cuh.
#include <math.h>

#include "decode_attention.cuh"
#include "kv_dtype.cuh"

#define DEC_THREADS 128
#define DEC_TARGET_BLOCKS 256 // enough blocks in flight to cover 132 SMs twice
#define DEC_MIN_PAGES 2	      // pages per chunk below which splitting costs more than it saves

// Shared memory of one block, in floats: q (G, d), K (p, d + 1) padded against bank conflicts,
// V (p, d), probabilities (G, p), accumulators (G, d), running max, sum and correction (G).
static size_t dec_smem_floats(int G, int d, int p)
{
	return (size_t)G * d * 2 + (size_t)p * (2 * d + 1) + (size_t)G * p + 3 * (size_t)G;
}

// Block (KV head, sequence, chunk): the G query heads of one KV head over one chunk of pages.
// Unsplit, it writes out directly; split, it writes (max, sum, unnormalised accumulator).
// Vec: K and V rows are read 16 bytes per thread.
template <typename T, bool Vec>
static __global__ void dec_chunk_kernel(float *__restrict__ out,	   // (batch, n_q, d)
					float *__restrict__ part,	   // (batch, n_q, splits, d + 2)
					const float *__restrict__ q,	   // (batch, n_q, d)
					const T *__restrict__ slots,	   // (n_slots, 2, p, n_kv, d)
					const T *const *__restrict__ seq_slots, // (batch) or NULL
					const int32_t *__restrict__ rows,  // (batch) or NULL
					const int32_t *__restrict__ slot_list, // (batch, n_kv, max_pages)
					const int32_t *__restrict__ n_tok, // (batch, n_kv)
					int n_q, int n_kv, int d, int p, int max_pages, int pps,
					float scale)
{
	extern __shared__ float sm[];
	const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
	const int G = n_q / n_kv, tid = threadIdx.x;
	const int dk = d + 1;
	float *qs = sm, *ks = qs + G * d, *vs = ks + p * dk, *ps = vs + p * d;
	float *acc = ps + G * p, *mx = acc + G * d, *sum = mx + G, *corr = sum + G;

	int nt = n_tok[(size_t)b * n_kv + h];
	nt = nt < 0 ? 0 : (nt > max_pages * p ? max_pages * p : nt);
	const int n_pages = (nt + p - 1) / p;
	const int pg0 = split * pps;
	const int pg1 = min(n_pages, pg0 + pps);

	const size_t qrow = rows ? (size_t)rows[b] : (size_t)b; // q and out row of sequence b
	if (seq_slots)
		slots = seq_slots[b];
	const float *qb = q + (qrow * n_q + (size_t)h * G) * d;
	for (int e = tid; e < G * d; e += blockDim.x) {
		qs[e] = qb[e];
		acc[e] = 0.0f;
	}
	for (int g = tid; g < G; g += blockDim.x) {
		mx[g] = -INFINITY;
		sum[g] = 0.0f;
	}
	const int32_t *list = slot_list + ((size_t)b * n_kv + h) * max_pages;
	const size_t row = (size_t)n_kv * d;
	for (int pg = pg0; pg < pg1; pg++) {
		const int n = min(p, nt - pg * p);
		const T *kp = slots + (size_t)list[pg] * 2 * p * row + (size_t)h * d;
		const T *vp = kp + (size_t)p * row;
		__syncthreads(); // the previous page's K, V and probabilities are no longer read
		if (Vec) { // 16-byte loads: d is a multiple of kv_vec<T>::n
			constexpr int V = kv_vec<T>::n;
			const int dv = d / V;
			for (int e = tid; e < n * dv; e += blockDim.x) {
				const int t = e / dv, c = (e - t * dv) * V;
				float kf[V], vf[V];
				kv_load16_f32(kf, kp + t * row + c);
				kv_load16_f32(vf, vp + t * row + c);
#pragma unroll
				for (int i = 0; i < V; i++) {
					ks[t * dk + c + i] = kf[i];
					vs[t * d + c + i] = vf[i];
				}
			}
		} else {
			for (int e = tid; e < n * d; e += blockDim.x) {
				const int t = e / d, c = e - t * d;
				ks[t * dk + c] = kv_to_f32(kp[t * row + c]);
				vs[t * d + c] = kv_to_f32(vp[t * row + c]);
			}
		}
		__syncthreads();
		for (int e = tid; e < G * n; e += blockDim.x) {
			const int g = e / n, t = e - g * n;
			const float *qg = qs + g * d, *kt = ks + t * dk;
			float s = 0.0f;
			for (int c = 0; c < d; c++)
				s += qg[c] * kt[c];
			ps[g * p + t] = s * scale;
		}
		__syncthreads();
		// One warp per query head: online-softmax update of max and sum.
		for (int g = tid >> 5; g < G; g += blockDim.x >> 5) {
			const int lane = tid & 31;
			float m = -INFINITY;
			for (int t = lane; t < n; t += 32)
				m = fmaxf(m, ps[g * p + t]);
			for (int off = 16; off > 0; off >>= 1)
				m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
			const float m_new = fmaxf(mx[g], m);
			float s = 0.0f;
			for (int t = lane; t < n; t += 32) {
				const float e = expf(ps[g * p + t] - m_new);
				ps[g * p + t] = e;
				s += e;
			}
			for (int off = 16; off > 0; off >>= 1)
				s += __shfl_xor_sync(0xffffffffu, s, off);
			__syncwarp(); // every lane has read mx[g] before lane 0 updates it
			if (lane == 0) {
				const float c = expf(mx[g] - m_new); // 0 on the first page
				corr[g] = c;
				sum[g] = sum[g] * c + s;
				mx[g] = m_new;
			}
		}
		__syncthreads();
		for (int e = tid; e < G * d; e += blockDim.x) {
			const int g = e / d, c = e - g * d;
			const float *pg_ = ps + g * p;
			float a = acc[e] * corr[g];
			for (int t = 0; t < n; t++)
				a += pg_[t] * vs[t * d + c];
			acc[e] = a;
		}
	}
	__syncthreads();
	if (splits == 1) {
		float *ob = out + (qrow * n_q + (size_t)h * G) * d;
		for (int e = tid; e < G * d; e += blockDim.x) {
			const float l = sum[e / d];
			ob[e] = l > 0.0f ? acc[e] / l : 0.0f;
		}
		return;
	}
	for (int e = tid; e < G * (d + 2); e += blockDim.x) {
		const int g = e / (d + 2), c = e - g * (d + 2);
		float *pr = part + (((size_t)b * n_q + (size_t)h * G + g) * splits + split) * (d + 2);
		pr[c] = c == 0 ? mx[g] : c == 1 ? sum[g] : acc[g * d + c - 2];
	}
}

// Block (query head, sequence): merges the chunks' partial softmaxes.
static __global__ void dec_merge_kernel(float *__restrict__ out,	  // (batch, n_q, d)
					const float *__restrict__ part,	  // (batch, n_q, splits, d + 2)
					const int32_t *__restrict__ rows, // (batch) or NULL
					int n_q, int d, int splits)
{
	const size_t bh = (size_t)blockIdx.y * n_q + blockIdx.x;
	const size_t oh = (rows ? (size_t)rows[blockIdx.y] : (size_t)blockIdx.y) * n_q + blockIdx.x;
	const float *pr = part + bh * splits * (d + 2);
	float M = -INFINITY;
	for (int s = 0; s < splits; s++)
		if (pr[s * (d + 2) + 1] > 0.0f)
			M = fmaxf(M, pr[s * (d + 2)]);
	float L = 0.0f;
	for (int s = 0; s < splits; s++) {
		const float l = pr[s * (d + 2) + 1];
		if (l > 0.0f)
			L += l * expf(pr[s * (d + 2)] - M);
	}
	for (int c = threadIdx.x; c < d; c += blockDim.x) {
		float a = 0.0f;
		for (int s = 0; s < splits; s++) {
			const float l = pr[s * (d + 2) + 1];
			if (l > 0.0f)
				a += pr[s * (d + 2) + 2 + c] * expf(pr[s * (d + 2)] - M);
		}
		out[oh * d + c] = L > 0.0f ? a / L : 0.0f;
	}
}

extern "C" int decode_attention_splits(int batch, int n_kv, int max_pages)
{
	if (batch <= 0 || n_kv <= 0 || max_pages <= 0)
		return 1;
	const long long units = (long long)batch * n_kv;
	long long splits = (DEC_TARGET_BLOCKS + units - 1) / units;
	const long long by_pages = (max_pages + DEC_MIN_PAGES - 1) / DEC_MIN_PAGES;
	if (splits > by_pages)
		splits = by_pages;
	if (splits > 65535)
		splits = 65535;
	return splits < 1 ? 1 : (int)splits;
}

static int dec_pages_per_split(int max_pages, int splits)
{
	return (max_pages + splits - 1) / splits;
}

extern "C" size_t decode_attention_workspace_bytes(int batch, int n_q, int n_kv, int d,
						   int max_pages)
{
	const int splits = decode_attention_splits(batch, n_kv, max_pages);
	if (splits <= 1 || batch <= 0 || n_q <= 0 || d <= 0)
		return 0;
	return (size_t)batch * n_q * splits * (d + 2) * sizeof(float);
}

// Both entry points: one slot buffer (seq_slots NULL, aligned read from slots) or one a
// sequence; q and out rows b, or rows[b].
static cudaError_t dec_launch(float *out, const float *q, const int32_t *rows, const void *slots,
			      const void *const *seq_slots, bool aligned, enum fkv_dtype dt,
			      const int32_t *slot_list, const int32_t *n_tok, int batch, int n_q,
			      int n_kv, int d, int p, int max_pages, float scale, void *workspace,
			      size_t workspace_bytes, cudaStream_t stream)
{
	if (n_q <= 0 || n_kv <= 0 || n_q % n_kv || d <= 0 || p <= 0 || max_pages <= 0 ||
	    n_kv > 65535 || batch > 65535 || (long long)max_pages * p > INT32_MAX)
		return cudaErrorInvalidValue; // the kernel clamps n_tok to max_pages * p in int
	if (batch <= 0)
		return cudaSuccess;
	int splits = decode_attention_splits(batch, n_kv, max_pages);
	const int pps = dec_pages_per_split(max_pages, splits);
	splits = (max_pages + pps - 1) / pps; // no chunk left empty by rounding
	if (splits > 1 && (workspace == NULL ||
			   workspace_bytes < decode_attention_workspace_bytes(batch, n_q, n_kv, d,
									      max_pages)))
		return cudaErrorInvalidValue;
	const int G = n_q / n_kv;
	const size_t smem = dec_smem_floats(G, d, p) * sizeof(float);
	int dev = 0, smem_max = 0;
	cudaError_t e = cudaGetDevice(&dev);
	if (e == cudaSuccess)
		e = cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
	if (e != cudaSuccess)
		return e;
	if (smem > (size_t)smem_max)
		return cudaErrorInvalidValue;
	const dim3 grid(n_kv, batch, splits);
	cudaError_t inner = cudaSuccess;
	e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		auto kernel = aligned && kv_vec_ok(slots, d, sizeof(T)) ? dec_chunk_kernel<T, true>
									: dec_chunk_kernel<T, false>;
		if (smem > 48 * 1024)
			inner = cudaFuncSetAttribute(kernel,
						     cudaFuncAttributeMaxDynamicSharedMemorySize,
						     (int)smem);
		if (inner == cudaSuccess)
			kernel<<<grid, DEC_THREADS, smem, stream>>>(
				out, (float *)workspace, q, (const T *)slots,
				(const T *const *)seq_slots, rows, slot_list, n_tok, n_q, n_kv, d,
				p, max_pages, pps, scale);
	});
	if (e != cudaSuccess)
		return e;
	if (inner != cudaSuccess)
		return inner;
	if (splits > 1) {
		e = cudaGetLastError();
		if (e != cudaSuccess)
			return e;
		const int threads = d >= 128 ? 128 : ((d + 31) / 32) * 32;
		dec_merge_kernel<<<dim3(n_q, batch), threads, 0, stream>>>(
			out, (const float *)workspace, rows, n_q, d, splits);
	}
	return cudaGetLastError();
}

extern "C" cudaError_t decode_attention(float *out, const float *q, const void *slots,
					enum fkv_dtype dt, const int32_t *slot_list,
					const int32_t *n_tok, int batch, int n_q, int n_kv, int d,
					int p, int max_pages, float scale, void *workspace,
					size_t workspace_bytes, cudaStream_t stream)
{
	return dec_launch(out, q, NULL, slots, NULL, true, dt, slot_list, n_tok, batch, n_q, n_kv,
			  d, p, max_pages, scale, workspace, workspace_bytes, stream);
}

extern "C" cudaError_t decode_attention_seqs(float *out, const float *q, const int32_t *rows,
					     const void *const *seq_slots, bool aligned,
					     enum fkv_dtype dt, const int32_t *slot_list,
					     const int32_t *n_tok, int batch, int n_q, int n_kv,
					     int d, int p, int max_pages, float scale,
					     void *workspace, size_t workspace_bytes,
					     cudaStream_t stream)
{
	if (!rows || !seq_slots)
		return cudaErrorInvalidValue;
	return dec_launch(out, q, rows, NULL, seq_slots, aligned, dt, slot_list, n_tok, batch,
			  n_q, n_kv, d, p, max_pages, scale, workspace, workspace_bytes, stream);
}
