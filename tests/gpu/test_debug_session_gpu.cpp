// Precision debugging through the embedding API on the GPU (docs/debugging.md, "Sessions"): a
// Session of a program compiled with a debug config switches plan variants by iteration, carries
// the quantizer state across them, logs each iteration's statistics to the files and the callback
// once the GPU finished it, and `fusec run --device gpu --debug-config` logs what `--device cpu`
// logs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "debug/stat_log.h"
#include "gpu_test_support.h"
#include "opfuse/program.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;

constexpr const char* kProgram = R"(recipe fp8 = delayed_scaling(amax_history = 8)
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses fp8 {
  layernorm(256)
  linear(256, 512) as fc1
  gelu()
  linear(512, 256) as fc2
}
)";

// fc1's tensors every other iteration, fc2's dgrad out of FP8 always and its gradient logged at
// iterations 1 and 2: iterations 0..3 run four different variants.
constexpr const char* kConfig = R"(log_fc1:
  layers:
    layer_name_regex_pattern: fc1
  transformer_engine:
    LogTensorStats:
      enabled: True
      tensors: [activation, weight, output, gradient, dgrad, wgrad]
      stats: [max, min, std, l2_norm, cur_amax]
      freq: 2
hp_fc2:
  layers:
    exact_layer_names: [fc2]
  transformer_engine:
    DisableFP8GEMM:
      enabled: True
      gemms: [dgrad]
    LogTensorStats:
      enabled: True
      tensors: [gradient]
      stats: [l2_norm]
      start_step: 1
      end_step: 2
)";

class DebugSessionGpu : public test::GpuStreamTest {
 protected:
  void* random_bf16(std::size_t elements, std::uint32_t seed) {
    std::mt19937_64 rng(seed);
    const test::DeviceArray& array = new_array(elements * 2);
    test::upload_bf16(array, test::random_bf16(elements, 1.0, rng));
    return array.data();
  }
  Program compile(bool with_config) {
    CompileOptions options;
    if (with_config) options.debug_config = DebugConfigSource{"", kConfig, "debug.yaml"};
    return Program::compile(kProgram, "mlp.fuse", options);
  }
  // A session with owned parameters (seed 5) and fixed x, dy.
  Session make_session(const Program& program, const DebugSessionOptions& debug = {}) {
    SessionOptions options;
    options.debug = debug;
    Session session(program, "", stream_, options);
    session.bind({{"tokens", 128}});
    session.own_parameters(5, stream_);
    session.set_tensor("x", x_ ? x_ : (x_ = random_bf16(128 * 256, 1)));
    session.set_tensor("dy", dy_ ? dy_ : (dy_ = random_bf16(128 * 256, 2)));
    return session;
  }
  void train(Session& session, int steps) {
    for (int i = 0; i < steps; ++i) {
      session.forward(stream_);
      session.backward(stream_);
      session.step(stream_);
    }
    session.flush_debug_stats();
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  void* x_ = nullptr;
  void* dy_ = nullptr;
};

TEST_F(DebugSessionGpu, StatisticsGoToTheFilesAndTheCallbackAtTheirIterations) {
  const Program program = compile(true);
  const std::string dir = test::make_temp_dir("debug_session");
  std::vector<DebugStat> seen;
  DebugSessionOptions debug;
  debug.log_dir = dir;
  debug.start_iteration = 10;
  debug.on_stat = [&seen](const DebugStat& s) { seen.push_back(s); };
  Session session = make_session(program, debug);
  EXPECT_EQ(session.debug_iteration(), 10);
  train(session, 4);
  EXPECT_EQ(session.debug_iteration(), 14);

  const std::vector<debug::StatRecord> logged =
      debug::read_stat_jsonl(fs::path(dir) / "opfuse_statistics" / "globalrank-0.jsonl");
  ASSERT_EQ(logged.size(), seen.size());
  std::map<std::int64_t, int> per_iteration;
  for (std::size_t i = 0; i < logged.size(); ++i) {
    EXPECT_EQ(logged[i].layer, seen[i].layer);
    EXPECT_EQ(logged[i].tensor, seen[i].tensor);
    EXPECT_EQ(logged[i].stat, seen[i].stat);
    EXPECT_EQ(logged[i].iteration, seen[i].iteration);
    EXPECT_EQ(logged[i].value, seen[i].value);
    ++per_iteration[logged[i].iteration];
    EXPECT_TRUE(std::isfinite(logged[i].value)) << logged[i].layer << " " << logged[i].stat;
  }
  // fc1: 6 tensors x 5 stats at 10 and 12; fc2's gradient (start_step 1, end_step 2: iterations)
  // never from 10 on.
  EXPECT_EQ(per_iteration[10], 30);
  EXPECT_EQ(per_iteration.count(11), 0u);
  EXPECT_EQ(per_iteration[12], 30);
  EXPECT_EQ(per_iteration.count(13), 0u);
  const std::string text = test::read_text(
      (fs::path(dir) / "nvdlfw_inspect_statistics_logs" / "nvdlfw_inspect_globalrank-0.log")
          .string());
  EXPECT_TRUE(test::contains(text, "fc1_activation_max \t\t\t\t iteration=000010 \t\t\t\t value="));
  EXPECT_FALSE(test::contains(text, "iteration=000011"));
}

// step() logs an iteration once the GPU has finished it, without draining the stream: by the time
// the step() after it returns at the latest, and in iteration order.
TEST_F(DebugSessionGpu, StatisticsTrailTheGpuByAtMostOneIterationInOrder) {
  const Program program = compile(true);
  std::vector<std::int64_t> iterations;
  DebugSessionOptions debug;
  debug.start_iteration = 10;
  debug.on_stat = [&iterations](const DebugStat& s) { iterations.push_back(s.iteration); };
  Session session = make_session(program, debug);
  const auto one_step = [&] {
    session.forward(stream_);
    session.backward(stream_);
    session.step(stream_);
  };
  one_step();  // iteration 10: 30 statistics, logged now or later
  EXPECT_TRUE(iterations.empty() || iterations.size() == 30u) << iterations.size();
  one_step();  // 11 (nothing to log) waits for 10
  ASSERT_EQ(iterations.size(), 30u);
  one_step();  // 12
  one_step();  // 13 waits for 12
  ASSERT_EQ(iterations.size(), 60u);
  session.flush_debug_stats();
  ASSERT_EQ(iterations.size(), 60u);
  EXPECT_TRUE(std::is_sorted(iterations.begin(), iterations.end()));
  EXPECT_EQ(iterations.front(), 10);
  EXPECT_EQ(iterations.back(), 12);
}

// Statistics observe; they do not change the training. The variants' quantizer states continue
// from one another: after four iterations through four variants the outputs and every quantizer's
// amax history agree with a session without a config (within the rounding the unfused casts of
// an instrumented layer and the high-precision dgrad change).
TEST_F(DebugSessionGpu, VariantsCarryTheQuantizerStateAndTrainAsThePlainPlan) {
  const Program plain_program = compile(false);
  const Program debug_program = compile(true);
  Session plain = make_session(plain_program);
  const std::string dir = test::make_temp_dir("debug_session_train");
  DebugSessionOptions debug;
  debug.log_dir = dir;
  Session routed = make_session(debug_program, debug);
  train(plain, 4);
  train(routed, 4);
  EXPECT_EQ(routed.debug_iteration(), 4);
  const std::vector<QuantizerStatus> a = plain.quantizers(stream_);
  const std::vector<QuantizerStatus> b = routed.quantizers(stream_);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t q = 0; q < a.size(); ++q) {
    ASSERT_EQ(a[q].name, b[q].name);
    ASSERT_EQ(a[q].amax_history.size(), b[q].amax_history.size());
    // The last four slots hold the four iterations' amaxes (the roll puts the newest last).
    const std::size_t length = a[q].amax_history.size();
    ASSERT_GE(length, 5u);
    for (std::size_t i = length - 4; i < length; ++i) {
      const double want = a[q].amax_history[i];
      ASSERT_GT(want, 0) << a[q].name << " slot " << i;
      EXPECT_NEAR(b[q].amax_history[i], want, 0.03 * want) << a[q].name << " slot " << i;
    }
    EXPECT_NEAR(b[q].scale, a[q].scale, 0.03 * a[q].scale) << a[q].name;
  }
  plain.forward(stream_, RunMode::Inference);
  routed.forward(stream_, RunMode::Inference);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<float> ya = test::download_bf16(plain.output("y"), 128 * 256);
  const std::vector<float> yb = test::download_bf16(routed.output("y"), 128 * 256);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ya.size(); ++i) {
    diff += (ya[i] - yb[i]) * (ya[i] - yb[i]);
    norm += ya[i] * ya[i];
  }
  // Same parameters, scales within 3%: the FP8 casts round differently (E4M3 keeps 3 mantissa
  // bits), which moves y by a few percent; a state lost in a switch (scale 1) moves it far more.
  EXPECT_LT(std::sqrt(diff / norm), 0.05);
}

// Forty inference forwards before one step(): the session merges older runs' records as it goes
// (a bounded number of pinned buffers) and logs one iteration whose values equal one run's (the
// same input each time).
TEST_F(DebugSessionGpu, ManyForwardsBeforeAStepMergeIntoOneIteration) {
  const Program program = compile(true);
  std::vector<DebugStat> one, many;
  for (const int forwards : {1, 40}) {
    std::vector<DebugStat>& seen = forwards == 1 ? one : many;
    DebugSessionOptions debug;
    debug.on_stat = [&seen](const DebugStat& s) { seen.push_back(s); };
    Session session = make_session(program, debug);
    for (int i = 0; i < forwards; ++i) session.forward(stream_, RunMode::Inference);
    session.step(stream_);
  }
  ASSERT_EQ(one.size(), many.size());
  ASSERT_FALSE(one.empty());
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].stat, many[i].stat);
    if (one[i].stat == "max" || one[i].stat == "min" || one[i].stat == "cur_amax") {
      EXPECT_EQ(one[i].value, many[i].value) << one[i].layer << "_" << one[i].tensor;
    } else if (one[i].stat == "std") {
      // Sample std of 40 copies: N - 1 becomes 40 N - 1 (a relative change of about 1 / N).
      EXPECT_NEAR(many[i].value, one[i].value, 1e-4 * std::abs(one[i].value) + 1e-12);
    }
  }
}

TEST_F(DebugSessionGpu, MisuseIsRefusedBeforeAnythingRuns) {
  const Program program = compile(true);
  DebugSessionOptions unwritable;
  unwritable.log_dir = "/proc/opfuse_cannot_write_here";
  EXPECT_THROW(
      {
        SessionOptions options;
        options.debug = unwritable;
        Session session(program, "", stream_, options);
      },
      UsageError);
  Session session = make_session(program);
  cudaStream_t capture_stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&capture_stream), cudaSuccess);
  try {
    session.capture(capture_stream, Session::GraphScope::TrainingStep);
    ADD_FAILURE() << "capture() under a debug config was accepted";
  } catch (const UsageError& e) {
    EXPECT_TRUE(test::contains(e.what(), "runs eagerly")) << e.what();
  }
  (void)cudaStreamDestroy(capture_stream);
  const Program plain = compile(false);
  Session no_config = make_session(plain);
  EXPECT_THROW((void)no_config.debug_iteration(), UsageError);
}

// `fusec run --device gpu --debug-config` logs the same statistics at the same iterations as the
// CPU reference, with values within the GPU-vs-CPU error of the tensors they describe.
TEST_F(DebugSessionGpu, FusecRunOnTheGpuLogsWhatTheCpuReferenceLogs) {
  const std::string dir = test::make_temp_dir("debug_fusec_run");
  const std::string program = dir + "/mlp.fuse", config = dir + "/debug.yaml";
  {
    std::FILE* f = std::fopen(program.c_str(), "w");
    std::fputs(kProgram, f);
    std::fclose(f);
    f = std::fopen(config.c_str(), "w");
    std::fputs(kConfig, f);
    std::fclose(f);
  }
  std::map<std::string, std::vector<debug::StatRecord>> logs;
  for (const std::string device : {"gpu", "cpu"}) {
    const test::CommandResult r =
        test::fusec("run " + test::shell_quoted(program) + " --device " + device +
                    " --bind tokens=64 --steps 4 --debug-config " + test::shell_quoted(config) +
                    " --debug-log-dir " + test::shell_quoted(dir + "/" + device));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    logs[device] =
        debug::read_stat_jsonl(fs::path(dir) / device / "opfuse_statistics" / "globalrank-0.jsonl");
  }
  const auto& gpu = logs["gpu"];
  const auto& cpu = logs["cpu"];
  ASSERT_EQ(gpu.size(), cpu.size());
  // fc1 at 0 and 2 (30 each), fc2's gradient at 1 and 2.
  EXPECT_EQ(gpu.size(), 62u);
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_EQ(std::tie(gpu[i].layer, gpu[i].tensor, gpu[i].stat, gpu[i].iteration),
              std::tie(cpu[i].layer, cpu[i].tensor, cpu[i].stat, cpu[i].iteration));
    const double tolerance = 0.03 * std::abs(cpu[i].value) + 1e-6;
    EXPECT_NEAR(gpu[i].value, cpu[i].value, tolerance)
        << gpu[i].layer << "_" << gpu[i].tensor << "_" << gpu[i].stat << " at " << gpu[i].iteration;
  }
}

// Application features through the embedding API (opfuse/debug_feature.h) on the GPU: an inspector
// gets the tensor after the run and its statistic reaches the callback; a pointwise modifier runs
// in the variant.
class NegativeShare final : public DebugFeature {
 public:
  std::string name() const override { return "NegativeShare"; }
  bool selects_tensors() const override { return true; }
  DebugRoute inspect_tensor_enabled(std::string_view, const DebugSettings&, DebugTensor,
                                    std::int64_t) const override {
    return {true, kDebugNever};
  }
  std::vector<DebugFeatureStat> inspect_tensor(std::string_view, const DebugSettings&, DebugTensor,
                                               const DebugInspectedTensor& t,
                                               std::int64_t) const override {
    double negative = 0;
    for (const float v : t.values) negative += v < 0 ? 1 : 0;
    // The FP8 copy fprop reads (delayed scaling: one scale_inv, no column-wise copy of its own):
    // the worst dequantization error in units of E4M3's rounding bound (at most 1).
    const DebugQuantizedTensor& q = t.rowwise;
    double worst = q.values.size() == t.values.size() && q.scale_inv.size() == 1 ? 0 : 1e9;
    for (std::size_t i = 0; i < q.values.size() && i < t.values.size(); ++i) {
      const double bound = 0.0625 * std::abs(t.values[i]) + std::ldexp(1.0, -10) * q.scale_inv[0];
      worst = std::max(worst, std::abs(double(q.values[i]) * q.scale_inv[0] - t.values[i]) / bound);
    }
    return {{"negative_share", negative / double(t.values.size())},
            {"fp8_copy_error", worst},
            {"fp8_copies", double(q.empty() ? 0 : 1) + double(t.columnwise.empty() ? 0 : 1) +
                               (q.format == "e4m3" ? 10 : 0)}};
  }
};

class ClipAll final : public DebugFeature {
 public:
  std::string name() const override { return "ClipAll"; }
  bool selects_gemms() const override { return true; }
  bool selects_tensors() const override { return true; }
  bool modifies() const override { return true; }
  DebugRoute modify_tensor_enabled(std::string_view, const DebugSettings&, DebugGemm, DebugTensor,
                                   std::int64_t) const override {
    return {true, kDebugNever};
  }
  std::optional<DebugModification> modify_tensor(std::string_view, const DebugSettings&, DebugGemm,
                                                 DebugTensor, std::int64_t) const override {
    DebugModification m;
    m.expr = min(max(DebugExpr::x(), DebugExpr(-1e-3)), DebugExpr(1e-3));
    return m;
  }
};

TEST_F(DebugSessionGpu, ApplicationFeaturesInspectAndModify) {
  CompileOptions options;
  options.debug_config = DebugConfigSource{"", R"(share:
  layers: {exact_layer_names: [fc1]}
  transformer_engine:
    NegativeShare: {tensors: [weight]}
clip:
  layers: {exact_layer_names: [fc2]}
  transformer_engine:
    ClipAll: {gemms: [fprop], tensors: [weight]}
)",
                                           "debug.yaml"};
  options.debug_features = {std::make_shared<NegativeShare>(), std::make_shared<ClipAll>()};
  const Program program = Program::compile(kProgram, "mlp.fuse", options);
  std::vector<DebugStat> seen;
  DebugSessionOptions debug;
  debug.on_stat = [&seen](const DebugStat& s) { seen.push_back(s); };
  Session session = make_session(program, debug);
  const std::vector<float> w = test::download_bf16(session.parameter("fc1.weight"), 512 * 256);
  double negative = 0;
  for (const float v : w) negative += v < 0 ? 1 : 0;
  train(session, 1);
  ASSERT_EQ(seen.size(), 3u);
  std::map<std::string, double> stats;
  for (const DebugStat& s : seen) {
    EXPECT_EQ(s.layer, "fc1");
    EXPECT_EQ(s.tensor, "weight");
    stats[s.stat] = s.value;
  }
  EXPECT_DOUBLE_EQ(stats.at("negative_share"), negative / double(w.size()));
  EXPECT_LE(stats.at("fp8_copy_error"), 1.0);
  EXPECT_EQ(stats.at("fp8_copies"), 11.0);  // an E4M3 row-wise copy, no column-wise one
  // fc2's fprop reads its weight clipped to 1e-3 (~N(0, 0.02) otherwise): y shrinks by far.
  const Program plain = compile(false);
  Session reference = make_session(plain);
  reference.forward(stream_, RunMode::Inference);
  session.forward(stream_, RunMode::Inference);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<float> y_plain = test::download_bf16(reference.output("y"), 128 * 256);
  const std::vector<float> y_clip = test::download_bf16(session.output("y"), 128 * 256);
  double a = 0, b = 0;
  for (std::size_t i = 0; i < y_plain.size(); ++i) {
    a += y_plain[i] * y_plain[i];
    b += y_clip[i] * y_clip[i];
  }
  EXPECT_LT(std::sqrt(b), 0.2 * std::sqrt(a));
}

}  // namespace
}  // namespace opfuse
