// Turns failed CUDA runtime and cuBLASLt calls into opfuse::CudaError, naming the call, the error,
// the source location, an optional context (which GEMM, which kernel) and what to check:
//
//   OPFUSE_CUDA_CHECK(cudaMemcpyAsync(...));
//   OPFUSE_CUBLAS_CHECK(cublasLtMatmul(...), describe(desc));
#pragma once

#include <cublas_api.h>
#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "opfuse/error.h"

namespace opfuse::gpu {

// The message of a failed CUDA call, e.g.
// "cudaMallocAsync(&p, bytes, stream) failed at runtime/gpu/device_memory.cpp:12:
//  cudaErrorMemoryAllocation (out of memory) while allocating 64 MiB. The GPU is out of memory:
//  ...". `context` may be empty.
std::string cuda_error_message(cudaError_t status, std::string_view call, std::string_view file,
                               int line, std::string_view context);
std::string cublas_error_message(cublasStatus_t status, std::string_view call,
                                 std::string_view file, int line, std::string_view context);

// Throw CudaError unless `status` is success. A failed CUDA call also resets the runtime's
// last-error state, so a later unrelated check does not report it again.
void check_cuda(cudaError_t status, std::string_view call, std::string_view file, int line,
                std::string_view context = {});
void check_cublas(cublasStatus_t status, std::string_view call, std::string_view file, int line,
                  std::string_view context = {});

}  // namespace opfuse::gpu

// The optional second argument is a context string appended to the message. It is evaluated only
// when the call failed: contexts such as describe(desc) are formatted strings, and building them
// on every successful call cost microseconds of host time per GEMM (fusec bench, tiny forward).
#define OPFUSE_CUDA_CHECK(call, ...)                                  \
  do {                                                                \
    const cudaError_t opfuse_status_ = (call);                        \
    if (opfuse_status_ != cudaSuccess) {                              \
      ::opfuse::gpu::check_cuda(opfuse_status_, #call, __FILE__,      \
                                __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                 \
  } while (false)
#define OPFUSE_CUBLAS_CHECK(call, ...)                                  \
  do {                                                                  \
    const cublasStatus_t opfuse_status_ = (call);                       \
    if (opfuse_status_ != CUBLAS_STATUS_SUCCESS) {                      \
      ::opfuse::gpu::check_cublas(opfuse_status_, #call, __FILE__,      \
                                  __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                   \
  } while (false)
