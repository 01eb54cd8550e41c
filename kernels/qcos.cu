// qcos — see qcos.cuh. One block per (KV head, sequence).
#include "kv_dtype.cuh"
#include "qcos.cuh"

#define QCOS_THREADS 128

static __device__ double warp_sum(double v)
{
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

static __global__ void qcos_kernel(float *__restrict__ out,	     // (batch, n_kv)
				   const float *__restrict__ q_t,    // (batch, n_q, d)
				   const float *__restrict__ q_prev, // (batch, n_q, d)
				   int n_q, int n_kv, int d)
{
	__shared__ double red[3][QCOS_THREADS / 32];
	const int kv = blockIdx.x, b = blockIdx.y, G = n_q / n_kv;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	double sum = 0.0;
	for (int gi = 0; gi < G; gi++) {
		const size_t off = ((size_t)b * n_q + kv * G + gi) * d;
		const float *a = q_t + off, *c = q_prev + off;
		double ab = 0, aa = 0, bb = 0;
		for (int i = threadIdx.x; i < d; i += blockDim.x) {
			ab += (double)a[i] * c[i];
			aa += (double)a[i] * a[i];
			bb += (double)c[i] * c[i];
		}
		ab = warp_sum(ab);
		aa = warp_sum(aa);
		bb = warp_sum(bb);
		if (lane == 0) {
			red[0][w] = ab;
			red[1][w] = aa;
			red[2][w] = bb;
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			ab = aa = bb = 0;
			for (int i = 0; i < QCOS_THREADS / 32; i++) {
				ab += red[0][i];
				aa += red[1][i];
				bb += red[2][i];
			}
			if (aa == 0.0 || bb == 0.0)
				sum += (aa == 0.0 && bb == 0.0) ? 1.0 : 0.0;
			else
				sum += ab / sqrt(aa * bb);
		}
		__syncthreads();
	}
	if (threadIdx.x == 0)
		out[(size_t)b * n_kv + kv] = (float)(sum / G);
}

extern "C" cudaError_t qcos_group(float *out, const float *q_t, const float *q_prev, int batch,
				  int n_q, int n_kv, int d, cudaStream_t stream)
{
	if (n_q <= 0 || n_kv <= 0 || n_q % n_kv || d <= 0 || batch > 65535)
		return cudaErrorInvalidValue;
	if (batch <= 0)
		return cudaSuccess;
	qcos_kernel<<<dim3(n_kv, batch), QCOS_THREADS, 0, stream>>>(out, q_t, q_prev, n_q, n_kv,
								     d);
	return cudaGetLastError();
}
