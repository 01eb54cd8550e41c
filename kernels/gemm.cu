// gemm — see gemm.cuh.
#include <limits.h>

#include "cuda_check.h"
#include "gemm.cuh"
#include "kv_dtype.cuh"

template <typename T>
static __global__ void round_kernel(T *__restrict__ dst,	 // (n)
				    const float *__restrict__ src, // (n)
				    long long n)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x)
		dst[i] = kv_from_f32<T>(src[i]);
}

extern "C" size_t gemm_workspace_bytes(enum fkv_dtype w_dt, long long n, long long cols)
{
	if (w_dt == FKV_F32 || n <= 0 || cols <= 0)
		return 0;
	return (size_t)n * (size_t)cols * 2;
}

extern "C" int gemm_xwt(cublasHandle_t handle, float *y, const float *x, const void *w,
			enum fkv_dtype w_dt, long long n, long long rows, long long cols,
			void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
	if (n < 0 || rows <= 0 || cols <= 0 || n > INT_MAX || rows > INT_MAX || cols > INT_MAX)
		return -EINVAL;
	if (n == 0)
		return 0;
	cudaDataType_t ty;
	const void *xin = x;
	switch (w_dt) {
	case FKV_F32:
		ty = CUDA_R_32F;
		break;
	case FKV_F16:
	case FKV_BF16: {
		if (workspace == NULL || workspace_bytes < gemm_workspace_bytes(w_dt, n, cols))
			return -EINVAL;
		const long long m = n * cols;
		unsigned blocks = kv_blocks(m, 256);
		if (blocks > 65535u * 8u)
			blocks = 65535u * 8u;
		if (w_dt == FKV_F16) {
			ty = CUDA_R_16F;
			round_kernel<__half><<<blocks, 256, 0, stream>>>((__half *)workspace, x, m);
		} else {
			ty = CUDA_R_16BF;
			round_kernel<__nv_bfloat16>
				<<<blocks, 256, 0, stream>>>((__nv_bfloat16 *)workspace, x, m);
		}
		CUDA_CHECK(cudaGetLastError());
		xin = workspace;
		break;
	}
	default:
		return -EINVAL;
	}
	const float alpha = 1.0f, beta = 0.0f;
	// cublasSetStream resets the handle's workspace to cuBLAS's own pool (which may allocate
	// inside a graph capture): only when the stream changes.
	cudaStream_t cur = NULL;
	CUBLAS_CHECK(cublasGetStream(handle, &cur));
	if (cur != stream)
		CUBLAS_CHECK(cublasSetStream(handle, stream));
	// Column-major view: W row-major (rows, cols) is Wᵀ (cols x rows) with ld = cols, X is
	// Xᵀ (cols x n), and Yᵀ (rows x n) = op_T(Wᵀ) · Xᵀ is Y row-major (n, rows).
	CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols,
				  &alpha, w, ty, (int)cols, xin, ty, (int)cols, &beta, y,
				  CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	return 0;
}
