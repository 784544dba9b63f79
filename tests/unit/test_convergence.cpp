// Training a small regression MLP on the CPU reference converges under every precision: fp32
// storage, bf16 storage, FP8 delayed scaling and FP8 current scaling, each from the same seed
// towards the same fixed random "teacher" network, with the FP8 runs ending close to fp32.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../../runtime/cpu/reference_executor.h"
#include "../../runtime/cpu/run_driver.h"
#include "driver/frontend.h"

namespace opfuse::cpu {
namespace {

constexpr int kTokens = 64;
constexpr int kSteps = 200;
constexpr double kLearningRate = 2.0;

ir::Program compile(const std::string& dtype, const std::string& recipe) {
  const std::string text = fmt::format(
      "recipe r = {}\n"
      "sequence mlp(x: {}[tokens, 64]) -> (y: {}[tokens, 64]) uses r {{\n"
      "  layernorm(64)\n  linear(64, 256) as fc1\n  gelu()\n  linear(256, 64) as fc2\n}}\n",
      recipe, dtype, dtype);
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto program = load_program_from_source("mlp.fuse", text, sources, diags);
  EXPECT_FALSE(diags.has_errors()) << diags.format_all();
  if (!program) throw std::runtime_error("program did not compile");
  return *program;
}

// The fixed target: an fp32 copy of the network with larger random weights, applied to the input.
Tensor<float> teacher_output(const Tensor<float>& x) {
  const ir::Program p = compile("fp32", "bf16()");
  ReferenceExecutor<float> teacher(p.sequences[0], {{"tokens", kTokens}});
  init_params_from_seed(teacher, 1);
  uint64_t seed = 1000;
  for (const char* name : {"fc1.weight", "fc2.weight"}) {
    Tensor<float>& w = teacher.param(name);
    w = seeded_normal(w.shape, seed++, 0.15);
  }
  teacher.params_changed();
  // Noise on the target slows the fit: after 200 steps fp32 is still limited by optimization, not
  // by its precision, so the FP8 runs are compared with fp32 where both are (without the noise
  // fp32 reaches 4e-4 and the comparison would only measure FP8's quantization floor).
  Tensor<float> target = teacher.forward({x})[0];
  const Tensor<float> noise = seeded_normal(target.shape, 2000, 0.3);
  for (size_t i = 0; i < target.data.size(); ++i) target.data[i] += noise.data[i];
  return target;
}

struct Losses {
  double first = 0, last = 0;
};

Losses train(const std::string& dtype, const std::string& recipe) {
  const ir::Program p = compile(dtype, recipe);
  ReferenceExecutor<float> exec(p.sequences[0], {{"tokens", kTokens}});
  init_params_from_seed(exec, 0);
  Tensor<float> x = seeded_normal({kTokens, 64}, 7, 1.0);
  const Tensor<float> target = teacher_output(x);
  Losses losses;
  for (int step = 0; step < kSteps; ++step) {
    const Tensor<float> y = exec.forward({x})[0];
    Tensor<float> dy = Tensor<float>::zeros(y.shape);
    double loss = 0;
    for (size_t i = 0; i < y.data.size(); ++i) {
      const double diff = double(y.data[i]) - target.data[i];
      loss += 0.5 * diff * diff / double(y.numel());
      dy.data[i] = float(diff / double(y.numel()));
    }
    if (step == 0) losses.first = loss;
    losses.last = loss;
    const Gradients<float> grads = exec.backward({dy});
    exec.step();
    exec.sgd_step(grads, kLearningRate);
  }
  return losses;
}

TEST(Convergence, SmallMlpConvergesUnderEveryRecipe) {
  const Losses fp32 = train("fp32", "bf16()");
  const Losses bf16 = train("bf16", "bf16()");
  const Losses delayed = train("bf16", "delayed_scaling(amax_history = 16)");
  const Losses current = train("bf16", "current_scaling()");
  fmt::print(
      "final losses (first -> last): fp32 {:.6g} -> {:.6g}, bf16 {:.6g} -> {:.6g}, "
      "delayed {:.6g} -> {:.6g}, current {:.6g} -> {:.6g}\n",
      fp32.first, fp32.last, bf16.first, bf16.last, delayed.first, delayed.last, current.first,
      current.last);
  // Measured on the development machine: first loss 1.8618 for all four; last loss
  // fp32 0.00406, bf16 0.00258, delayed 0.00447 (1.10x fp32), current 0.00597 (1.47x fp32).
  // Every run must cut the loss by 100x (measured 310x or more).
  for (const Losses& l : {fp32, bf16, delayed, current}) {
    EXPECT_TRUE(std::isfinite(l.last));
    EXPECT_LT(l.last, l.first / 100);
  }
  // FP8 must end within 2x of fp32's final loss (measured 1.10x and 1.47x; a relative bound this
  // loose because at this loss FP8's quantization noise is a visible share of it), and within
  // 0.2% of the starting loss in absolute terms (measured 0.02% and 0.11%).
  for (const Losses& l : {delayed, current}) {
    EXPECT_LT(l.last, 2 * fp32.last);
    EXPECT_LT(std::fabs(l.last - fp32.last), 0.002 * fp32.first);
  }
}

}  // namespace
}  // namespace opfuse::cpu
