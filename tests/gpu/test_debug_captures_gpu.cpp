// Tensor captures on the device (templates/tensor_capture.cuh) against the CPU reference: a plan
// variant capturing every tensor of two layers runs forward and backward on the GPU and on the
// reference from the same inputs and parameters; the captures have the plan's shapes, the tensors
// both sides hold bit for bit (the caller's x and dy, the weights) come back bit for bit, the rest
// within the GPU-vs-CPU error of what computes them; a C++ feature's inspect_tensor gives the
// same statistic on both sides' captures of the caller's tensors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <span>

#include "debug_config/captures.h"
#include "debug_routing_fixture.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "negative_fraction_feature.h"
#include "reference/reference_executor.h"
#include "test_support.h"

namespace opfuse::test {
namespace {

const std::string kProgram = R"(
sequence mlp(x: bf16[tokens, 128]) -> (y: bf16[tokens, 128]) {
  linear(128, 256) as fc1
  gelu()
  linear(256, 128) as fc2
}
)";

const std::string kConfig = R"(
all:
  layers: {layer_types: [fc]}
  transformer_engine:
    DumpTensors:
      tensors: [activation, weight, output, gradient, dgrad, wgrad]
)";

// The statistics NegativeFraction logs for one run's captures, by metric name.
std::map<std::string, double> feature_values(const debug::Routing& routing,
                                             std::span<const plan::CaptureSlot> slots,
                                             std::span<const debug::CapturedTensor> captures,
                                             const std::string& name) {
  const std::string dir = make_temp_dir(name);
  {
    debug::StatLog log = debug::StatLog::open(dir, 0);
    debug::IterationCaptures run;
    run.add_run(slots, captures);
    for (const debug::StatRecord& r : run.finish(routing, 0, dir, 0)) log.add(r);
    log.end_step();
  }
  std::map<std::string, double> out;
  for (const debug::StatRecord& r :
       debug::read_stat_jsonl(dir + "/opfuse_statistics/globalrank-0.jsonl"))
    out[debug::metric_name(r)] = r.value;
  return out;
}

// One program on the GPU and on the reference under one routing, from the same parameters and
// inputs: x (row r scaled by 2^-(r % spread)) and a small dy, uploaded.
struct BothSides {
  std::unique_ptr<CompiledProgram> compiled;
  std::unique_ptr<gpu::GemmRunner> gemms;
  std::unique_ptr<gpu::SequenceExecutor> gpu;
  std::unique_ptr<cpu::ReferenceExecutor<float>> ref;
  cpu::Tensor<float> x, dy;

  const ir::Sequence& seq() const { return compiled->program.sequences[0]; }
  const plan::SequencePlan& plan() const { return compiled->plan.sequences[0]; }
  // A forward and a backward on each side.
  void run(cudaStream_t stream) {
    ref->forward({x});
    ref->backward({dy});
    gpu->forward(stream);
    gpu->backward(stream);
  }
};

class DebugCapturesGpu : public GpuStreamTest {
 protected:
  // nullptr (the test failed) when the program does not compile.
  std::unique_ptr<BothSides> both_sides(const std::string& program, const debug::Routing& routing,
                                        int64_t tokens, uint64_t seed, double x_scale, int spread);
  int expect_quantized_copies_match(const std::string& recipe, int64_t tokens, int copies);
};

std::unique_ptr<BothSides> DebugCapturesGpu::both_sides(const std::string& program,
                                                        const debug::Routing& routing,
                                                        int64_t tokens, uint64_t seed,
                                                        double x_scale, int spread) {
  auto b = std::make_unique<BothSides>();
  b->compiled = compile_program("mlp", program, "", "", &routing);
  EXPECT_TRUE(b->compiled);
  if (!b->compiled) return nullptr;
  b->gemms = std::make_unique<gpu::GemmRunner>(stream_);
  b->gpu =
      std::make_unique<gpu::SequenceExecutor>(b->plan(), *b->compiled->modules, *b->gemms, stream_);
  b->gpu->bind({{"tokens", tokens}});
  const std::map<std::string, DeviceArray*> arrays = allocate_tensors(*b->gpu);
  b->ref =
      std::make_unique<cpu::ReferenceExecutor<float>>(b->seq(), cpu::Bindings{{"tokens", tokens}});
  std::mt19937_64 rng(seed);
  random_params(*b->ref, arrays, rng);
  b->x = cpu::Tensor<float>::zeros({tokens, 128});
  b->x.data = random_bf16(b->x.data.size(), x_scale, rng);
  for (size_t i = 0; i < b->x.data.size(); ++i)
    b->x.data[i] *= std::ldexp(1.0f, -int(i / 128 % size_t(spread)));
  upload_bf16(*arrays.at("x"), b->x.data);
  b->dy = cpu::Tensor<float>::zeros({tokens, 128});
  b->dy.data = random_bf16(b->dy.data.size(), 0.01, rng);
  upload_bf16(*arrays.at("dy"), b->dy.data);
  return b;
}

TEST_F(DebugCapturesGpu, CapturesMatchTheReference) {
  const auto routed_config = routed(kConfig, {"fc1", "fc2"}, false);
  const auto b = both_sides(kProgram, routed_config->routing, 200, 7, 1.0, 1);
  ASSERT_TRUE(b);
  const ir::Sequence& seq = b->seq();
  const plan::SequencePlan& plan = b->plan();
  ASSERT_EQ(plan.capture_slots.size(), 12u);
  b->run(stream_);
  const std::vector<debug::CapturedTensor> got = b->gpu->captures(stream_);
  const std::vector<debug::CapturedTensor>& want = b->ref->captures();
  ASSERT_EQ(got.size(), plan.capture_slots.size());
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const plan::CaptureSlot& slot = plan.capture_slots[i];
    SCOPED_TRACE(slot.layer + " " + slot.tensor);
    ASSERT_EQ(got[i].shape, want[i].shape);
    ASSERT_EQ(got[i].values.size(), want[i].values.size());
    const bool same_bits = (slot.layer == "fc1" && slot.tensor == "activation") ||
                           slot.tensor == "weight" ||
                           (slot.layer == "fc2" && slot.tensor == "gradient");
    if (same_bits) {
      EXPECT_EQ(got[i].values, want[i].values);
      continue;
    }
    double amax = 0, worst = 0;
    for (size_t k = 0; k < want[i].values.size(); ++k) {
      amax = std::max(amax, double(std::abs(want[i].values[k])));
      worst = std::max(worst, double(std::abs(got[i].values[k] - want[i].values[k])));
    }
    EXPECT_GT(amax, 0);
    EXPECT_LT(worst, 3e-2 * amax);
  }
  // The slots the reference and the plan list are the same, in the same order.
  ASSERT_EQ(seq.captures.size(), plan.capture_slots.size());
  for (size_t i = 0; i < seq.captures.size(); ++i) {
    EXPECT_EQ(seq.captures[i].layer, plan.capture_slots[i].layer);
    EXPECT_EQ(seq.captures[i].tensor, plan.capture_slots[i].tensor);
  }
}

TEST_F(DebugCapturesGpu, CppFeatureGivesTheReferenceStatistics) {
  const auto custom = read_custom_config(
      "all:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    NegativeFraction: {tensors: [activation, weight, gradient, output]}\n",
      {"fc1", "fc2"}, false);
  ASSERT_TRUE(custom->config);
  const debug::Routing routing = debug::route(custom->bindings, 0);
  const auto c = compile_program("mlp", kProgram, "", "", &routing);
  ASSERT_TRUE(c);
  const ir::Sequence& seq = c->program.sequences[0];
  const plan::SequencePlan& plan = c->plan.sequences[0];
  ASSERT_EQ(plan.capture_slots.size(), 8u);
  gpu::GemmRunner gemms(stream_);
  gpu::SequenceExecutor gpu(plan, *c->modules, gemms, stream_);
  const int64_t tokens = 64;
  gpu.bind({{"tokens", tokens}});
  const std::map<std::string, DeviceArray*> arrays = allocate_tensors(gpu);
  cpu::ReferenceExecutor<float> ref(seq, {{"tokens", tokens}});
  std::mt19937_64 rng(3);
  for (const std::string& name : ref.param_names()) {
    cpu::Tensor<float>& p = ref.param(name);
    p.data = random_bf16(p.data.size(), 0.05, rng);
    upload_bf16(*arrays.at(name), p.data);
  }
  ref.params_changed();
  cpu::Tensor<float> x = cpu::Tensor<float>::zeros({tokens, 128});
  x.data = random_bf16(x.data.size(), 1.0, rng);
  upload_bf16(*arrays.at("x"), x.data);
  cpu::Tensor<float> dy = cpu::Tensor<float>::zeros({tokens, 128});
  dy.data = random_bf16(dy.data.size(), 0.01, rng);
  upload_bf16(*arrays.at("dy"), dy.data);
  ref.forward({x});
  ref.backward({dy});
  gpu.forward(stream_);
  gpu.backward(stream_);
  const auto got = feature_values(routing, plan.capture_slots, gpu.captures(stream_), "neg_gpu");
  const auto want = feature_values(routing, seq.captures, ref.captures(), "neg_cpu");
  ASSERT_EQ(got.size(), 8u);
  ASSERT_EQ(want.size(), 8u);
  for (const auto& entry : want) {
    SCOPED_TRACE(entry.first);
    ASSERT_EQ(got.count(entry.first), 1u);
    // Signs of values near 0 may differ between the two sides' GEMMs: a few elements at most.
    EXPECT_NEAR(got.at(entry.first), entry.second, 2e-3);
    EXPECT_GT(entry.second, 0.2);  // random data: about half negative
    EXPECT_LT(entry.second, 0.8);
  }
  // The caller's tensors and the weights are the same bits on both sides: exactly equal.
  EXPECT_EQ(got.at("fc1_activation_negative_fraction"),
            want.at("fc1_activation_negative_fraction"));
  EXPECT_EQ(got.at("fc2_gradient_negative_fraction"), want.at("fc2_gradient_negative_fraction"));
  EXPECT_EQ(got.at("fc1_weight_negative_fraction"), want.at("fc1_weight_negative_fraction"));
}

// DumpTensors' quantized_tensor: the FP8 copies the GEMMs read and their scale_inv (a scalar or
// a block grid), against the reference's; for the tensors both sides hold bit for bit the codes
// and the scales are equal. Returns how many captures were compared bit for bit.
int DebugCapturesGpu::expect_quantized_copies_match(const std::string& recipe, int64_t tokens,
                                                    int copies) {
  std::string program = kProgram;
  program.replace(program.find("sequence"), 8, "recipe fp8 = " + recipe + "\nsequence");
  program.replace(program.find(") {"), 3, ") uses fp8 {");
  const auto routed_config = routed(
      "all:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, weight, gradient], quantized_tensor: true}\n",
      {"fc1", "fc2"}, true);
  // Rows of different magnitudes: block scales that differ.
  const auto b = both_sides(program, routed_config->routing, tokens, 5, 3.0, 7);
  if (!b) return 0;
  const plan::SequencePlan& plan = b->plan();
  // Per layer: the three high-precision tensors and their FP8 copies.
  int quantized = 0;
  for (const plan::CaptureSlot& s : plan.capture_slots) quantized += s.quantized;
  EXPECT_EQ(quantized, copies);
  EXPECT_EQ(plan.capture_slots.size(), size_t(6 + copies));
  b->run(stream_);
  const std::vector<debug::CapturedTensor> got = b->gpu->captures(stream_);
  const std::vector<debug::CapturedTensor>& want = b->ref->captures();
  EXPECT_EQ(got.size(), plan.capture_slots.size());
  EXPECT_EQ(want.size(), got.size());
  if (got.size() != plan.capture_slots.size() || want.size() != got.size()) return 0;
  int compared = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const plan::CaptureSlot& slot = plan.capture_slots[i];
    if (!slot.quantized) continue;
    SCOPED_TRACE(slot.layer + " " + slot.tensor);
    EXPECT_EQ(got[i].scale_inv.size(), size_t(slot.scale_count(got[i].shape)));
    EXPECT_EQ(got[i].scale_inv.size(), want[i].scale_inv.size());
    EXPECT_EQ(got[i].values.size(), want[i].values.size());
    if (got[i].scale_inv.empty() || got[i].scale_inv.size() != want[i].scale_inv.size() ||
        got[i].values.size() != want[i].values.size())
      continue;
    // Scales from these magnitudes are far from 1.
    EXPECT_NE(got[i].scale_inv[0], 1.0f);
    const auto not_fp8 = std::find_if(got[i].values.begin(), got[i].values.end(), [&](float v) {
      return !debug::fp8_code(v, slot.format).has_value();
    });
    EXPECT_EQ(not_fp8, got[i].values.end()) << "a value that is no FP8 number";
    const bool same_bits = (slot.layer == "fc1" && slot.tensor == "activation") ||
                           slot.tensor == "weight" ||
                           (slot.layer == "fc2" && slot.tensor == "gradient");
    if (same_bits) {
      EXPECT_EQ(got[i].shape, want[i].shape);
      EXPECT_EQ(got[i].scale_inv, want[i].scale_inv);
      EXPECT_EQ(got[i].values, want[i].values);
      ++compared;
    } else {
      // Computed tensors differ in the last bits between the two sides: a power-of-2 block scale
      // may land one binade away.
      EXPECT_LE(got[i].scale_inv[0], 2.0f * want[i].scale_inv[0]);
      EXPECT_GE(got[i].scale_inv[0], 0.5f * want[i].scale_inv[0]);
    }
  }
  return compared;
}

TEST_F(DebugCapturesGpu, QuantizedCopiesMatchTheReference) {
  // fc1's activation, both weights, fc2's gradient.
  EXPECT_EQ(expect_quantized_copies_match("current_scaling()", 208, 6), 4);
}

// Under float8_block_scaling also the column-wise copies of the activations and the gradients
// (quantized again down the columns), as the wgrad GEMMs read them.
TEST_F(DebugCapturesGpu, BlockScaledCopiesMatchTheReference) {
  EXPECT_EQ(expect_quantized_copies_match("float8_block_scaling()", 256, 10), 6);
}

// `with fp8_weights`: the weights are cast once, and their copies keep the scale_inv they were
// cast with while the quantizers' scales move on at each step. The captured scale_inv is the kept
// one, as the GEMMs read it, after a step as before; the reference keeps its cast codes alike.
TEST_F(DebugCapturesGpu, KeptFp8WeightsAreCapturedWithTheScaleTheirGemmsRead) {
  std::string program = kProgram;
  program.replace(program.find("sequence"), 8, "recipe fp8 = delayed_scaling()\nsequence");
  program.replace(program.find(") {"), 3, ") uses fp8 with fp8_weights {");
  const auto routed_config = routed(
      "all:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [weight], quantized_tensor: true, high_precision_tensor: "
      "false}\n",
      {"fc1", "fc2"}, true);
  const auto b = both_sides(program, routed_config->routing, 64, 9, 1.0, 1);
  ASSERT_TRUE(b);
  const plan::SequencePlan& plan = b->plan();
  ASSERT_EQ(plan.capture_slots.size(), 2u);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    b->run(stream_);
    const std::vector<debug::CapturedTensor> got = b->gpu->captures(stream_);
    const std::vector<debug::CapturedTensor>& want = b->ref->captures();
    ASSERT_EQ(got.size(), 2u);
    ASSERT_EQ(want.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(got[i].values, want[i].values);
      ASSERT_EQ(got[i].scale_inv.size(), 1u);
      EXPECT_EQ(got[i].scale_inv, want[i].scale_inv);
      // Cast once, at scale 1 (step 0 of delayed scaling): kept after the step moved the scale.
      EXPECT_EQ(got[i].scale_inv[0], 1.0f);
    }
    b->ref->step();
    b->gpu->end_step(stream_);
  }
  // The quantizers did move on: a scale_inv bound to them would have read another value.
  const std::vector<cpu::DelayedScalingState> states = b->gpu->download_quantizers(stream_);
  bool moved = false;
  for (size_t q = 0; q < states.size() && q < plan.quantizers.size(); ++q)
    moved |= plan.quantizers[q].name.ends_with(".weight") && states[q].scale_inv != 1.0f;
  EXPECT_TRUE(moved);
}

}  // namespace
}  // namespace opfuse::test
