// The exceptions the opfuse runtime throws at applications. Every message says what went wrong
// and what to change; catch opfuse::Error to handle them all.
//
//   Error        the base class (a std::runtime_error).
//   UsageError   misuse found before anything was launched: a shape or dtype the GPU path cannot
//                take, a misaligned or missing pointer, no GPU. Nothing was enqueued.
//   CudaError    a CUDA runtime or cuBLASLt call failed. The message names the call, the library's
//                error name and string, the source location, and what to check.
//   ContextFaultError  a CudaError saying the CUDA context has faulted (an illegal memory access,
//                a kernel trap: in a kernel of opfuse, of cuBLASLt or of the application). The
//                first opfuse call that sees it names the operation and step that saw it; every
//                later call throws the same message. Nothing on this GPU works in this process
//                any more: it must restart. OPFUSE_CHECK_EACH_STEP=1 names the faulting step
//                (docs/embedding.md, "Faults").
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace opfuse {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UsageError : public Error {
 public:
  using Error::Error;
};

class CudaError : public Error {
 public:
  // `library` is "CUDA" or "cuBLASLt"; `code` is that library's status value (cudaError_t or
  // cublasStatus_t), kept as an int so this header needs no CUDA headers.
  CudaError(const std::string& message, std::string library, int code)
      : Error(message), library_(std::move(library)), code_(code) {}

  const std::string& library() const { return library_; }
  int code() const { return code_; }

 private:
  std::string library_;
  int code_;
};

class ContextFaultError : public CudaError {
 public:
  using CudaError::CudaError;
};

}  // namespace opfuse
