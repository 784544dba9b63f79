// `fusec bench`: times one sequence of a compiled program on the GPU through the embedding API
// (Session), the way docs/design.md, "Benchmarks", asks: CUDA events around every iteration after a
// warm-up, the median (p10, p90) of many, inputs rotated over enough buffers that the L2 cannot
// hold them, and the floor to compare against (a device copy's bandwidth, measured in the same
// run). A profiling pass times every plan step through the executor's StepObserver, so the
// report splits the time into GEMMs (TFLOP/s) and generated kernels (GB/s, share of the copy
// bandwidth). Numbers only: nothing here asserts a speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "opfuse/program.h"

namespace opfuse::api {

enum class BenchMode : std::uint8_t {
  Forward,          // an inference forward
  ForwardBackward,  // a training step: forward, backward of a fixed random dy, step()
};

struct BenchOptions {
  std::string sequence;  // empty: the program's only one
  std::map<std::string, std::int64_t> bindings;
  BenchMode mode = BenchMode::Forward;
  // Replay a CUDA graph of one iteration (Session::capture) instead of eager calls; its inputs
  // cannot rotate (a graph's pointers are fixed).
  bool graph = false;
  // Forward only: mark the parameters changed before every forward, so the FP8 weights are cast
  // on every call (as a peer that casts per call does) instead of once and cached.
  bool recast_weights = false;
  bool gemm_autotune = false;             // SessionOptions::gemm_autotune
  bool auto_graph = true;                 // SessionOptions::auto_graph
  bool fused_epilogues = false;           // SessionOptions::fused_epilogues
  bool fused_training_epilogues = false;  // SessionOptions::fused_training_epilogues
  int iterations = 0;  // timed iterations per pass; 0: about 0.3 s worth, 50 to 2000
  int warmup = 10;
  // Forward only: untimed forwards, each followed by a quantizer update (Session::step), before
  // the warm-up. A loop of inference forwards never updates the quantizers, so under delayed
  // scaling they would keep their initial scale of 1 (weights on E4M3's subnormals): the large
  // MLP's forward measured ~3% faster that way than with scales from the data, against the same
  // peer in one process (H200, bench/RESULTS.md). 0: keep the initial scales.
  int calibrate = 4;
  std::uint64_t seed = 0;
  // For a program compiled with a debug config (fusec bench --debug-config): how its session
  // logs. Every timed iteration is a debug iteration (its statistics logged behind the GPU).
  DebugSessionOptions debug;
  // After the timed passes: this many iterations issued back to back under a GPU trace
  // (gpu/activity_trace.h, CUPTI), kept in BenchReport::trace; 0: no trace.
  int trace_iterations = 0;
  // Only for the report: the program's compile wall time as the caller measured it.
  double compile_wall_ms = 0;
  // A rank of a tensor-parallel sequence (`fusec bench --nproc N`, docs/parallel.md): every rank
  // runs run_benchmark with the same options, its GPU current; the ranks agree on the iteration
  // counts, and each reports its own times (its steps include the collectives it waits in).
  ParallelOptions parallel;
};

// Order statistics of a set of times, in milliseconds.
struct TimeStats {
  double median = 0, p10 = 0, p90 = 0, min = 0, mean = 0;
  int samples = 0;
};

struct BenchStep {
  int index = 0;
  std::string phase;  // "forward", "backward"
  std::string kind;   // "gemm" or "kernel"
  std::string what;   // the plan's description
  std::string kernel;
  std::string gemm;       // describe(GemmDesc)
  std::string gemm_role;  // "fprop", "dgrad", "wgrad"
  std::int64_t m = 0, n = 0, k = 0;
  std::string a_dtype, b_dtype, d_dtype;
  bool fast_accum = false;
  double flops = 0;
  std::size_t bytes_read = 0, bytes_written = 0;
  bool ran = false;          // false: skipped in every profiled iteration
  bool weight_cast = false;  // a weight-cast step (skipped while the FP8 weights are cached)
  TimeStats time;            // per profiled iteration
  TimeStats host_us;         // the host time enqueueing it (the executor's own overhead included)
  double tflops = 0;         // GEMMs
  double gb_per_s = 0;       // bytes read + written over the median time
  double copy_share = 0;     // gb_per_s over the copy bandwidth
};

struct BenchReport {
  std::string file, sequence, recipe, mode, device, arch;
  int sm_count = 0;
  std::size_t l2_bytes = 0;
  std::map<std::string, std::int64_t> bindings;
  int tp = 1, rank = 0;  // the tensor-parallel group size and this report's rank
  bool graph = false;
  std::string weights;                    // "cached" (cast once, reused) or "recast every call"
  std::string gemm_algorithms;            // "cuBLASLt heuristic" or "autotuned"
  bool auto_graph = true;                 // SessionOptions::auto_graph of the session
  bool fused_epilogues = false;           // SessionOptions::fused_epilogues of the session
  bool fused_training_epilogues = false;  // and its fused_training_epilogues
  BuildStats build;
  double compile_wall_ms = 0;

  int warmup = 0, iterations = 0;
  int rotation_sets = 0;            // 1 under --graph
  std::size_t input_set_bytes = 0;  // one set of rotated tensors
  TimeStats time;                   // per iteration, iterations issued back to back
  TimeStats device_time;            // per iteration, queued behind a host hold: no launch gaps
  double device_gap_us = 0;         // median idle time between queued iterations (about 0)
  double gemm_flops = 0;            // per iteration
  double tflops = 0;                // gemm_flops over time.median
  TimeStats host_us;                // wall time of one iteration's enqueueing calls, microseconds

  std::size_t executor_peak_bytes = 0;  // activations, workspaces, FP8 copies (Session::memory)
  std::size_t parameter_bytes = 0;
  std::size_t peak_bytes = 0;  // executor peak + parameters + one input set (as the peers count)
  std::size_t pool_high_bytes = 0;  // the pool's high-water mark, rotation sets included

  std::size_t copy_bytes = 0;  // bytes copied per cudaMemcpyAsync (moved: twice that)
  double copy_gb_per_s = 0;    // read + written, median
  int profile_iterations = 0;
  std::vector<BenchStep> steps;       // the steps of the mode (fwd: the forward steps)
  double gemm_ms = 0, kernel_ms = 0;  // sums of the steps' medians
  double collective_ms = 0;           // NCCL steps (the amax all-reduce included)
  std::size_t kernel_bytes = 0;
  double kernel_gb_per_s = 0, kernel_copy_share = 0;  // generated kernels together
  std::vector<std::string> notes;

  // BenchOptions::trace_iterations > 0: the GPU timeline of those iterations (Chrome trace JSON,
  // gpu::chrome_trace_json) and its summary: every activity's interval joined over all streams,
  // so span - busy is the time the GPU sat idle between the iterations' work.
  struct Trace {
    int iterations = 0;
    std::string library;  // the CUPTI that recorded it
    std::size_t activities = 0, kernels = 0, dropped = 0;
    double span_ms = 0, busy_ms = 0;
    std::vector<std::string> largest_gaps;  // "12.3 us after <kernel> before <kernel>"
    std::string json;
  } trace;
};

// Runs the benchmark on the current GPU. Throws UsageError (no GPU, unbound or unknown sizes,
// a sequence without an output gradient for ForwardBackward) before timing anything, CudaError
// when the device fails.
BenchReport run_benchmark(const Program& program, const BenchOptions& options);

std::string format_bench_report(const BenchReport& report);  // the text fusec bench prints
std::string bench_report_json(const BenchReport& report);    // every number, indented JSON
// Where rank `rank` writes its GPU trace given `path`: the path itself for rank 0, else
// ".rank<r>" inserted before the extension ("t.json" -> "t.rank1.json"; "t" -> "t.rank1").
std::string rank_trace_path(const std::string& path, int rank);

}  // namespace opfuse::api
