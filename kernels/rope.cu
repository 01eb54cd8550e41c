// rope — see rope.cuh.
#include "kv_dtype.cuh"
#include "rope.cuh"

static __device__ double rope_freq(const struct rope_cfg &c, int i, int d)
{
	double f = pow((double)c.theta, -2.0 * i / d);
	if (c.scaling_factor <= 0.0f)
		return f;
	double wavelen = 2.0 * 3.14159265358979323846 / f;
	double low_wl = c.original_ctx / (double)c.low_freq_factor;
	double high_wl = c.original_ctx / (double)c.high_freq_factor;
	if (wavelen < high_wl)
		return f;
	if (wavelen > low_wl)
		return f / c.scaling_factor;
	double smooth = (c.original_ctx / wavelen - c.low_freq_factor) /
			(c.high_freq_factor - c.low_freq_factor);
	return (1.0 - smooth) * f / c.scaling_factor + smooth * f;
}

// One block per token; thread i owns pair i of every head, so its angle is computed once.
static __global__ void rope_kernel(float *x,		 // (n, n_heads, d)
				   const int32_t *pos,	 // (n)
				   int n_heads, int d, struct rope_cfg cfg)
{
	const int half = d / 2;
	const double p = (double)pos[blockIdx.x];
	float *xt = x + (size_t)blockIdx.x * n_heads * d;
	for (int i = threadIdx.x; i < half; i += blockDim.x) {
		double s, c;
		sincos(p * rope_freq(cfg, i, d), &s, &c);
		const float cs = (float)c, sn = (float)s;
		const int a = cfg.pairing == ROPE_PAIR_INTERLEAVED ? 2 * i : i;
		const int b = cfg.pairing == ROPE_PAIR_INTERLEAVED ? 2 * i + 1 : i + half;
		for (int h = 0; h < n_heads; h++) {
			float *v = xt + (size_t)h * d;
			const float v0 = v[a], v1 = v[b];
			v[a] = v0 * cs - v1 * sn;
			v[b] = v0 * sn + v1 * cs;
		}
	}
}

extern "C" cudaError_t rope_f32(float *x, const int32_t *pos, int n, int n_heads, int d,
				struct rope_cfg cfg, cudaStream_t stream)
{
	if (d <= 0 || d % 2 || n_heads <= 0)
		return cudaErrorInvalidValue;
	if (cfg.pairing != ROPE_PAIR_INTERLEAVED && cfg.pairing != ROPE_PAIR_HALVES)
		return cudaErrorInvalidValue;
	if (cfg.scaling_factor > 0.0f &&
	    (cfg.original_ctx <= 0 || cfg.low_freq_factor <= 0.0f ||
	     cfg.high_freq_factor <= cfg.low_freq_factor))
		return cudaErrorInvalidValue;
	if (n <= 0)
		return cudaSuccess;
	const int half = d / 2;
	const int threads = half >= 128 ? 128 : ((half + 31) / 32) * 32;
	rope_kernel<<<n, threads, 0, stream>>>(x, pos, n_heads, d, cfg);
	return cudaGetLastError();
}
