#include "jit/nvrtc_compiler.h"

#include <fmt/format.h>
#include <nvrtc.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <set>
#include <string_view>
#include <thread>

#include "jit/cubin_info.h"
#include "jit/cuda_paths.h"
#include "jit/kernel_cache.h"
#include "jit/ptxas_log.h"
#include "jit/sha256.h"
#include "opfuse/version.h"

namespace opfuse::jit {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<std::uint64_t> compile_program_calls{0};

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// What every compile in this process shares; discovered (and the templates hashed) once.
struct JitContext {
  JitPaths paths;
  std::string templates_digest;
  std::string nvrtc_version;
};

JitContext make_context() {
  JitContext context;
  context.paths = find_jit_paths();
  context.templates_digest = hash_templates_dir(context.paths.templates_dir);
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) throw JitError("nvrtcVersion failed");
  context.nvrtc_version = fmt::format("{}.{}", major, minor);
  return context;
}

// A throwing initializer leaves the static uninitialized, so a later call retries.
const JitContext& jit_context() {
  static const JitContext context = make_context();
  return context;
}

// Note "Automatic PCH": NVRTC's --pch caches the parsed headers of a program in
// $TMPDIR/__nvrtc_auto_pch_<pid>_0 and reuses them for later programs with the same includes.
// Measured on a small fp8 cast kernel (cuda_fp8.h + cuda_bf16.h), warm compiles in one process
// took 53 -> 35 ms here (2 shared cores) and 41-86 -> 9-13 ms on the H200 host; the first
// compile pays ~15-30 ms more to create the PCH. The output is byte-identical, so PCH stays out
// of the cache key. It is used only by the process that first compiled: a forked child inherits
// NVRTC's state pointing at the parent's directory and would leave files there that nobody
// removes. OPFUSE_NVRTC_PCH=0 turns it off.
bool use_automatic_pch() {
  static const pid_t first_compiling_process = getpid();
  const char* setting = std::getenv("OPFUSE_NVRTC_PCH");
  if (setting != nullptr && std::string_view(setting) == "0") return false;
  return getpid() == first_compiling_process;
}

bool arch_is_ptx(const std::string& arch) { return arch.rfind("compute_", 0) == 0; }

std::string failure_prefix(const CompileRequest& request) {
  return fmt::format("failed to compile kernel '{}' for {}:", request.kernel_name, request.arch);
}

void check_arch(const CompileRequest& request) {
  if (!is_arch_name(request.arch)) {
    throw JitError(fmt::format(
        "{} unsupported arch '{}'; use sm_XX, sm_XXa or sm_XXf for a cubin (e.g. sm_90a) or "
        "compute_XX for PTX",
        failure_prefix(request), request.arch));
  }
}

// Owns an nvrtcProgram so every exit path destroys it.
class Program {
 public:
  explicit Program(const CompileRequest& request) {
    const std::string file_name =
        (request.kernel_name.empty() ? "kernel" : request.kernel_name) + ".cu";
    const nvrtcResult result = nvrtcCreateProgram(&program_, request.source.c_str(),
                                                  file_name.c_str(), 0, nullptr, nullptr);
    if (result != NVRTC_SUCCESS) {
      throw JitError(fmt::format("{} nvrtcCreateProgram: {}", failure_prefix(request),
                                 nvrtcGetErrorString(result)));
    }
  }
  ~Program() { nvrtcDestroyProgram(&program_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return program_; }

 private:
  nvrtcProgram program_ = nullptr;
};

std::string program_log(nvrtcProgram program) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

std::vector<char> program_binary(nvrtcProgram program, bool is_ptx) {
  std::size_t size = 0;
  std::vector<char> binary;
  if (is_ptx) {
    if (nvrtcGetPTXSize(program, &size) != NVRTC_SUCCESS) return {};
    binary.resize(size);
    if (nvrtcGetPTX(program, binary.data()) != NVRTC_SUCCESS) return {};
  } else {
    if (nvrtcGetCUBINSize(program, &size) != NVRTC_SUCCESS) return {};
    binary.resize(size);
    if (nvrtcGetCUBIN(program, binary.data()) != NVRTC_SUCCESS) return {};
  }
  return binary;
}

// Spill bytes from the log, counting only blocks of functions in this cubin (a callee's symbol
// is "$kernel$callee", its log name "callee"); unknown (-1) unless every entry function has one,
// since a log missing some blocks may miss the one that spills.
void spills_from_log(const CubinInfo& cubin, const std::string& log, CompiledKernel& kernel) {
  std::set<std::string> names;
  for (const CubinFunction& function : cubin.functions) {
    names.insert(function.name);
    names.insert(function.name.substr(function.name.rfind('$') + 1));
  }
  std::set<std::string> logged;
  int stores = 0, loads = 0;
  for (const LogFunctionSpills& block : log_function_spills(log)) {
    if (!names.contains(block.function)) continue;
    logged.insert(block.function);
    stores = std::max(stores, block.store_bytes);
    loads = std::max(loads, block.load_bytes);
  }
  for (const CubinFunction& entry : cubin.entry_functions()) {
    if (!logged.contains(entry.name)) return;
  }
  kernel.spill_store_bytes = stores;
  kernel.spill_load_bytes = loads;
}

// A missing header is the one failure whose fix is outside the source: say where we looked.
std::string include_hint(const std::string& log, const std::vector<std::string>& options) {
  if (log.find("cannot open source file") == std::string::npos) return {};
  std::string searched;
  for (const std::string& option : options) {
    if (option.rfind("-I", 0) == 0) searched += (searched.empty() ? "" : ", ") + option.substr(2);
  }
  return fmt::format(
      "\nhint: the include path was: {}. Set OPFUSE_TEMPLATES_DIR to opfuse's templates/ "
      "directory, or CUDA_HOME to the CUDA toolkit, if a header lives elsewhere",
      searched.empty() ? "(empty)" : searched);
}

void run_one(const CompileRequest& request, KernelCache* cache, CompileAllResult& result,
             std::size_t index) {
  const Clock::time_point start = Clock::now();
  std::string key;
  if (cache != nullptr) {
    key = cache_key_for(request);
    if (std::optional<CompiledKernel> cached = cache->load(key)) {
      cached->kernel_name = request.kernel_name;
      cached->cache_hit = true;
      // Entries written before note "Usage sources" may hold -1 registers from a parallel build.
      read_kernel_usage(*cached);
      cached->compile_ms = milliseconds_since(start);
      result.kernels[index] = std::move(*cached);
      result.stats.kernel_ms[index] = result.kernels[index].compile_ms;
      return;
    }
  }
  result.kernels[index] = compile_kernel(request);
  if (cache != nullptr) cache->store(key, result.kernels[index]);
  result.stats.kernel_ms[index] = milliseconds_since(start);
}

}  // namespace

std::vector<std::string> nvrtc_options(const CompileRequest& request) {
  const JitPaths& paths = jit_context().paths;
  // No --use_fast_math: quantization scales must be computed with IEEE division.
  std::vector<std::string> options = {
      "--gpu-architecture=" + request.arch,
      "-std=c++17",
      "-default-device",
      "-lineinfo",
      "-Xptxas=-v",  // puts spills in the log (note "Usage sources")
      // NVRTC's own cache (on hosts with a driver) skips ptxas on a hit, leaving no ptxas -v
      // lines in the log; opfuse's kernel cache, whose keys name every input, replaces it.
      "--no-cache",
      // NVRTC otherwise seeds internal symbol names randomly, so the same input would give
      // different cubin bytes; a seed from the source keeps modules distinct yet reproducible.
      "-frandom-seed=0x" + sha256_hex(request.source).substr(0, 8),
      "-I" + paths.cuda_include_dir,
  };
  if (!paths.cccl_include_dir.empty()) options.push_back("-I" + paths.cccl_include_dir);
  if (!paths.templates_dir.empty()) options.push_back("-I" + paths.templates_dir);
  options.insert(options.end(), request.extra_options.begin(), request.extra_options.end());
  return options;
}

std::string cache_key_for(const CompileRequest& request) {
  const JitContext& context = jit_context();
  KernelCacheKeyInputs inputs;
  inputs.source = request.source;
  inputs.templates_digest = context.templates_digest;
  inputs.options = nvrtc_options(request);
  inputs.arch = request.arch;
  inputs.name_expressions = request.name_expressions;
  inputs.nvrtc_version = context.nvrtc_version;
  inputs.codegen_version = kCodegenVersion;
  return kernel_cache_key(inputs);
}

std::uint64_t nvrtc_compile_count() { return compile_program_calls.load(); }

// Note "Usage sources": registers and stack sizes come from the cubin's EIATTR records, which are
// always there, not from the ptxas -v lines of the NVRTC log, which are not: on the GPU hosts NVRTC
// 13 keeps its own compile cache (in the driver's compute cache) and a hit skips ptxas, so a
// recompile's log had no -v lines (the parallel test recompiles what its serial pass compiled, and
// read -1 registers). --no-cache turns that cache off. The cubin holds no spill counts, but spills
// live in the stack frame (ptxas spills to local memory; CUDA 13's shared-memory spilling is opt-in
// per kernel and unused here), so a zero cumulative stack means zero spills; past that the log's
// counts are used when it has every entry function, and -1 (unknown) when not. The log stands in
// for the cubin only where the cubin cannot be read or lacks a register record, which NVRTC 13's
// output never does.
void read_kernel_usage(CompiledKernel& kernel) {
  kernel.registers = kernel.spill_store_bytes = kernel.spill_load_bytes = kernel.stack_bytes = -1;
  if (kernel.is_ptx) return;  // no ptxas ran
  CubinInfo cubin;
  try {
    cubin = read_cubin_info(kernel.binary);
  } catch (const CubinFormatError&) {
    kernel.registers = log_largest_registers(kernel.log);
    const LogSpills spills = log_largest_spills(kernel.log);
    kernel.spill_store_bytes = spills.store_bytes;
    kernel.spill_load_bytes = spills.load_bytes;
    return;
  }
  const std::vector<CubinFunction> entries = cubin.entry_functions();
  if (entries.empty()) return;
  int stack_bytes = 0;
  for (const CubinFunction& entry : entries) {
    kernel.registers = std::max(kernel.registers, entry.registers);
    const int entry_stack = entry.stack_bytes >= 0 ? entry.stack_bytes : entry.frame_bytes;
    stack_bytes = entry_stack < 0 || stack_bytes < 0 ? -1 : std::max(stack_bytes, entry_stack);
  }
  if (kernel.registers < 0) kernel.registers = log_largest_registers(kernel.log);
  kernel.stack_bytes = stack_bytes;
  if (stack_bytes == 0) {
    kernel.spill_store_bytes = kernel.spill_load_bytes = 0;
  } else {
    spills_from_log(cubin, kernel.log, kernel);
  }
}

CompiledKernel compile_kernel(const CompileRequest& request) {
  const Clock::time_point start = Clock::now();
  check_arch(request);
  std::vector<std::string> options = nvrtc_options(request);
  if (use_automatic_pch()) {
    // Messages off: they would make the logs of a cold and a warm compile differ.
    options.insert(options.end(), {"--pch", "--pch-messages=false", "--pch-verbose=false"});
  }
  std::vector<const char*> option_pointers;
  option_pointers.reserve(options.size());
  for (const std::string& option : options) option_pointers.push_back(option.c_str());

  Program program(request);
  for (const std::string& expression : request.name_expressions) {
    const nvrtcResult result = nvrtcAddNameExpression(program.get(), expression.c_str());
    if (result != NVRTC_SUCCESS) {
      throw JitError(fmt::format("{} name expression '{}': {}", failure_prefix(request), expression,
                                 nvrtcGetErrorString(result)));
    }
  }
  compile_program_calls++;
  const nvrtcResult compiled = nvrtcCompileProgram(
      program.get(), static_cast<int>(option_pointers.size()), option_pointers.data());
  CompiledKernel kernel;
  kernel.log = program_log(program.get());
  if (compiled != NVRTC_SUCCESS) {
    const std::string log = kernel.log.empty() ? nvrtcGetErrorString(compiled) : kernel.log;
    throw JitError(
        fmt::format("{}\n{}{}", failure_prefix(request), log, include_hint(log, options)));
  }

  kernel.kernel_name = request.kernel_name;
  kernel.arch = request.arch;
  kernel.is_ptx = arch_is_ptx(request.arch);
  for (const std::string& expression : request.name_expressions) {
    const char* lowered = nullptr;
    const nvrtcResult result = nvrtcGetLoweredName(program.get(), expression.c_str(), &lowered);
    if (result != NVRTC_SUCCESS || lowered == nullptr) {
      throw JitError(fmt::format(
          "{} name expression '{}' does not name a __global__ function or __device__ variable "
          "of the source ({})",
          failure_prefix(request), expression, nvrtcGetErrorString(result)));
    }
    kernel.lowered_names[expression] = lowered;
  }
  kernel.binary = program_binary(program.get(), kernel.is_ptx);
  if (kernel.binary.empty()) {
    throw JitError(fmt::format("{} NVRTC produced no {}", failure_prefix(request),
                               kernel.is_ptx ? "PTX" : "cubin"));
  }
  read_kernel_usage(kernel);
  kernel.compile_ms = milliseconds_since(start);
  return kernel;
}

// Why threads help less than expected: NVRTC 13.0 serializes most of a compile inside one
// process (on the 16-core H200 host, 16 threads gave 58 ms/compile vs 82 ms with one, and with
// PCH 11.4 vs 12.6 ms), while separate processes scale almost linearly. Threads still overlap
// cache I/O and the parts NVRTC does run concurrently.
CompileAllResult compile_all(const std::vector<CompileRequest>& requests,
                             KernelCache* cache_or_null, int threads) {
  const Clock::time_point start = Clock::now();
  CompileAllResult result;
  result.kernels.resize(requests.size());
  result.stats.kernel_ms.assign(requests.size(), 0.0);
  std::vector<std::exception_ptr> failures(requests.size());

  std::atomic<std::size_t> next_index{0};
  auto worker = [&] {
    for (std::size_t i = next_index++; i < requests.size(); i = next_index++) {
      try {
        run_one(requests[i], cache_or_null, result, i);
      } catch (...) {
        failures[i] = std::current_exception();
      }
    }
  };
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::size_t thread_count = std::min<std::size_t>(threads, requests.size());
  if (thread_count <= 1) {
    worker();
  } else {
    std::vector<std::jthread> pool;
    for (std::size_t t = 0; t < thread_count; ++t) pool.emplace_back(worker);
  }

  std::vector<std::size_t> failed;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (failures[i]) failed.push_back(i);
  }
  if (!failed.empty()) {
    if (failed.size() == 1) std::rethrow_exception(failures[failed.front()]);
    std::string others;
    for (std::size_t k = 1; k < failed.size(); ++k) {
      others += fmt::format("{}'{}'", k > 1 ? ", " : "", requests[failed[k]].kernel_name);
    }
    try {
      std::rethrow_exception(failures[failed.front()]);
    } catch (const JitError& first) {
      throw JitError(fmt::format("{}\n({} more kernels failed to compile: {})", first.what(),
                                 failed.size() - 1, others));
    }
  }
  for (const CompiledKernel& kernel : result.kernels) {
    (kernel.cache_hit ? result.stats.hits : result.stats.misses)++;
  }
  result.stats.wall_ms = milliseconds_since(start);
  return result;
}

}  // namespace opfuse::jit
