// What the libraries the runtime loads with dlopen instead of linking share (comm/nccl_library.h:
// NCCL; gpu/activity_trace.h: CUPTI): the environment overrides, the loader's message, the path it
// chose and each function's address.
#pragma once

#include <dlfcn.h>

#include <string>

namespace opfuse::gpu {

// The variable's value; empty when unset.
std::string environment_value(const char* name);
// dlerror()'s message ("unknown error" when it has none).
std::string dlerror_text();
// The file the dynamic loader chose for `handle` ("libnccl.so.2" alone says nothing of which copy
// was found); `fallback` when it does not say.
std::string loaded_library_path(void* handle, const std::string& fallback);

// Resolves `name` from `handle` into `slot`; returns false and appends the name to `missing`
// (comma-separated) when the library lacks it.
template <typename Function>
bool resolve_symbol(void* handle, const char* name, Function& slot, std::string& missing) {
  ::dlerror();  // dlsym reports failure through dlerror, not through a null result alone
  void* symbol = ::dlsym(handle, name);
  if (symbol == nullptr) {
    if (!missing.empty()) missing += ", ";
    missing += name;
    return false;
  }
  // POSIX guarantees that a data pointer from dlsym converts to a function pointer.
  slot = reinterpret_cast<Function>(symbol);
  return true;
}

}  // namespace opfuse::gpu
