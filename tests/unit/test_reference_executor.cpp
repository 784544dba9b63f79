// The CPU reference executor's FP8 emulation (delayed scaling over many steps, current-scaling
// casts, fp8_weights) and `fusec run`: determinism, seeds, bind and device errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../../runtime/gpu/device.h"
#include "driver/frontend.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse::cpu {
namespace {

ir::Program compile(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto program = load_program_from_source("test.fuse", text, sources, diags);
  EXPECT_FALSE(diags.has_errors()) << diags.format_all();
  if (!program) throw std::runtime_error("program did not compile");
  return *program;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

const QuantizerInfo& find_quantizer(const std::vector<QuantizerInfo>& all,
                                    const std::string& name) {
  for (const QuantizerInfo& q : all)
    if (q.name == name) return q;
  throw std::runtime_error("no quantizer " + name);
}

TEST(ReferenceExecutor, LinearHasThreeNamedQuantizersWithHybridFormats) {
  const ir::Program p = compile(
      "recipe r = delayed_scaling()\n"
      "sequence s(x: fp32[4, 16]) -> (y: fp32[4, 16]) uses r { linear(16, 16) as fc }");
  ReferenceExecutor<float> exec(p.sequences[0], {});
  const auto qs = exec.quantizers();
  ASSERT_EQ(qs.size(), 3u);
  EXPECT_EQ(qs[0].name, "fc.input");
  EXPECT_EQ(qs[1].name, "fc.weight");
  EXPECT_EQ(qs[2].name, "fc.grad_output");
  EXPECT_EQ(qs[0].format, Fp8Format::E4M3);
  EXPECT_EQ(qs[1].format, Fp8Format::E4M3);
  EXPECT_EQ(qs[2].format, Fp8Format::E5M2);
  EXPECT_EQ(qs[0].amax_history.size(), 1024u);
}

TEST(ReferenceExecutor, DelayedScalingScalesOverTwentyStepsMatchAnIndependentWindow) {
  // History 4, margin 1: after each step the scale is (fp8_max / max of the last 4 step amaxes)
  // / 2, computed here from a window of the amaxes the test itself measured.
  const ir::Program p = compile(
      "recipe r = delayed_scaling(amax_history = 4, margin = 1)\n"
      "sequence s(x: fp32[8, 16]) -> (y: fp32[8, 16]) uses r { linear(16, 16, bias = false) as fc "
      "}");
  ReferenceExecutor<float> exec(p.sequences[0], {});
  exec.param("fc.weight") = seeded_normal({16, 16}, 1, 0.1);
  exec.params_changed();
  const float weight_amax = max_abs(exec.param("fc.weight").data);
  std::deque<float> input_window, grad_window;
  for (int step = 0; step < 20; ++step) {
    // Inputs and gradients of very different sizes per step so the window matters.
    const double size = std::pow(2.0, (step * 7) % 11 - 5);
    const Tensor<float> x = seeded_normal({8, 16}, 100 + step, size);
    const Tensor<float> dy = seeded_normal({8, 16}, 200 + step, size * 1e-3);
    exec.forward({x});
    exec.backward({dy});
    const auto before = exec.quantizers();
    ASSERT_EQ(find_quantizer(before, "fc.input").amax_history[0], max_abs(x.data)) << step;
    input_window.push_back(max_abs(x.data));
    grad_window.push_back(find_quantizer(before, "fc.grad_output").amax_history[0]);
    if (input_window.size() > 4) input_window.pop_front();
    if (grad_window.size() > 4) grad_window.pop_front();
    exec.step();
    const auto after = exec.quantizers();
    const float input_amax = *std::max_element(input_window.begin(), input_window.end());
    const float grad_amax = *std::max_element(grad_window.begin(), grad_window.end());
    EXPECT_EQ(find_quantizer(after, "fc.input").scale, 448.0f / input_amax / 2.0f) << step;
    EXPECT_EQ(find_quantizer(after, "fc.weight").scale, 448.0f / weight_amax / 2.0f) << step;
    EXPECT_EQ(find_quantizer(after, "fc.grad_output").scale, 57344.0f / grad_amax / 2.0f) << step;
    EXPECT_EQ(find_quantizer(after, "fc.input").scale_inv,
              1.0f / find_quantizer(after, "fc.input").scale);
  }
}

TEST(ReferenceExecutor, CurrentScalingCastEqualsNumericsBitForBit) {
  const ir::Program p = compile(
      "recipe r = current_scaling(format = e4m3)\n"
      "sequence s(x: fp32[8, 16]) -> (y: fp32[8, 16]) uses r { quantize() as q }");
  ReferenceExecutor<float> exec(p.sequences[0], {});
  const Tensor<float> x = seeded_normal({8, 16}, 5, 3.0);
  const std::vector<float> y = exec.forward({x})[0].data;
  const float scale = 448.0f / max_abs(x.data);
  std::vector<uint8_t> bits(x.data.size());
  quantize_fp8(x.data, scale, Fp8Format::E4M3, bits, nullptr);
  std::vector<float> want(x.data.size());
  dequantize_fp8(bits, 1.0f / scale, Fp8Format::E4M3, want);
  EXPECT_EQ(y, want);
  EXPECT_NE(y, x.data);  // the cast really changed values
  EXPECT_EQ(exec.quantizers()[0].scale, scale);
}

TEST(ReferenceExecutor, CurrentScalingLinearUsesQuantizedOperands) {
  const ir::Program p = compile(
      "recipe r = current_scaling()\n"
      "sequence s(x: fp32[4, 16]) -> (y: fp32[4, 16]) uses r { linear(16, 16, bias = false) as fc "
      "}");
  ReferenceExecutor<float> exec(p.sequences[0], {});
  exec.param("fc.weight") = seeded_normal({16, 16}, 9, 0.05);
  exec.params_changed();
  const Tensor<float> x = seeded_normal({4, 16}, 10, 1.0);
  const std::vector<float> y = exec.forward({x})[0].data;
  auto cast = [](std::vector<float> v) {
    const float scale = 448.0f / max_abs(v);
    std::vector<uint8_t> bits(v.size());
    quantize_fp8(v, scale, Fp8Format::E4M3, bits, nullptr);
    dequantize_fp8(bits, 1.0f / scale, Fp8Format::E4M3, v);
    return v;
  };
  const std::vector<float> xq = cast(x.data), wq = cast(exec.param("fc.weight").data);
  double worst_vs_unquantized = 0;
  for (int m = 0; m < 4; ++m)
    for (int n = 0; n < 16; ++n) {
      double want = 0, exact = 0;
      for (int k = 0; k < 16; ++k) {
        want += double(xq[m * 16 + k]) * wq[n * 16 + k];
        exact += double(x.data[m * 16 + k]) * exec.param("fc.weight").data[n * 16 + k];
      }
      EXPECT_NEAR(y[m * 16 + n], want, 1e-5) << m << "," << n;
      worst_vs_unquantized = std::max(worst_vs_unquantized, std::fabs(y[m * 16 + n] - exact));
    }
  EXPECT_GT(worst_vs_unquantized, 1e-4);  // FP8 really was applied
}

// The FP8 wgrad (transposed dy and x copies) counts every token of a [batch, seq, hidden] input:
// the same tokens as a [batch * seq, hidden] input give the same weight gradient.
TEST(ReferenceExecutor, Fp8WgradOfABatchSeqInputEqualsTheFlattenedOne) {
  const char* kBody = " uses r { linear(16, 16, bias = false) as fc }";
  const ir::Program three_d =
      compile(std::string("recipe r = delayed_scaling()\n") +
              "sequence s(x: fp32[2, 8, 16]) -> (y: fp32[2, 8, 16])" + kBody);
  const ir::Program flat = compile(std::string("recipe r = delayed_scaling()\n") +
                                   "sequence s(x: fp32[16, 16]) -> (y: fp32[16, 16])" + kBody);
  std::vector<std::vector<float>> grads;
  for (const ir::Program* p : {&three_d, &flat}) {
    ReferenceExecutor<float> exec(p->sequences[0], {});
    exec.param("fc.weight") = seeded_normal({16, 16}, 3, 0.05);
    exec.params_changed();
    Tensor<float> x = seeded_normal({16, 16}, 4, 1.0);
    Tensor<float> dy = seeded_normal({16, 16}, 5, 1.0);
    x.shape = dy.shape = exec.input_shapes()[0];
    exec.forward({x});
    grads.push_back(exec.backward({dy}).params.at(0).data);
  }
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_GT(max_abs(grads[0]), 0.0f);
}

TEST(ReferenceExecutor, Fp8WeightsKeepOnlyTheFp8Value) {
  const ir::Program p = compile(
      "recipe r = current_scaling()\n"
      "sequence s(x: fp32[4, 16]) -> (y: fp32[4, 16]) uses r with fp8_weights {\n"
      "  linear(16, 16, bias = false) as fc }");
  ReferenceExecutor<float> exec(p.sequences[0], {});
  const Tensor<float> w = seeded_normal({16, 16}, 9, 0.05);
  exec.param("fc.weight") = w;
  exec.params_changed();
  const std::vector<float>& stored = exec.param("fc.weight").data;
  const float scale = 448.0f / max_abs(w.data);
  std::vector<uint8_t> bits(w.data.size());
  quantize_fp8(w.data, scale, Fp8Format::E4M3, bits, nullptr);
  std::vector<float> want(w.data.size());
  dequantize_fp8(bits, 1.0f / scale, Fp8Format::E4M3, want);
  EXPECT_EQ(stored, want);
  EXPECT_NE(stored, w.data);
}

// ---- fusec run ------------------------------------------------------------------------------

std::string write_program() {
  const std::string path = test::make_temp_dir("reference_run") + "/mlp.fuse";
  std::ofstream(path) << "recipe fp8 = delayed_scaling(amax_history = 8)\n"
                         "sequence mlp(x: bf16[tokens, 32]) -> (y: bf16[tokens, 32]) uses fp8 {\n"
                         "  layernorm(32)\n  linear(32, 64) as fc1\n  gelu()\n"
                         "  linear(64, 32) as fc2\n}\n";
  return path;
}

TEST(FusecRun, SameSeedSameOutputOtherSeedDiffers) {
  const std::string file = write_program();
  const std::string base = test::fusec_path() + " run " + file + " --bind tokens=16 --steps 3";
  const auto first = test::run_command(base + " --seed 11");
  const auto second = test::run_command(base + " --seed 11");
  const auto other = test::run_command(base + " --seed 12");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(first.output, second.output);
  EXPECT_NE(first.output, other.output);
  EXPECT_NE(first.output.find("step    2"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("fc2.grad_output"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("fc1.weight"), std::string::npos) << first.output;
}

TEST(FusecRun, UnboundSymbolNamesItAndBind) {
  const auto r = test::run_command(test::fusec_path() + " run " + write_program());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'tokens'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--bind"), std::string::npos) << r.output;
}

TEST(FusecRun, MalformedBindIsAUsageError) {
  const auto r =
      test::run_command(test::fusec_path() + " run " + write_program() + " --bind tokens");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("NAME=SIZE"), std::string::npos) << r.output;
}

TEST(FusecRun, GpuDeviceWithoutAGpuSaysWhyAndPointsToTheCpu) {
  if (gpu::gpu_available()) GTEST_SKIP() << "this machine has a GPU: tests/gpu cover --device gpu";
  const auto r = test::run_command(test::fusec_path() + " run " + write_program() +
                                   " --bind tokens=16 --device gpu");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--device gpu: no CUDA driver"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("use --device cpu"), std::string::npos) << r.output;
}

TEST(FusecRun, AutoDeviceFallsBackToTheCpuReferenceWithoutAGpu) {
  if (gpu::gpu_available()) GTEST_SKIP() << "this machine has a GPU: tests/gpu cover it";
  const auto r =
      test::run_command(test::fusec_path() + " run " + write_program() + " --bind tokens=16");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("running on the CPU reference"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step    0  loss"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace opfuse::cpu
