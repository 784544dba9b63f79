#include "gpu/cuda_check.h"

#include <cublasLt.h>
#include <fmt/format.h>

namespace opfuse::gpu {
namespace {

// What to check first for the errors people actually hit; the generic advice otherwise.
std::string_view cuda_hint(cudaError_t status) {
  switch (status) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      return "No usable GPU: run on a machine with an NVIDIA GPU and its driver "
             "(opfuse::gpu::gpu_available() says why).";
    case cudaErrorMemoryAllocation:
      return "The GPU is out of memory: use fewer tokens, free other allocations, or check "
             "nvidia-smi for another process holding the GPU.";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
      return "A kernel touched memory it does not own: run the program under compute-sanitizer. "
             "The CUDA context is now unusable; restart the process.";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorUnsupportedPtxVersion:
      return "The kernel was built for another GPU: compile it for current_device().arch.";
    case cudaErrorInvalidConfiguration:
      return "Invalid launch configuration: check grid, block and dynamic shared memory against "
             "the kernel's launch rules (templates/README.md).";
    case cudaErrorLaunchOutOfResources:
      return "The block needs more registers or shared memory than an SM has: launch fewer "
             "threads per block.";
    case cudaErrorSymbolNotFound:
      return "The kernel is not in the module: look it up by a name expression the module was "
             "compiled with.";
    default:
      return "Check the pointers, sizes and stream passed to this call.";
  }
}

std::string_view cublas_hint(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "cuBLASLt has no kernel for this problem on this GPU: check_gemm() lists the known "
             "restrictions (FP8 layout, dtypes, alignment, epilogues).";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLASLt could not start: check that a GPU and its driver are present.";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "Out of memory: free GPU memory or use fewer tokens.";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "An argument is invalid: check dims, leading dimensions and pointers.";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "This GPU lacks the feature (FP8 GEMMs need compute capability 8.9 or newer).";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "The GEMM kernel failed to run: run the program under compute-sanitizer.";
    default:
      return "Check the GEMM's arguments.";
  }
}

std::string with_context(std::string_view context) {
  return context.empty() ? std::string() : fmt::format(" ({})", context);
}

}  // namespace

std::string cuda_error_message(cudaError_t status, std::string_view call, std::string_view file,
                               int line, std::string_view context) {
  return fmt::format("{} failed at {}:{}: {} ({}){}. {}", call, file, line,
                     cudaGetErrorName(status), cudaGetErrorString(status), with_context(context),
                     cuda_hint(status));
}

std::string cublas_error_message(cublasStatus_t status, std::string_view call,
                                 std::string_view file, int line, std::string_view context) {
  return fmt::format("{} failed at {}:{}: {} ({}){}. {}", call, file, line,
                     cublasLtGetStatusName(status), cublasLtGetStatusString(status),
                     with_context(context), cublas_hint(status));
}

void check_cuda(cudaError_t status, std::string_view call, std::string_view file, int line,
                std::string_view context) {
  if (status == cudaSuccess) return;
  // Why: the runtime also records the error as the thread's last error; clear it so that a later
  // cudaGetLastError() (e.g. after a kernel launch) does not report this one again.
  (void)cudaGetLastError();
  throw CudaError(cuda_error_message(status, call, file, line, context), "CUDA",
                  static_cast<int>(status));
}

void check_cublas(cublasStatus_t status, std::string_view call, std::string_view file, int line,
                  std::string_view context) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(cublas_error_message(status, call, file, line, context), "cuBLASLt",
                  static_cast<int>(status));
}

}  // namespace opfuse::gpu
