// The GPU plan executor (runtime/gpu/plan_executor.h) against the CPU reference executor on the
// same compiled (fused) sequences: outputs, input and parameter gradients and the quantizer state
// over several training steps, for small copies of every dsl_examples program under bf16, FP8
// delayed scaling, FP8 current scaling and the block-scaled and micro-scaled recipes (Float8
// block scaling also emulated: "blocks_emulated"), and the seed MLP with one linear kept out of
// the recipe (`precision = high`); FP8 weight casts bit for bit; the FP8 weight
// cache; misuse caught before any launch; memory returning to its baseline. Label `gpu`: skips
// (visibly) where no GPU is present.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codegen/kernel_source.h"
#include "codegen/plan.h"
#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "gpu/device.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "ir/pointwise_ops.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/error.h"
#include "reference/reference_executor.h"
#include "side_by_side.h"

namespace opfuse::gpu {
namespace {

using namespace side_by_side;  // NOLINT(google-build-using-namespace): the tests' shared fixture

// Small copies of dsl_examples/*.fuse (same ops, hidden 256, ffn 1024) so that the CPU reference
// runs in moments; the recipes are picked per test with the recipe override.
constexpr const char* kMlp = R"(
const hidden = 256
const ffn = 1024
sequence mlp(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) uses delayed {
  layernorm(hidden, eps = 1e-5)
  linear(hidden, ffn, bias = false) as fc1
  swiglu()
  linear(ffn / 2, hidden, bias = false) as fc2
}
)";

// The seed MLP with its output layer kept out of the recipe (`precision = high`): fc1's GEMMs
// under the recipe, fc2's in bf16, in one sequence.
constexpr const char* kMlpFc2High = R"(
const hidden = 256
const ffn = 1024
sequence mlp(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) uses delayed {
  layernorm(hidden, eps = 1e-5)
  linear(hidden, ffn, bias = false) as fc1
  swiglu()
  linear(ffn / 2, hidden, bias = false, precision = high) as fc2
}
)";

constexpr const char* kGeluBiasMlp = R"(
const hidden = 256
sequence gpt_mlp(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) uses delayed {
  layernorm(hidden, eps = 1e-5) as ln_2
  linear(hidden, 4 * hidden) as c_fc
  gelu()
  linear(4 * hidden, hidden) as c_proj
}
)";

// mlp_residual.fuse: fc2 keeps its weight in FP8 only (`with fp8_weights`), cast when the
// parameters change, not every step.
constexpr const char* kResidual = R"(
const hidden = 256
const ffn = 1024
sequence fc1(x: bf16[tokens, hidden]) -> (h: bf16[tokens, ffn / 2], residual: bf16[tokens, hidden])
    uses delayed {
  make_extra_output(residual)
  layernorm(hidden, eps = 1e-5)
  linear(hidden, ffn, bias = false) as up_proj
  swiglu()
}
sequence fc2(h: bf16[tokens, ffn / 2], residual: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden])
    uses delayed with fp8_weights {
  linear(ffn / 2, hidden, bias = false) as down_proj
  add_extra_input(residual)
}
)";

constexpr const char* kLlama = R"(
const hidden = 256
const intermediate = 512
sequence llama_mlp(x: bf16[batch, seq, hidden], residual: bf16[batch, seq, hidden])
    -> (y: bf16[batch, seq, hidden]) uses current {
  rmsnorm(hidden, eps = 1e-5) as post_attention_layernorm
  linear(hidden, 2 * intermediate, bias = false) as gate_up_proj
  swiglu()
  linear(intermediate, hidden, bias = false) as down_proj
  add_extra_input(residual)
}
)";

struct ProgramCase {
  const char* name;
  const char* text;
  cpu::Bindings bindings;
};

std::vector<ProgramCase> program_cases() {
  return {{"mlp", kMlp, {{"tokens", 128}}},
          {"gelu_bias_mlp", kGeluBiasMlp, {{"tokens", 128}}},
          {"mlp_residual", kResidual, {{"tokens", 96}}},
          {"rmsnorm_swiglu", kLlama, {{"batch", 2}, {"seq", 64}}},
          {"mlp_fc2_high", kMlpFc2High, {{"tokens", 128}}}};
}

class ExecutorMatchesReference : public ExecutorGpu,
                                 public ::testing::WithParamInterface<std::pair<int, std::string>> {
};

TEST_P(ExecutorMatchesReference, OutputsGradientsAndQuantizersOverThreeTrainingSteps) {
  const ProgramCase program = program_cases()[static_cast<std::size_t>(GetParam().first)];
  const std::string recipe = GetParam().second;
  const auto c = compile(program.name, program.text, recipe);
  ASSERT_NE(c, nullptr);
  const double bound = bound_for(recipe);
  for (std::size_t s = 0; s < c->program.sequences.size(); ++s) {
    SideBySide run(*c, s, program.bindings, *gemms_, stream_, 1234 + s);
    for (int step = 1; step <= 3; ++step) {
      const StepErrors e = run.train_step(step, 0.05);
      std::cout << "[ errors   ] " << program.name << "/" << c->plan.sequences[s].name << " "
                << recipe << " step " << step << ": outputs " << e.outputs << ", input grads "
                << e.input_grads << ", param grads " << e.param_grads << " (worst "
                << run.worst_param() << "), computed quantizers' amax "
                << run.worst_quantizer_error() << "\n";
      EXPECT_LE(e.outputs, bound) << "step " << step;
      EXPECT_LE(e.input_grads, bound) << "step " << step;
      EXPECT_LE(e.param_grads, bound) << "step " << step << ", " << run.worst_param();
    }
  }
}

// `with fp8_weights`: steps without a parameter change keep the FP8 weight cast at the last
// change, and its quantizer records the weight's amax only then (a forward recasting the weight
// would record it at every step: the amax histories would then differ from the reference's).
TEST_F(ExecutorGpu, Fp8WeightsAreCastOnlyWhenTheParametersChange) {
  for (const std::string recipe : {"delayed", "current", "blocks"}) {
    SCOPED_TRACE(recipe);
    const auto c = compile("mlp_residual", kResidual, recipe);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->plan.sequences.at(1).fp8_weights);
    SideBySide run(*c, 1, {{"tokens", 96}}, *gemms_, stream_, 99);
    for (int step = 1; step <= 4; ++step) {
      const StepErrors e = run.train_step(step, 0.05, /*update_params=*/step == 2);
      EXPECT_LE(e.outputs, bound_for(recipe)) << "step " << step;
      EXPECT_LE(e.input_grads, bound_for(recipe)) << "step " << step;
    }
  }
}

// Float8 block scaling emulated (note "Emulated block scaling" in docs/architecture.md): the
// decoded copies the BF16 GEMMs read equal the oracle's (cpu::block_fake_quantize, rounded to
// bf16) bit for bit where their source is the caller's tensor (a weight, an input), for every
// copy still in memory after the forward: the weight's 128 x 128 copy (dgrad reads it) and the
// input's 128 x 1 copy (wgrad reads it) at least.
TEST_F(ExecutorGpu, EmulatedBlockCopiesAreTheOraclesBitForBit) {
  const auto c = compile("mlp_residual", kResidual, "blocks_emulated");
  ASSERT_NE(c, nullptr);
  const std::size_t index = 1;  // fc2: a linear on the sequence's input
  const ir::Sequence& seq = c->program.sequences.at(index);
  const codegen::SequencePlan& plan = c->plan.sequences.at(index);
  SideBySide run(*c, index, {{"tokens", 96}}, *gemms_, stream_, 21);
  const std::vector<cpu::Tensor<float>> inputs = run.new_inputs();
  run.gpu().forward(stream_);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  std::size_t checked = 0;
  for (const ir::Operation& op : seq.ops) {
    if (op.kind != ir::OpKind::EmulatedCast) continue;
    const ir::QuantizerDecl& q = seq.quantizers.at(static_cast<std::size_t>(op.quantizer));
    const ir::Value& source = seq.value(q.source);
    std::vector<float> values;
    if (source.kind == ir::ValueKind::Param) values = run.ref().param(source.name).data;
    for (std::size_t i = 0; i < seq.inputs.size(); ++i)
      if (seq.inputs[i] == q.source) values = inputs[i].data;
    if (values.empty()) continue;  // a computed source: rounding differs from the CPU's
    const codegen::Buffer* buffer = nullptr;
    for (const codegen::Buffer& b : plan.buffers)
      if (b.value == op.results.at(0) && b.alias_of < 0) buffer = &b;
    ASSERT_NE(buffer, nullptr) << op.instance;
    const void* device = run.gpu().debug_buffer(buffer->id);
    if (device == nullptr) continue;  // not kept after the forward
    const bool columnwise = ir::attr_bool(op.attrs, "columnwise");
    SCOPED_TRACE(q.name + (columnwise ? " column-wise" : " row-wise"));
    const std::int64_t cols = source.type.shape.back().size;
    const std::int64_t rows = static_cast<std::int64_t>(values.size()) / cols;
    cpu::BlockQuantParams params;
    params.format = q.format() == ir::DType::E5M2 ? cpu::Fp8Format::E5M2 : cpu::Fp8Format::E4M3;
    params.two_d = q.spec.scaling == plan::ScalingKind::Block2D;
    params.power_of_2_scale = q.spec.power_of_2_scale;
    params.epsilon = static_cast<float>(q.spec.epsilon);
    params.value_for_inf = cpu::bf16_max_finite();
    std::vector<float> want = cpu::block_fake_quantize(values, rows, cols, params, columnwise);
    for (float& v : want) v = cpu::bf16_to_float(cpu::float_to_bf16(v));
    const std::vector<float> got = download_bf16(device, want.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < want.size(); ++i) mismatches += !same_bits(got[i], want[i]);
    EXPECT_EQ(mismatches, 0u);
    ++checked;
  }
  EXPECT_GE(checked, 2u) << "the weight's copy and the input's column-wise copy";
}

std::vector<std::pair<int, std::string>> matrix() {
  std::vector<std::pair<int, std::string>> cases;
  for (int p = 0; p < static_cast<int>(program_cases().size()); ++p) {
    for (const char* recipe : {"bf16", "delayed", "current", "blocks", "blocks_emulated", "mxfp8",
                               "nvfp4", "nvfp4_no_rht"})
      cases.emplace_back(p, recipe);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Programs, ExecutorMatchesReference, ::testing::ValuesIn(matrix()),
    [](const ::testing::TestParamInfo<std::pair<int, std::string>>& info) {
      return std::string(program_cases()[static_cast<std::size_t>(info.param.first)].name) + "_" +
             info.param.second;
    });

// ---- the FP8 weight cache -----------------------------------------------------------------------

class WeightCache : public ExecutorGpu, public ::testing::WithParamInterface<const char*> {};

TEST_P(WeightCache, SecondForwardReusesTheCastUntilInvalidated) {
  const auto c = compile("mlp", kMlp, GetParam());
  ASSERT_NE(c, nullptr);
  const cpu::Bindings bindings = {{"tokens", 64}};
  SideBySide run(*c, 0, bindings, *gemms_, stream_, 7);
  SideBySide fresh(*c, 0, bindings, *gemms_, stream_, 7);  // same seed: same weights
  run.new_inputs();
  fresh.new_inputs();
  const std::size_t count = 64 * 256;
  run.gpu().forward(stream_);
  const std::vector<float> first = download_bf16(run.gpu().output("y"), count);

  // New fc1 weights in the same memory: without invalidation the cached FP8 copy is used.
  std::mt19937_64 rng(99);
  const std::vector<float> changed = random_bf16(1024 * 256, 0.0625, rng);
  upload_bf16(run.array("fc1.weight"), changed);
  run.gpu().forward(stream_);
  EXPECT_EQ(download_bf16(run.gpu().output("y"), count), first) << "the weights were cast again";

  run.gpu().invalidate_weight_cache();
  run.gpu().forward(stream_);
  const std::vector<float> recast = download_bf16(run.gpu().output("y"), count);
  EXPECT_NE(recast, first);
  upload_bf16(fresh.array("fc1.weight"), changed);
  fresh.gpu().forward(stream_);
  EXPECT_EQ(recast, download_bf16(fresh.gpu().output("y"), count))
      << "after invalidation the output is that of the new weights";

  // Another parameter pointer is another weight: cast again without being told.
  DeviceArray other(1024 * 256 * 2);
  upload_bf16(other, random_bf16(1024 * 256, 0.0625, rng));
  run.gpu().set_tensor("fc1.weight", other.data());
  run.gpu().forward(stream_);
  EXPECT_NE(download_bf16(run.gpu().output("y"), count), recast);
}

INSTANTIATE_TEST_SUITE_P(Recipes, WeightCache,
                         ::testing::Values("delayed", "current", "blocks", "blocks_emulated"));

// ---- inference forwards -------------------------------------------------------------------------

class InferenceForward : public ExecutorGpu, public ::testing::WithParamInterface<const char*> {};

// An inference forward runs the steps' inference variants: the same outputs bit for bit, none of
// the FP8 transposed copies only backward reads, and less memory.
TEST_P(InferenceForward, MatchesTrainingWithoutTheTransposedCopies) {
  const auto c = compile("mlp", kMlp, GetParam());
  ASSERT_NE(c, nullptr);
  const codegen::SequencePlan& plan = c->plan.sequences[0];
  std::vector<int> left_out;  // what the variants do not write
  for (const codegen::Step& step : plan.steps) {
    if (!step.inference) continue;
    for (int id : step.writes) {
      const auto& kept = step.inference->writes;
      if (std::find(kept.begin(), kept.end(), id) == kept.end()) left_out.push_back(id);
    }
  }
  ASSERT_FALSE(left_out.empty()) << "an FP8 plan of the MLP writes transposed copies of its "
                                    "activations for wgrad; inference must leave them out";
  const cpu::Bindings bindings = {{"tokens", 96}};
  SideBySide run(*c, 0, bindings, *gemms_, stream_, 11);
  SequenceExecutor& gpu = run.gpu();
  // The planned steps, as training runs them (FusedEpilogueMatchesThePlannedSteps covers the
  // fused GEMM, whose summation order is its own).
  gpu.set_fused_epilogues(false);
  run.new_inputs();
  const std::size_t count = 96 * 256;

  gpu.forward(stream_, RunMode::Inference);
  const std::vector<float> inference = download_bf16(gpu.output("y"), count);
  const std::size_t inference_reserved = gpu.memory().reserved_bytes;
  EXPECT_GT(inference_reserved, 0u);
  for (int id : left_out) EXPECT_EQ(gpu.debug_buffer(id), nullptr) << "buffer " << id;
  const void* output = gpu.output("y");
  gpu.forward(stream_, RunMode::Inference);
  EXPECT_EQ(gpu.output("y"), output) << "buffers are placed once per binding";
  EXPECT_EQ(download_bf16(gpu.output("y"), count), inference);

  gpu.forward(stream_, RunMode::Training);
  EXPECT_EQ(download_bf16(gpu.output("y"), count), inference);
  // The copies live on for backward; what only a forward step reads (under block scaling the
  // norm's 16-bit output, which the column-wise cast reads) is dead again.
  for (int id : left_out) {
    if (plan.buffers.at(size_t(id)).saved) {
      EXPECT_NE(gpu.debug_buffer(id), nullptr) << "buffer " << id;
    }
  }
  EXPECT_GT(gpu.memory().reserved_bytes, inference_reserved);
  EXPECT_GE(gpu.memory().reserved_bytes, gpu.memory().peak_bytes);
  gpu.backward(stream_);
  gpu.end_step(stream_);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// Note "Fused GEMM epilogues": under delayed scaling an inference forward on an sm_90 runs fc1 with
// the SwiGLU and its E4M3 cast in the GEMM's epilogue (a CUTLASS kernel) and skips the activation
// step: the planned steps' output and amax up to the GEMM's FP32 summation order, also after new
// weights are cast (the kernel's interleaved copy of them follows) and after a training forward.
TEST_F(ExecutorGpu, FusedEpilogueMatchesThePlannedSteps) {
  const auto c = compile("mlp", kMlp, "delayed");
  ASSERT_NE(c, nullptr);
  const cpu::Bindings bindings = {{"tokens", 96}};
  SideBySide fused(*c, 0, bindings, *gemms_, stream_, 11);
  SideBySide planned(*c, 0, bindings, *gemms_, stream_, 11);  // same seed: same weights, inputs
  const auto off = fused.gpu().step_profiles(RunMode::Inference);
  EXPECT_EQ(std::count_if(off.begin(), off.end(), [](const auto& p) { return p.folded; }), 0)
      << "off by default";
  fused.gpu().set_fused_epilogues(true);
  if (const auto refused = fused.gpu().fused_gemm_refusals(); !refused.empty())
    GTEST_SKIP() << "step " << refused.begin()->first << ": " << refused.begin()->second;
  const auto profiles = fused.gpu().step_profiles(RunMode::Inference);
  const auto fused_step = std::find_if(profiles.begin(), profiles.end(), [](const auto& p) {
    return p.what.find("in its epilogue (CUTLASS)") != std::string::npos;
  });
  ASSERT_NE(fused_step, profiles.end()) << "no GEMM runs fused";
  EXPECT_NE(fused_step->what.find("fc1"), std::string::npos) << fused_step->what;
  // Scales from the data: two training steps on each side.
  for (int step = 0; step < 2; ++step) {
    fused.train_step(step, 0.5);
    planned.train_step(step, 0.5);
  }
  const std::size_t count = 96 * 256;
  auto compare = [&](const char* when) {
    SCOPED_TRACE(when);
    fused.new_inputs();
    planned.new_inputs();
    fused.gpu().forward(stream_, RunMode::Inference);
    planned.gpu().forward(stream_, RunMode::Inference);
    const std::vector<float> got = download_bf16(fused.gpu().output("y"), count);
    const std::vector<float> want = download_bf16(planned.gpu().output("y"), count);
    std::size_t same = 0;
    for (std::size_t i = 0; i < count; ++i) same += got[i] == want[i];
    // A bf16 rounding of fc1's output that goes the other way moves an E4M3 code of fc2's input
    // by one step; each output mixes 512 of them.
    EXPECT_LT(relative_error(got, want), 5e-3) << same << " of " << count << " outputs equal";
    const auto qf = fused.gpu().download_quantizers(stream_);
    const auto qp = planned.gpu().download_quantizers(stream_);
    for (std::size_t q = 0; q < qf.size(); ++q)
      EXPECT_NEAR(qf[q].amax_history[0], qp[q].amax_history[0], 2e-2 * qp[q].amax_history[0])
          << c->plan.sequences[0].quantizers[q].name;
    return got;
  };
  const std::vector<float> first = compare("after two training steps");
  // New fc1 weights, cast again: the fused GEMM must read the new ones.
  std::mt19937_64 rng(5);
  const std::vector<float> changed = random_bf16(1024 * 256, 0.0625, rng);
  for (SideBySide* side : {&fused, &planned}) {
    upload_bf16(side->array("fc1.weight"), changed);
    side->gpu().invalidate_weight_cache();
  }
  EXPECT_GT(relative_error(compare("after new weights"), first), 1e-2);
  // A training forward casts the weights again in between.
  fused.gpu().forward(stream_, RunMode::Training);
  planned.gpu().forward(stream_, RunMode::Training);
  compare("after a training forward");
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// Note "Fused GEMM epilogues", training: fc1's fused kernel also writes the SwiGLU's transposed
// E4M3 copy (fc2's wgrad reads it) and the GEMM's BF16 output (the SwiGLU backward reads it). Both
// sides train on the same weights and inputs (SideBySide takes the reference's updates); each
// step's output and gradients agree with the CPU reference as closely as the planned steps'; then
// a training forward on both: fc1's BF16 output and the transposed copy agree up to the GEMM's
// FP32 summation order (test_fused_gemm_gpu checks the copy's transpose byte for byte).
TEST_F(ExecutorGpu, FusedTrainingEpilogueMatchesThePlannedSteps) {
  const auto c = compile("mlp", kMlp, "delayed");
  ASSERT_NE(c, nullptr);
  const plan::SequencePlan& plan = c->plan.sequences[0];
  const cpu::Bindings bindings = {{"tokens", 96}};
  SideBySide fused(*c, 0, bindings, *gemms_, stream_, 13);
  SideBySide planned(*c, 0, bindings, *gemms_, stream_, 13);
  planned.gpu().set_fused_epilogues(false);
  planned.gpu().set_fused_training_epilogues(true);  // needs set_fused_epilogues
  if (const auto refused = fused.gpu().fused_gemm_refusals(); !refused.empty())
    GTEST_SKIP() << "step " << refused.begin()->first << ": " << refused.begin()->second;
  const plan::GemmStep* fc1 = nullptr;
  int fc1_step = -1;
  for (const plan::Step& step : plan.steps)
    if (const auto* gemm = std::get_if<plan::GemmStep>(&step.body);
        gemm != nullptr && gemm->training_epilogue) {
      fc1 = gemm;
      fc1_step = step.index;
    }
  ASSERT_NE(fc1, nullptr) << "the plan marks no training epilogue";
  const plan::GatedEpilogue& e = *fc1->training_epilogue;
  EXPECT_FALSE(fused.gpu().step_profiles(RunMode::Training).at(size_t(e.step)).folded)
      << "training forwards fuse only when asked";
  fused.gpu().set_fused_epilogues(true);
  fused.gpu().set_fused_training_epilogues(true);
  const auto profiles = fused.gpu().step_profiles(RunMode::Training);
  EXPECT_NE(profiles.at(size_t(fc1_step)).what.find("in its epilogue (CUTLASS)"), std::string::npos)
      << profiles.at(size_t(fc1_step)).what;
  EXPECT_TRUE(profiles.at(size_t(e.step)).folded);
  EXPECT_FALSE(planned.gpu().step_profiles(RunMode::Training).at(size_t(e.step)).folded);

  const std::size_t count = 96 * 256, d_count = 96 * 1024, act_count = 96 * 512;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepErrors f = fused.train_step(step, 0.5, /*update_params=*/false);
    const StepErrors p = planned.train_step(step, 0.5, /*update_params=*/false);
    // Against the CPU reference, as close as the planned steps (the bounds of the training tests).
    EXPECT_LT(f.outputs, std::max(2 * p.outputs, 3e-2));
    EXPECT_LT(f.input_grads, std::max(2 * p.input_grads, 3e-2));
    EXPECT_LT(f.param_grads, std::max(2 * p.param_grads, 3e-2)) << fused.worst_param();
    // New weights for both: the fused GEMM's interleaved copy follows them.
    for (SideBySide* side : {&fused, &planned}) {
      for (const std::string& name : side->ref().param_names()) {
        cpu::Tensor<float>& w = side->ref().param(name);
        for (float& v : w.data) v *= 0.875f;
      }
      side->upload_params();
      side->ref().params_changed();
      side->gpu().invalidate_weight_cache();
    }
  }
  // A last training forward on both sides, the same inputs: what backward would read.
  fused.new_inputs();
  planned.new_inputs();
  fused.gpu().forward(stream_, RunMode::Training);
  planned.gpu().forward(stream_, RunMode::Training);
  EXPECT_LT(relative_error(download_bf16(fused.gpu().output("y"), count),
                           download_bf16(planned.gpu().output("y"), count)),
            5e-3);
  const std::vector<float> d_fused = download_bf16(fused.gpu().debug_buffer(fc1->d), d_count);
  const std::vector<float> d_planned = download_bf16(planned.gpu().debug_buffer(fc1->d), d_count);
  std::size_t same = 0;
  for (std::size_t i = 0; i < d_count; ++i) same += d_fused[i] == d_planned[i];
  EXPECT_LT(relative_error(d_fused, d_planned), 4e-3) << same << " of " << d_count << " equal";
  EXPECT_GT(same, d_count * 9 / 10) << "fc1's BF16 output, value by value";
  // The transposed copies (the copy itself is dead once fc2 has read it): the fused kernel's,
  // cast from its own BF16 values, against the activation kernel's from cuBLASLt's. A rounding of
  // D that goes the other way moves a code by one step at most.
  const std::vector<std::uint8_t> t_fused =
      download_bytes(fused.gpu().debug_buffer(e.output_t), act_count);
  const std::vector<std::uint8_t> t_planned =
      download_bytes(planned.gpu().debug_buffer(e.output_t), act_count);
  std::size_t equal = 0, far = 0;
  for (std::size_t i = 0; i < act_count; ++i) {
    equal += t_fused[i] == t_planned[i];
    const int a = t_fused[i], b = t_planned[i];
    far += (a & 0x80) != (b & 0x80) && (a & 0x7f) + (b & 0x7f) > 1 ? 1
           : std::abs((a & 0x7f) - (b & 0x7f)) > 1                 ? 1
                                                                   : 0;
  }
  EXPECT_GT(equal, act_count * 9 / 10) << "the transposed copies, byte by byte";
  EXPECT_EQ(far, 0u);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// Small inference forwards replay a graph the executor records (note "Automatic graphs"): every
// output equals the eager executor's, with new input values, a new input pointer, a new
// parameter pointer and a recast weight cache in between.
TEST_P(InferenceForward, AutomaticGraphReplaysMatchEagerForwards) {
  const auto c = compile("mlp", kMlp, GetParam());
  ASSERT_NE(c, nullptr);
  const cpu::Bindings bindings = {{"tokens", 32}};
  SideBySide graphed(*c, 0, bindings, *gemms_, stream_, 5);
  SideBySide eager(*c, 0, bindings, *gemms_, stream_, 5);  // same seed: same weights and inputs
  eager.gpu().set_auto_graph(false);
  const std::size_t count = 32 * 256;
  std::mt19937_64 rng(3);
  DeviceArray other_x(count * 2);
  DeviceArray other_w(1024 * 256 * 2);
  for (int call = 0; call < 12; ++call) {
    SCOPED_TRACE(call);
    if (call % 2 == 0) {  // new input values in the same memory
      graphed.new_inputs();
      eager.new_inputs();
    }
    if (call == 7) {  // the input moves
      const std::vector<float> x = random_bf16(count, 1.0, rng);
      upload_bf16(other_x, x);
      graphed.gpu().set_tensor("x", other_x.data());
      eager.gpu().set_tensor("x", other_x.data());
    }
    if (call == 9) {  // a parameter moves: recorded again
      upload_bf16(other_w, random_bf16(1024 * 256, 0.0625, rng));
      graphed.gpu().set_tensor("fc1.weight", other_w.data());
      eager.gpu().set_tensor("fc1.weight", other_w.data());
    }
    if (call == 10) {  // the FP8 weights are cast again
      graphed.gpu().invalidate_weight_cache();
      eager.gpu().invalidate_weight_cache();
    }
    graphed.gpu().forward(stream_, RunMode::Inference);
    eager.gpu().forward(stream_, RunMode::Inference);
    ASSERT_EQ(download_bf16(graphed.gpu().output("y"), count),
              download_bf16(eager.gpu().output("y"), count));
  }
  EXPECT_EQ(eager.gpu().graph_replays(), 0u);
  EXPECT_GE(graphed.gpu().graph_replays(), 5u);
  // Training forwards never replay, and a training step in between keeps inference right.
  const std::size_t replays = graphed.gpu().graph_replays();
  graphed.gpu().forward(stream_, RunMode::Training);
  EXPECT_EQ(graphed.gpu().graph_replays(), replays);
  graphed.gpu().backward(stream_);
  for (int call = 0; call < 3; ++call) {
    graphed.gpu().forward(stream_, RunMode::Inference);
    eager.gpu().forward(stream_, RunMode::Inference);
    ASSERT_EQ(download_bf16(graphed.gpu().output("y"), count),
              download_bf16(eager.gpu().output("y"), count));
  }
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// The legacy default stream cannot be recorded (CUDA refuses the capture): small inference
// forwards there run eagerly, every call, with the eager executor's outputs.
TEST_F(ExecutorGpu, AutomaticGraphRunsEagerlyOnTheLegacyDefaultStream) {
  const auto c = compile("mlp", kMlp, "delayed");
  ASSERT_NE(c, nullptr);
  const cpu::Bindings bindings = {{"tokens", 32}};
  SideBySide graphed(*c, 0, bindings, *gemms_, stream_, 5);
  SideBySide eager(*c, 0, bindings, *gemms_, stream_, 5);
  eager.gpu().set_auto_graph(false);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::size_t count = 32 * 256;
  for (int call = 0; call < 6; ++call) {
    SCOPED_TRACE(call);
    graphed.gpu().forward(nullptr, RunMode::Inference);
    eager.gpu().forward(nullptr, RunMode::Inference);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    ASSERT_EQ(download_bf16(graphed.gpu().output("y"), count),
              download_bf16(eager.gpu().output("y"), count));
  }
  EXPECT_EQ(graphed.gpu().graph_replays(), 0u);
  // The same executor on a stream of its own records and replays.
  for (int call = 0; call < 4; ++call) graphed.gpu().forward(stream_, RunMode::Inference);
  EXPECT_GE(graphed.gpu().graph_replays(), 1u);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Recipes, InferenceForward,
                         ::testing::Values("delayed", "current", "blocks", "blocks_emulated",
                                           "nvfp4"));

// ---- misuse -------------------------------------------------------------------------------------

template <typename Call>
std::string usage_error(Call&& call) {
  try {
    call();
  } catch (const UsageError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no UsageError";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(ExecutorGpu, MisuseIsAUsageErrorBeforeAnyLaunch) {
  const auto c = compile("mlp", kMlp, "delayed");
  ASSERT_NE(c, nullptr);
  SequenceExecutor executor(c->plan.sequences[0], *c->modules, *gemms_, stream_);
  const auto initial = executor.download_quantizers(stream_);

  EXPECT_TRUE(contains(usage_error([&] { executor.forward(stream_); }), "bind"));
  EXPECT_TRUE(contains(usage_error([&] { executor.tensors(); }), "bind"));
  EXPECT_TRUE(contains(usage_error([&] { executor.bind({}); }), "'tokens'"));
  EXPECT_TRUE(contains(usage_error([&] {
                         executor.bind({{"tokens", 0}});
                       }),
                       "sizes must be from 1"));
  EXPECT_TRUE(contains(usage_error([&] {
                         executor.bind({{"tokens", 64}, {"batch", 2}});
                       }),
                       "'batch'"));
  EXPECT_TRUE(contains(usage_error([&] {
                         executor.bind({{"tokens", 64}, {"num_sms", 2}});
                       }),
                       "from the device"));
  // FP8 GEMMs need every dimension a multiple of 16: tokens = 72 is m of fc1's fprop.
  const std::string fp8_dim = usage_error([&] { executor.bind({{"tokens", 72}}); });
  EXPECT_TRUE(contains(fp8_dim, "fprop GEMM of fc1")) << fp8_dim;
  EXPECT_TRUE(contains(fp8_dim, "mlp.fuse:")) << fp8_dim;
  EXPECT_TRUE(contains(fp8_dim, "tokens")) << fp8_dim;
  EXPECT_TRUE(contains(fp8_dim, "16")) << fp8_dim;

  executor.bind({{"tokens", 64}});
  EXPECT_TRUE(contains(usage_error([&] { executor.set_tensor("nope", nullptr); }), "nope"));
  DeviceArray x(64 * 256 * 2 + 16);
  EXPECT_TRUE(contains(usage_error([&] { executor.set_tensor("x", nullptr); }), "null"));
  EXPECT_TRUE(contains(
      usage_error([&] { executor.set_tensor("x", static_cast<char*>(x.data()) + 8); }), "16-byte"));
  executor.set_tensor("x", x.data());
  const std::string missing = usage_error([&] { executor.forward(stream_); });
  EXPECT_TRUE(contains(missing, "fc1.weight")) << missing;
  EXPECT_TRUE(contains(usage_error([&] { executor.backward(stream_); }), "forward"));
  EXPECT_TRUE(contains(usage_error([&] { executor.output("y"); }), "not computed"));
  EXPECT_TRUE(contains(usage_error([&] { executor.output("z"); }), "no output 'z'"));
  EXPECT_TRUE(contains(usage_error([&] { executor.param_grad("fc1.weight"); }), "not computed"));
  EXPECT_TRUE(contains(usage_error([&] { executor.tensor("nope"); }), "nope"));
  EXPECT_TRUE(contains(usage_error([&] { executor.upload_quantizers({}, stream_); }), "0"));

  // Nothing ran: no buffer was allocated and the quantizer state is untouched.
  EXPECT_EQ(executor.memory().peak_bytes, 0u);
  const auto after = executor.download_quantizers(stream_);
  ASSERT_EQ(after.size(), initial.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].amax_history, initial[i].amax_history);
    EXPECT_EQ(after[i].scale, initial[i].scale);
  }

  // bf16 GEMMs need multiples of 8 only.
  const auto plain = compile("mlp", kMlp, "bf16");
  ASSERT_NE(plain, nullptr);
  SequenceExecutor bf16(plain->plan.sequences[0], *plain->modules, *gemms_, stream_);
  EXPECT_NO_THROW(bf16.bind({{"tokens", 72}}));
  EXPECT_TRUE(contains(usage_error([&] { bf16.bind({{"tokens", 70}}); }), "multiple of 8"));
}

TEST_F(ExecutorGpu, PlanModulesRejectsMissingAndForeignBinaries) {
  const auto c = compile("mlp", kMlp, "bf16");
  ASSERT_NE(c, nullptr);
  EXPECT_THROW(PlanModules(c->plan, {}), UsageError);
  jit::CompileRequest request;
  request.kernel_name = "foreign";
  request.source = codegen::kernel_source(c->plan, c->plan.kernels[0]);
  request.name_expressions = {c->plan.kernels[0].name_expression};
  request.arch = current_device().arch == "sm_89" ? "sm_80" : "sm_89";
  std::vector<jit::CompiledKernel> foreign(c->plan.kernels.size(), jit::compile_kernel(request));
  const std::string error = usage_error([&] { PlanModules(c->plan, foreign); });
  EXPECT_TRUE(contains(error, request.arch)) << error;
}

// ---- memory -------------------------------------------------------------------------------------

// The FP8 copies of the weights: the buffers the weight cache keeps.
std::size_t weight_copy_bytes(const codegen::SequencePlan& plan) {
  std::size_t bytes = 0;
  for (const codegen::Buffer& buffer : plan.buffers) {
    if (buffer.quantizer >= 0 && plan.quantizers[static_cast<std::size_t>(buffer.quantizer)].role ==
                                     ir::QuantizerRole::Weight) {
      bytes += static_cast<std::size_t>(*buffer.bytes.value());
    }
  }
  return bytes;
}

TEST_F(ExecutorGpu, LiveMemoryReturnsToItsBaselineAfterEveryBackward) {
  const auto c = compile("gelu_bias_mlp", kGeluBiasMlp, "delayed");
  ASSERT_NE(c, nullptr);
  SideBySide run(*c, 0, {{"tokens", 128}}, *gemms_, stream_, 5);
  SequenceExecutor& gpu = run.gpu();
  std::size_t grads = 0, outputs = 0;
  for (const TensorInfo& info : gpu.tensors()) {
    if (info.role != BufferRole::Result) continue;
    (info.name == "y" ? outputs : grads) += info.bytes;
  }
  // input_grad x is an executor buffer, like the parameter gradients.
  const std::size_t cache = weight_copy_bytes(c->plan.sequences[0]);
  ASSERT_GT(cache, 0u);
  std::size_t training_peak = 0;
  for (int step = 0; step < 3; ++step) {
    run.new_inputs();
    gpu.forward(stream_);
    gpu.backward(stream_);
    // The output stays readable until the next forward, the gradients until then too.
    EXPECT_EQ(gpu.memory().live_bytes, outputs + grads + cache) << "step " << step;
    gpu.end_step(stream_);
    training_peak = gpu.memory().peak_bytes;
  }
  EXPECT_GT(training_peak, grads + cache);
  // Inference keeps only the output (and the weight copies) after forward and peaks lower.
  gpu.forward(stream_, RunMode::Inference);  // also lets the last step's gradients go
  gpu.reset_peak();
  gpu.forward(stream_, RunMode::Inference);
  EXPECT_EQ(gpu.memory().live_bytes, outputs + cache);
  EXPECT_LT(gpu.memory().peak_bytes, training_peak);
  EXPECT_TRUE(contains(usage_error([&] { gpu.backward(stream_); }), "Training"));
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

TEST_F(ExecutorGpu, QuantizerStateUploadsAndDownloadsUnchanged) {
  const auto c = compile("mlp", kMlp, "delayed");
  ASSERT_NE(c, nullptr);
  SequenceExecutor executor(c->plan.sequences[0], *c->modules, *gemms_, stream_);
  std::vector<cpu::DelayedScalingState> states = executor.download_quantizers(stream_);
  ASSERT_EQ(states.size(), c->plan.sequences[0].quantizers.size());
  for (std::size_t i = 0; i < states.size(); ++i) {
    EXPECT_EQ(states[i].amax_history.size(), 16u);
    states[i].scale = 2.0f + float(i);
    states[i].scale_inv = 1.0f / states[i].scale;
    states[i].amax_history[3] = float(i) + 0.5f;
  }
  executor.upload_quantizers(states, stream_);
  const auto back = executor.download_quantizers(stream_);
  for (std::size_t i = 0; i < states.size(); ++i) {
    EXPECT_EQ(back[i].amax_history, states[i].amax_history);
    EXPECT_EQ(back[i].scale, states[i].scale);
  }
  states.pop_back();
  EXPECT_THROW(executor.upload_quantizers(states, stream_), UsageError);
}

}  // namespace
}  // namespace opfuse::gpu
