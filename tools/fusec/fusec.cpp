// fusec: the opfuse command-line compiler.
//
// Exit codes (also in --help and the README):
//   0  success
//   1  user error in a .fuse program (diagnostics printed); for build, also a kernel that NVRTC
//      rejects (its name and log printed) or an output that cannot be written
//   2  usage error (bad command line)
//   3  internal error (a bug in opfuse; please report it with the input)
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/build_dir.h"
#include "api/program_impl.h"
#include "bench/bench.h"
#include "codegen/kernel_source.h"
#include "codegen/plan.h"
#include "driver/frontend.h"
#include "gpu/device.h"
#include "ir/printer.h"
#include "jit/kernel_cache.h"
#include "jit/nvrtc_compiler.h"
#include "jit/ptxas_log.h"
#include "opfuse/program.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "reference/run_driver.h"
#include "run/gpu_run.h"
#include "support/assert.h"
#include "support/atomic_file.h"

extern char** environ;  // posix_spawnp's environment

namespace {

constexpr int kExitOk = 0;
constexpr int kExitUserError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 3;

constexpr const char* kExitCodeHelp =
    "Exit codes: 0 success, 1 errors in a .fuse program, 2 usage error, 3 internal error "
    "(a bug in opfuse). build also exits 1 when a kernel fails to compile or an output cannot "
    "be written.";

struct CommonOptions {
  std::string recipe;
  bool warnings_as_errors = false;
};

void add_common(CLI::App* cmd, CommonOptions& common) {
  cmd->add_option("--recipe", common.recipe,
                  "use this declared recipe (or bf16) for every sequence instead of its own");
  cmd->add_flag("--Werror", common.warnings_as_errors, "treat warnings as errors");
}

// Loads one file; prints its diagnostics. Returns nullopt on user errors.
std::optional<opfuse::ir::Program> load(const std::string& path, const CommonOptions& common,
                                        opfuse::SourceManager& sources) {
  opfuse::DiagnosticEngine diags(sources);
  diags.set_warnings_as_errors(common.warnings_as_errors);
  opfuse::ir::BuildOptions build;
  build.recipe_override = common.recipe;
  auto program = opfuse::load_program(path, sources, diags, build);
  std::fputs(diags.format_all().c_str(), stderr);
  if (diags.has_errors()) {
    std::fprintf(stderr, "%s: %zu error%s, %zu warning%s\n", path.c_str(), diags.error_count(),
                 diags.error_count() == 1 ? "" : "s", diags.warning_count(),
                 diags.warning_count() == 1 ? "" : "s");
    return std::nullopt;
  }
  return program;
}

int run_check(const std::vector<std::string>& files, const CommonOptions& common) {
  int status = kExitOk;
  for (const std::string& f : files) {
    opfuse::SourceManager sources;
    if (!load(f, common, sources)) status = kExitUserError;
  }
  return status;
}

// Narrows `program` to the sequence `name` (empty: all of them); false (reported) when absent.
bool select_sequence(opfuse::ir::Program& program, const std::string& name,
                     const std::string& file) {
  if (name.empty()) return true;
  const opfuse::ir::Sequence* s = program.find_sequence(name);
  if (!s) {
    std::string names;
    for (const auto& seq : program.sequences) names += " " + seq.name;
    std::fprintf(stderr, "fusec: error: no sequence '%s' in %s; sequences:%s\n", name.c_str(),
                 file.c_str(), names.c_str());
    return false;
  }
  opfuse::ir::Program only;
  only.recipes = program.recipes;
  only.sequences.push_back(*s);
  program = std::move(only);
  return true;
}

struct IrOptions {
  std::string file;
  std::string sequence;
  std::string after;
  std::vector<std::string> disable;
  bool timings = false;
};

int run_ir(const IrOptions& opts, const CommonOptions& common) {
  opfuse::passes::PassManager manager(opfuse::passes::default_pipeline());
  opfuse::passes::PassOptions pass_options;
  pass_options.disabled.insert(opts.disable.begin(), opts.disable.end());
  if (opts.after == "all") {
    pass_options.print_after.insert("all");
  } else if (!opts.after.empty()) {
    pass_options.stop_after = opts.after;
  }
  if (auto unknown = manager.unknown_names(pass_options); !unknown.empty()) {
    std::string names;
    for (const auto& p : manager.passes()) names += fmt::format(" {}", p.name);
    std::fprintf(stderr, "fusec: error: unknown pass '%s'; passes:%s (or 'all' for --after)\n",
                 unknown[0].c_str(), names.c_str());
    return kExitUsage;
  }
  opfuse::SourceManager sources;
  auto program = load(opts.file, common, sources);
  if (!program) return kExitUserError;
  if (!select_sequence(*program, opts.sequence, opts.file)) return kExitUserError;
  auto print = [&](std::string_view title, const opfuse::ir::Program& p) {
    std::printf("// ----- IR after %.*s -----\n%s", int(title.size()), title.data(),
                opfuse::ir::print_program(p, &sources).c_str());
  };
  if (opts.after == "all") print("build", *program);
  const auto timings = manager.run(*program, pass_options, print);
  // --after all printed each change already; otherwise show the IR where the pipeline stopped.
  if (opts.after != "all")
    std::fputs(opfuse::ir::print_program(*program, &sources).c_str(), stdout);
  if (opts.timings) {
    std::fprintf(stderr, "%-24s %10s  %s\n", "pass", "ms", "result");
    for (const auto& t : timings)
      std::fprintf(stderr, "%-24s %10.3f  %s\n", t.name.c_str(), t.milliseconds,
                   t.skipped   ? "disabled"
                   : t.changed ? "changed"
                               : "no change");
  }
  return kExitOk;
}

struct RunCommandOptions {
  std::string file;
  std::string sequence;
  std::string device = "auto";
  std::vector<std::string> binds;
  int steps = 1;
  uint64_t seed = 0;
  double lr = 0.01;
};

// NAME=SIZE pairs; nullopt after reporting the first malformed one.
std::optional<std::map<std::string, int64_t>> parse_bindings(
    const std::vector<std::string>& binds) {
  std::map<std::string, int64_t> bindings;
  for (const std::string& bind : binds) {
    const size_t eq = bind.find('=');
    bool ok = eq != std::string::npos && eq > 0 && eq + 1 < bind.size();
    if (ok) {
      try {
        size_t used = 0;
        bindings[bind.substr(0, eq)] = std::stoll(bind.substr(eq + 1), &used);
        ok = used == bind.size() - eq - 1;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok) {
      std::fprintf(stderr, "fusec: error: --bind '%s' is not NAME=SIZE (e.g. --bind tokens=64)\n",
                   bind.c_str());
      return std::nullopt;
    }
  }
  return bindings;
}

// `fusec run --device gpu`: compile through the kernel cache, then the GPU training loop.
int run_on_gpu(const RunCommandOptions& opts, const CommonOptions& common,
               const opfuse::cpu::RunOptions& run) {
  std::string no_gpu;
  if (!opfuse::gpu::gpu_available(&no_gpu)) {
    std::fprintf(stderr,
                 "fusec: error: --device gpu: %s; use --device cpu (the CPU reference executor)\n",
                 no_gpu.c_str());
    return kExitUserError;
  }
  try {
    opfuse::CompileOptions compile;
    compile.recipe = common.recipe;
    const opfuse::Program program = opfuse::Program::compile_file(opts.file, compile);
    opfuse::api::GpuRunOptions gpu_run;
    gpu_run.sequence = opts.sequence;
    gpu_run.bindings.insert(run.bindings.begin(), run.bindings.end());
    gpu_run.steps = run.steps;
    gpu_run.seed = run.seed;
    gpu_run.lr = run.lr;
    std::fputs(opfuse::api::run_gpu_training(program, gpu_run).c_str(), stdout);
  } catch (const opfuse::CompileError& e) {
    std::fputs(e.what(), stderr);
    return kExitUserError;
  } catch (const opfuse::Error& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

int run_run(const RunCommandOptions& opts, const CommonOptions& common) {
  opfuse::cpu::RunOptions run;
  const auto bindings = parse_bindings(opts.binds);
  if (!bindings) return kExitUsage;
  run.bindings.insert(bindings->begin(), bindings->end());
  run.steps = opts.steps;
  run.seed = opts.seed;
  run.lr = opts.lr;
  std::string no_gpu;
  const bool on_gpu =
      opts.device == "gpu" || (opts.device == "auto" && opfuse::gpu::gpu_available(&no_gpu));
  if (opts.device == "auto" && !on_gpu)
    std::fprintf(stderr, "fusec: no GPU (%s): running on the CPU reference\n", no_gpu.c_str());
  if (on_gpu) return run_on_gpu(opts, common, run);
  opfuse::SourceManager sources;
  auto program = load(opts.file, common, sources);
  if (!program) return kExitUserError;
  const opfuse::ir::Sequence* seq = nullptr;
  std::string names;
  for (const auto& s : program->sequences) names += " " + s.name;
  if (!opts.sequence.empty()) {
    seq = program->find_sequence(opts.sequence);
    if (!seq) {
      std::fprintf(stderr, "fusec: error: no sequence '%s' in %s; sequences:%s\n",
                   opts.sequence.c_str(), opts.file.c_str(), names.c_str());
      return kExitUserError;
    }
  } else if (program->sequences.size() == 1) {
    seq = &program->sequences[0];
  } else {
    std::fprintf(stderr, "fusec: error: %s has %zu sequences; pick one with --sequence NAME:%s\n",
                 opts.file.c_str(), program->sequences.size(), names.c_str());
    return kExitUserError;
  }
  try {
    std::fputs(opfuse::cpu::run_reference_training(*seq, run).c_str(), stdout);
  } catch (const opfuse::cpu::ReferenceError& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

// ---- build and dump-kernels ---------------------------------------------------------------------

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct BuildCommandOptions {
  std::string file;
  std::string out_dir;
  std::string arch = "sm_90a";
  std::vector<std::string> disable;  // passes to skip
  std::string sequence;
};

// Loads the file (narrowed to --sequence); nullopt after printing the user errors.
std::optional<opfuse::ir::Program> load_selected(const BuildCommandOptions& opts,
                                                 const CommonOptions& common,
                                                 opfuse::SourceManager& sources) {
  auto program = load(opts.file, common, sources);
  if (!program || !select_sequence(*program, opts.sequence, opts.file)) return std::nullopt;
  return program;
}

// Runs the whole pass pipeline and builds the plan; nullopt after printing the user errors.
struct CompiledProgram {
  opfuse::ir::Program program;
  opfuse::codegen::Plan plan;
};
std::optional<CompiledProgram> compile_program(opfuse::ir::Program program,
                                               const BuildCommandOptions& opts,
                                               const opfuse::SourceManager& sources) {
  opfuse::passes::PassOptions pass_options;
  pass_options.disabled.insert(opts.disable.begin(), opts.disable.end());
  opfuse::passes::PassManager(opfuse::passes::default_pipeline())
      .run(program, pass_options, nullptr);
  try {
    opfuse::codegen::Plan plan = opfuse::codegen::build_plan(program, {opts.arch, &sources});
    return CompiledProgram{std::move(program), std::move(plan)};
  } catch (const opfuse::codegen::CodegenError& e) {
    opfuse::DiagnosticEngine diags(sources);
    diags.error(e.loc(), e.what(), e.hint());
    std::fputs(diags.format_all().c_str(), stderr);
    return std::nullopt;
  }
}

bool make_directory(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error || !fs::is_directory(dir)) {
    std::fprintf(stderr, "fusec: error: cannot create the output directory %s: %s\n", dir.c_str(),
                 error ? error.message().c_str() : "not a directory");
    return false;
  }
  return true;
}

// Every output is written atomically: a reader (or a concurrent build) sees a whole file. Not
// fsync'd: a rebuild recreates outputs, and fsyncs were most of a warm build's time.
bool write_output(const std::string& path, std::string_view bytes) {
  const std::string failure =
      opfuse::write_file_atomically(path, bytes, opfuse::Durability::VisibleOnly);
  if (failure.empty()) return true;
  std::fprintf(stderr, "fusec: error: cannot write %s: %s\n", path.c_str(), failure.c_str());
  return false;
}

// Removes kernel files an earlier build left in the directory: kernels this plan does not have
// and, after a build, binaries of the other kind (.cubin vs .ptx) than `binary_ext`.
void remove_stale_kernels(const std::string& kernels_dir, const opfuse::codegen::Plan& plan,
                          const std::string& binary_ext = "") {
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(kernels_dir, error)) {
    const fs::path& path = entry.path();
    const std::string ext = path.extension().string();
    if (ext != ".cu" && ext != ".cubin" && ext != ".ptx") continue;
    if (plan.find_kernel(path.stem().string()) == nullptr ||
        (!binary_ext.empty() && ext != ".cu" && ext != binary_ext))
      stale.push_back(path);
  }
  for (const fs::path& path : stale) fs::remove(path, error);
}

// The "[3/7] compiling NAME" line on a terminal; warnings printed through it do not tear it.
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled) {}
  void show(const std::string& text) {
    if (!enabled_) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    std::fprintf(stderr, "\r%s\033[K", text.c_str());
    std::fflush(stderr);
  }
  void clear() {
    if (!enabled_) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
  void print_line(const std::string& line) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (enabled_) std::fputs("\r\033[K", stderr);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::mutex mutex_;
};

struct CompileOutcome {
  std::vector<opfuse::jit::CompiledKernel> kernels;  // request order
  std::vector<std::string> failures;                 // one message per failed kernel
  double wall_ms = 0;
};

// Compiles the kernels on every core, each through compile_all (cache lookup, NVRTC, store), so
// that the progress line can name the kernel being compiled.
CompileOutcome compile_kernels(const std::vector<opfuse::jit::CompileRequest>& requests,
                               opfuse::jit::KernelCache& cache, ProgressLine& progress) {
  const Clock::time_point start = Clock::now();
  CompileOutcome outcome;
  outcome.kernels.resize(requests.size());
  std::vector<std::string> failures(requests.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < requests.size(); i = next++) {
      progress.show(
          fmt::format("[{}/{}] compiling {}", i + 1, requests.size(), requests[i].kernel_name));
      try {
        outcome.kernels[i] = opfuse::jit::compile_all({requests[i]}, &cache, 1).kernels.at(0);
      } catch (const std::exception& e) {
        failures[i] = e.what();
      }
    }
  };
  const size_t threads =
      std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), requests.size());
  {
    std::vector<std::jthread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
  }
  progress.clear();
  for (std::string& f : failures)
    if (!f.empty()) outcome.failures.push_back(std::move(f));
  outcome.wall_ms = milliseconds_since(start);
  return outcome;
}

std::string ops_text(const std::vector<opfuse::codegen::OpRef>& ops) {
  std::string text;
  for (const auto& op : ops) {
    text += fmt::format("{}{} \"{}\"{}", text.empty() ? "" : ", ", op.op, op.instance,
                        op.location.empty() ? "" : " (" + op.location + ")");
  }
  return text.empty() ? "the end-of-step scale update" : text;
}

std::string build_report(const opfuse::codegen::Plan& plan, const CompileOutcome& compiled,
                         const opfuse::jit::KernelCache& cache, double total_ms) {
  const opfuse::jit::KernelCacheStats stats = cache.stats();
  std::string r = fmt::format("fusec build report\nsource: {}\narch: {}\n", plan.source, plan.arch);
  r += fmt::format("kernel cache: {}{}\n", cache.directory().empty() ? "(none)" : cache.directory(),
                   cache.writable() ? "" : " (not writable: nothing stored)");
  r += fmt::format("cache: {} hits, {} misses ({} corrupt entries recompiled), {} stored\n",
                   stats.hits, stats.misses, stats.corrupt_entries, stats.stores);
  double compile_ms = 0, load_ms = 0;
  for (const auto& k : compiled.kernels) (k.cache_hit ? load_ms : compile_ms) += k.compile_ms;
  r += fmt::format(
      "compile stage: {:.1f} ms wall; NVRTC {:.1f} ms, cache loads {:.1f} ms (summed over "
      "kernels)\n",
      compiled.wall_ms, compile_ms, load_ms);
  r += fmt::format("build: {:.1f} ms in all\n\n", total_ms);
  r += fmt::format("{} kernels:\n", plan.kernels.size());
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const auto& kernel = plan.kernels[i];
    const auto& binary = compiled.kernels.at(i);
    r += fmt::format("  {}  [{} {:.1f} ms, {} registers, {} bytes spilled]\n", kernel.id,
                     binary.cache_hit ? "cache hit" : "compiled", binary.compile_ms,
                     binary.registers, binary.spill_store_bytes);
    r += fmt::format("    {}\n", kernel.name_expression);
    for (const auto& use : kernel.uses) {
      r += fmt::format("    {} {}{}: {}\n", use.sequence, opfuse::ir::phase_name(use.phase),
                       use.pattern.empty() ? "" : " fused " + use.pattern, ops_text(use.ops));
    }
  }
  for (const auto& s : plan.sequences) {
    size_t gemms = 0;
    for (const auto& step : s.steps)
      gemms += std::holds_alternative<opfuse::codegen::GemmStep>(step.body);
    r += fmt::format("\nsequence {}: {} steps ({} GEMMs, {} kernel launches)\n", s.name,
                     s.steps.size(), gemms, s.steps.size() - gemms);
    for (const auto& step : s.steps) {
      r += fmt::format("  {:3} {:8} {}{}\n", step.index, opfuse::ir::phase_name(step.phase),
                       step.what, step.ops.empty() ? "" : "  <- " + ops_text(step.ops));
      if (step.inference) {
        r += fmt::format("               inference forwards run {} (without the transposed copy)\n",
                         step.inference->launch.kernel);
      }
    }
  }
  return r;
}

// --disable-pass names that are not passes; reported as a usage error.
bool pass_names_are_known(const BuildCommandOptions& opts) {
  const opfuse::passes::PassManager manager(opfuse::passes::default_pipeline());
  opfuse::passes::PassOptions pass_options;
  pass_options.disabled.insert(opts.disable.begin(), opts.disable.end());
  const auto unknown = manager.unknown_names(pass_options);
  if (unknown.empty()) return true;
  std::string names;
  for (const auto& p : manager.passes()) names += fmt::format(" {}", p.name);
  std::fprintf(stderr, "fusec: error: unknown pass '%s'; passes:%s\n", unknown[0].c_str(),
               names.c_str());
  return false;
}

int run_build(const BuildCommandOptions& opts, const CommonOptions& common) {
  const Clock::time_point start = Clock::now();
  if (!pass_names_are_known(opts)) return kExitUsage;
  opfuse::SourceManager sources;
  auto loaded = load_selected(opts, common, sources);
  if (!loaded) return kExitUserError;
  auto compiled = compile_program(std::move(*loaded), opts, sources);
  if (!compiled) return kExitUserError;
  const opfuse::codegen::Plan& plan = compiled->plan;
  const std::string kernels_dir = opts.out_dir + "/kernels";
  if (!make_directory(kernels_dir)) return kExitUserError;

  const std::vector<opfuse::jit::CompileRequest> requests =
      opfuse::kernel_requests(plan, opts.arch);
  for (const auto& request : requests) {
    if (!write_output(kernels_dir + "/" + request.kernel_name + ".cu", request.source))
      return kExitUserError;
  }

  ProgressLine progress(::isatty(STDERR_FILENO) != 0);
  opfuse::jit::KernelCache cache(
      opfuse::jit::KernelCache::default_directory(),
      [&](const std::string& message) { progress.print_line("fusec: warning: " + message); });
  const CompileOutcome outcome = compile_kernels(requests, cache, progress);
  if (!outcome.failures.empty()) {
    for (const std::string& failure : outcome.failures)
      std::fprintf(stderr, "fusec: error: %s\n", failure.c_str());
    std::fprintf(stderr, "fusec: %zu of %zu kernels failed to compile; nothing else was written\n",
                 outcome.failures.size(), requests.size());
    return kExitUserError;
  }
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const auto& binary = outcome.kernels[i];
    std::string_view bytes(binary.binary.data(), binary.binary.size());
    if (binary.is_ptx && !bytes.empty() && bytes.back() == '\0') bytes.remove_suffix(1);
    const std::string path =
        kernels_dir + "/" + plan.kernels[i].id + (binary.is_ptx ? ".ptx" : ".cubin");
    if (!write_output(path, bytes)) return kExitUserError;
  }
  const std::string plan_text = opfuse::codegen::plan_json_text(plan);
  if (!write_output(opts.out_dir + "/plan.json", plan_text)) return kExitUserError;
  // The manifest opfuse::Program::load_build verifies the directory against.
  if (!write_output(opts.out_dir + "/kernels.json",
                    opfuse::api::build_manifest_text(plan, plan_text, outcome.kernels)))
    return kExitUserError;
  remove_stale_kernels(kernels_dir, plan, opts.arch.starts_with("compute_") ? ".ptx" : ".cubin");
  const double total_ms = milliseconds_since(start);
  if (!write_output(opts.out_dir + "/report.txt", build_report(plan, outcome, cache, total_ms)))
    return kExitUserError;

  const auto stats = cache.stats();
  size_t steps = 0, gemms = 0;
  for (const auto& s : plan.sequences) {
    steps += s.steps.size();
    for (const auto& step : s.steps)
      gemms += std::holds_alternative<opfuse::codegen::GemmStep>(step.body);
  }
  std::printf(
      "fusec: built %s for %s: %zu kernels (%lld compiled, %lld from the cache) in %.0f ms; "
      "%zu sequence%s, %zu steps, %zu GEMMs -> %s\n",
      plan.source.c_str(), plan.arch.c_str(), plan.kernels.size(),
      static_cast<long long>(requests.size()) - static_cast<long long>(stats.hits),
      static_cast<long long>(stats.hits), total_ms, plan.sequences.size(),
      plan.sequences.size() == 1 ? "" : "s", steps, gemms, opts.out_dir.c_str());
  return kExitOk;
}

// The first `name` in $PATH that is an executable file; "" when none.
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "";
  for (size_t begin = 0; begin <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', begin), dirs.size());
    std::string candidate =
        (end > begin ? dirs.substr(begin, end - begin) : std::string(".")) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate;
    begin = end + 1;
  }
  return {};
}

// Runs clang-format over `source` (CUDA, the project's style); nullopt when it fails.
std::optional<std::string> clang_format(const std::string& exe, const std::string& source) {
  const fs::path tmp = fs::temp_directory_path();
  std::string in_path = (tmp / "fusec-format-in-XXXXXX").string();
  std::string out_path = (tmp / "fusec-format-out-XXXXXX").string();
  const int in_fd = ::mkstemp(in_path.data());
  const int out_fd = in_fd < 0 ? -1 : ::mkstemp(out_path.data());
  std::optional<std::string> formatted;
  if (in_fd >= 0 && out_fd >= 0 &&
      ::write(in_fd, source.data(), source.size()) == static_cast<ssize_t>(source.size())) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
    std::string style = "--style={BasedOnStyle: Google, ColumnLimit: 100}";
    std::string assume = "--assume-filename=kernel.cu";
    std::vector<char*> argv = {const_cast<char*>(exe.c_str()), style.data(), assume.data(),
                               in_path.data(), nullptr};
    pid_t pid = 0;
    int status = -1;
    if (posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ) == 0 &&
        ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      std::ifstream in(out_path, std::ios::binary);
      formatted = std::string{std::istreambuf_iterator<char>(in), {}};
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  if (in_fd >= 0) ::close(in_fd), ::unlink(in_path.c_str());
  if (out_fd >= 0) ::close(out_fd), ::unlink(out_path.c_str());
  return formatted;
}

int run_dump_kernels(const BuildCommandOptions& opts, const CommonOptions& common) {
  if (!pass_names_are_known(opts)) return kExitUsage;
  opfuse::SourceManager sources;
  auto loaded = load_selected(opts, common, sources);
  if (!loaded) return kExitUserError;
  // The IR before fusion: the same pipeline with the fusion passes disabled.
  const opfuse::passes::PassManager manager(opfuse::passes::default_pipeline());
  opfuse::passes::PassOptions no_fusion;
  no_fusion.disabled.insert(opts.disable.begin(), opts.disable.end());
  for (const auto& pass : manager.passes())
    if (pass.name == "fuse-forward" || pass.name == "fuse-backward")
      no_fusion.disabled.insert(std::string(pass.name));
  opfuse::ir::Program before = *loaded;
  manager.run(before, no_fusion, nullptr);
  auto compiled = compile_program(std::move(*loaded), opts, sources);
  if (!compiled) return kExitUserError;
  const opfuse::codegen::Plan& plan = compiled->plan;

  const std::string kernels_dir = opts.out_dir + "/kernels";
  if (!make_directory(kernels_dir)) return kExitUserError;
  if (!write_output(opts.out_dir + "/ir_before_fusion.ir",
                    opfuse::ir::print_program(before, &sources)) ||
      !write_output(opts.out_dir + "/ir_after_fusion.ir",
                    opfuse::ir::print_program(compiled->program, &sources)) ||
      !write_output(opts.out_dir + "/plan.json", opfuse::codegen::plan_json_text(plan)))
    return kExitUserError;
  const std::string formatter = find_on_path("clang-format");
  bool formatted_all = !formatter.empty();
  for (const auto& kernel : plan.kernels) {
    std::string source = opfuse::codegen::kernel_source(plan, kernel);
    if (!formatter.empty()) {
      if (auto formatted = clang_format(formatter, source)) {
        source = std::move(*formatted);
      } else {
        formatted_all = false;
      }
    }
    if (!write_output(kernels_dir + "/" + kernel.id + ".cu", source)) return kExitUserError;
  }
  remove_stale_kernels(kernels_dir, plan);
  if (!formatter.empty() && !formatted_all)
    std::fprintf(stderr, "fusec: warning: %s failed on some kernels; they are left unformatted\n",
                 formatter.c_str());
  std::printf(
      "fusec: wrote %zu kernels (%s), ir_before_fusion.ir, ir_after_fusion.ir and "
      "plan.json to %s\n",
      plan.kernels.size(),
      formatter.empty() ? "unformatted: clang-format is not on PATH"
                        : "formatted with clang-format",
      opts.out_dir.c_str());
  return kExitOk;
}

// ---- bench
// ---------------------------------------------------------------------------------------

struct BenchCommandOptions {
  std::string file;
  std::string sequence;
  std::vector<std::string> binds;
  std::string mode = "fwd";
  bool graph = false;
  bool recast_weights = false;
  bool gemm_autotune = false;
  bool no_auto_graph = false;
  int iterations = 0;
  int warmup = 10;
  int calibrate = 4;
  uint64_t seed = 0;
  std::string json;
};

int run_bench(const BenchCommandOptions& opts, const CommonOptions& common) {
  const auto bindings = parse_bindings(opts.binds);
  if (!bindings) return kExitUsage;
  std::string no_gpu;
  if (!opfuse::gpu::gpu_available(&no_gpu)) {
    std::fprintf(stderr,
                 "fusec: error: bench needs a GPU: %s; `fusec build` compiles without one\n",
                 no_gpu.c_str());
    return kExitUserError;
  }
  try {
    opfuse::CompileOptions compile;
    compile.recipe = common.recipe;
    const Clock::time_point start = Clock::now();
    const opfuse::Program program = opfuse::Program::compile_file(opts.file, compile);
    opfuse::api::BenchOptions bench;
    bench.compile_wall_ms = milliseconds_since(start);
    bench.sequence = opts.sequence;
    bench.bindings = *bindings;
    bench.mode = opts.mode == "fwdbwd" ? opfuse::api::BenchMode::ForwardBackward
                                       : opfuse::api::BenchMode::Forward;
    bench.graph = opts.graph;
    bench.recast_weights = opts.recast_weights;
    bench.gemm_autotune = opts.gemm_autotune;
    bench.auto_graph = !opts.no_auto_graph;
    bench.iterations = opts.iterations;
    bench.warmup = opts.warmup;
    bench.calibrate = opts.calibrate;
    bench.seed = opts.seed;
    opfuse::api::BenchReport report = opfuse::api::run_benchmark(program, bench);
    report.file = opts.file;
    std::fputs(opfuse::api::format_bench_report(report).c_str(), stdout);
    if (!opts.json.empty()) {
      const fs::path parent = fs::path(opts.json).parent_path();
      if (!parent.empty() && !make_directory(parent.string())) return kExitUserError;
      if (!write_output(opts.json, opfuse::api::bench_report_json(report))) return kExitUserError;
    }
  } catch (const opfuse::CompileError& e) {
    std::fputs(e.what(), stderr);
    return kExitUserError;
  } catch (const opfuse::Error& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fusec: compile .fuse programs of fused transformer ops into CUDA kernels", "fusec"};
  app.footer(kExitCodeHelp);
  app.set_version_flag("--version", std::string("fusec (opfuse) ") + OPFUSE_VERSION);
  app.require_subcommand(1);

  CommonOptions common;
  std::vector<std::string> check_files;
  CLI::App* check =
      app.add_subcommand("check", "parse and type-check .fuse files; report every error");
  check->add_option("files", check_files, ".fuse files")->required()->check(CLI::ExistingFile);
  add_common(check, common);
  check->footer(kExitCodeHelp);

  IrOptions ir_opts;
  CLI::App* ir = app.add_subcommand("ir", "print the IR of a .fuse file (after the passes)");
  ir->add_option("file", ir_opts.file, ".fuse file")->required()->check(CLI::ExistingFile);
  ir->add_option("--sequence", ir_opts.sequence, "print only this sequence");
  ir->add_option("--after", ir_opts.after,
                 "print the IR after this pass, or after every pass that changes it (all)");
  ir->add_option("--disable-pass", ir_opts.disable, "skip this pass (repeatable)")
      ->allow_extra_args(false);
  ir->add_flag("--timings", ir_opts.timings, "print the time each pass took (stderr)");
  add_common(ir, common);
  ir->footer(kExitCodeHelp);

  RunCommandOptions run_opts;
  CLI::App* run = app.add_subcommand(
      "run",
      "train a sequence for a few steps on the GPU (or the CPU reference executor) from seeded "
      "random inputs and parameters; print the loss, gradient norms and quantizer state per "
      "step, and on the GPU the peak device memory");
  run->add_option("file", run_opts.file, ".fuse file")->required()->check(CLI::ExistingFile);
  run->add_option("--sequence", run_opts.sequence,
                  "the sequence to run (needed when the file has several)");
  run->add_option("--device", run_opts.device,
                  "gpu, cpu (the reference executor) or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}))
      ->capture_default_str();
  run->add_option("--bind", run_opts.binds, "NAME=SIZE for a symbolic dimension (repeatable)")
      ->allow_extra_args(false);
  run->add_option("--steps", run_opts.steps, "training steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  run->add_option("--seed", run_opts.seed, "seed of the random inputs and parameters")
      ->capture_default_str();
  run->add_option("--lr", run_opts.lr, "SGD learning rate")->capture_default_str();
  add_common(run, common);
  run->footer(std::string(opfuse::cpu::kRunLossDescription) +
              ". Parameters: linear weights ~ N(0, 0.02), norm weights 1 (0 if zero-centered), "
              "biases 0; inputs ~ N(0, 1).\n" +
              kExitCodeHelp);

  BuildCommandOptions build_opts;
  CLI::App* build = app.add_subcommand(
      "build",
      "compile a .fuse file for the GPU: DIR/plan.json (the execution plan), DIR/kernels/<kernel>"
      ".cu and .cubin (NVRTC, through the kernel cache at $OPFUSE_CACHE_DIR or ~/.cache/opfuse) "
      "and DIR/report.txt");
  BuildCommandOptions dump_opts;
  CLI::App* dump = app.add_subcommand(
      "dump-kernels",
      "write readable sources for review: DIR/kernels/<kernel>.cu (formatted by clang-format "
      "when it is on PATH; Clang's libFormat is not linked into fusec, so no clang-format means "
      "unformatted sources), DIR/ir_before_fusion.ir, DIR/ir_after_fusion.ir and DIR/plan.json. "
      "Compiles nothing");
  for (auto [cmd, opts] : {std::pair{build, &build_opts}, std::pair{dump, &dump_opts}}) {
    cmd->add_option("file", opts->file, ".fuse file")->required()->check(CLI::ExistingFile);
    cmd->add_option("-o,--output", opts->out_dir, "output directory (created if missing)")
        ->required();
    cmd->add_option("--arch", opts->arch,
                    "target: sm_XX[a|f] for a cubin, compute_XX for PTX (never queried from a "
                    "device)")
        ->capture_default_str()
        ->check(CLI::Validator(
            [](const std::string& arch) -> std::string {
              return opfuse::jit::is_arch_name(arch)
                         ? ""
                         : "'" + arch + "' is not an arch: use sm_90a, sm_89, compute_90, ...";
            },
            "ARCH"));
    cmd->add_option("--sequence", opts->sequence, "build only this sequence");
    cmd->add_option("--disable-pass", opts->disable,
                    "skip this pass (repeatable), e.g. fuse-forward to build every op unfused")
        ->allow_extra_args(false);
    add_common(cmd, common);
    cmd->footer(kExitCodeHelp);
  }

  BenchCommandOptions bench_opts;
  CLI::App* bench = app.add_subcommand(
      "bench",
      "time a sequence on the GPU: CUDA events around each iteration after a warm-up, median "
      "(p10, p90) of many, inputs rotated over enough buffers to miss the L2; prints the time, "
      "TFLOP/s, host time per call, peak device memory and a per-step breakdown (GEMMs in "
      "TFLOP/s, generated kernels in GB/s against a device copy measured in the same run)");
  bench->add_option("file", bench_opts.file, ".fuse file")->required()->check(CLI::ExistingFile);
  bench->add_option("--sequence", bench_opts.sequence,
                    "the sequence to time (needed when the file has several)");
  bench->add_option("--bind", bench_opts.binds, "NAME=SIZE for a symbolic dimension (repeatable)")
      ->allow_extra_args(false);
  bench
      ->add_option("--mode", bench_opts.mode,
                   "fwd (an inference forward) or fwdbwd (forward, backward of a fixed random "
                   "dy, step)")
      ->check(CLI::IsMember({"fwd", "fwdbwd"}))
      ->capture_default_str();
  bench->add_flag("--graph", bench_opts.graph,
                  "replay a CUDA graph of one iteration (inputs cannot rotate: fixed pointers)");
  bench->add_flag("--gemm-autotune", bench_opts.gemm_autotune,
                  "time cuBLASLt's first candidate algorithms per GEMM and keep the fastest "
                  "(SessionOptions::gemm_autotune)");
  bench->add_flag("--no-auto-graph", bench_opts.no_auto_graph,
                  "fwd: run every forward step by step, also when its inputs are small enough "
                  "for the session's automatic CUDA graph (SessionOptions::auto_graph)");
  bench->add_flag("--recast-weights", bench_opts.recast_weights,
                  "fwd: cast the FP8 weights on every call instead of once (cached)");
  bench
      ->add_option("--iterations", bench_opts.iterations,
                   "timed iterations per pass; 0: about 0.3 s worth (50 to 2000)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  bench->add_option("--warmup", bench_opts.warmup, "untimed iterations first")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  bench
      ->add_option("--calibrate", bench_opts.calibrate,
                   "fwd: untimed forwards, each followed by a quantizer update, before the "
                   "warm-up, so delayed scaling's scales come from the inputs; 0: initial scales")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  bench->add_option("--seed", bench_opts.seed, "seed of the parameters and inputs")
      ->capture_default_str();
  bench->add_option("--json", bench_opts.json, "also write every number to this JSON file");
  add_common(bench, common);
  bench->footer(
      "Needs a GPU (exit 1 without one). Parameters as `fusec run` makes them; inputs and output "
      "gradients random. --recipe picks any recipe the file declares, or bf16.\n" +
      std::string(kExitCodeHelp));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  try {
    if (*check) return run_check(check_files, common);
    if (*ir) return run_ir(ir_opts, common);
    if (*run) return run_run(run_opts, common);
    if (*build) return run_build(build_opts, common);
    if (*dump) return run_dump_kernels(dump_opts, common);
    if (*bench) return run_bench(bench_opts, common);
  } catch (const opfuse::InternalError& e) {
    std::fprintf(stderr, "%s\nfusec: this is a bug in opfuse; please report it with the input.\n",
                 e.what());
    return kExitInternal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusec: internal error: %s\n", e.what());
    return kExitInternal;
  }
  return kExitUsage;
}
