// The plan pass gated-epilogues (compiler/codegen/plan_epilogues.cpp; note "Fused GEMM epilogues"
// in docs/architecture.md): which FP8 GEMMs an inference or a training forward may run with the
// gated activation after them in their epilogue, and plan.json's spelling of it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "driver/compile.h"
#include "gpu/memory_plan.h"
#include "plan/plan.h"
#include "plan/sym_expr.h"
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

// The forward GEMMs' epilogues for one run mode, in step order.
std::vector<std::optional<plan::GatedEpilogue>> epilogues(const plan::Plan& p,
                                                          bool training = false) {
  std::vector<std::optional<plan::GatedEpilogue>> out;
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* gemm = std::get_if<plan::GemmStep>(&step.body);
        gemm != nullptr && step.phase == plan::Phase::Forward)
      out.push_back(training ? gemm->training_epilogue : gemm->inference_epilogue);
  return out;
}

constexpr const char* kDelayed = "delayed_scaling(format = hybrid, amax_history = 16)";

// plan.json's GEMM steps that carry `key` ("inference_epilogue" or "training_epilogue").
std::vector<nlohmann::ordered_json*> steps_with(nlohmann::ordered_json& json, const char* key) {
  std::vector<nlohmann::ordered_json*> found;
  for (auto& phase : json["sequences"][0]["phases"])
    for (auto& step : phase["steps"])
      if (step.contains("gemm") && step["gemm"].contains(key)) found.push_back(&step);
  return found;
}

// Why plan_from_json refuses `json`, or "accepted".
std::string load_error(const nlohmann::ordered_json& json) {
  try {
    plan::plan_from_json(json);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

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

TEST(GatedEpilogues, TrainingAlsoWritesTheTransposedCopyThatBackwardReads) {
  const plan::Plan p = compile(mlp(kDelayed, "swiglu()"));
  const auto inference = epilogues(p), training = epilogues(p, true);
  ASSERT_EQ(training.size(), 2u);
  ASSERT_TRUE(training[0].has_value());
  EXPECT_FALSE(training[1].has_value());
  const plan::GatedEpilogue& e = *training[0];
  // The same fold as the inference forward's, plus the transposed copy.
  EXPECT_EQ(e.step, inference[0]->step);
  EXPECT_EQ(e.output, inference[0]->output);
  EXPECT_EQ(e.quantizer, inference[0]->quantizer);
  EXPECT_EQ(inference[0]->output_t, -1);
  const plan::SequencePlan& s = p.sequences[0];
  const plan::Step& act = s.steps.at(size_t(e.step));
  // Exactly what the training launch writes: the copy and its transposed copy.
  std::vector<int> writes = act.writes, want{e.output, e.output_t};
  std::sort(writes.begin(), writes.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(writes, want);
  // Backward reads the transposed copy (fc2's wgrad) and the GEMM's D (the SwiGLU backward), which
  // the training kernel writes too.
  const plan::Step& gemm_step = s.steps.at(size_t(e.step - 1));
  const int d = std::get<plan::GemmStep>(gemm_step.body).d;
  bool reads_t = false, reads_d = false;
  for (const plan::Step& step : s.steps)
    if (step.phase == plan::Phase::Backward)
      for (int id : step.reads) {
        reads_t |= s.buffers.at(size_t(id)).root == s.buffers.at(size_t(e.output_t)).root;
        reads_d |= s.buffers.at(size_t(id)).root == s.buffers.at(size_t(d)).root;
      }
  EXPECT_TRUE(reads_t);
  EXPECT_TRUE(reads_d);
}

// The GEMM writes the activation's outputs already: their memory is live from the GEMM's step in
// the mode whose epilogue writes them, so the memory plan cannot place them over the GEMM's
// operands (the LayerNorm's E4M3 output dies at fc1's step in an inference forward).
TEST(GatedEpilogues, TheFoldedOutputsLiveFromTheGemmsStep) {
  const plan::Plan p = compile(mlp(kDelayed, "swiglu()"));
  const plan::SequencePlan& s = p.sequences[0];
  const plan::GatedEpilogue& e = *epilogues(p, true).at(0);
  const int gemm_step = e.step - 1;
  ASSERT_TRUE(std::holds_alternative<plan::GemmStep>(s.steps.at(size_t(gemm_step)).body));
  const plan::Buffer& out = s.buffers.at(size_t(s.buffers.at(size_t(e.output)).root));
  const plan::Buffer& out_t = s.buffers.at(size_t(s.buffers.at(size_t(e.output_t)).root));
  EXPECT_EQ(out.training.first, gemm_step);
  EXPECT_EQ(out.inference.first, gemm_step);
  EXPECT_EQ(out_t.training.first, gemm_step);
  // The inference forward does not write the transposed copy at all.
  EXPECT_LT(out_t.inference.first, 0);
  const auto named = plan::buffers_named_by(s.steps.at(size_t(gemm_step)), false);
  EXPECT_TRUE(std::binary_search(named.begin(), named.end(), e.output_t));
  const auto named_inference = plan::buffers_named_by(s.steps.at(size_t(gemm_step)), true);
  EXPECT_FALSE(std::binary_search(named_inference.begin(), named_inference.end(), e.output_t));
}

// The memory plan the executor makes from those lifetimes (gpu::plan_memory, largest first) at a
// size with many tiles: the folded output must not share bytes with the GEMM's A operand. Before
// the lifetimes started at the GEMM's step it did, in the inference layout: the LayerNorm's E4M3
// output and the SwiGLU's sat at the same offset, and fc1's later tiles read the activation.
TEST(GatedEpilogues, TheFoldedOutputNeverSharesMemoryWithTheGemmsOperands) {
  const plan::Plan p = compile(mlp(kDelayed, "swiglu()"));
  const plan::SequencePlan& s = p.sequences[0];
  const std::map<std::string, int64_t> bound = {{"tokens", 16384}, {"num_sms", 132}};
  for (const bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    std::vector<gpu::BufferLifetime> lifetimes(s.buffers.size());
    for (const plan::Buffer& b : s.buffers) {
      const plan::Lifetime& life = training ? b.training : b.inference;
      const bool callers = b.role == plan::BufferRole::Input || b.role == plan::BufferRole::Param ||
                           b.role == plan::BufferRole::OutputGrad;
      if (b.root != b.id || callers || b.weight_cache || life.first < 0) continue;
      lifetimes[size_t(b.id)] = {size_t(plan::evaluate(b.bytes.text(), bound)), life.first,
                                 life.last};
    }
    const gpu::MemoryPlan placed = gpu::plan_memory(lifetimes, 256);
    for (const plan::Step& step : s.steps) {
      const auto* gemm = std::get_if<plan::GemmStep>(&step.body);
      const auto& e = gemm == nullptr ? std::nullopt
                      : training      ? gemm->training_epilogue
                                      : gemm->inference_epilogue;
      if (!e) continue;
      auto range = [&](int id) {
        const int root = s.buffers.at(size_t(id)).root;
        return std::pair{placed.offsets[size_t(root)],
                         placed.offsets[size_t(root)] + lifetimes[size_t(root)].bytes};
      };
      const auto out = range(e->output);
      for (int operand : {gemm->a.buffer, gemm->d}) {
        if (lifetimes[size_t(s.buffers.at(size_t(operand)).root)].bytes == 0) continue;
        const auto in = range(operand);
        EXPECT_TRUE(out.second <= in.first || in.second <= out.first)
            << "buffer " << e->output << " at [" << out.first << ", " << out.second
            << ") overlaps operand " << operand << " at [" << in.first << ", " << in.second << ")";
      }
    }
  }
}

TEST(GatedEpilogues, EveryCompiledGatedActivationAndNoOther) {
  for (const char* gated : {"geglu", "reglu", "qgeglu", "sreglu"}) {
    const plan::Plan p = compile(mlp(kDelayed, std::string(gated) + "()"));
    for (const bool training : {false, true}) {
      const auto found = epilogues(p, training);
      ASSERT_TRUE(found.at(0).has_value()) << gated;
      EXPECT_EQ(found[0]->activation, std::string("opfuse::pointwise_") + gated);
    }
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
    const plan::Plan p = compile(mlp(recipe, "swiglu()"));
    for (const bool training : {false, true})
      for (const auto& e : epilogues(p, training)) EXPECT_FALSE(e.has_value()) << recipe;
  }
}

TEST(GatedEpilogues, ThePassCanBeDisabled) {
  const plan::Plan p = compile(mlp(kDelayed, "swiglu()"), {"gated-epilogues"});
  for (const bool training : {false, true})
    for (const auto& e : epilogues(p, training)) EXPECT_FALSE(e.has_value());
}

TEST(GatedEpilogues, PlanJsonKeepsItAndRefusesABadOne) {
  const plan::Plan p = compile(mlp(kDelayed, "swiglu()"));
  const nlohmann::ordered_json json = plan::plan_to_json(p);
  const plan::Plan back = plan::plan_from_json(json);
  EXPECT_EQ(epilogues(back), epilogues(p));
  EXPECT_EQ(epilogues(back, true), epilogues(p, true));
  EXPECT_EQ(plan::plan_json_text(back), plan::plan_json_text(p));

  // The epilogue's step must be a later forward launch: point it at the GEMM itself.
  nlohmann::ordered_json bad = json;
  const auto steps = steps_with(bad, "inference_epilogue");
  ASSERT_FALSE(steps.empty());
  for (nlohmann::ordered_json* step : steps)
    (*step)["gemm"]["inference_epilogue"]["step"] = (*step)["index"];
  const std::string why = load_error(bad);
  EXPECT_TRUE(test::contains(why, "inference_epilogue.step")) << why;
  EXPECT_TRUE(test::contains(why, "not a later forward launch")) << why;
}

TEST(GatedEpilogues, PlanJsonRefusesABadTransposedCopy) {
  const nlohmann::ordered_json json = plan::plan_to_json(compile(mlp(kDelayed, "swiglu()")));
  auto refusal = [&](const char* key, const nlohmann::ordered_json& output_t) {
    nlohmann::ordered_json bad = json;
    for (nlohmann::ordered_json* step : steps_with(bad, key)) {
      if (output_t.is_null())
        (*step)["gemm"][key].erase("output_t");
      else
        (*step)["gemm"][key]["output_t"] = output_t;
    }
    return load_error(bad);
  };
  EXPECT_TRUE(test::contains(refusal("training_epilogue", 100000), "training_epilogue.output_t"));
  EXPECT_TRUE(test::contains(refusal("training_epilogue", 100000), "no buffer 100000"));
  EXPECT_TRUE(test::contains(refusal("training_epilogue", nullptr), "output_t"));
  EXPECT_TRUE(test::contains(refusal("inference_epilogue", 24), "writes no transposed copy"));
}

// A plan written before the folded outputs' lifetimes started at the GEMM's step (the race the
// test above guards against) is refused with a message to rebuild it.
TEST(GatedEpilogues, PlanJsonRefusesLifetimesThatStartAfterTheGemm) {
  nlohmann::ordered_json json = plan::plan_to_json(compile(mlp(kDelayed, "swiglu()")));
  const auto steps = steps_with(json, "inference_epilogue");
  ASSERT_EQ(steps.size(), 1u);
  const int gemm_step = (*steps[0])["index"].get<int>();
  const int output = (*steps[0])["gemm"]["inference_epilogue"]["output"].get<int>();
  auto& buffer = json["sequences"][0]["buffers"][size_t(output)];
  ASSERT_EQ(buffer["inference"][0].get<int>(), gemm_step);
  buffer["inference"][0] = gemm_step + 1;  // as the older opfuse wrote it
  const std::string why = load_error(json);
  EXPECT_TRUE(test::contains(why, "inference_epilogue.output")) << why;
  EXPECT_TRUE(test::contains(why, "rebuild it")) << why;
}

}  // namespace
}  // namespace opfuse
