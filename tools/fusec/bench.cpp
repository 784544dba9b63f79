// `fusec bench FILE --bind N=SIZE`: time forward or forward+backward on the GPU (the measurement
// and the report are bench/bench.h's).
#include <cstdio>
#include <memory>

#include "bench/bench.h"
#include "commands.h"
#include "gpu/device.h"
#include "launch.h"
#include "opfuse/program.h"

namespace opfuse::fusec {

namespace {

struct BenchCommandOptions {
  std::string file;
  std::string sequence;
  std::vector<std::string> binds;
  std::string mode = "fwd";
  bool graph = false;
  bool recast_weights = false;
  bool gemm_autotune = false;
  bool no_auto_graph = false;
  bool fused_epilogues = false;
  bool fused_training_epilogues = false;
  int iterations = 0;
  int warmup = 10;
  int calibrate = 4;
  uint64_t seed = 0;
  std::string json;
  std::string debug_config;
  std::string debug_log_dir;
  int nproc = 1;  // tensor-parallel ranks, one process per GPU
  std::string trace;
  int trace_iterations = 5;
};

int run_bench(const BenchCommandOptions& opts, const CommonOptions& common) {
  if (opts.nproc > 1 && !is_launched_rank()) return launch_ranks(opts.nproc);
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
    opfuse::api::BenchOptions bench;
    bench.parallel = launched_rank();
    opfuse::CompileOptions compile;
    compile.recipe = common.recipe;
    if (!opts.debug_config.empty())
      compile.debug_config = opfuse::DebugConfigSource{opts.debug_config, {}, {}};
    const Clock::time_point start = Clock::now();
    const opfuse::Program program = opfuse::Program::compile_file(opts.file, compile);
    std::fputs(program.warnings().c_str(), stderr);
    bench.debug.log_dir = opts.debug_log_dir;
    bench.compile_wall_ms = milliseconds_since(start);
    bench.sequence = opts.sequence;
    bench.bindings = *bindings;
    bench.mode = opts.mode == "fwdbwd" ? opfuse::api::BenchMode::ForwardBackward
                                       : opfuse::api::BenchMode::Forward;
    bench.graph = opts.graph;
    bench.recast_weights = opts.recast_weights;
    bench.gemm_autotune = opts.gemm_autotune;
    bench.auto_graph = !opts.no_auto_graph;
    bench.fused_epilogues = opts.fused_epilogues || opts.fused_training_epilogues;
    bench.fused_training_epilogues = opts.fused_training_epilogues;
    bench.iterations = opts.iterations;
    bench.warmup = opts.warmup;
    bench.calibrate = opts.calibrate;
    bench.seed = opts.seed;
    if (!opts.trace.empty()) bench.trace_iterations = opts.trace_iterations;
    opfuse::api::BenchReport report = opfuse::api::run_benchmark(program, bench);
    report.file = opts.file;
    std::fputs(opfuse::api::format_bench_report(report).c_str(), stdout);
    // Every rank prints its report (rank r > 0 to its log); rank 0 writes the JSON.
    if (!opts.json.empty() && bench.parallel.rank == 0 &&
        !write_output_with_parents(opts.json, opfuse::api::bench_report_json(report))) {
      return kExitUserError;
    }
    // Every rank writes its own timeline (api::rank_trace_path).
    if (!opts.trace.empty()) {
      const std::string path = opfuse::api::rank_trace_path(opts.trace, bench.parallel.rank);
      if (!write_output_with_parents(path, report.trace.json)) return kExitUserError;
      std::printf("GPU trace written to %s\n", path.c_str());
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

Command add_bench_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<BenchCommandOptions>();
  CLI::App* bench = app.add_subcommand(
      "bench",
      "time a sequence on the GPU: CUDA events around each iteration after a warm-up, median "
      "(p10, p90) of many, inputs rotated over enough buffers to miss the L2; prints the time, "
      "TFLOP/s, host time per call, peak device memory and a per-step breakdown (GEMMs in "
      "TFLOP/s, generated kernels in GB/s against a device copy measured in the same run)");
  bench->add_option("file", opts->file, ".fuse file")->required()->check(CLI::ExistingFile);
  bench->add_option("--sequence", opts->sequence,
                    "the sequence to time (needed when the file has several)");
  bench->add_option("--bind", opts->binds, "NAME=SIZE for a symbolic dimension (repeatable)")
      ->allow_extra_args(false);
  bench
      ->add_option("--mode", opts->mode,
                   "fwd (an inference forward) or fwdbwd (forward, backward of a fixed random "
                   "dy, step)")
      ->check(CLI::IsMember({"fwd", "fwdbwd"}))
      ->capture_default_str();
  bench->add_flag("--graph", opts->graph,
                  "replay a CUDA graph of one iteration (inputs cannot rotate: fixed pointers)");
  bench->add_flag("--gemm-autotune", opts->gemm_autotune,
                  "time cuBLASLt's first candidate algorithms per GEMM and keep the fastest "
                  "(SessionOptions::gemm_autotune)");
  bench->add_flag("--no-auto-graph", opts->no_auto_graph,
                  "fwd: run every forward step by step, also when its inputs are small enough "
                  "for the session's automatic CUDA graph (SessionOptions::auto_graph)");
  bench->add_flag("--fused-epilogues", opts->fused_epilogues,
                  "fwd: fold a gated activation into the GEMM's epilogue where the plan marks "
                  "the pair and this GPU has the kernel (SessionOptions::fused_epilogues)");
  bench->add_flag("--fused-training-epilogues", opts->fused_training_epilogues,
                  "fwdbwd: fold the gated activation into the GEMM's epilogue in training "
                  "forwards too (SessionOptions::fused_training_epilogues; implies "
                  "--fused-epilogues)");
  bench->add_flag("--recast-weights", opts->recast_weights,
                  "fwd: cast the FP8 weights on every call instead of once (cached)");
  bench
      ->add_option("--iterations", opts->iterations,
                   "timed iterations per pass; 0: about 0.3 s worth (50 to 2000)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  bench->add_option("--warmup", opts->warmup, "untimed iterations first")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  bench
      ->add_option("--calibrate", opts->calibrate,
                   "fwd: untimed forwards, each followed by a quantizer update, before the "
                   "warm-up, so delayed scaling's scales come from the inputs; 0: initial scales")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  bench->add_option("--seed", opts->seed, "seed of the parameters and inputs")
      ->capture_default_str();
  bench->add_option("--json", opts->json,
                    "also write every number to this JSON file (rank 0's under --nproc)");
  bench
      ->add_option("--nproc", opts->nproc,
                   "processes, one GPU each, for a sequence `with parallel(tp = N)`: every rank "
                   "times its part and rank 0 prints its report (docs/parallel.md)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  auto* trace =
      bench->add_option("--trace", opts->trace,
                        "after the timed passes, record a GPU timeline (CUPTI: every kernel, copy "
                        "and memset with its start, end and stream) of --trace-iterations "
                        "iterations and write it here as Chrome trace JSON (chrome://tracing, "
                        "Perfetto); under --nproc rank r > 0 writes FILE with .rank<r> before its "
                        "extension (docs/embedding.md, \"Timelines\")");
  bench
      ->add_option("--trace-iterations", opts->trace_iterations,
                   "iterations issued back to back under --trace")
      ->check(CLI::Range(1, 1000))
      ->needs(trace)
      ->capture_default_str();
  auto* debug_config =
      bench
          ->add_option("--debug-config", opts->debug_config,
                       "time with a precision-debug config (docs/debugging.md): every iteration "
                       "runs its routing's plan variant and logs its statistics; compare with the "
                       "same command without it for the features' cost")
          ->check(CLI::ExistingFile);
  bench
      ->add_option("--debug-log-dir", opts->debug_log_dir,
                   "with --debug-config: write the statistics there (TE's layout); without it "
                   "they are computed and gathered but not written")
      ->needs(debug_config);
  add_common(bench, common);
  bench->footer(
      "Needs a GPU (exit 1 without one). Parameters as `fusec run` makes them; inputs and output "
      "gradients random. --recipe picks any recipe the file declares, or bf16.\n" +
      std::string(kExitCodeHelp));

  return {bench, [opts, &common] { return run_bench(*opts, common); }};
}

}  // namespace opfuse::fusec
