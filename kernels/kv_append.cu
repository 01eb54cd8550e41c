// kv_append — see kv_append.cuh.
#include "kv_append.cuh"
#include "kv_dtype.cuh"

template <typename T>
static __global__ void kv_append_kernel(T *__restrict__ slots,		  // (n_slots, 2, p, n_kv, d)
					const float *__restrict__ k,	  // (n_tok, n_kv, d)
					const float *__restrict__ v,	  // (n_tok, n_kv, d)
					const int32_t *__restrict__ slot_pos, // (n_tok)
					int n_kv, int p, int d)
{
	const int tok = blockIdx.x;
	const int sp = slot_pos[tok];
	const int slot = sp / p, row = sp % p;
	const size_t hd = (size_t)n_kv * d;
	T *kdst = slots + ((size_t)slot * 2 * p + row) * hd;
	T *vdst = slots + ((size_t)slot * 2 * p + p + row) * hd;
	const float *ksrc = k + (size_t)tok * hd, *vsrc = v + (size_t)tok * hd;
	for (size_t i = threadIdx.x; i < hd; i += blockDim.x) {
		kdst[i] = kv_from_f32<T>(ksrc[i]);
		vdst[i] = kv_from_f32<T>(vsrc[i]);
	}
}

extern "C" cudaError_t kv_append(void *slots, enum fkv_dtype dt, const float *k, const float *v,
				 const int32_t *slot_pos, int n_tok, int n_kv, int p, int d,
				 cudaStream_t stream)
{
	if (n_kv <= 0 || p <= 0 || d <= 0)
		return cudaErrorInvalidValue;
	if (n_tok <= 0)
		return cudaSuccess;
	const int hd = n_kv * d;
	const int threads = hd >= 256 ? 256 : ((hd + 31) / 32) * 32;
	cudaError_t e = kv_dispatch(dt, [&](auto tag) {
		using T = decltype(tag);
		kv_append_kernel<T><<<n_tok, threads, 0, stream>>>((T *)slots, k, v, slot_pos,
								   n_kv, p, d);
	});
	return e != cudaSuccess ? e : cudaGetLastError();
}
