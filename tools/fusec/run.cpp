// `fusec run FILE --bind N=SIZE`: train a few steps from seeded inputs and parameters, on the GPU
// (run/gpu_run.h) or the CPU reference (reference/run_driver.h).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "gpu/device.h"
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
    const Program program = Program::compile_file(opts.file, compile);
    api::GpuRunOptions gpu_run;
    gpu_run.sequence = opts.sequence;
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

int run_run(const RunCommandOptions& opts, const CommonOptions& common) {
  cpu::RunOptions run;
  const auto bindings = parse_bindings(opts.binds);
  if (!bindings) return kExitUsage;
  run.bindings.insert(bindings->begin(), bindings->end());
  run.steps = opts.steps;
  run.seed = opts.seed;
  run.lr = opts.lr;
  std::string no_gpu;
  const bool on_gpu =
      opts.device == "gpu" || (opts.device == "auto" && gpu::gpu_available(&no_gpu));
  if (opts.device == "auto" && !on_gpu)
    std::fprintf(stderr, "fusec: no GPU (%s): running on the CPU reference\n", no_gpu.c_str());
  if (on_gpu) return run_on_gpu(opts, common, run);
  SourceManager sources;
  auto program = load(opts.file, common, sources);
  if (!program) return kExitUserError;
  const ir::Sequence* seq = nullptr;
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
  add_common(run, common);
  run->footer(std::string(cpu::kRunLossDescription) +
              ". Parameters: linear weights ~ N(0, 0.02), norm weights 1 (0 if zero-centered), "
              "biases 0; inputs ~ N(0, 1).\n" +
              kExitCodeHelp);
  return {run, [opts, &common] { return run_run(*opts, common); }};
}

}  // namespace opfuse::fusec
