#include "comm/nccl_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include "gpu/dynamic_library.h"
#include "opfuse/error.h"

namespace opfuse::comm {

namespace {

constexpr const char* kWhatToDo =
    "install NCCL >= 2.19 (Debian/Ubuntu: libnccl2) or set "
    "OPFUSE_NCCL_LIBRARY=/path/to/libnccl.so.2";

// Resolves every function of `library` from `handle` and checks the version. Throws UsageError
// naming `library.path` when the library is unusable.
void bind_functions(void* handle, NcclLibrary& library) {
  std::string missing;
  bool ok = true;
  ok &= gpu::resolve_symbol(handle, "ncclGetVersion", library.get_version, missing);
  ok &= gpu::resolve_symbol(handle, "ncclGetUniqueId", library.get_unique_id, missing);
  ok &= gpu::resolve_symbol(handle, "ncclCommInitRank", library.comm_init_rank, missing);
  ok &= gpu::resolve_symbol(handle, "ncclCommDestroy", library.comm_destroy, missing);
  ok &= gpu::resolve_symbol(handle, "ncclCommAbort", library.comm_abort, missing);
  ok &= gpu::resolve_symbol(handle, "ncclCommGetAsyncError", library.comm_get_async_error, missing);
  ok &= gpu::resolve_symbol(handle, "ncclGetErrorString", library.get_error_string, missing);
  ok &= gpu::resolve_symbol(handle, "ncclGetLastError", library.get_last_error, missing);
  ok &= gpu::resolve_symbol(handle, "ncclAllReduce", library.all_reduce, missing);
  ok &= gpu::resolve_symbol(handle, "ncclAllGather", library.all_gather, missing);
  ok &= gpu::resolve_symbol(handle, "ncclReduceScatter", library.reduce_scatter, missing);
  ok &= gpu::resolve_symbol(handle, "ncclBroadcast", library.broadcast, missing);
  ok &= gpu::resolve_symbol(handle, "ncclGroupStart", library.group_start, missing);
  ok &= gpu::resolve_symbol(handle, "ncclGroupEnd", library.group_end, missing);
  if (!ok) {
    throw UsageError(fmt::format(
        "the NCCL library {} lacks the functions {}: it is not NCCL, or an NCCL older than 2.19; "
        "{}",
        library.path, missing, kWhatToDo));
  }
  int version = 0;
  if (library.get_version(&version) != ncclSuccess || version < kMinNcclVersion) {
    throw UsageError(fmt::format("the NCCL library {} is NCCL {}; opfuse needs NCCL >= {}: {}",
                                 library.path,
                                 version == 0 ? "(unknown version)" : nccl_version_text(version),
                                 nccl_version_text(kMinNcclVersion), kWhatToDo));
  }
  library.version = version;
}

// Loads `path` (RTLD_NOW: a missing dependency of NCCL is reported here, not at the first call),
// binds it and returns it; nullopt with `why` when it does not load. Throws UsageError when it
// loads but is unusable.
std::optional<NcclLibrary> try_load(const std::string& path, std::string* why) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    *why = gpu::dlerror_text();
    return std::nullopt;
  }
  NcclLibrary library;
  library.path = gpu::loaded_library_path(handle, path);
  try {
    bind_functions(handle, library);
  } catch (...) {
    ::dlclose(handle);
    throw;
  }
  return library;
}

}  // namespace

NcclSearchInputs NcclSearchInputs::from_environment() {
  NcclSearchInputs inputs;
  inputs.library_env = gpu::environment_value("OPFUSE_NCCL_LIBRARY");
  inputs.cuda_home = gpu::environment_value("CUDA_HOME");
  return inputs;
}

NcclLibrary load_nccl_library(const NcclSearchInputs& inputs) {
  std::string why;
  if (!inputs.library_env.empty()) {
    if (std::optional<NcclLibrary> library = try_load(inputs.library_env, &why)) return *library;
    throw UsageError(fmt::format(
        "cannot load OPFUSE_NCCL_LIBRARY={}: {}. Point OPFUSE_NCCL_LIBRARY at an existing "
        "libnccl.so.2 (NCCL >= 2.19), or unset it to search the usual places",
        inputs.library_env, why));
  }
  std::vector<std::string> candidates = {"libnccl.so.2"};
  for (const std::string& root : {inputs.cuda_home, inputs.default_cuda_root}) {
    if (root.empty()) continue;
    candidates.push_back(root + "/lib64/libnccl.so.2");
    candidates.push_back(root + "/lib/libnccl.so.2");
  }
  std::string tried;
  for (const std::string& candidate : candidates) {
    if (std::optional<NcclLibrary> library = try_load(candidate, &why)) return *library;
    tried += fmt::format("\n  {}: {}", candidate, why);
  }
  throw UsageError(fmt::format(
      "cannot load NCCL, which multi-GPU runs need; tried (OPFUSE_NCCL_LIBRARY is not set{}):{}\n"
      "To fix: {}",
      inputs.cuda_home.empty() ? ", nor CUDA_HOME" : "", tried, kWhatToDo));
}

const NcclLibrary& nccl_library() {
  // One acquire load once loaded; the mutex serialises the first loads (and retries after a
  // failure, which leaves `loaded` null). Not std::call_once: libstdc++'s pthread_once-based one
  // could hang on the call after one that threw (GCC bug 66146).
  static std::atomic<const NcclLibrary*> loaded{nullptr};
  static std::mutex mutex;
  if (const NcclLibrary* library = loaded.load(std::memory_order_acquire)) return *library;
  const std::scoped_lock lock(mutex);
  if (const NcclLibrary* library = loaded.load(std::memory_order_relaxed)) return *library;
  // Never freed: the library stays loaded for the process, and so do its function pointers.
  const auto* library = new NcclLibrary(load_nccl_library(NcclSearchInputs::from_environment()));
  loaded.store(library, std::memory_order_release);
  return *library;
}

std::string nccl_version_text(int code) {
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9 on.
  if (code < 10000) return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

}  // namespace opfuse::comm
