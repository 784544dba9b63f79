// The measurement side of `fusec bench` (bench.h); bench_report.cpp formats the results.
#include "bench/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "api/session_access.h"
#include "comm/communicator.h"
#include "cpu/numerics.h"
#include "gpu/activity_trace.h"
#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_memory.h"
#include "gpu/plan_executor.h"
#include "run/quantized_inputs.h"

namespace opfuse::api {

namespace {

using Clock = std::chrono::steady_clock;

// Rotated inputs add up to this many L2 caches (as the peers' scripts rotate theirs).
constexpr double kL2Multiple = 3.0;
constexpr int kMaxRotationSets = 512;
constexpr double kAutoSeconds = 0.3;    // auto iteration count: about this long per timed pass
constexpr int kAutoMinIterations = 50;  // as the peers time their large problems
constexpr int kAutoMaxIterations = 2000;
constexpr int kHostIterations = 200;
constexpr int kProfileIterations = 30;
constexpr int kQueuedChunk = 16;
constexpr std::size_t kCopyBytes = std::size_t{512} << 20;
constexpr int kCopyRepeats = 20;

TimeStats stats_of(std::vector<double> samples) {
  TimeStats stats;
  if (samples.empty()) return stats;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  auto at = [&](double q) {
    return samples[static_cast<std::size_t>(std::lround(q * double(n - 1)))];
  };
  stats.median = n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  stats.p10 = at(0.1);
  stats.p90 = at(0.9);
  stats.min = samples.front();
  double sum = 0;
  for (const double sample : samples) sum += sample;
  stats.mean = sum / double(n);
  stats.samples = static_cast<int>(n);
  return stats;
}

class OwnedStream {
 public:
  OwnedStream() {
    OPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "fusec bench");
  }
  ~OwnedStream() { (void)cudaStreamDestroy(stream_); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Timing events, created on first use and reused; destroyed with the pool.
class EventPool {
 public:
  EventPool() = default;
  ~EventPool() {
    for (cudaEvent_t event : events_) (void)cudaEventDestroy(event);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  // Creates events up to `count` now, so that a timed pass does not create them between the two
  // events of an iteration.
  void reserve(std::size_t count) {
    if (count > 0) (void)at(count - 1);
  }
  cudaEvent_t at(std::size_t i) {
    while (events_.size() <= i) {
      cudaEvent_t event = nullptr;
      OPFUSE_CUDA_CHECK(cudaEventCreate(&event), "fusec bench");
      events_.push_back(event);
    }
    return events_[i];
  }

 private:
  std::vector<cudaEvent_t> events_;
};

double elapsed_ms(cudaEvent_t start, cudaEvent_t end) {
  float ms = 0;
  OPFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end), "fusec bench");
  return double(ms);
}

// Holds the stream on the host for `microseconds` so that the host can enqueue a chunk of
// iterations behind it: events then time the device's work without launch gaps.
void CUDART_CB hold_stream(void* microseconds) {
  std::this_thread::sleep_for(
      std::chrono::duration<double, std::micro>(*static_cast<const double*>(microseconds)));
}

// Device memory of `info` filled with pseudo-normal values (a seeded tile repeated: the values
// only have to be realistic, and generating the large inputs on the host would take seconds).
gpu::DeviceBuffer random_tensor(const TensorInfo& info, std::uint64_t seed, cudaStream_t stream) {
  const std::size_t element = tensor_dtype_bytes(info.dtype);
  const std::size_t tile_elements = std::min<std::size_t>(info.bytes / element, 1u << 20);
  std::vector<unsigned char> tile(tile_elements * element);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < tile_elements; ++i) {
    const float value = normal(rng);
    std::uint16_t half = 0;
    switch (info.dtype) {
      case TensorDType::BF16:
        half = cpu::float_to_bf16(value);
        std::memcpy(tile.data() + 2 * i, &half, 2);
        break;
      case TensorDType::FP16:
        half = cpu::float_to_fp16(value);
        std::memcpy(tile.data() + 2 * i, &half, 2);
        break;
      case TensorDType::FP32:
        std::memcpy(tile.data() + 4 * i, &value, 4);
        break;
      default:
        throw UsageError(fmt::format("fusec bench fills bf16, fp16 or fp32 tensors; '{}' is {}",
                                     info.name, tensor_dtype_name(info.dtype)));
    }
  }
  gpu::DeviceBuffer buffer(info.bytes, stream);
  auto* bytes = static_cast<unsigned char*>(buffer.data());
  for (std::size_t offset = 0; offset < info.bytes; offset += tile.size()) {
    OPFUSE_CUDA_CHECK(
        cudaMemcpyAsync(bytes + offset, tile.data(), std::min(tile.size(), info.bytes - offset),
                        cudaMemcpyHostToDevice, stream),
        fmt::format("filling '{}'", info.name));
  }
  // Why: the tile is host memory that goes away on return.
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "fusec bench");
  return buffer;
}

// Median bandwidth of a large device-to-device copy, bytes read plus written per second.
double copy_bandwidth(std::size_t bytes, cudaStream_t stream, EventPool& events) {
  const gpu::DeviceBuffer source(bytes, stream), destination(bytes, stream);
  OPFUSE_CUDA_CHECK(cudaMemsetAsync(source.data(), 1, bytes, stream), "fusec bench");
  std::vector<double> ms;
  for (int i = 0; i < kCopyRepeats + 3; ++i) {
    OPFUSE_CUDA_CHECK(cudaEventRecord(events.at(0), stream), "fusec bench");
    OPFUSE_CUDA_CHECK(
        cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, stream),
        "fusec bench: the copy-bandwidth reference");
    OPFUSE_CUDA_CHECK(cudaEventRecord(events.at(1), stream), "fusec bench");
    OPFUSE_CUDA_CHECK(cudaEventSynchronize(events.at(1)), "fusec bench");
    if (i >= 3) ms.push_back(elapsed_ms(events.at(0), events.at(1)));
  }
  return 2.0 * double(bytes) / (stats_of(ms).median * 1e-3) / 1e9;
}

// Records an event pair around every step; the events of all profiled iterations are read
// after one synchronization.
class StepTimer : public gpu::StepObserver {
 public:
  explicit StepTimer(EventPool& events) : events_(events) {}
  void before(int step, cudaStream_t stream) override {
    records_.push_back({step, events_.at(2 * records_.size()), nullptr, {}, 0});
    OPFUSE_CUDA_CHECK(cudaEventRecord(records_.back().start, stream), "fusec bench profile");
    records_.back().host_start = Clock::now();
  }
  void after(int /*step*/, cudaStream_t stream) override {
    Record& record = records_.back();
    record.host_us =
        std::chrono::duration<double, std::micro>(Clock::now() - record.host_start).count();
    record.end = events_.at(2 * records_.size() - 1);
    OPFUSE_CUDA_CHECK(cudaEventRecord(record.end, stream), "fusec bench profile");
  }
  // Per step, the times of every profiled run of it, in milliseconds.
  std::map<int, std::vector<double>> times() const {
    std::map<int, std::vector<double>> result;
    for (const Record& record : records_)
      result[record.step].push_back(elapsed_ms(record.start, record.end));
    return result;
  }
  // Per step, the host time of each enqueueing (between the two events), in microseconds.
  std::map<int, std::vector<double>> host_times() const {
    std::map<int, std::vector<double>> result;
    for (const Record& record : records_) result[record.step].push_back(record.host_us);
    return result;
  }

 private:
  struct Record {
    int step;
    cudaEvent_t start, end;
    Clock::time_point host_start;
    double host_us;
  };
  EventPool& events_;
  std::vector<Record> records_;
};

// One benchmark iteration over a session, with the tensors it rotates.
class Iteration {
 public:
  Iteration(Session& session, const BenchOptions& options, cudaStream_t stream)
      : session_(session), options_(options), stream_(stream) {}

  void add_rotated(const TensorInfo& info) { rotated_.push_back(info); }
  std::size_t set_bytes() const {
    std::size_t bytes = 0;
    for (const TensorInfo& info : rotated_) bytes += info.bytes;
    return bytes;
  }
  void allocate_sets(int count) {
    for (int set = 0; set < count; ++set) {
      std::vector<gpu::DeviceBuffer> buffers;
      for (std::size_t t = 0; t < rotated_.size(); ++t) {
        buffers.push_back(
            random_tensor(rotated_[t], options_.seed + 7919 * std::uint64_t(set) + t, stream_));
      }
      sets_.push_back(std::move(buffers));
    }
  }
  int sets() const { return static_cast<int>(sets_.size()); }

  // Host-side work outside the timed region: the next set's pointers.
  void prepare(int i) {
    if (session_.has_graph()) return;
    const auto& buffers = sets_[static_cast<std::size_t>(i % sets())];
    for (std::size_t t = 0; t < rotated_.size(); ++t)
      session_.set_tensor(rotated_[t].name, buffers[t].data());
    if (options_.recast_weights) session_.parameters_changed();
  }
  // The enqueueing calls that are timed.
  void enqueue() {
    if (session_.has_graph()) {
      session_.replay(stream_);
    } else if (options_.mode == BenchMode::Forward) {
      session_.forward(stream_, RunMode::Inference);
    } else {
      session_.forward(stream_, RunMode::Training);
      session_.backward(stream_);
      session_.step(stream_);
    }
  }
  void run(int i) {
    prepare(i);
    enqueue();
  }
  // `steps` untimed inference forwards on the first set, each followed by a quantizer update.
  void calibrate(int steps) {
    prepare(0);
    for (int i = 0; i < steps; ++i) {
      session_.forward(stream_, RunMode::Inference);
      session_.step(stream_);
    }
    sync();
  }
  void sync() const { OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_), "fusec bench"); }

 private:
  Session& session_;
  const BenchOptions& options_;
  cudaStream_t stream_;
  std::vector<TensorInfo> rotated_;
  std::vector<std::vector<gpu::DeviceBuffer>> sets_;
};

int choose_iterations(const BenchOptions& options, Iteration& iteration) {
  if (options.iterations > 0) return options.iterations;
  const int probe = 5;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < probe; ++i) iteration.run(i);
  iteration.sync();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / probe;
  const double wanted = kAutoSeconds / std::max(seconds, 1e-7);
  return static_cast<int>(
      std::clamp(wanted, double(kAutoMinIterations), double(kAutoMaxIterations)));
}

// Every rank of a tensor-parallel session must run the same number of iterations (each one
// meets the others in its collectives): the largest any rank chose, through the session's
// communicator. One rank: `iterations` as it is.
int agreed(int iterations, Session& session, cudaStream_t stream) {
  comm::Communicator* communicator = SessionAccess::communicator(session);
  if (communicator == nullptr) return iterations;
  gpu::DeviceBuffer word(sizeof(float), stream);
  auto value = static_cast<float>(iterations);  // exact: at most kAutoMaxIterations
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(word.data(), &value, sizeof value, cudaMemcpyHostToDevice, stream),
      "fusec bench");
  communicator->all_reduce(word.data(), word.data(), 1, plan::DType::FP32, comm::ReduceOp::Max,
                           stream);
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(&value, word.data(), sizeof value, cudaMemcpyDeviceToHost, stream),
      "fusec bench");
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "fusec bench");
  return static_cast<int>(value);
}

// Wall time of the enqueueing calls alone: the stream is drained before each, so a full launch
// queue never blocks the host and inflates the number.
TimeStats host_pass(int iterations, Iteration& iteration) {
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    iteration.prepare(i);
    iteration.sync();
    const Clock::time_point start = Clock::now();
    iteration.enqueue();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  iteration.sync();
  return stats_of(us);
}

TimeStats back_to_back_pass(int iterations, Iteration& iteration, EventPool& events,
                            cudaStream_t stream) {
  for (int i = 0; i < iterations; ++i) {
    iteration.prepare(i);
    OPFUSE_CUDA_CHECK(cudaEventRecord(events.at(2 * std::size_t(i)), stream), "fusec bench");
    iteration.enqueue();
    OPFUSE_CUDA_CHECK(cudaEventRecord(events.at(2 * std::size_t(i) + 1), stream), "fusec bench");
  }
  iteration.sync();
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(iterations));
  for (int i = 0; i < iterations; ++i)
    ms.push_back(elapsed_ms(events.at(2 * std::size_t(i)), events.at(2 * std::size_t(i) + 1)));
  return stats_of(ms);
}

// Chunks of iterations queued behind a host hold long enough for the host to enqueue the whole
// chunk: the events see only device work. `gap_us` is the median idle time between iterations
// inside a chunk (about zero when the hold was long enough).
TimeStats queued_pass(int iterations, double host_us_per_iteration, Iteration& iteration,
                      EventPool& events, cudaStream_t stream, double& gap_us) {
  double hold_us = 2.0 * kQueuedChunk * host_us_per_iteration + 200.0;
  for (int begin = 0; begin < iterations; begin += kQueuedChunk) {
    OPFUSE_CUDA_CHECK(cudaLaunchHostFunc(stream, hold_stream, &hold_us), "fusec bench");
    for (int i = begin; i < std::min(iterations, begin + kQueuedChunk); ++i) {
      iteration.prepare(i);
      OPFUSE_CUDA_CHECK(cudaEventRecord(events.at(2 * std::size_t(i)), stream), "fusec bench");
      iteration.enqueue();
      OPFUSE_CUDA_CHECK(cudaEventRecord(events.at(2 * std::size_t(i) + 1), stream), "fusec bench");
    }
  }
  iteration.sync();
  std::vector<double> ms, gaps;
  for (int i = 0; i < iterations; ++i) {
    ms.push_back(elapsed_ms(events.at(2 * std::size_t(i)), events.at(2 * std::size_t(i) + 1)));
    if (i + 1 < iterations && (i + 1) % kQueuedChunk != 0) {
      gaps.push_back(
          1e3 * elapsed_ms(events.at(2 * std::size_t(i) + 1), events.at(2 * std::size_t(i) + 2)));
    }
  }
  gap_us = stats_of(gaps).median;
  return stats_of(ms);
}

std::string kind_name(gpu::StepProfile::Kind kind) {
  switch (kind) {
    case gpu::StepProfile::Kind::Gemm:
      return "gemm";
    case gpu::StepProfile::Kind::Collective:
      return "collective";
    case gpu::StepProfile::Kind::Kernel:
      break;
  }
  return "kernel";
}

// Per-step rows from the profiled times (the steps of the mode: no backward for a forward), and
// the GEMM and kernel sums.
void summarize_steps(const std::vector<gpu::StepProfile>& profiles,
                     const std::map<int, std::vector<double>>& times,
                     const std::map<int, std::vector<double>>& host_times, BenchMode mode,
                     BenchReport& report) {
  for (const gpu::StepProfile& profile : profiles) {
    if (mode == BenchMode::Forward &&
        (profile.phase != plan::Phase::Forward || profile.end_of_step)) {
      continue;
    }
    BenchStep step;
    step.index = profile.index;
    step.phase = std::string(plan::phase_name(profile.phase));
    step.kind = kind_name(profile.kind);
    step.what = profile.what;
    step.kernel = profile.kernel;
    if (profile.kind == gpu::StepProfile::Kind::Gemm) {
      step.gemm = gpu::describe(profile.gemm);
      step.gemm_role = profile.gemm_role;
      step.m = profile.gemm.m;
      step.n = profile.gemm.n;
      step.k = profile.gemm.k;
      step.a_dtype = std::string(plan::dtype_name(profile.gemm.a));
      step.b_dtype = std::string(plan::dtype_name(profile.gemm.b));
      step.d_dtype = std::string(plan::dtype_name(profile.gemm.d));
      step.fast_accum = profile.gemm.fast_accum;
    }
    step.flops = profile.flops;
    step.bytes_read = profile.bytes_read;
    step.bytes_written = profile.bytes_written;
    step.weight_cast = profile.weight_cast;
    const auto found = times.find(profile.index);
    step.ran = found != times.end();
    if (step.ran) {
      step.time = stats_of(found->second);
      step.host_us = stats_of(host_times.at(profile.index));
      const double seconds = step.time.median * 1e-3;
      if (seconds > 0) {
        step.tflops = step.flops / seconds / 1e12;
        step.gb_per_s = double(step.bytes_read + step.bytes_written) / seconds / 1e9;
        if (report.copy_gb_per_s > 0) step.copy_share = step.gb_per_s / report.copy_gb_per_s;
      }
      if (step.kind == "gemm") {
        report.gemm_ms += step.time.median;
      } else if (step.kind == "collective") {
        report.collective_ms += step.time.median;
      } else {
        report.kernel_ms += step.time.median;
        report.kernel_bytes += step.bytes_read + step.bytes_written;
      }
    }
    report.steps.push_back(std::move(step));
  }
  if (report.kernel_ms > 0) {
    report.kernel_gb_per_s = double(report.kernel_bytes) / (report.kernel_ms * 1e-3) / 1e9;
    if (report.copy_gb_per_s > 0)
      report.kernel_copy_share = report.kernel_gb_per_s / report.copy_gb_per_s;
  }
}

// options.trace_iterations iterations issued back to back under a GPU trace (CUPTI), after
// everything timed: the timeline and its summary into report.trace. One more iteration first,
// recorded and dropped: the first launches after recording starts wait for CUPTI's setup (4-6 ms
// of idle GPU after the first kernel on an H200, bench/RESULTS.md).
void trace_pass(const BenchOptions& options, Iteration& iteration, BenchReport& report) {
  iteration.sync();
  gpu::ActivityTrace trace;  // on an exception its destructor stops the recording
  iteration.run(0);
  iteration.sync();
  const std::uint64_t from = trace.now_ns();
  for (int i = 0; i < options.trace_iterations; ++i) iteration.run(i);
  iteration.sync();
  const std::vector<gpu::TraceEvent> events = gpu::events_from(trace.finish(), from);
  BenchReport::Trace& t = report.trace;
  t.iterations = options.trace_iterations;
  t.library = gpu::ActivityTrace::library_path();
  t.dropped = trace.dropped();
  const gpu::TraceSummary summary = gpu::summarize_trace(events);
  t.activities = summary.activities;
  t.kernels = summary.kernels;
  t.span_ms = double(summary.span_ns) * 1e-6;
  t.busy_ms = double(summary.busy_ns) * 1e-6;
  // A CUTLASS kernel's demangled name runs to thousands of characters: the report line keeps
  // the start (the JSON timeline has them whole).
  const auto shown = [](const std::string& name) {
    constexpr std::size_t kShown = 120;
    return name.size() <= kShown ? name : name.substr(0, kShown) + "...";
  };
  for (const gpu::TraceGap& gap : summary.largest_gaps) {
    t.largest_gaps.push_back(fmt::format("{:.1f} us after {} before {}", double(gap.ns) * 1e-3,
                                         shown(gap.before), shown(gap.after)));
  }
  t.json = gpu::chrome_trace_json(
      events, report.rank,
      fmt::format("sequence {} ({}, recipe {})", report.sequence, report.mode, report.recipe));
}

}  // namespace

BenchReport run_benchmark(const Program& program, const BenchOptions& options) {
  if (std::string why; !gpu::gpu_available(&why))
    throw UsageError(fmt::format("fusec bench needs a GPU: {}", why));
  if (options.iterations < 0 || options.warmup < 0 || options.calibrate < 0) {
    throw UsageError(
        fmt::format("iterations ({}), warm-up ({}) and calibration steps ({}) must not be negative",
                    options.iterations, options.warmup, options.calibrate));
  }
  const gpu::DeviceInfo device = gpu::current_device();
  OwnedStream owned_stream;
  const cudaStream_t stream = owned_stream.get();
  EventPool events;

  BenchReport report;
  SessionOptions session_options;
  session_options.gemm_autotune = options.gemm_autotune;
  session_options.auto_graph = options.auto_graph;
  session_options.fused_epilogues = options.fused_epilogues;
  session_options.fused_training_epilogues = options.fused_training_epilogues;
  session_options.debug = options.debug;
  session_options.parallel = options.parallel;
  if (program.has_debug_config() && options.graph) {
    throw UsageError(
        "--graph with --debug-config: a debug session runs eagerly (its plan changes by "
        "iteration)");
  }
  Session session(program, options.sequence, stream, session_options);
  session.bind(options.bindings);
  report.sequence = session.sequence();
  report.recipe = program.recipe(report.sequence);
  report.mode = options.mode == BenchMode::Forward ? "fwd" : "fwdbwd";
  report.device = device.name;
  report.arch = device.arch;
  report.sm_count = device.sm_count;
  report.l2_bytes = device.l2_cache_bytes;
  report.bindings = options.bindings;
  report.tp = options.parallel.size;
  report.rank = options.parallel.rank;
  report.graph = options.graph;
  report.build = program.build_stats();
  report.compile_wall_ms = options.compile_wall_ms;
  report.warmup = options.warmup;
  if (program.has_debug_config()) {
    report.notes.push_back(fmt::format(
        "precision debug config: each iteration runs its routing's plan variant and its "
        "statistics are merged{} once the GPU finished it (step() waits for the iteration before "
        "the one it ends); the per-step breakdown is the variant that ran after the warm-up",
        options.debug.log_dir.empty() ? " (not written: no --debug-log-dir)"
                                      : " and written to " + options.debug.log_dir));
  }

  Iteration iteration(session, options, stream);
  bool has_output_grad = false;
  for (const TensorInfo& info : session.tensors()) {
    if (info.kind == TensorKind::Input && !quantized_input_piece(session, info.name))
      iteration.add_rotated(info);
    if (info.kind == TensorKind::OutputGrad && options.mode == BenchMode::ForwardBackward) {
      iteration.add_rotated(info);
      has_output_grad = true;
    }
  }
  if (options.mode == BenchMode::ForwardBackward && !has_output_grad) {
    throw UsageError(fmt::format(
        "--mode fwdbwd needs an output gradient, and sequence '{}' has none", report.sequence));
  }
  session.own_parameters(options.seed, stream);
  report.parameter_bytes = session.memory().owned_bytes;
  // A quantized input (a consumer sequence): one tensor quantized by opfuse::quantize, not
  // rotated (its copies are read once per iteration, as a producer's output would be).
  std::vector<gpu::DeviceBuffer> quantized_memory;
  give_quantized_inputs(session, options.seed, stream, quantized_memory);
  if (!quantized_memory.empty())
    report.notes.push_back("the quantized input is one tensor quantized once, not rotated");

  // The floor for memory-bound kernels, measured before the session's buffers take memory.
  std::size_t free_bytes = 0, total_bytes = 0;
  OPFUSE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), "fusec bench");
  report.copy_bytes = std::min(kCopyBytes, free_bytes / 8) & ~std::size_t{255};
  report.copy_gb_per_s = copy_bandwidth(report.copy_bytes, stream, events);

  report.input_set_bytes = iteration.set_bytes();
  const std::size_t set_bytes = std::max<std::size_t>(report.input_set_bytes, 1);
  int sets = static_cast<int>(std::ceil(kL2Multiple * double(device.l2_cache_bytes) / set_bytes));
  // At most a quarter of the free memory goes to rotation (the session needs the rest).
  sets = std::min({std::max(sets, 2), kMaxRotationSets,
                   std::max(2, static_cast<int>(free_bytes / 4 / set_bytes))});
  iteration.allocate_sets(options.graph ? 1 : sets);
  report.rotation_sets = iteration.sets();

  if (options.mode == BenchMode::Forward && options.calibrate > 0) {
    iteration.calibrate(options.calibrate);
    report.notes.push_back(fmt::format(
        "quantizer scales from {} untimed forwards, each followed by a quantizer update (an "
        "inference loop never updates them; --calibrate 0 keeps the initial scales)",
        options.calibrate));
  }
  gpu::reset_pool_peak();
  session.reset_peak_memory();
  for (int i = 0; i < options.warmup; ++i) iteration.run(i);
  iteration.sync();

  // The profiling pass runs eagerly, also under --graph (a graph's steps are the same kernels).
  const int probe_iterations = agreed(choose_iterations(options, iteration), session, stream);
  report.profile_iterations = std::min(probe_iterations, kProfileIterations);
  gpu::SequenceExecutor& executor = SessionAccess::executor(session);
  for (const std::string& line : executor.collective_overlap())
    report.notes.push_back("collectives: " + line);
  const std::vector<gpu::StepProfile> profiles = executor.step_profiles(
      options.mode == BenchMode::Forward ? gpu::RunMode::Inference : gpu::RunMode::Training);
  events.reserve(2 * profiles.size() * std::size_t(report.profile_iterations));
  StepTimer timer(events);
  executor.set_observer(&timer);
  try {
    for (int i = 0; i < report.profile_iterations; ++i) iteration.run(i);
    iteration.sync();
  } catch (...) {
    executor.set_observer(nullptr);
    throw;
  }
  executor.set_observer(nullptr);
  summarize_steps(profiles, timer.times(), timer.host_times(), options.mode, report);

  if (options.graph) {
    session.capture(stream, options.mode == BenchMode::Forward
                                ? Session::GraphScope::InferenceForward
                                : Session::GraphScope::TrainingStep);
    for (int i = 0; i < std::max(options.warmup, 1); ++i) iteration.run(i);
    iteration.sync();
    report.notes.push_back(
        "graph replay: the inputs are not rotated (a CUDA graph's pointers are fixed), so at "
        "small sizes the L2 may hold them between replays");
  }
  report.iterations = options.graph ? agreed(choose_iterations(options, iteration), session, stream)
                                    : probe_iterations;
  const bool casts_weights = options.recast_weights || options.mode == BenchMode::ForwardBackward ||
                             (options.graph && options.mode == BenchMode::Forward);
  report.weights = casts_weights ? "cast every call" : "cast once, cached";
  report.gemm_algorithms = options.gemm_autotune ? "autotuned" : "cuBLASLt heuristic";
  report.auto_graph = options.auto_graph;
  report.fused_epilogues = options.fused_epilogues;
  report.fused_training_epilogues = options.fused_training_epilogues;
  if (options.fused_epilogues) {
    for (const auto& [step, why] : executor.fused_gemm_refusals())
      report.notes.push_back(fmt::format("step {} runs without its fused epilogue: {}", step, why));
  }
  if (options.graph && options.mode == BenchMode::Forward && !options.recast_weights) {
    report.notes.push_back("graph replay: the recording casts the FP8 weights on every replay");
  }

  events.reserve(2 * std::size_t(report.iterations));
  const std::size_t replays_before = executor.graph_replays();
  report.host_us = host_pass(std::min(report.iterations, kHostIterations), iteration);
  report.time = back_to_back_pass(report.iterations, iteration, events, stream);
  double& gap_us = report.device_gap_us;
  report.device_time =
      queued_pass(report.iterations, report.host_us.p90, iteration, events, stream, gap_us);
  if (const std::size_t replays = executor.graph_replays() - replays_before; replays > 0) {
    report.notes.push_back(fmt::format(
        "{} of the timed inference forwards replayed the session's automatic CUDA graph (inputs "
        "copied into it; SessionOptions::auto_graph)",
        replays));
  }
  // Why 3 us: two back-to-back events read about 1.3 us apart on an H100 with nothing between.
  if (gap_us > 3.0) {
    report.notes.push_back(fmt::format(
        "device-only time: {:.1f} us median idle between queued iterations (the host hold was "
        "too short); it is not free of launch gaps",
        gap_us));
  }

  if (options.trace_iterations > 0) trace_pass(options, iteration, report);

  for (const BenchStep& step : report.steps) {
    if (step.kind == "gemm") report.gemm_flops += step.flops;
  }
  report.tflops = report.gemm_flops / (report.time.median * 1e-3) / 1e12;
  const MemoryStats memory = session.memory();
  // Why the reservation: the buffers are placed in one allocation, which is what the device holds.
  report.executor_peak_bytes = std::max(memory.peak_bytes, memory.reserved_bytes);
  report.peak_bytes = report.executor_peak_bytes + report.parameter_bytes + report.input_set_bytes;
  report.pool_high_bytes = gpu::pool_usage().used_high;
  if (session.has_graph()) session.release_graph();
  return report;
}

}  // namespace opfuse::api
