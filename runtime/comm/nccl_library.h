// NCCL, loaded with dlopen at first use and never linked: the runtime links the CUDA runtime
// statically and must start on machines without a GPU and without NCCL (docs/design.md,
// "GPU-less machines"); only multi-GPU runs need NCCL. nccl.h is read at build time for the types
// and enums alone, so the functions below have exactly the declared signatures of the header
// this was built with.
//
// Search order (the first library that loads is used; later candidates are not tried):
//   1. $OPFUSE_NCCL_LIBRARY, an exact path. When set it is the only candidate: a path that does
//      not load is an error naming it, never a silent fall-back to another NCCL.
//   2. "libnccl.so.2" through the dynamic loader's own search (LD_LIBRARY_PATH, the ld.so cache:
//      Debian's libnccl2 in /usr/lib/x86_64-linux-gnu).
//   3. $CUDA_HOME/lib64, $CUDA_HOME/lib, /usr/local/cuda/lib64, /usr/local/cuda/lib.
// A library that loads but lacks a function, or is older than 2.19, is an error naming it (the
// search does not go on to another copy: two NCCLs in one process is worse than a clear error).
//
// This header includes nccl.h, whose directory only opfuse_runtime has on its include path;
// code outside runtime/comm uses comm/communicator.h, which does not.
#pragma once

#include <nccl.h>

#include <string>

namespace opfuse::comm {

// NCCL_VERSION(2, 19, 0): the oldest NCCL the runtime accepts (the GPU machines have 2.28). An
// older one is refused at load, not left to fail later in a collective.
inline constexpr int kMinNcclVersion = 21900;

// The loaded library: where it came from, its version and every function the runtime calls.
struct NcclLibrary {
  // The file that loaded, as the dynamic loader names it (the path it found for "libnccl.so.2").
  std::string path;
  int version = 0;  // ncclGetVersion's code, e.g. 22803 for 2.28.3

  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
};

// What the search reads; from_environment() fills it from the process environment, tests by hand.
struct NcclSearchInputs {
  std::string library_env;  // $OPFUSE_NCCL_LIBRARY, "" when unset
  std::string cuda_home;    // $CUDA_HOME, "" when unset
  std::string default_cuda_root = "/usr/local/cuda";

  static NcclSearchInputs from_environment();
};

// Searches, loads and checks once per process (thread-safe) and returns the same library on
// every later call. Throws UsageError naming every candidate tried and why it failed, and what to
// do; a failed load is tried again on the next call. The library is never unloaded (NCCL keeps
// threads and exit handlers of its own).
const NcclLibrary& nccl_library();

// One search and load with explicit inputs, not cached (tests). Loading the same file again only
// raises the loader's reference count.
NcclLibrary load_nccl_library(const NcclSearchInputs& inputs);

// "2.28.3" for the code 22803 (and "2.8.4" for the pre-2.9 code 2804).
std::string nccl_version_text(int code);

}  // namespace opfuse::comm
