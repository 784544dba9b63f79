// Turns failed CUDA runtime and cuBLASLt calls into opfuse::CudaError, naming the call, the error,
// the source location, an optional context (which GEMM, which kernel) and what to check:
//
//   OPFUSE_CUDA_CHECK(cudaMemcpyAsync(...));
//   OPFUSE_CUBLAS_CHECK(cublasLtMatmul(...), describe(desc));
//
// Note "Faulted context": after an illegal memory access or a kernel trap (in any kernel of the
// process: ours, cuBLASLt's, the application's) the CUDA context is unusable and every later CUDA
// call fails, with the fault's error (cudaErrorIllegalAddress) or with errors that point
// elsewhere (cublasLtCreate's CUBLAS_STATUS_NOT_INITIALIZED). The first check that sees such an
// error, or a failed cuBLASLt call while the context has faulted, records one message for the
// process: the fault, the call that saw it and the operations running then (OperationScope:
// which step of which sequence), and that the process must restart. It throws
// ContextFaultError with it, and so does every later check and throw_if_faulted() (the
// embedding API's entry points), instead of unrelated library errors. Kernels run
// asynchronously, so the call that sees a fault is usually not the kernel that caused it:
// OPFUSE_CHECK_EACH_STEP=1 (check_each_step()) makes the executor synchronize after every step
// and name the step that faulted.
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

// Errors after which the CUDA context is unusable (note "Faulted context").
bool is_context_fault(cudaError_t status);
// Throws the recorded ContextFaultError once the context has faulted; otherwise nothing (one
// atomic load).
void throw_if_faulted();
// Records (once per process) and throws the fault `status`, seen by `seen_by` (what was being
// done), with `origin` saying what is known of its cause (empty: the asynchronous default).
[[noreturn]] void report_context_fault(cudaError_t status, std::string_view seen_by,
                                       std::string_view origin = {});
// OPFUSE_CHECK_EACH_STEP=1 in the environment (read once).
bool check_each_step();

// Names what the calling thread is doing while it lives, for fault messages ("step 4 (fc1: FP8
// GEMM ...) of forward() of sequence 'mlp'"): scopes nest, innermost first in the message. The
// text must outlive the scope. Costs two stores.
class OperationScope {
 public:
  explicit OperationScope(std::string_view what);
  ~OperationScope();
  OperationScope(const OperationScope&) = delete;
  OperationScope& operator=(const OperationScope&) = delete;
};

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
