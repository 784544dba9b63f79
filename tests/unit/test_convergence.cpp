// Issue 4's convergence test: a small regression MLP trained 200 steps from one seed on the CPU
// reference in fp32, bf16, FP8 delayed scaling and FP8 current scaling, where both FP8 runs end
// within 2% of the fp32 loss.
//
// Why this setup. The target is a fixed random "teacher" MLP of the student's shape plus Gaussian
// noise, so no run can go below the noise floor (0.5 * 0.5^2 = 0.125 in this loss) and fp32 ends
// near it (0.194) instead of at zero, where FP8 would only show its quantization floor. 1024
// tokens give 32k targets for 8k weights, so the student cannot memorize the noise either (with
// 512 tokens fp32 dipped to 0.16). Learning rate 2 converges in 200 steps; 4 ends lower in fp32
// but lets the E5M2 gradients' noise show (FP8 +10%).
//
// The FP8 runs store fp32, like TE's fp8_autocast over fp32 parameters, so they measure what the
// recipe changes: GEMM operands in E4M3 (forward) and E5M2 (gradients). Parameters take the dtype
// of the tensor flowing in and SGD updates them in place without an fp32 master copy, so bf16
// storage loses updates below bf16's resolution: the bf16 run ends 5.4% above fp32, and FP8 runs
// on bf16 storage end +5.2% above fp32 but within 0.1% of the bf16 run. That gap is storage's,
// not FP8's, and is bounded separately below.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "driver/frontend.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"

namespace opfuse::cpu {
namespace {

constexpr int kTokens = 1024;
constexpr int kHidden = 32;
constexpr int kFfn = 128;
constexpr int kSteps = 200;
constexpr double kLearningRate = 2.0;
constexpr double kTeacherWeightStd = 0.17;  // teacher output variance 1.42
constexpr double kTargetNoiseStd = 0.5;

ir::Program compile(const std::string& dtype, const std::string& recipe) {
  const std::string text = fmt::format(
      "recipe r = {0}\n"
      "sequence mlp(x: {1}[tokens, {2}]) -> (y: {1}[tokens, {2}]) uses r {{\n"
      "  layernorm({2})\n  linear({2}, {3}) as fc1\n  gelu()\n  linear({3}, {2}) as fc2\n}}\n",
      recipe, dtype, kHidden, kFfn);
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto program = load_program_from_source("mlp.fuse", text, sources, diags);
  EXPECT_FALSE(diags.has_errors()) << diags.format_all();
  if (!program) throw std::runtime_error("program did not compile");
  return *program;
}

struct Task {
  Tensor<float> input;
  Tensor<float> target;
  double noise_floor = 0;  // the loss of predicting the teacher exactly
};

Task make_task() {
  Task task;
  task.input = seeded_normal({kTokens, kHidden}, 7, 1.0);
  const ir::Program p = compile("fp32", "bf16()");
  ReferenceExecutor<float> teacher(p.sequences[0], {{"tokens", kTokens}});
  init_params_from_seed(teacher, 1);
  uint64_t seed = 1000;
  for (const char* name : {"fc1.weight", "fc2.weight"}) {
    Tensor<float>& w = teacher.param(name);
    w = seeded_normal(w.shape, seed++, kTeacherWeightStd);
  }
  teacher.params_changed();
  task.target = teacher.forward({task.input})[0];
  const Tensor<float> noise = seeded_normal(task.target.shape, 2000, kTargetNoiseStd);
  for (size_t i = 0; i < task.target.data.size(); ++i) {
    task.target.data[i] += noise.data[i];
    task.noise_floor += 0.5 * double(noise.data[i]) * noise.data[i] / double(noise.numel());
  }
  return task;
}

struct TrainingRun {
  double first_loss = 0, last_loss = 0;
  size_t quantizers = 0;
};

TrainingRun train(const Task& task, const std::string& dtype, const std::string& recipe) {
  const ir::Program p = compile(dtype, recipe);
  ReferenceExecutor<float> exec(p.sequences[0], {{"tokens", kTokens}});
  init_params_from_seed(exec, 0);
  TrainingRun run;
  run.quantizers = exec.quantizers().size();
  for (int step = 0; step < kSteps; ++step) {
    const Tensor<float> y = exec.forward({task.input})[0];
    Tensor<float> dy = Tensor<float>::zeros(y.shape);
    double loss = 0;
    for (size_t i = 0; i < y.data.size(); ++i) {
      const double diff = double(y.data[i]) - task.target.data[i];
      loss += 0.5 * diff * diff / double(y.numel());
      dy.data[i] = float(diff / double(y.numel()));
    }
    if (step == 0) run.first_loss = loss;
    run.last_loss = loss;
    const Gradients<float> grads = exec.backward({dy});
    exec.step();
    exec.sgd_step(grads, kLearningRate);
  }
  return run;
}

double relative_gap(const TrainingRun& run, const TrainingRun& reference) {
  return run.last_loss / reference.last_loss - 1.0;
}

TEST(Convergence, Fp8RunsEndWithinTwoPercentOfFp32) {
  const Task task = make_task();
  const TrainingRun fp32 = train(task, "fp32", "bf16()");
  const TrainingRun bf16 = train(task, "bf16", "bf16()");
  const TrainingRun delayed = train(task, "fp32", "delayed_scaling(amax_history = 16)");
  const TrainingRun current = train(task, "fp32", "current_scaling()");
  fmt::print(
      "noise floor {:.5f}; loss first -> last: fp32 {:.5f} -> {:.5f}, bf16 {:.5f} -> {:.5f} "
      "({:+.2f}%), delayed {:.5f} -> {:.5f} ({:+.2f}%), current {:.5f} -> {:.5f} ({:+.2f}%)\n",
      task.noise_floor, fp32.first_loss, fp32.last_loss, bf16.first_loss, bf16.last_loss,
      100 * relative_gap(bf16, fp32), delayed.first_loss, delayed.last_loss,
      100 * relative_gap(delayed, fp32), current.first_loss, current.last_loss,
      100 * relative_gap(current, fp32));

  // Measured (RelWithDebInfo, x86-64): noise floor 0.1228; first loss 0.834 in every run; last
  // fp32 0.19411, bf16 0.20451 (+5.36%), delayed 0.19545 (+0.69%), current 0.19526 (+0.59%);
  // the executor before the training graph gave +0.74% and +0.60%. Seeds 1-3 for the student and
  // the inputs gave FP8 gaps of 0.38-0.68% and bf16 5.4-5.7%.
  // Every run must at least halve the loss (measured: to 0.23-0.25 of the first).
  for (const TrainingRun& run : {fp32, bf16, delayed, current}) {
    ASSERT_TRUE(std::isfinite(run.last_loss));
    EXPECT_LT(run.last_loss, 0.5 * run.first_loss);
  }
  // The bound: 2%, about 3x the largest gap measured over four seeds, yet below what a real
  // regression shows here (FP8 on bf16 storage +5.2%, FP8 at learning rate 4 +10%).
  for (const TrainingRun& fp8 : {delayed, current}) {
    EXPECT_GT(fp8.quantizers, 0u) << "the FP8 recipe made no quantizers";
    EXPECT_NE(fp8.last_loss, fp32.last_loss) << "FP8 changed nothing: is it applied?";
    EXPECT_LT(relative_gap(fp8, fp32), 0.02);
    EXPECT_GT(relative_gap(fp8, fp32), -0.02);
  }
  EXPECT_EQ(fp32.quantizers, 0u);
  // bf16 storage's own gap (no master weights, see the top): within 10% (measured 5.4-5.7%).
  EXPECT_LT(relative_gap(bf16, fp32), 0.10);
}

}  // namespace
}  // namespace opfuse::cpu
