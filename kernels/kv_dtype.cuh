// kv_dtype — device-side loads and stores of the stored element types (enum fkv_dtype of
// common/dtype.h: f32, f16, bf16), shared by the kernels. Internal to kernels/*.cu: CUDA C++
// only, not a public header. Conversions round to nearest even, like common/dtype.c.
#pragma once
#ifndef __CUDACC__
#error "kv_dtype.cuh is for kernels/*.cu only"
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype.h"

static __device__ __forceinline__ float kv_to_f32(float v) { return v; }
static __device__ __forceinline__ float kv_to_f32(__half v) { return __half2float(v); }
static __device__ __forceinline__ float kv_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> static __device__ __forceinline__ T kv_from_f32(float v);
template <> __device__ __forceinline__ float kv_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half kv_from_f32<__half>(float v)
{
	return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 kv_from_f32<__nv_bfloat16>(float v)
{
	return __float2bfloat16_rn(v);
}

// 16-byte vector accesses: KV_VEC<T> elements of T per uint4.
template <typename T> struct kv_vec {
	static constexpr int n = 16 / (int)sizeof(T);
};

// Converts the KV_VEC elements at src (16-byte aligned) to f32 in dst.
template <typename T> static __device__ __forceinline__ void kv_load16_f32(float *dst, const T *src)
{
	const uint4 raw = *reinterpret_cast<const uint4 *>(src);
	const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
	for (int i = 0; i < kv_vec<T>::n; i++)
		dst[i] = kv_to_f32(e[i]);
}

// True when rows of d elements of elem_size bytes starting at p can be read 16 bytes at a time.
static inline bool kv_vec_ok(const void *p, int d, size_t elem_size)
{
	return ((size_t)p % 16) == 0 && ((size_t)d * elem_size) % 16 == 0;
}

// Calls f(T{}) with T the C++ type of dt; returns cudaErrorInvalidValue for an unknown dtype.
// Launchers use it to pick a kernel instantiation once per call.
template <typename F> static cudaError_t kv_dispatch(enum fkv_dtype dt, F f)
{
	switch (dt) {
	case FKV_F32:
		f(float{});
		return cudaSuccess;
	case FKV_F16:
		f(__half{});
		return cudaSuccess;
	case FKV_BF16:
		f(__nv_bfloat16{});
		return cudaSuccess;
	}
	return cudaErrorInvalidValue;
}

// Blocks needed for n items at `per` items per block, capped at the grid's x limit.
static inline unsigned kv_blocks(long long n, int per)
{
	long long b = (n + per - 1) / per;
	return (unsigned)(b > 2147483647LL ? 2147483647LL : b);
}
