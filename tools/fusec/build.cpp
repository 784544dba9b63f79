// `fusec build FILE -o DIR`: compile for the GPU through the kernel cache and write the build
// directory (plan.json, kernels/*.cu and their binaries, kernels.json, report.txt).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include "api/build_dir.h"
#include "api/program_impl.h"
#include "build_common.h"
#include "commands.h"
#include "jit/kernel_cache.h"
#include "jit/nvrtc_compiler.h"

namespace opfuse::fusec {

namespace {

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
  return text.empty() ? "the end of the step" : text;
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
        // Without the outputs only backward reads: transposed FP8 copies, dropout's mask.
        r += fmt::format("               inference forwards run {}\n",
                         step.inference->launch.kernel);
      }
    }
  }
  return r;
}

int run_build(const BuildCommandOptions& opts, const CommonOptions& common) {
  const Clock::time_point start = Clock::now();
  const driver::CompileOptions options = build_driver_options(opts, common);
  if (!pass_options_are_valid(options)) return kExitUsage;
  SourceManager sources;
  auto loaded = load(opts.file, common, sources, opts.sequence);
  if (!loaded) return kExitUserError;
  auto compiled = compile_program(std::move(*loaded), options, sources);
  if (!compiled) return kExitUserError;
  const opfuse::codegen::Plan& plan = compiled->plan;
  const std::string kernels_dir = opts.out_dir + "/kernels";
  if (!make_directory(kernels_dir)) return kExitUserError;

  const std::vector<opfuse::jit::CompileRequest> requests = compile_requests(compiled->kernels);
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

}  // namespace

Command add_build_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<BuildCommandOptions>();
  CLI::App* build = app.add_subcommand(
      "build",
      "compile a .fuse file for the GPU: DIR/plan.json (the execution plan), DIR/kernels/<kernel>"
      ".cu and .cubin (NVRTC, through the kernel cache at $OPFUSE_CACHE_DIR or ~/.cache/opfuse) "
      "and DIR/report.txt");
  add_build_options(build, *opts, common);
  return {build, [opts, &common] { return run_build(*opts, common); }};
}

}  // namespace opfuse::fusec
