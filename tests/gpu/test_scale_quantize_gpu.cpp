// constant_scale and the user quantize op on the GPU (templates/scale.cuh through codegen and the
// plan executor) against the CPU reference executor, over three training steps under bf16, FP8
// delayed scaling and FP8 current scaling, with quantize forward and/or backward. Every value is
// the same fp32 arithmetic on both sides (a product rounded once, an FP8 cast, a product with
// scale_inv, a bf16 rounding), so outputs, input gradients and the quantizer state must agree
// bit for bit. Label `gpu`: skips (visibly) where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codegen/plan.h"
#include "cpu/numerics.h"
#include "gpu/device.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "reference/reference_executor.h"

namespace opfuse::gpu {
namespace {

constexpr const char* kRecipes = R"(
recipe delayed = delayed_scaling(format = hybrid, amax_history = 4, amax_compute = max, margin = 0)
recipe current = current_scaling(format = hybrid)
)";

// 100 rows (a partial row tile) of 136 columns (a partial column tile). Every quantize form:
// forward and backward, backward only (identity forward), forward only (identity backward).
constexpr const char* kScaleQuantize = R"(
sequence scale_quantize(x: bf16[tokens, 136]) -> (y: bf16[tokens, 136]) uses delayed {
  constant_scale(0.3)
  quantize(forward = true, backward = true) as both
  quantize(forward = false, backward = true) as grad_only
  constant_scale(-2.5)
  quantize(forward = true, backward = false) as forward_only
}
)";

// One quantize and nothing else: under bf16 the output is a view of the caller's input and the
// input gradient a view of the caller's output gradient.
constexpr const char* kQuantizeOnly = R"(
sequence quantize_only(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses delayed {
  quantize(forward = false, backward = true) as q
}
)";

using test::DeviceArray;
using test::download_bf16_bits;
using test::random_bf16;
using test::upload_bf16;

// An empty `recipe` keeps the sequences' own (delayed).
std::unique_ptr<test::CompiledProgram> compile(const std::string& text, const std::string& recipe) {
  return test::compile_program("scale_quantize", std::string(kRecipes) + text, recipe);
}

// Elements whose bf16 bits differ; prints the first few.
std::size_t count_mismatches(const std::vector<std::uint16_t>& got, const std::vector<float>& want,
                             const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const std::uint16_t expected = cpu::float_to_bf16(want[i]);
    if (got[i] == expected) continue;
    if (++mismatches <= 3) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << cpu::bf16_to_float(got[i]) << " (0x"
                    << std::hex << got[i] << "), cpu " << want[i] << " (0x" << expected << ")"
                    << std::dec;
    }
  }
  return mismatches;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

class ScaleQuantizeGpu : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "skipping constant_scale/quantize GPU tests: " << why;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    gemms_ = std::make_unique<GemmRunner>(stream_);
  }
  void TearDown() override {
    gemms_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Three training steps of sequence 0 of `text` on both executors. Input scales per step: 300
  // (E4M3 saturates at the delayed recipe's first scale of 1), 1, then 1e-3 (under delayed
  // scaling the history still holds step 1's amax: FP8 subnormals and zeros).
  void run_three_steps(const std::string& text, std::int64_t tokens) {
    const std::string recipe = GetParam();
    const auto c = compile(text, recipe == "delayed" ? "" : recipe);
    ASSERT_NE(c, nullptr);
    const ir::Sequence& seq = c->program.sequences.at(0);
    const codegen::SequencePlan& plan = c->plan.sequences.at(0);
    const cpu::Bindings bindings{{"tokens", tokens}};
    SequenceExecutor gpu(plan, *c->modules, *gemms_, stream_);
    cpu::ReferenceExecutor<float> ref(seq, bindings);
    gpu.bind({bindings.begin(), bindings.end()});
    const std::string x_name = seq.value(seq.inputs.at(0)).name;
    const std::string y_name = seq.outputs.at(0).name;
    const std::size_t count = static_cast<std::size_t>(tokens * ref.input_shapes().at(0).at(1));
    DeviceArray x(count * 2), dy(count * 2);
    std::string dy_name;
    for (const TensorInfo& info : gpu.tensors()) {
      if (info.role == codegen::BufferRole::OutputGrad) dy_name = info.name;
    }
    ASSERT_FALSE(dy_name.empty());
    gpu.set_tensor(x_name, x.data());
    gpu.set_tensor(dy_name, dy.data());
    std::mt19937_64 rng(20240611);
    const double input_scales[] = {300.0, 1.0, 1e-3};
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE(recipe + ", step " + std::to_string(step));
      cpu::Tensor<float> x_host = cpu::Tensor<float>::zeros(ref.input_shapes().at(0));
      x_host.data = random_bf16(count, input_scales[step - 1], rng);
      upload_bf16(x, x_host.data);
      const std::vector<cpu::Tensor<float>> want_y = ref.forward({x_host});
      gpu.forward(stream_);
      EXPECT_EQ(
          count_mismatches(download_bf16_bits(gpu.output(y_name), count), want_y.at(0).data, "y"),
          0u);

      cpu::Tensor<float> dy_host = cpu::Tensor<float>::zeros(want_y.at(0).shape);
      dy_host.data = random_bf16(count, 0.05 * input_scales[step - 1], rng);
      upload_bf16(dy, dy_host.data);
      const cpu::Gradients<float> want_grads = ref.backward({dy_host});
      gpu.backward(stream_);
      EXPECT_EQ(count_mismatches(download_bf16_bits(gpu.input_grad(x_name), count),
                                 want_grads.inputs.at(0).data, "dx"),
                0u);

      gpu.end_step(stream_);
      ref.step();
      expect_quantizers_bit_exact(gpu, ref, plan);
    }
  }

  void expect_quantizers_bit_exact(const SequenceExecutor& gpu,
                                   const cpu::ReferenceExecutor<float>& ref,
                                   const codegen::SequencePlan& plan) {
    const std::vector<cpu::DelayedScalingState> got = gpu.download_quantizers(stream_);
    const std::vector<cpu::QuantizerInfo> want = ref.quantizers();
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(got.size(), plan.quantizers.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE("quantizer " + want[i].name);
      EXPECT_EQ(plan.quantizers[i].name, want[i].name);
      ASSERT_EQ(got[i].amax_history.size(), want[i].amax_history.size());
      for (std::size_t k = 0; k < got[i].amax_history.size(); ++k) {
        EXPECT_TRUE(same_bits(got[i].amax_history[k], want[i].amax_history[k]))
            << "slot " << k << ": " << got[i].amax_history[k] << " vs " << want[i].amax_history[k];
      }
      EXPECT_TRUE(same_bits(got[i].scale, want[i].scale))
          << got[i].scale << " vs " << want[i].scale;
      EXPECT_TRUE(same_bits(got[i].scale_inv, want[i].scale_inv));
    }
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmRunner> gemms_;
};

TEST_P(ScaleQuantizeGpu, ConstantScaleAndEveryQuantizeFormMatchTheReferenceBitForBit) {
  run_three_steps(kScaleQuantize, 100);
}

TEST_P(ScaleQuantizeGpu, LoneQuantizeMatchesTheReferenceBitForBit) {
  run_three_steps(kQuantizeOnly, 48);
}

TEST_P(ScaleQuantizeGpu, PlanRunsTheKernelsTheRecipeCallsFor) {
  const std::string recipe = GetParam();
  const auto c = compile(kScaleQuantize, recipe == "delayed" ? "" : recipe);
  ASSERT_NE(c, nullptr);
  std::map<std::string, int> launches;
  for (const codegen::Step& step : c->plan.sequences.at(0).steps) {
    if (const auto* launch = std::get_if<codegen::LaunchStep>(&step.body))
      ++launches[c->plan.find_kernel(launch->kernel)->template_name];
  }
  EXPECT_EQ(launches["constant_scale"], 4);  // two ops, forward and backward
  // both (forward and backward), grad_only (backward), forward_only (forward).
  EXPECT_EQ(launches["fake_quantize"], recipe == "bf16" ? 0 : 4);
  // Current scaling: amax_reduce measures the amax and its last block derives the scale.
  EXPECT_EQ(launches["amax_reduce"], recipe == "current" ? 4 : 0);
  EXPECT_EQ(launches["update_scales"], recipe == "delayed" ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Recipes, ScaleQuantizeGpu,
                         ::testing::Values(std::string("bf16"), std::string("delayed"),
                                           std::string("current")),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace opfuse::gpu
