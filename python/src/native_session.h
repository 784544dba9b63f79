// The C interface of a GPU session that `opfuse._opfuse` hands to `opfuse._opfuse_torch`
// (python/src/torch_module.cpp, docs/python.md "The torch fast path"): plain functions over an
// opaque session, so the torch module calls the one runtime `_opfuse` links instead of linking a
// second copy (whose process-wide state, the kernel cache and cuBLASLt handles, would be its
// own). Session._native() returns the address of a NativeSession that lives as long as the
// Python Session object.
#pragma once

#include <cstdint>

namespace opfuse::python {

// What a call reports: nothing went wrong, a misuse (opfuse.UsageError), a CUDA error
// (opfuse.CudaError), anything else (opfuse.Error).
enum class NativeStatus : std::int32_t { Ok = 0, Usage = 1, Cuda = 2, Other = 3 };

struct NativeSessionApi {
  // kNativeSessionVersion: the torch module refuses a session of another layout.
  std::int32_t version;
  // Each call returns its status; the message of the last failure on this thread, until the
  // next call on it, is `message()`.
  NativeStatus (*set_tensor)(void* session, const char* name, const void* device_ptr);
  NativeStatus (*parameters_changed)(void* session);
  NativeStatus (*forward)(void* session, void* stream, std::int32_t training);
  NativeStatus (*backward)(void* session, void* stream);
  // output / input_grad / param_grad: *address = the device memory (Session::output, ...).
  NativeStatus (*result)(void* session, std::int32_t kind, const char* name, const void** address);
  const char* (*message)();
};

// result()'s kinds.
inline constexpr std::int32_t kNativeOutput = 0;
inline constexpr std::int32_t kNativeInputGrad = 1;
inline constexpr std::int32_t kNativeParamGrad = 2;
inline constexpr std::int32_t kNativeSessionVersion = 1;

struct NativeSession {
  const NativeSessionApi* api;
  void* session;  // an opfuse::Session
};

}  // namespace opfuse::python
