// The error convention of the bench shims' C entry points (gemm_shim.cpp, session_shim.cpp): an
// entry point returns 0, or 1 with the message of what it threw in the caller's buffer, which
// bench/peers/*.py raise as RuntimeError.
#pragma once

#include <cstdio>
#include <exception>

namespace opfuse::bench {

// Runs body(); 0, or 1 with the exception's message copied into `error` (error_bytes long,
// always terminated; nullptr or 0 bytes: not copied).
template <typename Body>
int report_errors(char* error, int error_bytes, Body&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    if (error != nullptr && error_bytes > 0)
      std::snprintf(error, static_cast<std::size_t>(error_bytes), "%s", e.what());
    return 1;
  }
}

}  // namespace opfuse::bench
