// The plan pass gated-epilogues (compiler/codegen/plan_epilogues.cpp; note "Fused GEMM epilogues"
// in docs/architecture.md): which FP8 GEMMs an inference forward may run with the gated
// activation after them in their epilogue, and plan.json's spelling of it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <set>
#include <stdexcept>
#include <string>

#include "driver/compile.h"
#include "plan/plan.h"
#include "support/diagnostics.h"
#include "test_support.h"

namespace opfuse {
namespace {

// The seed MLP with `activation` between the linears under `recipe` (declared as r).
std::string mlp(const std::string& recipe, const std::string& activation, bool gated = true) {
  return "recipe r = " + recipe +
         "\nsequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) " +
         "uses r {\n  layernorm(256)\n  linear(256, 1024, bias = false) as fc1\n  " + activation +
         "\n  linear(" + (gated ? "512" : "1024") + ", 256, bias = false) as fc2\n}\n";
}

plan::Plan compile(const std::string& text, std::set<std::string> disabled = {}) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.disabled_passes = std::move(disabled);
  options.last_stage = driver::Stage::Plan;
  driver::CompileResult result = driver::compile_source("mlp.fuse", text, sources, diags, options);
  EXPECT_EQ(result.status, driver::CompileStatus::Ok) << result.error;
  return std::move(result.plan);
}

// The forward GEMMs' epilogues, in step order.
std::vector<std::optional<plan::GatedEpilogue>> epilogues(const plan::Plan& p) {
  std::vector<std::optional<plan::GatedEpilogue>> out;
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* gemm = std::get_if<plan::GemmStep>(&step.body);
        gemm != nullptr && step.phase == plan::Phase::Forward)
      out.push_back(gemm->inference_epilogue);
  return out;
}

constexpr const char* kDelayed = "delayed_scaling(format = hybrid, amax_history = 16)";

TEST(GatedEpilogues, Fc1OfTheDelayedScalingMlpFoldsItsSwiglu) {
  const plan::Plan p = compile(mlp(kDelayed, "swiglu()"));
  const auto found = epilogues(p);
  ASSERT_EQ(found.size(), 2u);
  ASSERT_TRUE(found[0].has_value());
  EXPECT_FALSE(found[1].has_value()) << "fc2's output is the sequence's, no activation";
  const plan::SequencePlan& s = p.sequences[0];
  const plan::GatedEpilogue& e = *found[0];
  EXPECT_EQ(e.activation, "opfuse::pointwise_swiglu");
  const plan::Step& act = s.steps.at(size_t(e.step));
  EXPECT_EQ(act.pattern, "activation_cast");
  ASSERT_TRUE(act.inference.has_value());
  // The output is what the activation's inference variant writes, cast by fc2's input quantizer.
  EXPECT_EQ(act.inference->writes, std::vector<int>{e.output});
  EXPECT_EQ(s.quantizers.at(size_t(e.quantizer)).name, "fc2.input");
  EXPECT_EQ(s.buffers.at(size_t(e.output)).quantizer, e.quantizer);
}

TEST(GatedEpilogues, EveryCompiledGatedActivationAndNoOther) {
  for (const char* gated : {"geglu", "reglu", "qgeglu", "sreglu"}) {
    const auto found = epilogues(compile(mlp(kDelayed, std::string(gated) + "()")));
    ASSERT_TRUE(found.at(0).has_value()) << gated;
    EXPECT_EQ(found[0]->activation, std::string("opfuse::pointwise_") + gated);
  }
  // An activation with attributes, a plain one: no kernel is compiled for them.
  EXPECT_FALSE(epilogues(compile(mlp(kDelayed, "clamped_swiglu()"))).at(0).has_value());
  EXPECT_FALSE(epilogues(compile(mlp(kDelayed, "gelu()", false))).at(0).has_value());
}

TEST(GatedEpilogues, OnlyPerTensorDelayedScaling) {
  // Current scaling needs the activation's amax before its cast; block scaling casts to
  // 1 x 128 blocks; BF16 casts nothing.
  for (const char* recipe : {"current_scaling(format = hybrid)", "float8_block_scaling()",
                             "mxfp8_block_scaling()", "bf16()"}) {
    const auto found = epilogues(compile(mlp(recipe, "swiglu()")));
    for (const auto& e : found) EXPECT_FALSE(e.has_value()) << recipe;
  }
}

TEST(GatedEpilogues, ThePassCanBeDisabled) {
  const auto found = epilogues(compile(mlp(kDelayed, "swiglu()"), {"gated-epilogues"}));
  for (const auto& e : found) EXPECT_FALSE(e.has_value());
}

TEST(GatedEpilogues, PlanJsonKeepsItAndRefusesABadOne) {
  const plan::Plan p = compile(mlp(kDelayed, "swiglu()"));
  const nlohmann::ordered_json json = plan::plan_to_json(p);
  const plan::Plan back = plan::plan_from_json(json);
  EXPECT_EQ(epilogues(back), epilogues(p));
  EXPECT_EQ(plan::plan_json_text(back), plan::plan_json_text(p));

  // The epilogue's step must be a later forward launch: point it at the GEMM itself.
  nlohmann::ordered_json bad = json;
  bool edited = false;
  for (auto& phase : bad["sequences"][0]["phases"])
    for (auto& step : phase["steps"])
      if (step.contains("gemm") && step["gemm"].contains("inference_epilogue")) {
        step["gemm"]["inference_epilogue"]["step"] = step["index"];
        edited = true;
      }
  ASSERT_TRUE(edited);
  try {
    plan::plan_from_json(bad);
    ADD_FAILURE() << "a self-referencing epilogue was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(test::contains(e.what(), "inference_epilogue.step")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "not a later forward launch")) << e.what();
  }
}

}  // namespace
}  // namespace opfuse
