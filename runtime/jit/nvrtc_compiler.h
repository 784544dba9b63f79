// NVRTC compilation of kernel templates to cubin (or PTX), with the disk kernel cache.
// The compiler side never queries a device: the target arch is always an explicit input.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "opfuse/error.h"

namespace opfuse::jit {

class KernelCache;  // kernel_cache.h

// A compile failure: what() names the kernel and carries NVRTC's log.
struct JitError : opfuse::Error {
  using opfuse::Error::Error;
};

struct CompileRequest {
  std::string kernel_name;                    // display name, used in logs and errors
  std::string source;                         // full CUDA source (may #include templates/)
  std::vector<std::string> name_expressions;  // e.g. "opfuse::rmsnorm_fwd<__nv_bfloat16, 4096>"
  std::string arch = "sm_90a";                // sm_XX[a|f] -> cubin; compute_XX[a|f] -> PTX
  std::vector<std::string> extra_options;     // appended after opfuse's own options
};

struct CompiledKernel {
  std::string kernel_name;
  std::string arch;
  bool is_ptx = false;
  std::vector<char> binary;                          // cubin, or PTX text with its final NUL
  std::map<std::string, std::string> lowered_names;  // name expression -> mangled symbol
  std::string log;                                   // NVRTC + ptxas log (ptxas -v output)
  // Usage per thread, the largest over the program's entry functions; -1 when unknown (PTX).
  // Registers and stack come from the cubin, spills from it or the log (note "Usage sources").
  int registers = -1;
  int spill_store_bytes = -1;
  int spill_load_bytes = -1;
  int stack_bytes = -1;  // cumulative stack: spills, local arrays and callees' frames
  bool cache_hit = false;
  double compile_ms = 0.0;  // this call's time: compile or cache load
};

// Compiles one request with NVRTC (no cache), using NVRTC's automatic precompiled headers unless
// OPFUSE_NVRTC_PCH=0 (note "Automatic PCH" in nvrtc_compiler.cpp). Throws JitError on failure,
// whose message starts with "failed to compile kernel '<name>' for <arch>:" followed by NVRTC's
// log.
CompiledKernel compile_kernel(const CompileRequest& request);

struct CompileAllStats {
  int hits = 0;                   // kernels served by the cache
  int misses = 0;                 // kernels compiled by NVRTC
  std::vector<double> kernel_ms;  // per request, in request order: compile or load time
  double wall_ms = 0.0;
};

struct CompileAllResult {
  std::vector<CompiledKernel> kernels;  // in request order
  CompileAllStats stats;
};

// Compiles independent requests on up to `threads` threads (<= 0: hardware concurrency),
// consulting `cache_or_null` first and storing what it compiles. When kernels fail, throws the
// JitError of the first failing request (in request order), noting how many others failed.
CompileAllResult compile_all(const std::vector<CompileRequest>& requests,
                             KernelCache* cache_or_null, int threads = 0);

// Sets kernel.registers, spills and stack_bytes from kernel.binary and kernel.log (note "Usage
// sources" in nvrtc_compiler.cpp); compile_kernel and cache loads call it.
void read_kernel_usage(CompiledKernel& kernel);

// The NVRTC options compile_kernel uses for `request`: opfuse's own, then extra_options.
std::vector<std::string> nvrtc_options(const CompileRequest& request);
// The kernel-cache key of `request` in this process: the source, the templates directory's
// contents (hashed once per process), the options, arch, name expressions, NVRTC's version and
// opfuse::kCodegenVersion.
std::string cache_key_for(const CompileRequest& request);
// How many times this process has invoked nvrtcCompileProgram (lets tests prove a cache hit).
std::uint64_t nvrtc_compile_count();

}  // namespace opfuse::jit
