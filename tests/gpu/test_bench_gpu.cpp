// The benchmark hooks on the GPU: the executor's StepObserver sees every enqueued step (and no
// skipped weight cast), step_profiles() counts bound bytes and GEMM flops, and run_benchmark's
// report is consistent with them (fusec bench, tools/bench/bench.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "api/session_access.h"
#include "bench/bench.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "opfuse/program.h"
#include "test_support.h"

namespace opfuse {
namespace {

constexpr std::int64_t kTokens = 32, kHidden = 256, kFfn = 1024;

constexpr const char* kProgram = test::kSmallFp8Mlp;

// Every before/after call, in order.
class Recorder : public gpu::StepObserver {
 public:
  void before(int step, cudaStream_t stream) override { calls.emplace_back(step, stream, true); }
  void after(int step, cudaStream_t stream) override { calls.emplace_back(step, stream, false); }
  struct Call {
    Call(int s, cudaStream_t st, bool b) : step(s), stream(st), before(b) {}
    int step;
    cudaStream_t stream;
    bool before;
  };
  std::vector<Call> calls;
};

class BenchGpu : public test::GpuStreamTest {
 protected:
  // Device memory of `bytes` zero bytes, freed at the end of the test.
  void* zeros(std::size_t bytes) {
    void* memory = new_array(bytes).data();
    EXPECT_EQ(cudaMemset(memory, 0, bytes), cudaSuccess);
    return memory;
  }
};

TEST_F(BenchGpu, ObserverSeesEveryEnqueuedStepOnceInOrder) {
  const Program program = Program::compile(kProgram, "bench_mlp.fuse");
  Session session(program, "mlp", stream_);
  session.bind({{"tokens", kTokens}});
  session.own_parameters(1, stream_);
  session.set_tensor("x", zeros(kTokens * kHidden * 2));
  gpu::SequenceExecutor& executor = SessionAccess::executor(session);
  // As an inference forward runs them: an activation folded into its GEMM's epilogue (note
  // "Fused GEMM epilogues", where the GPU has the kernel) runs nothing.
  const std::vector<gpu::StepProfile> profiles = executor.step_profiles(gpu::RunMode::Inference);
  std::vector<int> forward_steps, weight_casts;
  for (const gpu::StepProfile& p : profiles) {
    if (p.phase == ir::Phase::Forward && !p.end_of_step && !p.folded)
      forward_steps.push_back(p.index);
    if (p.weight_cast) weight_casts.push_back(p.index);
  }
  ASSERT_FALSE(weight_casts.empty()) << "FP8 delayed scaling casts the weights in the forward";

  Recorder recorder;
  executor.set_observer(&recorder);
  session.forward(stream_, RunMode::Inference);
  std::vector<int> seen;
  for (std::size_t i = 0; i < recorder.calls.size(); i += 2) {
    ASSERT_LT(i + 1, recorder.calls.size());
    EXPECT_TRUE(recorder.calls[i].before);
    EXPECT_FALSE(recorder.calls[i + 1].before);
    EXPECT_EQ(recorder.calls[i].step, recorder.calls[i + 1].step);
    EXPECT_EQ(recorder.calls[i].stream, stream_);
    seen.push_back(recorder.calls[i].step);
  }
  EXPECT_EQ(seen, forward_steps);

  // The weights are cached now: the second forward skips their casts and reports none of them.
  recorder.calls.clear();
  session.forward(stream_, RunMode::Inference);
  std::vector<int> expected;
  for (int step : forward_steps) {
    if (std::find(weight_casts.begin(), weight_casts.end(), step) == weight_casts.end())
      expected.push_back(step);
  }
  seen.clear();
  for (std::size_t i = 0; i < recorder.calls.size(); i += 2) seen.push_back(recorder.calls[i].step);
  EXPECT_EQ(seen, expected);

  executor.set_observer(nullptr);
  recorder.calls.clear();
  session.forward(stream_, RunMode::Inference);
  EXPECT_TRUE(recorder.calls.empty());
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

TEST_F(BenchGpu, StepProfilesCountBoundBytesAndGemmFlops) {
  const Program program = Program::compile(kProgram, "bench_mlp.fuse");
  Session session(program, "mlp", stream_);
  session.bind({{"tokens", kTokens}});
  double forward_flops = 0;
  int gemms = 0;
  for (const gpu::StepProfile& p : SessionAccess::executor(session).step_profiles()) {
    if (p.kind != gpu::StepProfile::Kind::Gemm) continue;
    ++gemms;
    EXPECT_EQ(p.flops, 2.0 * double(p.gemm.m) * double(p.gemm.n) * double(p.gemm.k)) << p.what;
    if (p.phase == ir::Phase::Forward) forward_flops += p.flops;
    // Every element of A, B and D is at least a byte (FP8).
    const double least = double(p.gemm.m * p.gemm.k + p.gemm.n * p.gemm.k + p.gemm.m * p.gemm.n);
    EXPECT_GE(double(p.bytes_read + p.bytes_written), least) << p.what;
  }
  EXPECT_EQ(gemms, 6) << "fprop, dgrad and wgrad of two linears";
  EXPECT_EQ(forward_flops, 2.0 * kTokens * kFfn * kHidden + 2.0 * kTokens * (kFfn / 2) * kHidden);
}

TEST_F(BenchGpu, ReportAgreesWithItsStepsAndWritesJson) {
  const Program program = Program::compile(kProgram, "bench_mlp.fuse");
  api::BenchOptions options;
  options.bindings = {{"tokens", kTokens}};
  options.mode = api::BenchMode::ForwardBackward;
  options.iterations = 25;
  options.warmup = 2;
  const api::BenchReport report = api::run_benchmark(program, options);
  EXPECT_EQ(report.iterations, 25);
  EXPECT_GE(report.rotation_sets, 2);
  EXPECT_GT(report.time.median, 0);
  EXPECT_LE(report.time.p10, report.time.median);
  EXPECT_LE(report.time.median, report.time.p90);
  EXPECT_GT(report.copy_gb_per_s, 100);
  EXPECT_GT(report.host_us.median, 0);
  EXPECT_EQ(report.gemm_flops,
            3 * (2.0 * kTokens * kFfn * kHidden + 2.0 * kTokens * (kFfn / 2) * kHidden));
  EXPECT_NEAR(report.tflops, report.gemm_flops / (report.time.median * 1e-3) / 1e12, 1e-9);
  double gemm_ms = 0;
  for (const api::BenchStep& step : report.steps) {
    EXPECT_TRUE(step.ran) << "training steps cast the weights every time: " << step.what;
    if (step.kind == "gemm") gemm_ms += step.time.median;
  }
  EXPECT_DOUBLE_EQ(report.gemm_ms, gemm_ms);
  EXPECT_GT(report.peak_bytes, report.parameter_bytes);

  const nlohmann::json json = nlohmann::json::parse(api::bench_report_json(report));
  EXPECT_EQ(json["mode"], "fwdbwd");
  EXPECT_EQ(json["steps"].size(), report.steps.size());
  EXPECT_DOUBLE_EQ(json["time_ms"]["median"].get<double>(), report.time.median);
}

TEST_F(BenchGpu, GraphReplayUsesOneInputSetAndSaysSo) {
  const Program program = Program::compile(kProgram, "bench_mlp.fuse");
  api::BenchOptions options;
  options.bindings = {{"tokens", kTokens}};
  options.graph = true;
  options.iterations = 20;
  options.warmup = 1;
  const api::BenchReport report = api::run_benchmark(program, options);
  EXPECT_EQ(report.rotation_sets, 1);
  EXPECT_GT(report.time.median, 0);
  bool noted = false;
  for (const std::string& note : report.notes)
    noted |= note.find("not rotated") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_EQ(report.weights, "cast every call");
  ASSERT_FALSE(report.steps.empty());
  for (const api::BenchStep& step : report.steps)
    EXPECT_EQ(step.phase, "forward") << "a forward benchmark lists no backward step: " << step.what;
}

// The forward benchmark's calibration (BenchOptions::calibrate) rests on inference forwards
// recording the amaxes that step() turns into scales: without it, delayed scaling's quantizers
// keep the initial scale of 1 however many forwards run.
TEST_F(BenchGpu, InferenceForwardsAndStepsGiveDelayedScalingItsScales) {
  const Program program = Program::compile(kProgram, "bench_mlp.fuse");
  Session session(program, "mlp", stream_);
  session.bind({{"tokens", kTokens}});
  session.own_parameters(1, stream_);
  std::mt19937_64 rng(5);
  const test::DeviceArray& x = new_array(std::size_t(kTokens * kHidden) * 2);
  test::upload_bf16(x, test::random_bf16(std::size_t(kTokens * kHidden), 1.0, rng));
  session.set_tensor("x", x.data());
  auto scale_of = [&](const std::string& name) {
    for (const QuantizerStatus& q : session.quantizers(stream_))
      if (q.name == name) return q.scale;
    ADD_FAILURE() << "no quantizer " << name;
    return 0.0f;
  };
  for (int i = 0; i < 3; ++i) session.forward(stream_, RunMode::Inference);
  EXPECT_EQ(scale_of("fc1.input"), 1.0f) << "forwards alone do not update the quantizers";
  EXPECT_EQ(scale_of("fc1.weight"), 1.0f);
  session.step(stream_);
  EXPECT_NE(scale_of("fc1.input"), 1.0f) << "step() turned the recorded amax into a scale";
  EXPECT_NE(scale_of("fc1.weight"), 1.0f);
  EXPECT_NE(scale_of("fc2.input"), 1.0f);
}

TEST_F(BenchGpu, ForwardBenchmarkCalibratesTheScalesAndSaysSo) {
  const Program program = Program::compile(kProgram, "bench_mlp.fuse");
  auto calibration_noted = [&](api::BenchMode mode, int calibrate) {
    api::BenchOptions options;
    options.bindings = {{"tokens", kTokens}};
    options.mode = mode;
    options.iterations = 5;
    options.warmup = 1;
    options.calibrate = calibrate;
    const api::BenchReport report = api::run_benchmark(program, options);
    bool noted = false;
    for (const std::string& note : report.notes)
      noted |= note.find("quantizer scales from " + std::to_string(calibrate)) != std::string::npos;
    return noted;
  };
  EXPECT_TRUE(calibration_noted(api::BenchMode::Forward, 3));
  EXPECT_FALSE(calibration_noted(api::BenchMode::Forward, 0));
  EXPECT_FALSE(calibration_noted(api::BenchMode::ForwardBackward, 3))
      << "a training benchmark updates the quantizers every iteration";
}

// fusec bench --trace (gpu/activity_trace.h): the CUPTI timeline of the traced iterations holds
// every GEMM and generated kernel of each of them, as Chrome trace JSON, and its summary is
// consistent (the GPU busy at most the span; the events inside it).
TEST_F(BenchGpu, TraceRecordsEveryKernelOfTheTracedIterations) {
  const Program program = Program::compile(kProgram, "bench_mlp.fuse");
  api::BenchOptions options;
  options.bindings = {{"tokens", kTokens}};
  options.mode = api::BenchMode::ForwardBackward;
  options.iterations = 5;
  options.warmup = 1;
  options.trace_iterations = 3;
  const api::BenchReport report = api::run_benchmark(program, options);
  const api::BenchReport::Trace& t = report.trace;
  ASSERT_EQ(t.iterations, 3);
  EXPECT_FALSE(t.library.empty());
  EXPECT_EQ(t.dropped, 0u);
  std::size_t launches = 0;  // every step of a training iteration launches one kernel or GEMM
  for (const api::BenchStep& step : report.steps) launches += step.ran ? 1 : 0;
  EXPECT_GE(t.kernels, 3 * launches) << "a GEMM may run more than one kernel, never fewer";
  EXPECT_GT(t.span_ms, 0);
  EXPECT_GT(t.busy_ms, 0);
  EXPECT_LE(t.busy_ms, t.span_ms);

  const nlohmann::json json = nlohmann::json::parse(t.json);
  std::size_t complete = 0, kernels = 0;
  double first = 0, last = 0;
  for (const nlohmann::json& e : json["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    EXPECT_GE(dur, 0) << e.dump();
    first = complete == 0 ? ts : std::min(first, ts);
    last = std::max(last, ts + dur);
    ++complete;
    kernels += e["cat"] == "kernel" ? 1 : 0;
  }
  EXPECT_EQ(complete, t.activities);
  EXPECT_EQ(kernels, t.kernels);
  EXPECT_NEAR((last - first) * 1e-3, t.span_ms, 1e-6 + 1e-9 * last);
  bool saw_gemm_or_cast = false;
  for (const nlohmann::json& e : json["traceEvents"]) {
    const std::string name = e.value("name", "");
    saw_gemm_or_cast |= name.find("opfuse::") != std::string::npos;
  }
  EXPECT_TRUE(saw_gemm_or_cast) << "the generated kernels appear under their demangled names";
  EXPECT_NE(api::format_bench_report(report).find("GPU trace"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(api::bench_report_json(report))["trace"]["kernels"], t.kernels);
}

}  // namespace
}  // namespace opfuse
