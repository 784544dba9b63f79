// build-backward and plan-quantization: the backward ops every op's rule makes, gradient
// accumulation where a value fans out, and the quantizers, formats and FP8 copies the GEMMs get.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "driver/frontend.h"
#include "ir/verifier.h"
#include "passes/build_backward.h"
#include "passes/plan_quantization.h"

namespace opfuse {
namespace {

using ir::OpKind;

ir::Sequence lower(const std::string& text, bool backward = true) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto p = load_program_from_source("g.fuse", text, sources, diags);
  EXPECT_TRUE(p.has_value()) << diags.format_all();
  if (!p) return {};
  if (backward) passes::build_backward(*p);
  passes::plan_quantization(*p);
  EXPECT_EQ(ir::verify_sequence(p->sequences[0]), std::vector<std::string>{});
  return p->sequences[0];
}

const ir::Operation* find(const ir::Sequence& s, OpKind kind, std::string_view instance = {}) {
  for (const ir::Operation& op : s.ops)
    if (op.kind == kind && (instance.empty() || op.instance == instance)) return &op;
  return nullptr;
}

const ir::QuantizerDecl* quantizer(const ir::Sequence& s, std::string_view name) {
  for (const ir::QuantizerDecl& q : s.quantizers)
    if (q.name == name) return &q;
  return nullptr;
}

const char* kMlp = R"(recipe r = delayed_scaling()
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses r {
  layernorm(64)
  linear(64, 128) as up
  gelu()
  linear(128, 64, bias = false) as down
}
)";

TEST(BuildBackward, EveryOpGetsItsBackwardInReverseOrder) {
  const ir::Sequence s = lower(kMlp);
  ASSERT_TRUE(s.has_backward);
  std::vector<std::string> backward;
  for (const ir::Operation& op : s.ops)
    if (op.phase == ir::Phase::Backward && op.kind != OpKind::CastFp8)
      backward.push_back(fmt::format("{}:{}", ir::op_info(op.kind).name, op.instance));
  EXPECT_EQ(backward, (std::vector<std::string>{"linear_dgrad:down", "linear_wgrad:down",
                                                "activation_backward:gelu_0", "bias_grad:up",
                                                "linear_dgrad:up", "linear_wgrad:up",
                                                "layernorm_backward:layernorm_0"}));
  // One gradient per input and parameter, of the same shape; the layernorm saves mean and rstd.
  EXPECT_EQ(s.param_grads.size(), s.params.size());
  EXPECT_EQ(s.input_grads.size(), 1u);
  EXPECT_EQ(find(s, OpKind::LayerNorm)->results.size(), 3u);
}

TEST(BuildBackward, BiasGradientReadsTheUnquantizedGradient) {
  const ir::Sequence s = lower(kMlp);
  const ir::Operation* bias_grad = find(s, OpKind::BiasGrad, "up");
  ASSERT_NE(bias_grad, nullptr);
  EXPECT_EQ(s.value(bias_grad->operands[0]).type.dtype, ir::DType::BF16);
}

TEST(BuildBackward, FanOutSumsGradientsAndResidualsPassThrough) {
  const ir::Sequence s = lower(R"(
sequence b(x: bf16[t, 32], r: bf16[t, 32]) -> (y: bf16[t, 32], skip: bf16[t, 32]) {
  make_extra_output(skip)
  rmsnorm(32)
  linear(32, 32)
  add_extra_input(r)
}
)");
  // x feeds the rmsnorm and the extra output: its gradient is a grad_add of both.
  const ir::ValueId dx = s.input_grads[0];
  EXPECT_EQ(s.ops[size_t(s.value(dx).producer)].kind, OpKind::GradAdd);
  // The residual's gradient is the output gradient itself (add passes it through).
  EXPECT_EQ(s.input_grads[1], s.output_grads[0]);
}

// An extra input never added (a warning at build) has no gradient op: build-backward leaves its
// gradient out and the verifier takes it (it failed with an internal error before).
TEST(BuildBackward, AnUnusedExtraInputGetsNoGradientOp) {
  const ir::Sequence s = lower(R"(
sequence b(x: bf16[t, 32], r: bf16[t, 32]) -> (y: bf16[t, 32]) {
  gelu()
}
)");
  ASSERT_EQ(s.input_grads.size(), 2u);
  EXPECT_NE(s.input_grads[0], ir::kNoValue);
  EXPECT_EQ(s.input_grads[1], ir::kNoValue);
}

TEST(PlanQuantization, HybridGivesGradientsE5M2AndTheTransposedCopiesTnNeeds) {
  const ir::Sequence s = lower(kMlp);
  ASSERT_EQ(s.quantizers.size(), 6u);
  EXPECT_EQ(quantizer(s, "up.input")->format(), ir::DType::E4M3);
  EXPECT_EQ(quantizer(s, "up.weight")->format(), ir::DType::E4M3);
  EXPECT_EQ(quantizer(s, "up.grad_output")->format(), ir::DType::E5M2);
  for (const ir::QuantizerDecl& q : s.quantizers)
    EXPECT_TRUE(q.usages.rowwise && q.usages.columnwise) << q.name;
  // dgrad reads the weight's column-wise copy, wgrad the column-wise copies of dy and x.
  const ir::Operation* dgrad = find(s, OpKind::LinearDgrad, "down");
  const ir::Operation* wgrad = find(s, OpKind::LinearWgrad, "down");
  EXPECT_EQ(s.value(dgrad->operands[1]).type.shape,
            (ir::Shape{ir::Dim::known(128), ir::Dim::known(64)}));
  EXPECT_EQ(s.quantizers[size_t(s.value(dgrad->operands[1]).quantizer)].name, "down.weight");
  EXPECT_EQ(s.quantizers[size_t(s.value(wgrad->operands[0]).quantizer)].name, "down.grad_output");
  EXPECT_EQ(s.quantizers[size_t(s.value(wgrad->operands[1]).quantizer)].name, "down.input");
  EXPECT_EQ(s.value(wgrad->operands[1]).type.shape[0], ir::Dim::known(128));  // x^T: [in, tokens]
}

TEST(PlanQuantization, E4M3FormatAndInferenceAndBf16) {
  std::string e4m3 = kMlp;
  e4m3.replace(e4m3.find("delayed_scaling()"), 17, "delayed_scaling(format = e4m3)");
  EXPECT_EQ(quantizer(lower(e4m3), "down.grad_output")->format(), ir::DType::E4M3);
  // Without backward no GEMM needs a transposed copy.
  const ir::Sequence inference = lower(kMlp, false);
  for (const ir::QuantizerDecl& q : inference.quantizers)
    EXPECT_FALSE(q.usages.columnwise) << q.name;
  EXPECT_EQ(inference.quantizers.size(), 4u);
  std::string bf16 = kMlp;
  bf16.replace(bf16.find("delayed_scaling()"), 17, "bf16()");
  const ir::Sequence plain = lower(bf16);
  EXPECT_TRUE(plain.quantizers.empty());
  EXPECT_EQ(find(plain, OpKind::CastFp8), nullptr);
}

TEST(PlanQuantization, QuantizeOpGetsForwardAndBackwardQuantizers) {
  const ir::Sequence s = lower(R"(recipe r = current_scaling()
sequence q(x: bf16[t, 32]) -> (y: bf16[t, 32]) uses r { quantize(backward = true) as cast }
)");
  ASSERT_NE(quantizer(s, "cast.output"), nullptr);
  ASSERT_NE(quantizer(s, "cast.grad_input"), nullptr);
  EXPECT_EQ(quantizer(s, "cast.grad_input")->format(), ir::DType::E5M2);
}

}  // namespace
}  // namespace opfuse
