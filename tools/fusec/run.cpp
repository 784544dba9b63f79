// `fusec run FILE --bind N=SIZE`: train a few steps from seeded inputs and parameters, on the GPU
// (run/gpu_run.h; --nproc N: one process per rank, tools/fusec/launch.h) or the CPU reference
// (reference/run_driver.h; --nproc N: the ranks simulated in this process).
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "debug/stat_log.h"
#include "debug_config/routing.h"
#include "gpu/device.h"
#include "launch.h"
#include "opfuse/program.h"
#include "reference/run_driver.h"
#include "run/gpu_run.h"

namespace opfuse::fusec {

namespace {

struct RunCommandOptions {
  std::string file;
  std::string sequence;
  std::string device = "auto";
  std::vector<std::string> binds;
  int steps = 1;
  uint64_t seed = 0;
  double lr = 0.01;
  // Precision debugging (docs/debugging.md).
  std::string debug_config;
  std::string debug_log_dir;
  int debug_precision = 4;
  int64_t debug_start_iteration = 0;
  int nproc = 1;  // tensor-parallel ranks: one process per GPU, or simulated on the CPU
};

// `fusec run --device gpu`: compile through the kernel cache, then the GPU training loop.
int run_on_gpu(const RunCommandOptions& opts, const CommonOptions& common,
               const cpu::RunOptions& run) {
  std::string no_gpu;
  if (!gpu::gpu_available(&no_gpu)) {
    std::fprintf(stderr,
                 "fusec: error: --device gpu: %s; use --device cpu (the CPU reference executor)\n",
                 no_gpu.c_str());
    return kExitUserError;
  }
  try {
    CompileOptions compile;
    compile.recipe = common.recipe;
    api::GpuRunOptions gpu_run;
    if (!opts.debug_config.empty()) {
      compile.debug_config = DebugConfigSource{opts.debug_config, {}, {}};
      gpu_run.debug.log_dir = opts.debug_log_dir;
      gpu_run.debug.precision = opts.debug_precision;
      gpu_run.debug.start_iteration = opts.debug_start_iteration;
    }
    const Program program = Program::compile_file(opts.file, compile);
    std::fputs(program.warnings().c_str(), stderr);
    if (common.warnings_as_errors && !program.warnings().empty()) return kExitUserError;
    gpu_run.sequence = opts.sequence;
    gpu_run.parallel = launched_rank();
    gpu_run.bindings.insert(run.bindings.begin(), run.bindings.end());
    gpu_run.steps = run.steps;
    gpu_run.seed = run.seed;
    gpu_run.lr = run.lr;
    std::fputs(api::run_gpu_training(program, gpu_run).c_str(), stdout);
  } catch (const CompileError& e) {
    std::fputs(e.what(), stderr);
    return kExitUserError;
  } catch (const Error& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

// The sequence to run: --sequence, else the file's only one; null after printing why not.
const ir::Sequence* pick_sequence(const ir::Program& program, const RunCommandOptions& opts) {
  std::string names;
  for (const auto& s : program.sequences) names += " " + s.name;
  if (!opts.sequence.empty()) {
    const ir::Sequence* seq = program.find_sequence(opts.sequence);
    if (!seq)
      std::fprintf(stderr, "fusec: error: no sequence '%s' in %s; sequences:%s\n",
                   opts.sequence.c_str(), opts.file.c_str(), names.c_str());
    return seq;
  }
  if (program.sequences.size() == 1) return &program.sequences[0];
  std::fprintf(stderr, "fusec: error: %s has %zu sequences; pick one with --sequence NAME:%s\n",
               opts.file.c_str(), program.sequences.size(), names.c_str());
  return nullptr;
}

// On the CPU --nproc N simulates the N ranks of a sequence `with parallel(tp = N)` in this
// process; any other N, or none for a tensor-parallel sequence, is refused before running.
bool nproc_fits(const ir::Sequence& seq, const RunCommandOptions& opts) {
  const int tp = seq.parallel.tp;
  if (opts.nproc == tp) return true;
  if (tp > 1) {
    const std::string given = opts.nproc > 1 ? fmt::format(", not --nproc {}", opts.nproc) : "";
    std::fprintf(stderr,
                 "fusec: error: sequence '%s' is tensor-parallel over tp = %d ranks: run it with "
                 "--nproc %d%s\n",
                 seq.name.c_str(), tp, tp, given.c_str());
  } else {
    std::fprintf(stderr,
                 "fusec: error: --nproc %d runs the ranks of a sequence `with parallel(tp = %d)`, "
                 "but sequence '%s' is not tensor-parallel; run it without --nproc\n",
                 opts.nproc, opts.nproc, seq.name.c_str());
  }
  return false;
}

int run_run(const RunCommandOptions& opts, const CommonOptions& common) {
  std::string no_gpu;
  const bool on_gpu =
      opts.device == "gpu" || (opts.device == "auto" && gpu::gpu_available(&no_gpu));
  if (on_gpu && opts.nproc > 1 && !is_launched_rank()) return launch_ranks(opts.nproc);
  cpu::RunOptions run;
  const auto bindings = parse_bindings(opts.binds);
  if (!bindings) return kExitUsage;
  run.bindings.insert(bindings->begin(), bindings->end());
  run.steps = opts.steps;
  run.seed = opts.seed;
  run.lr = opts.lr;
  if (opts.device == "auto" && !on_gpu) {
    const std::string ranks =
        opts.nproc > 1 ? fmt::format(" ({} simulated ranks in one process)", opts.nproc) : "";
    std::fprintf(stderr, "fusec: no GPU (%s): running on the CPU reference%s\n", no_gpu.c_str(),
                 ranks.c_str());
  }
  if (on_gpu) return run_on_gpu(opts, common, run);
  SourceManager sources;
  auto program = load(opts.file, common, sources);
  if (!program) return kExitUserError;
  const ir::Sequence* seq = pick_sequence(*program, opts);
  if (!seq || !nproc_fits(*seq, opts)) return kExitUserError;
  std::optional<debug::DebugConfig> config;
  std::optional<debug::StatLog> log;
  if (!opts.debug_config.empty()) {
    if (seq->parallel.active()) {
      // As the GPU Session refuses it: the debug variants do not run over several ranks yet.
      std::fprintf(stderr,
                   "fusec: error: --debug-config: sequence '%s' is tensor-parallel and the "
                   "precision-debug variants do not run over several ranks yet; run the config on "
                   "the one-rank program\n",
                   seq->name.c_str());
      return kExitUserError;
    }
    DiagnosticEngine diags(sources);
    diags.set_warnings_as_errors(common.warnings_as_errors);
    const auto registry =
        std::make_shared<const debug::FeatureRegistry>(debug::FeatureRegistry::with_builtins());
    config = debug::load_debug_config(opts.debug_config, sources, registry, diags);
    cpu::DebugRunOptions debug_run;
    if (config)
      debug_run.bindings = debug::bind_layers(*config, debug::program_layers(*program), diags);
    std::fputs(diags.format_all().c_str(), stderr);
    if (diags.has_errors()) return kExitUserError;
    try {
      // An unwritable directory is reported here, before the first step.
      log.emplace(debug::StatLog::open(opts.debug_log_dir, 0, opts.debug_precision));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fusec: error: %s\n", e.what());
      return kExitUserError;
    }
    debug_run.log = &*log;
    debug_run.log_dir = opts.debug_log_dir;
    debug_run.sources = &sources;
    debug_run.start_iteration = opts.debug_start_iteration;
    run.debug = std::move(debug_run);
  }
  try {
    std::fputs(cpu::run_reference_training(*seq, run).c_str(), stdout);
  } catch (const cpu::ReferenceError& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

}  // namespace

Command add_run_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<RunCommandOptions>();
  CLI::App* run = app.add_subcommand(
      "run",
      "train a sequence for a few steps on the GPU (or the CPU reference executor) from seeded "
      "random inputs and parameters; print the loss, gradient norms and quantizer state per "
      "step, and on the GPU the peak device memory");
  run->add_option("file", opts->file, ".fuse file")->required()->check(CLI::ExistingFile);
  run->add_option("--sequence", opts->sequence,
                  "the sequence to run (needed when the file has several)");
  run->add_option("--device", opts->device,
                  "gpu, cpu (the reference executor) or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}))
      ->capture_default_str();
  run->add_option("--bind", opts->binds, "NAME=SIZE for a symbolic dimension (repeatable)")
      ->allow_extra_args(false);
  run->add_option("--steps", opts->steps, "training steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  run->add_option("--seed", opts->seed, "seed of the random inputs and parameters")
      ->capture_default_str();
  run->add_option("--lr", opts->lr, "SGD learning rate")->capture_default_str();
  run->add_option("--nproc", opts->nproc,
                  "the N ranks of a sequence `with parallel(tp = N)`: N processes, one GPU each; "
                  "on the CPU reference, N simulated ranks in one process, reporting the whole "
                  "tensors")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  auto* config = run->add_option("--debug-config", opts->debug_config,
                                 "a precision-debug config (TE's config.yaml schema; "
                                 "docs/debugging.md): each step runs its iteration's plan variant "
                                 "and logs the statistics")
                     ->check(CLI::ExistingFile);
  run->add_option("--debug-log-dir", opts->debug_log_dir,
                  "where the statistics and debug logs go (TE's layout)")
      ->needs(config);
  config->needs(run->get_option("--debug-log-dir"));
  run->add_option("--debug-precision", opts->debug_precision,
                  "decimals of the values in the text log (TE prints 4)")
      ->check(CLI::Range(0, 30))
      ->capture_default_str()
      ->needs(config);
  run->add_option("--debug-start-iteration", opts->debug_start_iteration,
                  "the iteration of the first step (to resume a run)")
      ->check(CLI::NonNegativeNumber)
      ->needs(config);
  add_common(run, common);
  run->footer(std::string(cpu::kRunLossDescription) +
              ". Parameters: linear weights ~ N(0, 0.02), norm weights 1 (0 if zero-centered), "
              "biases 0; inputs ~ N(0, 1). Under --nproc every rank starts from its shard of the "
              "unsharded program's parameters (on the CPU also from its share of the inputs).\n" +
              kExitCodeHelp);
  return {run, [opts, &common] { return run_run(*opts, common); }};
}

}  // namespace opfuse::fusec
