/* cuda_check — CUDA_CHECK / CUBLAS_CHECK for code that must survive a failed CUDA call.
 *
 * Each macro evaluates one runtime or cuBLAS statement; on failure it prints the statement, the
 * enclosing function, file and line and the library's message to stderr, then makes the
 * enclosing function return a negative errno (-ENOMEM for allocation failures, -EINVAL for
 * invalid values, -ENODEV when no device is usable, -EIO otherwise). It never aborts, so a
 * long-lived worker can report the error and carry on. Usable from C and CUDA C++; nothing is
 * allocated or owned. */
#ifndef FREEKV_CUDA_CHECK_H
#define FREEKV_CUDA_CHECK_H

#include <errno.h>
#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

static inline int cuda_check_fail(cudaError_t e, const char *stmt, const char *func,
				  const char *file, int line)
{
	fprintf(stderr, "%s:%d: %s: %s failed: %s (%s)\n", file, line, func, stmt,
		cudaGetErrorString(e), cudaGetErrorName(e));
	/* Clears the runtime's last-error flag, so the next launch's check reports its own
	 * error, not this one again (a sticky error, after a device fault, stays). */
	(void)cudaGetLastError();
	switch (e) {
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidConfiguration:
	case cudaErrorInvalidDevicePointer:
		return -EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	default:
		return -EIO;
	}
}

static inline const char *cublas_status_name(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
	default: return "unknown cuBLAS status";
	}
}

static inline int cublas_check_fail(cublasStatus_t s, const char *stmt, const char *func,
				    const char *file, int line)
{
	fprintf(stderr, "%s:%d: %s: %s failed: %s\n", file, line, func, stmt,
		cublas_status_name(s));
	switch (s) {
	case CUBLAS_STATUS_ALLOC_FAILED:
		return -ENOMEM;
	case CUBLAS_STATUS_INVALID_VALUE:
		return -EINVAL;
	case CUBLAS_STATUS_NOT_SUPPORTED:
	case CUBLAS_STATUS_ARCH_MISMATCH:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

#define CUDA_CHECK(stmt)                                                                   \
	do {                                                                               \
		cudaError_t cuda_check_e_ = (stmt);                                        \
		if (cuda_check_e_ != cudaSuccess)                                          \
			return cuda_check_fail(cuda_check_e_, #stmt, __func__, __FILE__,   \
					       __LINE__);                                  \
	} while (0)

#define CUBLAS_CHECK(stmt)                                                                 \
	do {                                                                               \
		cublasStatus_t cublas_check_s_ = (stmt);                                   \
		if (cublas_check_s_ != CUBLAS_STATUS_SUCCESS)                              \
			return cublas_check_fail(cublas_check_s_, #stmt, __func__, __FILE__, \
						 __LINE__);                                \
	} while (0)

#endif
