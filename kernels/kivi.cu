// kivi — see kivi.cuh.
#include "kivi.cuh"
#include "kv_dtype.cuh"

// The design's zero and scale of a group with min mn and max mx, and the code of x. The _rn
// intrinsics keep the compiler from contracting, so the double results are the CPU's.
static __device__ __forceinline__ void kivi_zs(double mn, double mx, int bits, double *z,
					       double *s)
{
	if (bits == 2) {
		*z = mn;
		*s = __ddiv_rn(__dsub_rn(mx, mn), 3.0);
	} else {
		*z = __ddiv_rn(__dadd_rn(__dmul_rn(3.0, mn), mx), 4.0);
		*s = __ddiv_rn(__dsub_rn(mx, mn), 2.0);
	}
}

static __device__ __forceinline__ unsigned kivi_code(double x, double z, double s, int bits)
{
	if (s == 0.0)
		return 0;
	const double c = floor(__dadd_rn(__ddiv_rn(__dsub_rn(x, z), s), 0.5));
	const double top = (double)((1 << bits) - 1);
	if (!(c >= 0.0))
		return 0;
	return c > top ? (unsigned)top : (unsigned)c;
}

// One thread per (group, head, code byte): the byte's 8/bits channels over the group's p
// tokens — their min and max, zero and scale, then the byte of every token.
template <typename T>
static __global__ void quant_keys_kernel(uint8_t *__restrict__ kc,	// (cap, n_kv, cb)
					 float *__restrict__ kzs,	// (cap/p, n_kv, 2, d)
					 const T *__restrict__ k,	// (n, n_kv, d)
					 long long t0, long long groups, int n_kv, int d, int p,
					 int bits)
{
	const int cb = d * bits / 8, per = 8 / bits;
	const long long id = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (id >= groups * n_kv * cb)
		return;
	const int byte = (int)(id % cb);
	const int h = (int)(id / cb % n_kv);
	const long long g = id / cb / n_kv;
	const size_t row = (size_t)n_kv * d;
	double z[8], s[8];
	for (int j = 0; j < per; j++) {
		const int c = byte * per + j;
		double mn = INFINITY, mx = -INFINITY;
		for (int i = 0; i < p; i++) {
			const double x = kv_to_f32(k[(size_t)(g * p + i) * row + (size_t)h * d + c]);
			mn = x < mn ? x : mn;
			mx = x > mx ? x : mx;
		}
		kivi_zs(mn, mx, bits, &z[j], &s[j]);
		float *zs = kzs + ((size_t)(t0 / p + g) * n_kv + h) * 2 * d;
		zs[c] = (float)z[j];
		zs[d + c] = (float)s[j];
	}
	for (int i = 0; i < p; i++) {
		unsigned b = 0;
		for (int j = 0; j < per; j++) {
			const int c = byte * per + j;
			const double x = kv_to_f32(k[(size_t)(g * p + i) * row + (size_t)h * d + c]);
			b |= kivi_code(x, z[j], s[j], bits) << (j * bits);
		}
		kc[((size_t)(t0 + g * p + i) * n_kv + h) * cb + byte] = (uint8_t)b;
	}
}

// One thread per (token, head): every value group of the row, then its bytes.
template <typename T>
static __global__ void quant_values_kernel(uint8_t *__restrict__ vc,   // (cap, n_kv, cb)
					   float *__restrict__ vzs,	// (cap, n_kv, 2, nvg)
					   const T *__restrict__ v,	// (n, n_kv, d)
					   long long t0, long long n, int n_kv, int d, int p,
					   int bits)
{
	const long long id = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (id >= n * n_kv)
		return;
	const int h = (int)(id % n_kv);
	const long long t = id / n_kv;
	const int gv = p < d ? p : d, nvg = (d + gv - 1) / gv, cb = d * bits / 8, per = 8 / bits;
	const T *x = v + (size_t)t * n_kv * d + (size_t)h * d;
	float *zs = vzs + ((size_t)(t0 + t) * n_kv + h) * 2 * nvg;
	uint8_t *codes = vc + ((size_t)(t0 + t) * n_kv + h) * cb;
	for (int i = 0; i < cb; i++)
		codes[i] = 0;
	for (int gi = 0; gi < nvg; gi++) {
		const int c0 = gi * gv, c1 = c0 + gv < d ? c0 + gv : d;
		double mn = INFINITY, mx = -INFINITY, z, s;
		for (int c = c0; c < c1; c++) {
			const double e = kv_to_f32(x[c]);
			mn = e < mn ? e : mn;
			mx = e > mx ? e : mx;
		}
		kivi_zs(mn, mx, bits, &z, &s);
		zs[gi] = (float)z;
		zs[nvg + gi] = (float)s;
		for (int c = c0; c < c1; c++)
			codes[c / per] |= (uint8_t)(kivi_code(kv_to_f32(x[c]), z, s, bits)
						    << (c % per * bits));
	}
}

static bool kivi_geom_ok(int n_kv, int d, int p, int bits)
{
	return n_kv > 0 && d > 0 && p > 0 && (bits == 1 || bits == 2) && (d * bits) % 8 == 0;
}

extern "C" cudaError_t kivi_quant(uint8_t *kc, float *kzs, uint8_t *vc, float *vzs,
				  const void *k, const void *v, enum fkv_dtype dt, long long t0,
				  long long n, int n_kv, int d, int p, int bits, cudaStream_t stream)
{
	if (!kivi_geom_ok(n_kv, d, p, bits) || t0 < 0 || n < 0 || t0 % p || n % p)
		return cudaErrorInvalidValue;
	if (!n)
		return cudaSuccess;
	const long long keys = n / p * n_kv * (d * bits / 8), vals = n * n_kv;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		quant_keys_kernel<T><<<kv_blocks(keys, 128), 128, 0, stream>>>(
			kc, kzs, (const T *)k, t0, n / p, n_kv, d, p, bits);
		quant_values_kernel<T><<<kv_blocks(vals, 128), 128, 0, stream>>>(
			vc, vzs, (const T *)v, t0, n, n_kv, d, p, bits);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}

// One thread per (token, head, channel) of both K and V.
static __global__ void dequant_kernel(float *__restrict__ k, float *__restrict__ v, // (n, n_kv, d)
				      const uint8_t *__restrict__ kc,	// (cap, n_kv, cb)
				      const float *__restrict__ kzs,	// (cap/p, n_kv, 2, d)
				      const uint8_t *__restrict__ vc,	// (cap, n_kv, cb)
				      const float *__restrict__ vzs,	// (cap, n_kv, 2, nvg)
				      long long t0, long long n, int n_kv, int d, int p, int bits)
{
	const long long id = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (id >= n * n_kv * d)
		return;
	const int c = (int)(id % d), h = (int)(id / d % n_kv);
	const long long t = id / d / n_kv, pos = t0 + t;
	const int cb = d * bits / 8, per = 8 / bits, gv = p < d ? p : d, nvg = (d + gv - 1) / gv;
	const unsigned mask = (1u << bits) - 1u, shift = c % per * bits;
	const size_t at = ((size_t)pos * n_kv + h) * cb + c / per;
	const float *kz = kzs + ((size_t)(pos / p) * n_kv + h) * 2 * d;
	const float *vz = vzs + ((size_t)pos * n_kv + h) * 2 * nvg;
	k[id] = __fmaf_rn(kz[d + c], (float)((kc[at] >> shift) & mask), kz[c]);
	v[id] = __fmaf_rn(vz[nvg + c / gv], (float)((vc[at] >> shift) & mask), vz[c / gv]);
}

extern "C" cudaError_t kivi_dequant(float *k, float *v, const uint8_t *kc, const float *kzs,
				    const uint8_t *vc, const float *vzs, long long t0, long long n,
				    int n_kv, int d, int p, int bits, cudaStream_t stream)
{
	if (!kivi_geom_ok(n_kv, d, p, bits) || t0 < 0 || n < 0)
		return cudaErrorInvalidValue;
	if (!n)
		return cudaSuccess;
	dequant_kernel<<<kv_blocks(n * n_kv * d, 256), 256, 0, stream>>>(k, v, kc, kzs, vc, vzs, t0,
									   n, n_kv, d, p, bits);
	return cudaGetLastError();
}

template <typename T>
static __global__ void put_rows_kernel(float *__restrict__ dst,	  // (positions, n_kv, d)
				       const T *__restrict__ rows,	  // (n_kv, n_f, d)
				       const int32_t *__restrict__ pos, // (n_kv, n_f)
				       int n_kv, int n_f, int d)
{
	const long long id = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (id >= (long long)n_kv * n_f * d)
		return;
	const int c = (int)(id % d);
	const long long r = id / d; // h * n_f + i
	const int h = (int)(r / n_f);
	const int32_t at = pos[r];
	if (at >= 0)
		dst[((size_t)at * n_kv + h) * d + c] = kv_to_f32(rows[id]);
}

extern "C" cudaError_t kivi_put_rows(float *dst, const void *rows, enum fkv_dtype dt,
				     const int32_t *pos, int n_kv, int n_f, int d,
				     cudaStream_t stream)
{
	if (n_kv <= 0 || n_f < 0 || d <= 0)
		return cudaErrorInvalidValue;
	if (!n_f)
		return cudaSuccess;
	const long long n = (long long)n_kv * n_f * d;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		put_rows_kernel<T><<<kv_blocks(n, 256), 256, 0, stream>>>(dst, (const T *)rows, pos,
									  n_kv, n_f, d);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}

template <typename T>
static __global__ void widen_kernel(float *__restrict__ dst, // (n)
				    const T *__restrict__ src, // (n)
				    long long n)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x)
		dst[i] = kv_to_f32(src[i]);
}

extern "C" cudaError_t kivi_widen(float *dst, const void *src, enum fkv_dtype dt, long long n,
				  cudaStream_t stream)
{
	if (n < 0)
		return cudaErrorInvalidValue;
	if (!n)
		return cudaSuccess;
	unsigned blocks = kv_blocks(n, 256);
	if (blocks > 65535u * 8u)
		blocks = 65535u * 8u;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		widen_kernel<T><<<blocks, 256, 0, stream>>>(dst, (const T *)src, n);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
