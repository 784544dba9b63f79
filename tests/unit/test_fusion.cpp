// Every fusion pattern of passes/fusion/: the structure it forms (which ops fused, and where it
// must not fuse), and that fused and unfused execution agree in the CPU reference, which runs a
// fused op as its parts with rounding only where values leave it (docs/design.md, "Passes").
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "driver/frontend.h"
#include "ir/pointwise_ops.h"
#include "ir/verifier.h"
#include "passes/fusion/patterns.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"

namespace opfuse {
namespace {

constexpr const char* kDelayed = "recipe fp8 = delayed_scaling(amax_history = 4)\n";
constexpr const char* kCurrent = "recipe fp8 = current_scaling()\n";
constexpr const char* kBf16 = "recipe fp8 = bf16()\n";
constexpr const char* kBlocks = "recipe fp8 = float8_block_scaling(format = hybrid)\n";
constexpr const char* kMxfp8 = "recipe fp8 = mxfp8_block_scaling(format = hybrid)\n";
constexpr const char* kNvfp4 = "recipe fp8 = nvfp4_block_scaling()\n";

// Runs the whole pipeline (verifier after every pass), or stops before the fusion passes.
ir::Sequence lower(const std::string& text, bool fuse) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  if (!fuse) options.disabled_passes = {"fuse-forward", "fuse-backward"};
  options.last_stage = driver::Stage::Passes;
  driver::CompileResult result =
      driver::compile_source("fusion.fuse", text, sources, diags, options);
  EXPECT_TRUE(result.ok()) << diags.format_all() << text;
  if (!result.ok()) return {};
  EXPECT_TRUE(ir::verify_sequence(result.program.sequences[0]).empty());
  return result.program.sequences[0];
}

std::string program(const char* recipe, const std::string& signature, const std::string& body) {
  return fmt::format("{}sequence s{} uses fp8 {{\n{}\n}}\n", recipe, signature, body);
}

// The fused ops of a pattern, each as the list of its parts' op names.
std::vector<std::vector<std::string>> fused(const ir::Sequence& s, std::string_view pattern) {
  std::vector<std::vector<std::string>> out;
  for (const ir::Operation& op : s.ops) {
    if (op.kind != ir::OpKind::Fused || ir::attr_name(op.attrs, "pattern") != pattern) continue;
    std::vector<std::string> parts;
    for (const ir::Operation& p : op.parts) parts.emplace_back(ir::op_info(p.kind).name);
    out.push_back(parts);
  }
  return out;
}

using Parts = std::vector<std::vector<std::string>>;

const std::string kSig = "(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64])";
const std::string kMlpGelu =
    "  layernorm(64)\n  linear(64, 128) as up\n  gelu()\n  linear(128, 64) as down";
const std::string kMlpSwiglu =
    "  rmsnorm(64)\n  linear(64, 256, bias = false) as up\n  swiglu()\n  linear(128, 64, bias = "
    "false) as down";
const std::string kResidualSig =
    "(x: bf16[tokens, 64], res: bf16[tokens, 64]) -> (y: bf16[tokens, 64], skip: bf16[tokens, "
    "64])";
const std::string kResidualBody =
    "  make_extra_output(skip)\n  layernorm(64)\n  linear(64, 64, bias = false) as proj\n  "
    "add_extra_input(res)";

// ---- structure ------------------------------------------------------------------------------

TEST(FusionStructure, NormCastFoldsTheInputCastIntoTheNorm) {
  const ir::Sequence s = lower(program(kDelayed, kSig, kMlpSwiglu), true);
  EXPECT_EQ(fused(s, "norm_cast"), (Parts{{"rmsnorm", "cast_fp8"}}));
}

TEST(FusionStructure, ActivationCastFoldsTheNextLinearsInputCast) {
  EXPECT_EQ(fused(lower(program(kDelayed, kSig, kMlpSwiglu), true), "activation_cast"),
            (Parts{{"swiglu", "cast_fp8"}}));
  // Under FP8 a GELU with a cast after it becomes activation + cast, not a GELU epilogue.
  const ir::Sequence gelu = lower(program(kDelayed, kSig, kMlpGelu), true);
  EXPECT_EQ(fused(gelu, "activation_cast"), (Parts{{"gelu", "cast_fp8"}}));
  EXPECT_TRUE(fused(gelu, "linear_bias_gelu").empty());
}

TEST(FusionStructure, LinearBiasGeluUsesTheEpilogueUnderBf16) {
  EXPECT_EQ(fused(lower(program(kBf16, kSig, kMlpGelu), true), "linear_bias_gelu"),
            (Parts{{"linear", "gelu"}}));
  const std::string bias_op =
      "  linear(64, 128, bias = false)\n  bias(128)\n  gelu()\n  linear(128, 64)";
  EXPECT_EQ(fused(lower(program(kBf16, kSig, bias_op), true), "linear_bias_gelu"),
            (Parts{{"linear", "bias", "gelu"}}));
  // No bias at all: GELU_AUX_BIAS needs one (and a plain GELU epilogue is not a pattern yet).
  const std::string no_bias = "  linear(64, 128, bias = false)\n  gelu()\n  linear(128, 64)";
  EXPECT_TRUE(fused(lower(program(kBf16, kSig, no_bias), true), "linear_bias_gelu").empty());
}

TEST(FusionStructure, LinearBiasFoldsABiasOpIntoTheGemm) {
  const std::string body = "  linear(64, 64, bias = false)\n  bias(64)";
  EXPECT_EQ(fused(lower(program(kBf16, kSig, body), true), "linear_bias"),
            (Parts{{"linear", "bias"}}));
  EXPECT_EQ(fused(lower(program(kDelayed, kSig, body), true), "linear_bias"),
            (Parts{{"linear", "bias"}}));
}

TEST(FusionStructure, LinearResidualAccumulatesIntoTheExtraInput) {
  EXPECT_EQ(fused(lower(program(kDelayed, kResidualSig, kResidualBody), true), "linear_residual"),
            (Parts{{"linear", "add_extra_input"}}));
}

TEST(FusionStructure, MakeExtraOutputStaysAnAliasOutsideAnyKernel) {
  const ir::Sequence s = lower(program(kDelayed, kResidualSig, kResidualBody), true);
  // The extra output is the input itself: no op copies it.
  EXPECT_EQ(s.ops[0].kind, ir::OpKind::MakeExtraOutput);
  EXPECT_EQ(ir::op_info(s.ops[0].kind).family, ir::KernelFamily::Alias);
  EXPECT_EQ(s.outputs[1].value, s.ops[0].results[0]);
}

TEST(FusionStructure, DactCastTakesTheBiasGradientAlong) {
  EXPECT_EQ(fused(lower(program(kDelayed, kSig, kMlpGelu), true), "dact_cast"),
            (Parts{{"activation_backward", "bias_grad", "cast_fp8"}}));
  EXPECT_EQ(fused(lower(program(kDelayed, kSig, kMlpSwiglu), true), "dact_cast"),
            (Parts{{"gated_activation_backward", "cast_fp8"}}));
}

TEST(FusionStructure, CastDbiasPairsTheOutputGradientsCastAndBiasGradient) {
  EXPECT_EQ(fused(lower(program(kDelayed, kSig, kMlpGelu), true), "cast_dbias"),
            (Parts{{"bias_grad", "cast_fp8"}}));
}

TEST(FusionStructure, NormBackwardAccumulatesTheResidualGradient) {
  EXPECT_EQ(
      fused(lower(program(kDelayed, kResidualSig, kResidualBody), true), "norm_backward_residual"),
      (Parts{{"layernorm_backward", "grad_add"}}));
}

TEST(FusionStructure, DgradAccumulatesASecondGradientOfItsInput) {
  const std::string sig = "(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64], skip: bf16[tokens, 64])";
  const std::string body = "  make_extra_output(skip)\n  linear(64, 64) as proj";
  EXPECT_EQ(fused(lower(program(kBf16, sig, body), true), "dgrad_residual"),
            (Parts{{"linear_dgrad", "grad_add"}}));
}

TEST(FusionStructure, DgeluBgradFollowsAGeluEpilogue) {
  EXPECT_EQ(fused(lower(program(kBf16, kSig, kMlpGelu), true), "dgelu_bgrad"),
            (Parts{{"linear_dgrad", "activation_backward", "bias_grad"}}));
  // Without the forward epilogue (FP8: GELU fused with its cast) there is no aux buffer to read.
  EXPECT_TRUE(fused(lower(program(kDelayed, kSig, kMlpGelu), true), "dgelu_bgrad").empty());
}

TEST(FusionStructure, CurrentScalingKeepsCastsSeparate) {
  // The cast needs the whole tensor's amax first: no cast folds into a producer.
  const ir::Sequence s = lower(program(kCurrent, kSig, kMlpGelu), true);
  for (const char* p : {"norm_cast", "activation_cast", "dact_cast", "cast_dbias"})
    EXPECT_TRUE(fused(s, p).empty()) << p;
  // The GELU epilogue may form on the FP8 forward GEMM, but not DGELU on the FP8 dgrad GEMM.
  EXPECT_EQ(fused(s, "linear_bias_gelu"), (Parts{{"linear", "gelu"}}));
  EXPECT_TRUE(fused(s, "dgelu_bgrad").empty());
}

TEST(FusionStructure, BlockCastsFoldIntoTheActivationsForwardAndBackward) {
  // 1x128 blocks of the next linear's input and of the activation's gradient (both copies); the
  // per-tensor patterns stay out, and the norm, whose rows (64 wide) hold no whole 1x128 block,
  // keeps its block cast apart.
  const ir::Sequence swiglu = lower(program(kBlocks, kSig, kMlpSwiglu), true);
  EXPECT_EQ(fused(swiglu, "activation_block_cast"), (Parts{{"swiglu", "cast_fp8"}}));
  EXPECT_EQ(fused(swiglu, "dact_block_cast"), (Parts{{"gated_activation_backward", "cast_fp8"}}));
  for (const char* p :
       {"norm_cast", "norm_block_cast", "activation_cast", "dact_cast", "cast_dbias"})
    EXPECT_TRUE(fused(swiglu, p).empty()) << p;
  const ir::Sequence gelu = lower(program(kBlocks, kSig, kMlpGelu), true);
  EXPECT_EQ(fused(gelu, "activation_block_cast"), (Parts{{"gelu", "cast_fp8"}}));
  EXPECT_EQ(fused(gelu, "dact_block_cast"),
            (Parts{{"activation_backward", "bias_grad", "cast_fp8"}}));
}

// Rows a multiple of 128 wide: the norm writes its output's row-wise 1x128 copy (norm_block_cast),
// not under per-tensor recipes.
const std::string kWideMlp =
    "  rmsnorm(128)\n  linear(128, 256, bias = false) as up\n  swiglu()\n  linear(128, 128, "
    "bias = false) as down";
const std::string kWideSig = "(x: bf16[tokens, 128]) -> (y: bf16[tokens, 128])";

TEST(FusionStructure, ABlockCastFoldsIntoTheNormWhoseRowsHoldWholeBlocks) {
  EXPECT_EQ(fused(lower(program(kBlocks, kWideSig, kWideMlp), true), "norm_block_cast"),
            (Parts{{"rmsnorm", "cast_fp8"}}));
  const ir::Sequence delayed = lower(program(kDelayed, kWideSig, kWideMlp), true);
  EXPECT_TRUE(fused(delayed, "norm_block_cast").empty());
  EXPECT_EQ(fused(delayed, "norm_cast"), (Parts{{"rmsnorm", "cast_fp8"}}));
}

// MXFP8 (emulated): the norm and the activation write their outputs' decoded 1x32 row-wise
// copies (norm_micro_cast, activation_micro_cast); the column-wise copies' casts stay apart and
// read the outputs. NVFP4's copies need the tensor's amax first, so nothing fuses there.
TEST(FusionStructure, TheMxfp8RowwiseCopiesFoldIntoTheirProducers) {
  const ir::Sequence mx = lower(program(kMxfp8, kWideSig, kWideMlp), true);
  EXPECT_EQ(fused(mx, "norm_micro_cast"), (Parts{{"rmsnorm", "emulated_cast"}}));
  // The SwiGLU writes the next linear's (activation_micro_cast), its backward the gradient's of
  // the linear before it (dact_micro_cast).
  EXPECT_EQ(fused(mx, "activation_micro_cast"), (Parts{{"swiglu", "emulated_cast"}}));
  EXPECT_EQ(fused(mx, "dact_micro_cast"), (Parts{{"gated_activation_backward", "emulated_cast"}}));
  size_t columnwise_casts_of_the_norm = 0;
  for (const ir::Operation& op : mx.ops) {
    if (op.kind == ir::OpKind::EmulatedCast && op.instance == "up.input")
      columnwise_casts_of_the_norm += ir::attr_bool(op.attrs, "columnwise") ? 1 : 0;
  }
  EXPECT_EQ(columnwise_casts_of_the_norm, 1u) << "the column-wise copy stays its own op";
  const ir::Sequence fp4 = lower(program(kNvfp4, kWideSig, kWideMlp), true);
  EXPECT_TRUE(fused(fp4, "norm_micro_cast").empty());
  EXPECT_TRUE(fused(fp4, "activation_micro_cast").empty());
  EXPECT_TRUE(fused(fp4, "dact_micro_cast").empty());
  EXPECT_TRUE(fused(lower(program(kBlocks, kWideSig, kWideMlp), true), "norm_micro_cast").empty());
}

// The GELU's gradient feeds the bias gradient before its MXFP8 copy's cast: the fused backward
// takes the activation's place (the engine's fuse_position), and the bias gradient reads the
// gradient the kernel writes.
TEST(FusionStructure, AFusedGradientMovesUpBeforeTheBiasGradientThatReadsIt) {
  const ir::Sequence mx = lower(program(kMxfp8, kSig, kMlpGelu), true);
  ASSERT_EQ(fused(mx, "dact_micro_cast"), (Parts{{"activation_backward", "emulated_cast"}}));
  size_t fused_at = 0, bias_grad_at = 0;
  for (size_t i = 0; i < mx.ops.size(); ++i) {
    const ir::Operation& op = mx.ops[i];
    if (op.kind == ir::OpKind::Fused && ir::attr_name(op.attrs, "pattern") == "dact_micro_cast")
      fused_at = i;
    if (op.kind == ir::OpKind::BiasGrad) bias_grad_at = i;
  }
  EXPECT_LT(fused_at, bias_grad_at);
}

TEST(FusionStructure, AGatedBackwardWhosePlanesSplitABlockStaysUnfused) {
  // SwiGLU of width 64: a 1x128 row block of its [tokens, 128] gradient would hold 64 columns of
  // d gate and 64 of d linear, which the fused kernel's planes cannot share. The forward (one
  // plane) still fuses.
  const std::string body =
      "  rmsnorm(64)\n  linear(64, 128, bias = false) as up\n  swiglu()\n  linear(64, 64, bias = "
      "false) as down";
  const ir::Sequence s = lower(program(kBlocks, kSig, body), true);
  EXPECT_EQ(fused(s, "activation_block_cast"), (Parts{{"swiglu", "cast_fp8"}}));
  EXPECT_TRUE(fused(s, "dact_block_cast").empty());
}

TEST(FusionStructure, AValueUsedOutsideTheGroupIsNotFusedAway) {
  // The norm's bf16 output is also a sequence output: the norm kernel cannot write it and FP8.
  const std::string sig = "(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64], n: bf16[tokens, 64])";
  const std::string body = "  layernorm(64)\n  make_extra_output(n)\n  linear(64, 64)";
  EXPECT_TRUE(fused(lower(program(kDelayed, sig, body), true), "norm_cast").empty());
}

TEST(FusionStructure, Bf16HasNoCastsToFuse) {
  const ir::Sequence s = lower(program(kBf16, kSig, kMlpSwiglu), true);
  for (const ir::Operation& op : s.ops) {
    EXPECT_NE(op.kind, ir::OpKind::CastFp8);
    for (const ir::Operation& part : op.parts) EXPECT_NE(part.kind, ir::OpKind::CastFp8);
  }
  EXPECT_TRUE(s.quantizers.empty());
}

// ---- fused vs unfused in the CPU reference --------------------------------------------------

struct Run {
  std::vector<cpu::Tensor<float>> outputs;
  cpu::Gradients<float> grads;
  std::vector<cpu::QuantizerInfo> quantizers;
};

// Two training steps from one seed (the second uses the delayed scales the first set).
// tokens: 48, or a multiple of 32 where MXFP8's column-wise blocks need it.
Run train(const ir::Sequence& s, int64_t tokens = 48) {
  cpu::ReferenceExecutor<float> exec(s, {{"tokens", tokens}});
  cpu::init_params_from_seed(exec, 3);
  // Nonzero biases: with the seed's zero biases a dropped rounding after the GEMM would vanish.
  for (size_t i = 0; i < exec.param_names().size(); ++i)
    if (exec.param_names()[i].ends_with(".bias"))
      exec.param(exec.param_names()[i]) =
          cpu::seeded_normal(exec.param(exec.param_names()[i]).shape, 50 + i, 0.5);
  exec.params_changed();
  Run r;
  for (int step = 0; step < 2; ++step) {
    std::vector<cpu::Tensor<float>> inputs, seeds;
    for (size_t i = 0; i < exec.input_shapes().size(); ++i)
      inputs.push_back(cpu::seeded_normal(exec.input_shapes()[i], 10 * step + i, 1.0));
    for (size_t i = 0; i < exec.output_shapes().size(); ++i)
      seeds.push_back(cpu::seeded_normal(exec.output_shapes()[i], 100 + 10 * step + i, 1e-2));
    r.outputs = exec.forward(inputs);
    r.grads = exec.backward(seeds);
    r.quantizers = exec.quantizers();
    exec.step();
  }
  return r;
}

double relative_error(const cpu::Tensor<float>& a, const cpu::Tensor<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    diff += std::pow(double(a.data[i]) - double(b.data[i]), 2);
    norm += std::pow(double(b.data[i]), 2);
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

struct Agreement {
  double worst = 0;  // largest norm-wise relative difference over outputs and gradients
  bool identical = true;
};

// Runs `text` unfused, and fused by `pattern` alone (after `prerequisite`, a forward pattern a
// backward one builds on), so each pattern's numerics are measured in isolation.
Agreement compare(const std::string& text, const passes::fusion::FusionPattern& pattern,
                  const passes::fusion::FusionPattern* prerequisite = nullptr,
                  int64_t tokens = 48) {
  const ir::Sequence unfused = lower(text, false);
  ir::Sequence fused_seq = unfused;
  for (const auto* p : {prerequisite, &pattern}) {
    if (p == nullptr) continue;
    const passes::fusion::FusionPattern* only[] = {p};
    passes::fusion::apply_patterns(fused_seq, p->phase, only);
  }
  EXPECT_TRUE(ir::verify_sequence(fused_seq).empty());
  EXPECT_FALSE(fused(fused_seq, pattern.name).empty()) << pattern.name << " did not form";
  const Run a = train(fused_seq, tokens), b = train(unfused, tokens);
  Agreement out;
  auto add = [&](const cpu::Tensor<float>& x, const cpu::Tensor<float>& y) {
    out.worst = std::max(out.worst, relative_error(x, y));
    out.identical &= x.data == y.data;
  };
  for (size_t i = 0; i < a.outputs.size(); ++i) add(a.outputs[i], b.outputs[i]);
  for (size_t i = 0; i < a.grads.inputs.size(); ++i) add(a.grads.inputs[i], b.grads.inputs[i]);
  for (size_t i = 0; i < a.grads.params.size(); ++i) add(a.grads.params[i], b.grads.params[i]);
  return out;
}

// Tolerances, from what dropping one intermediate rounding can do (measured values in the test
// output: bf16 patterns 0.08-0.5%, FP8 patterns 1.3-4.3%). bf16 keeps 8 significant bits: one
// rounding moves an element by at most 2^-9 relative, and a few such steps through a GEMM and a
// gradient stay well under 1% norm-wise. An FP8 cast of a value that moved by a bf16 step lands on
// the neighbouring code for roughly 1 element in 32 (bf16 step / E4M3 step = 2^-8 / 2^-3), each
// moving by one E4M3 step (12.5%); norm-wise that is a few percent, so 6%. A wrong fusion (a wrong
// operand, a dropped part) is off by O(1).
constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp8Tolerance = 6e-2;

struct NumericCase {
  const passes::fusion::FusionPattern* pattern;
  std::string text;
  double tolerance;
  const passes::fusion::FusionPattern* prerequisite = nullptr;
};

class FusedVsUnfused : public ::testing::TestWithParam<NumericCase> {};

TEST_P(FusedVsUnfused, AgreeWithinRoundingAndDiffer) {
  const NumericCase& c = GetParam();
  const Agreement a = compare(c.text, *c.pattern, c.prerequisite);
  std::printf("%s: worst norm-wise relative difference %.2e\n", c.pattern->name.data(), a.worst);
  EXPECT_LT(a.worst, c.tolerance) << c.pattern->name;
  // Each of these patterns drops an intermediate rounding, so the fused run must really differ:
  // an executor that ignored the fusion would run both the same way.
  EXPECT_FALSE(a.identical) << c.pattern->name;
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, FusedVsUnfused,
    ::testing::Values(
        NumericCase{&passes::fusion::norm_cast(), program(kDelayed, kSig, kMlpSwiglu),
                    kFp8Tolerance},
        NumericCase{&passes::fusion::activation_cast(), program(kDelayed, kSig, kMlpSwiglu),
                    kFp8Tolerance},
        NumericCase{&passes::fusion::linear_bias_gelu(), program(kBf16, kSig, kMlpGelu),
                    kBf16Tolerance},
        NumericCase{&passes::fusion::linear_bias(),
                    program(kBf16, kSig, "  linear(64, 64, bias = false)\n  bias(64)"),
                    kBf16Tolerance},
        NumericCase{&passes::fusion::linear_residual(), program(kBf16, kResidualSig, kResidualBody),
                    kBf16Tolerance},
        NumericCase{&passes::fusion::dact_cast(), program(kDelayed, kSig, kMlpGelu), kFp8Tolerance},
        NumericCase{&passes::fusion::norm_backward_residual(),
                    program(kBf16, kResidualSig, kResidualBody), kBf16Tolerance},
        NumericCase{&passes::fusion::dgrad_residual(),
                    program(kBf16,
                            "(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64], skip: bf16[tokens, "
                            "64])",
                            "  make_extra_output(skip)\n  linear(64, 64) as proj"),
                    kBf16Tolerance},
        NumericCase{&passes::fusion::dgelu_bgrad(), program(kBf16, kSig, kMlpGelu), kBf16Tolerance,
                    &passes::fusion::linear_bias_gelu()}),
    [](const ::testing::TestParamInfo<NumericCase>& info) {
      return std::string(info.param.pattern->name);
    });

// Every pointwise op (compiler/ir/pointwise_defs.cpp, so a new one is covered with no change
// here) between two linears: its forward fuses with the next FP8 cast (activation_cast), its
// backward with the gradient's cast (dact_cast), and the fused runs agree with the unfused ones
// within FP8 rounding while differing from them.
std::string pointwise_mlp(const ir::PointwiseDef& def) {
  return fmt::format("  layernorm(64)\n  linear(64, 128) as up\n  {}()\n  linear({}, 64) as down",
                     def.name, def.gated ? 64 : 128);
}

TEST(FusionByTrait, EveryPointwiseOpFusesWithItsCasts) {
  for (const ir::PointwiseDef* def : ir::pointwise_defs()) {
    const ir::Sequence s = lower(program(kDelayed, kSig, pointwise_mlp(*def)), true);
    const std::string name(def->name);
    const std::string backward = def->gated ? "gated_activation_backward" : "activation_backward";
    EXPECT_EQ(fused(s, "activation_cast"), (Parts{{name, "cast_fp8"}})) << name;
    EXPECT_EQ(fused(s, "dact_cast"), (Parts{{backward, "bias_grad", "cast_fp8"}})) << name;
    for (const passes::fusion::FusionPattern* pattern :
         {&passes::fusion::activation_cast(), &passes::fusion::dact_cast()}) {
      const Agreement a = compare(program(kDelayed, kSig, pointwise_mlp(*def)), *pattern);
      EXPECT_LT(a.worst, kFp8Tolerance) << name << " " << pattern->name;
      // relu's value and gradient (x or 0, dy or 0) are exact in bf16: the rounding the fusion
      // drops changes nothing there. Every other op must show the dropped rounding.
      if (name != "relu") {
        EXPECT_FALSE(a.identical) << name << " " << pattern->name;
      }
    }
  }
}

// cuBLASLt's GELU epilogue computes gelu only: a linear with a bias before any other pointwise
// op stays a GEMM plus an activation kernel (linear_bias fuses instead).
TEST(FusionByTrait, OnlyTheGeluEpilogueTraitFusesIntoTheGemm) {
  for (const ir::PointwiseDef* def : ir::pointwise_defs()) {
    const ir::Sequence s = lower(program(kBf16, kSig, pointwise_mlp(*def)), true);
    const bool fused_gelu = !fused(s, "linear_bias_gelu").empty();
    EXPECT_EQ(fused_gelu, def->cublaslt_gelu_epilogue) << def->name;
    EXPECT_EQ(!fused(s, "dgelu_bgrad").empty(), def->cublaslt_gelu_epilogue) << def->name;
  }
}

TEST(FusedVsUnfusedExact, CastDbiasIsBitIdenticalToItsParts) {
  // Both parts read the same gradient and nothing between them was rounded: fusing them changes
  // only where they run, never a bit.
  const Agreement a = compare(program(kDelayed, kSig, kMlpGelu), passes::fusion::cast_dbias());
  EXPECT_TRUE(a.identical);
}

TEST(FusedVsUnfusedExact, BlockCastsFoldedIntoActivationsAreBitIdenticalToTheirParts) {
  // The fused kernel quantizes the activation's values as stored in bf16, exactly as the unfused
  // cast reads them: forward and the SwiGLU backward (no bias) change no bit.
  const std::string swiglu = program(kBlocks, kSig, kMlpSwiglu);
  EXPECT_TRUE(compare(swiglu, passes::fusion::activation_block_cast()).identical);
  EXPECT_TRUE(compare(swiglu, passes::fusion::dact_block_cast()).identical);
  // The norm likewise rounds its output to bf16 before the blocks' scales.
  EXPECT_TRUE(
      compare(program(kBlocks, kWideSig, kWideMlp), passes::fusion::norm_block_cast()).identical);
  // MXFP8: the norm quantizes its output as rounded to bf16, as micro_scale_cast reads it.
  EXPECT_TRUE(
      compare(program(kMxfp8, kWideSig, kWideMlp), passes::fusion::norm_micro_cast(), nullptr, 64)
          .identical);
  EXPECT_TRUE(compare(program(kMxfp8, kWideSig, kWideMlp), passes::fusion::activation_micro_cast(),
                      nullptr, 64)
                  .identical);
  EXPECT_TRUE(
      compare(program(kMxfp8, kWideSig, kWideMlp), passes::fusion::dact_micro_cast(), nullptr, 64)
          .identical);
  // Moved up before the bias gradient that reads its gradient (fuse_position): the same bits.
  EXPECT_TRUE(
      compare(program(kMxfp8, kSig, kMlpGelu), passes::fusion::dact_micro_cast(), nullptr, 64)
          .identical);
  // With a bias gradient, dbias sums the unrounded values (as activation_bwd does): close, and
  // different, so the bias gradient really comes from the fused kernel.
  const Agreement a = compare(program(kBlocks, kSig, kMlpGelu), passes::fusion::dact_block_cast());
  EXPECT_LT(a.worst, kBf16Tolerance);
  EXPECT_FALSE(a.identical);
}

}  // namespace
}  // namespace opfuse
