#include "gpu/cuda_check.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace opfuse::gpu {
namespace {

// Note "Faulted context" (cuda_check.h): the process's one fault message, set once.
std::atomic<bool> g_faulted{false};
std::mutex g_fault_mutex;
std::string g_fault_message;
cudaError_t g_fault_status = cudaSuccess;

// The calling thread's OperationScopes, outermost first; deeper ones are counted, not named.
constexpr int kMaxScopes = 8;
thread_local std::array<std::string_view, kMaxScopes> t_scopes;
thread_local int t_depth = 0;

std::string scope_text() {
  std::string text;
  for (int i = std::min(t_depth, kMaxScopes) - 1; i >= 0; --i) {
    text += text.empty() ? " during " : " of ";
    text += t_scopes[static_cast<std::size_t>(i)];
  }
  return text;
}

[[noreturn]] void throw_recorded_fault() {
  const std::lock_guard<std::mutex> lock(g_fault_mutex);
  throw ContextFaultError(g_fault_message, "CUDA", static_cast<int>(g_fault_status));
}

// The fault a failed cuBLASLt call may be hiding: cuBLASLt reports a faulted context as its own
// status (NOT_INITIALIZED, EXECUTION_FAILED), so ask the runtime. cudaMemGetInfo is not a stream
// operation (safe during a graph capture) and fails with the fault once the context has one.
cudaError_t context_fault_now() {
  cudaError_t status = cudaPeekAtLastError();
  if (is_context_fault(status)) return status;
  std::size_t free_bytes = 0, total_bytes = 0;
  status = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (is_context_fault(status)) return status;
  (void)cudaGetLastError();
  return cudaSuccess;
}

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
  throw_if_faulted();
  if (is_context_fault(status)) {
    report_context_fault(status,
                         fmt::format("{} at {}:{}{}", call, file, line, with_context(context)));
  }
  // Why: the runtime also records the error as the thread's last error; clear it so that a later
  // cudaGetLastError() (e.g. after a kernel launch) does not report this one again.
  (void)cudaGetLastError();
  throw CudaError(cuda_error_message(status, call, file, line, context), "CUDA",
                  static_cast<int>(status));
}

void check_cublas(cublasStatus_t status, std::string_view call, std::string_view file, int line,
                  std::string_view context) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_if_faulted();
  if (const cudaError_t fault = context_fault_now(); fault != cudaSuccess) {
    report_context_fault(fault, fmt::format("{} at {}:{}{}, which returned {}", call, file, line,
                                            with_context(context), cublasLtGetStatusName(status)));
  }
  throw CudaError(cublas_error_message(status, call, file, line, context), "cuBLASLt",
                  static_cast<int>(status));
}

bool is_context_fault(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorTensorMemoryLeak:
      return true;
    default:
      return false;
  }
}

void throw_if_faulted() {
  if (g_faulted.load(std::memory_order_acquire)) throw_recorded_fault();
}

void report_context_fault(cudaError_t status, std::string_view seen_by, std::string_view origin) {
  {
    const std::lock_guard<std::mutex> lock(g_fault_mutex);
    if (!g_faulted.load(std::memory_order_relaxed)) {
      g_fault_status = status;
      g_fault_message = fmt::format(
          "the CUDA context has faulted: {} ({}), first seen by {}{}. {} The context is "
          "unusable: every later CUDA call in this process fails (opfuse repeats this message); "
          "restart the process.",
          cudaGetErrorName(status), cudaGetErrorString(status), seen_by, scope_text(),
          origin.empty()
              ? std::string_view(
                    "Kernels run asynchronously, so the kernel that faulted ran before this "
                    "call: one of opfuse's, cuBLASLt's or the application's own. To name it, run "
                    "again with OPFUSE_CHECK_EACH_STEP=1 (opfuse synchronizes after every step) "
                    "or under compute-sanitizer; check the pointers given to set_tensor() and "
                    "that their memory was not freed.")
              : origin);
      g_faulted.store(true, std::memory_order_release);
    }
  }
  // Why: the runtime keeps the error as the thread's last error; a fault cannot be cleared, but
  // a non-sticky one recorded alongside it can.
  (void)cudaGetLastError();
  throw_recorded_fault();
}

bool check_each_step() {
  static const bool enabled = [] {
    const char* value = std::getenv("OPFUSE_CHECK_EACH_STEP");
    return value != nullptr && value[0] != '\0' && std::string_view(value) != "0";
  }();
  return enabled;
}

OperationScope::OperationScope(std::string_view what) {
  if (t_depth < kMaxScopes) t_scopes[static_cast<std::size_t>(t_depth)] = what;
  ++t_depth;
}

OperationScope::~OperationScope() { --t_depth; }

}  // namespace opfuse::gpu
