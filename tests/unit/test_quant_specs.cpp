// Quantization specified per tensor (note "Quantization specs" in docs/architecture.md): the
// specs plan-quantization expands from a recipe, per-layer / per-GEMM / per-tensor overrides in the
// IR, the plan and the CPU reference, the plan's typed vocabulary and its JSON, and the GEMM
// capability table.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "codegen/plan.h"
#include "cpu/numerics.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "ir/printer.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "plan/gemm_caps.h"
#include "plan/param_init.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "support/diagnostics.h"

namespace opfuse {
namespace {

using ir::QuantOverride;
using plan::GemmRole;
using plan::ScalingKind;

constexpr const char* kMlp = R"(
recipe fp8 = delayed_scaling(format = hybrid, amax_history = 4)
recipe plain = bf16()
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {
  layernorm(64)
  linear(64, 128, bias = false) as fc1
  gelu()
  linear(128, 64, bias = false) as fc2
}
)";

// The program (kMlp unless given) through every pass, with `overrides` on its first sequence
// before plan-quantization.
struct Lowered {
  SourceManager sources;
  ir::Program program;
  const ir::Sequence& seq() const { return program.sequences.at(0); }
};

std::unique_ptr<Lowered> lower(const std::vector<QuantOverride>& overrides,
                               const std::string& recipe = "", const char* source = kMlp) {
  auto out = std::make_unique<Lowered>();
  DiagnosticEngine diags(out->sources);
  ir::BuildOptions options;
  options.recipe_override = recipe;
  auto program = load_program_from_source("mlp.fuse", source, out->sources, diags, options);
  EXPECT_TRUE(program.has_value()) << diags.format_all();
  if (!program) return out;
  // After the builder's own (a `precision = high` linear's), as a debug config's come.
  std::vector<QuantOverride>& all = program->sequences.at(0).quant_overrides;
  all.insert(all.end(), overrides.begin(), overrides.end());
  passes::PassManager(passes::default_pipeline()).run(*program, {}, nullptr);
  out->program = std::move(*program);
  return out;
}

const ir::QuantizerDecl* quantizer(const ir::Sequence& s, const std::string& name) {
  for (const ir::QuantizerDecl& q : s.quantizers)
    if (q.name == name) return &q;
  return nullptr;
}

std::vector<const plan::GemmStep*> gemms_of(const plan::SequencePlan& s, GemmRole role) {
  std::vector<const plan::GemmStep*> out;
  for (const plan::Step& step : s.steps)
    if (const auto* g = std::get_if<plan::GemmStep>(&step.body); g && g->role == role)
      out.push_back(g);
  return out;
}

QuantOverride keep_high_precision(std::string layer, std::optional<GemmRole> gemm = {}) {
  QuantOverride o;
  o.layer = std::move(layer);
  o.gemm = gemm;
  o.high_precision = true;
  return o;
}

QuantOverride current_scaled(std::string layer, ir::QuantizerRole tensor) {
  QuantOverride o;
  o.layer = std::move(layer);
  o.tensor = tensor;
  o.spec.scaling = ScalingKind::Current;
  o.spec.format = plan::DType::E4M3;
  return o;
}

TEST(QuantSpecs, TheRecipeExpandsIntoOneSpecPerQuantizer) {
  const auto l = lower({});
  ASSERT_EQ(l->seq().quantizers.size(), 6u);
  for (const ir::QuantizerDecl& q : l->seq().quantizers) {
    EXPECT_EQ(q.spec.scaling, ScalingKind::Delayed) << q.name;
    EXPECT_EQ(q.spec.history_length, 4) << q.name;
    const bool gradient = q.role == ir::QuantizerRole::GradOutput;
    EXPECT_EQ(q.format(), gradient ? plan::DType::E5M2 : plan::DType::E4M3) << q.name;
    EXPECT_EQ(q.columnwise_layout, plan::CopyLayout::Transposed) << q.name;
  }
  // The IR printer shows each spec.
  const std::string text = ir::print_program(l->program, nullptr);
  EXPECT_NE(text.find("quantizer \"fc1.input\": input e4m3 of %"), std::string::npos) << text;
  EXPECT_NE(text.find("rowwise columnwise(transposed) delayed(e4m3, history = 4, amax = max, "
                      "margin = 0)"),
            std::string::npos)
      << text;
}

TEST(QuantSpecs, AHighPrecisionDgradDropsOnlyTheCopiesItWouldRead) {
  const auto l = lower({keep_high_precision("fc2", GemmRole::Dgrad)});
  const ir::QuantizerDecl* w = quantizer(l->seq(), "fc2.weight");
  const ir::QuantizerDecl* dy = quantizer(l->seq(), "fc2.grad_output");
  ASSERT_TRUE(w && dy);
  EXPECT_EQ(w->usages, (plan::Usages{true, false})) << "fprop still reads W row-wise";
  EXPECT_EQ(dy->usages, (plan::Usages{false, true})) << "wgrad still reads dy column-wise";
  EXPECT_EQ(quantizer(l->seq(), "fc1.weight")->usages, (plan::Usages{true, true}));

  const plan::Plan p = codegen::build_plan(l->program, {"sm_90a", &l->sources});
  const plan::SequencePlan& s = p.sequences.at(0);
  ASSERT_EQ(gemms_of(s, GemmRole::Dgrad).size(), 2u);
  int hp = 0, fp8 = 0;
  for (const plan::GemmStep* g : gemms_of(s, GemmRole::Dgrad))
    (g->a.dtype == plan::DType::BF16 && g->b.dtype == plan::DType::BF16 ? hp : fp8) += 1;
  for (const plan::GemmStep* g : gemms_of(s, GemmRole::Wgrad)) {
    EXPECT_TRUE(plan::dtype_is_fp8(g->a.dtype)) << "every wgrad stays FP8";
    EXPECT_TRUE(g->a.scale_inv.present() && g->b.scale_inv.present());
  }
  EXPECT_EQ(hp, 1) << "fc2's dgrad";
  EXPECT_EQ(fp8, 1) << "fc1's dgrad";
}

TEST(QuantSpecs, OneCurrentScaledTensorInsideDelayedScaling) {
  const auto l = lower({current_scaled("fc1", ir::QuantizerRole::Input)});
  const ir::QuantizerDecl* x = quantizer(l->seq(), "fc1.input");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->spec.scaling, ScalingKind::Current);
  for (const ir::QuantizerDecl& q : l->seq().quantizers) {
    if (q.name == "fc1.input") continue;
    EXPECT_EQ(q.spec.scaling, ScalingKind::Delayed) << q.name;
  }

  const plan::Plan p = codegen::build_plan(l->program, {"sm_90a", &l->sources});
  const plan::SequencePlan& s = p.sequences.at(0);
  const int index = int(x - l->seq().quantizers.data());
  bool measured = false, in_update = false;
  for (const plan::Step& step : s.steps) {
    const auto* launch = std::get_if<plan::LaunchStep>(&step.body);
    if (!launch) continue;
    for (const plan::ParamBinding& b : launch->params) {
      measured |= b.kind == plan::ParamKind::Quantizer && b.quantizer == index &&
                  b.quantizer_value == plan::QuantizerValue::RunningAmax;
      if (b.kind == plan::ParamKind::Records && b.field == "records")
        in_update |= std::find(b.records.begin(), b.records.end(), index) != b.records.end();
    }
  }
  EXPECT_TRUE(measured) << "a producer measures the amax of the current-scaled tensor";
  EXPECT_FALSE(in_update) << "the delayed scale update leaves the current-scaled quantizer alone";
  EXPECT_EQ(s.quantizers.at(size_t(index)).spec.scaling, ScalingKind::Current);
}

TEST(QuantSpecs, EveryGemmInHighPrecisionMatchesTheBf16RecipeBitForBit) {
  const auto all_hp = lower({keep_high_precision("")});
  EXPECT_TRUE(all_hp->seq().quantizers.empty());
  const auto bf16 = lower({}, "plain");
  const cpu::Bindings bindings{{"tokens", 8}};
  cpu::ReferenceExecutor<float> a(all_hp->seq(), bindings), b(bf16->seq(), bindings);
  cpu::init_params_from_seed(a, 7);
  cpu::init_params_from_seed(b, 7);
  const cpu::Tensor<float> x = cpu::seeded_normal({8, 64}, 3, 1.0);
  const auto ya = a.forward({x}), yb = b.forward({x});
  EXPECT_EQ(ya.at(0).data, yb.at(0).data);
  const auto ga = a.backward({ya.at(0)}), gb = b.backward({yb.at(0)});
  EXPECT_EQ(ga.inputs.at(0).data, gb.inputs.at(0).data);
  // And the override really changed something: the delayed recipe alone differs.
  const auto fp8 = lower({});
  cpu::ReferenceExecutor<float> c(fp8->seq(), bindings);
  cpu::init_params_from_seed(c, 7);
  EXPECT_NE(c.forward({x}).at(0).data, ya.at(0).data);
}

// `precision = high` on a linear (docs/language.md, section 6) keeps that layer's GEMMs out of the
// recipe under any recipe, as the debug configs' DisableFP8Layer does.
TEST(QuantSpecs, APrecisionHighLinearKeepsItsGemmsOutOfTheRecipe) {
  constexpr const char* kSource = R"(
recipe fp8 = delayed_scaling(format = hybrid)
recipe fp4 = nvfp4_block_scaling()
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {
  layernorm(64)
  linear(64, 128, bias = false) as fc1
  gelu()
  linear(128, 64, bias = false, precision = high) as fc2
}
sequence all_high(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {
  layernorm(64)
  linear(64, 128, bias = false, precision = high) as fc1
  gelu()
  linear(128, 64, bias = false, precision = high) as fc2
}
)";
  auto compile = [&](const std::string& recipe) { return lower({}, recipe, kSource); };
  for (const std::string recipe : {"", "fp4"}) {
    SCOPED_TRACE("recipe " + (recipe.empty() ? std::string("fp8 (uses)") : recipe));
    const auto built = compile(recipe);
    const ir::Sequence& s = built->program.sequences.at(0);
    std::vector<std::string> names;
    for (const ir::QuantizerDecl& q : s.quantizers) names.push_back(q.name);
    EXPECT_TRUE(quantizer(s, "fc1.input") && quantizer(s, "fc1.weight") &&
                quantizer(s, "fc1.grad_output"))
        << fmt::format("{}", fmt::join(names, ", "));
    for (const std::string& name : names) EXPECT_NE(name.rfind("fc2.", 0), 0u) << name;
    const plan::Plan p = codegen::build_plan(built->program, {"sm_90a", &built->sources});
    // Under fp8 fc1's GEMMs read FP8 copies and fc2's bf16 tensors; under NVFP4 (emulated on
    // Hopper) every GEMM reads bf16, fc1's the decoded copies its quantizers make (above).
    int gemms = 0;
    for (const plan::Step& step : p.sequences.at(0).steps) {
      const auto* g = std::get_if<plan::GemmStep>(&step.body);
      if (!g) continue;
      ++gemms;
      const bool bf16 = g->a.dtype == plan::DType::BF16 && g->b.dtype == plan::DType::BF16;
      EXPECT_EQ(bf16, recipe == "fp4" || step.what.find("of fc2") != std::string::npos)
          << step.what;
    }
    EXPECT_EQ(gemms, 6);
  }
  // Every linear in high precision under FP8 computes what the bf16 recipe does, bit for bit.
  const auto high = compile(""), plain = compile("bf16");
  const cpu::Bindings bindings{{"tokens", 8}};
  cpu::ReferenceExecutor<float> a(high->program.sequences.at(1), bindings),
      b(plain->program.sequences.at(1), bindings), c(high->program.sequences.at(0), bindings);
  for (auto* e : {&a, &b, &c}) cpu::init_params_from_seed(*e, 7);
  const cpu::Tensor<float> x = cpu::seeded_normal({8, 64}, 3, 1.0);
  const auto ya = a.forward({x}), yb = b.forward({x});
  EXPECT_EQ(ya.at(0).data, yb.at(0).data);
  EXPECT_EQ(a.backward({ya.at(0)}).inputs.at(0).data, b.backward({yb.at(0)}).inputs.at(0).data);
  // With fc1 under FP8 the output moves.
  EXPECT_NE(c.forward({x}).at(0).data, yb.at(0).data);
}

TEST(QuantSpecs, TheCpuReferenceScalesTheOverriddenTensorFromItsOwnAmax) {
  const auto l = lower({current_scaled("fc1", ir::QuantizerRole::Input)});
  cpu::ReferenceExecutor<float> ref(l->seq(), {{"tokens", 8}});
  cpu::init_params_from_seed(ref, 7);
  ref.forward({cpu::seeded_normal({8, 64}, 3, 1.0)});
  for (const cpu::QuantizerInfo& q : ref.quantizers()) {
    if (q.name == "fc1.input") {
      EXPECT_EQ(q.amax_history.size(), 1u);
      EXPECT_GT(q.amax_history.at(0), 0.0f);
      EXPECT_FLOAT_EQ(q.scale, 448.0f / q.amax_history.at(0)) << "current: fp8_max / amax";
    } else {
      EXPECT_EQ(q.amax_history.size(), 4u) << q.name;
      EXPECT_EQ(q.scale, 1.0f) << q.name << ": delayed scales move only at step()";
    }
  }
}

TEST(PlanJson, SpecsUsagesAndScaleInversesRoundTrip) {
  const auto l = lower({current_scaled("fc1", ir::QuantizerRole::Input),
                        keep_high_precision("fc2", GemmRole::Dgrad)});
  const plan::Plan p = codegen::build_plan(l->program, {"sm_90a", &l->sources});
  const nlohmann::ordered_json j = plan::plan_to_json(p);
  EXPECT_EQ(j.at("version"), plan::kPlanFormatVersion);
  EXPECT_EQ(plan::plan_json_text(plan::plan_from_json(j)), plan::plan_json_text(p));
  const auto& q0 = j.at("sequences").at(0).at("quantizers").at(0);
  EXPECT_EQ(q0.at("spec").at("scaling"), "current");
  EXPECT_EQ(q0.at("columnwise_layout"), "transposed");
}

TEST(PlanJson, AnOldVersionOrAnUnknownSpellingIsRefusedByName) {
  const auto l = lower({});
  nlohmann::ordered_json j = plan::plan_to_json(codegen::build_plan(l->program, {"sm_90a"}));
  nlohmann::ordered_json old = j;
  old["version"] = 2;
  try {
    plan::plan_from_json(old);
    ADD_FAILURE() << "version 2 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rebuild"), std::string::npos) << e.what();
  }
  nlohmann::ordered_json bad = j;
  bad["sequences"][0]["quantizers"][0]["spec"]["scaling"] = "sometimes";
  try {
    plan::plan_from_json(bad);
    ADD_FAILURE() << "unknown scaling accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sequences[0].quantizers[0].spec.scaling"),
              std::string::npos)
        << e.what();
  }
}

TEST(PlanEnums, EveryNameParsesBackToItsValue) {
  for (const plan::GemmEpilogue e : plan::all_values<plan::GemmEpilogue>())
    EXPECT_EQ(plan::parse<plan::GemmEpilogue>(plan::name(e)), e);
  for (const plan::QuantizerValue v : plan::all_values<plan::QuantizerValue>())
    EXPECT_EQ(plan::parse<plan::QuantizerValue>(plan::name(v)), v);
  for (const ScalingKind k : plan::all_values<ScalingKind>())
    EXPECT_EQ(plan::parse<ScalingKind>(plan::name(k)), k);
  EXPECT_FALSE(plan::parse<plan::GemmEpilogue>("gelu").has_value());
  EXPECT_EQ(plan::interface_string({plan::InterfaceKind::ParamGrad, "fc1.weight"}),
            "param_grad fc1.weight");
}

TEST(QuantSpecs, SpecStringsNameEveryField) {
  plan::QuantSpec block;
  block.scaling = ScalingKind::Block1D;
  block.block = {1, 128};
  block.power_of_2_scale = true;
  EXPECT_EQ(plan::quant_spec_string(block),
            "block_1d(e4m3, 1x128, scale = fp32, epsilon = 0, power_of_2)");
  plan::QuantSpec current;
  current.scaling = ScalingKind::Current;
  current.format = plan::DType::E5M2;
  EXPECT_EQ(plan::quant_spec_string(current), "current(e5m2, epsilon = 0)");
}

TEST(GemmCaps, OneTableAnswersLayoutsMultiplesAndScaleModes) {
  const plan::GemmCaps& hopper = plan::gemm_caps("sm_90a");
  EXPECT_EQ(hopper.arch, "sm_90");
  EXPECT_TRUE(hopper.fp8_tn_only);
  EXPECT_EQ(plan::columnwise_layout(hopper), plan::CopyLayout::Transposed);
  EXPECT_EQ(plan::gemm_dim_multiple(hopper, true), 16);
  EXPECT_EQ(plan::gemm_dim_multiple(hopper, false), 8);
  plan::QuantSpec block;
  block.scaling = ScalingKind::Block1D;
  EXPECT_EQ(plan::gemm_support_problem(hopper, block), "");
  block.scaling = ScalingKind::Block2D;
  EXPECT_EQ(plan::gemm_support_problem(hopper, block), "");
  plan::QuantSpec mx;
  mx.scaling = ScalingKind::MicroScaled;
  mx.scale_dtype = plan::ScaleDType::E8M0;
  EXPECT_NE(plan::gemm_support_problem(hopper, mx), "") << "MXFP8 GEMMs need sm_100";

  const plan::GemmCaps& blackwell = plan::gemm_caps("sm_100a");
  EXPECT_EQ(plan::columnwise_layout(blackwell), plan::CopyLayout::AsIs);
  EXPECT_EQ(plan::gemm_support_problem(blackwell, mx), "");
  EXPECT_NE(plan::gemm_support_problem(blackwell, block), "") << "128x128 blocks: sm_90 only";
  EXPECT_EQ(plan::find_gemm_caps("sm_75"), nullptr);
  EXPECT_EQ(plan::gemm_caps("sm_75").arch, "sm_89") << "unknown: the strictest FP8 rules";
}

}  // namespace
}  // namespace opfuse

namespace opfuse {
namespace {

// Lifetimes per run mode and the weight-cache groups are the plan's (computed once by codegen).
TEST(PlanLifetimes, WeightCastsAndRunModeLifetimesAreComputedByCodegen) {
  const auto l = lower({});
  const plan::Plan p = codegen::build_plan(l->program, {"sm_90a", &l->sources});
  const plan::SequencePlan& s = p.sequences.at(0);
  ASSERT_EQ(s.weight_cache_groups.size(), 2u) << "one cast per linear weight";
  for (size_t g = 0; g < s.weight_cache_groups.size(); ++g) {
    const plan::WeightCacheGroup& group = s.weight_cache_groups[g];
    ASSERT_EQ(group.params.size(), 1u);
    EXPECT_EQ(s.buffers.at(size_t(group.params[0])).role, plan::BufferRole::Param);
    ASSERT_EQ(group.quantizers.size(), 1u);
    EXPECT_TRUE(s.quantizers.at(size_t(group.quantizers[0])).name.ends_with(".weight"));
    for (int step : group.steps) {
      EXPECT_EQ(s.steps.at(size_t(step)).weight_cache_group, int(g));
      EXPECT_FALSE(s.steps.at(size_t(step)).inference.has_value()) << "weight casts are cached";
    }
  }
  int copies_dropped = 0;
  for (const plan::Buffer& b : s.buffers) {
    EXPECT_EQ(s.buffers.at(size_t(b.root)).alias_of, -1) << b.name;
    if (b.root != b.id) continue;
    EXPECT_LE(b.training.first, b.training.last);
    EXPECT_LE(b.inference.last, b.training.last) << b.name << ": inference ends no later";
    if (b.weight_cache) {
      EXPECT_GE(b.quantizer, 0) << b.name;
    }
    // A column-wise activation copy only backward reads: an inference forward never makes it.
    if (b.usage == plan::CopyUsage::Columnwise && !b.weight_cache && b.quantizer >= 0 &&
        s.quantizers.at(size_t(b.quantizer)).role == ir::QuantizerRole::Input) {
      EXPECT_EQ(b.inference, (plan::Lifetime{-1, -1})) << b.name;
      EXPECT_GE(b.training.first, 0) << b.name;
      ++copies_dropped;
    }
  }
  EXPECT_EQ(copies_dropped, 2) << "fc1.input's and fc2.input's transposed copies";
}

}  // namespace
}  // namespace opfuse

namespace opfuse {
namespace {

// Session::own_parameters fills parameters from the plan alone (no CPU reference in the runtime):
// the plan's initializers in plan order give exactly the CPU reference's starting values.
TEST(PlanParamInit, ThePlanGivesTheReferencesStartingParameters) {
  const auto l = lower({});
  const plan::Plan p = codegen::build_plan(l->program, {"sm_90a", &l->sources});
  cpu::ReferenceExecutor<float> ref(l->seq(), {{"tokens", 8}});
  cpu::init_params_from_seed(ref, 42);
  plan::ParamInitializer initializer(42);
  int params = 0, normals = 0;
  for (const plan::Buffer& b : p.sequences.at(0).buffers) {
    if (b.role != plan::BufferRole::Param) continue;
    ++params;
    normals += b.init.kind == plan::ParamInit::Kind::Normal;
    std::vector<float> values(size_t(*b.bytes.value() / plan::dtype_bytes(b.dtype)));
    initializer.fill(b.init, values);
    cpu::round_to_bf16(values);
    EXPECT_EQ(values, ref.param(b.name.substr(1)).data) << b.name;
  }
  EXPECT_EQ(params, 4) << "layernorm weight and bias, two linear weights";
  EXPECT_EQ(normals, 2);
  // plan.json carries the initializers.
  const plan::Plan back = plan::plan_from_json(plan::plan_to_json(p));
  for (size_t i = 0; i < back.sequences[0].buffers.size(); ++i)
    EXPECT_EQ(back.sequences[0].buffers[i].init, p.sequences[0].buffers[i].init);
}

}  // namespace
}  // namespace opfuse

namespace opfuse {
namespace {

// Note "Plan passes": the plan-level steps are named passes the driver (and so `fusec ir --after`
// and `--disable-pass`) reaches.
struct PlanPassRun {
  driver::CompileResult result;
  std::vector<std::string> printed;
};

PlanPassRun compile_with(std::set<std::string> disabled, std::set<std::string> print_after,
                         const std::string& recipe = "") {
  PlanPassRun run;
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.recipe = recipe;
  options.disabled_passes = std::move(disabled);
  options.print_after = std::move(print_after);
  options.last_stage = driver::Stage::Plan;
  options.print_plan = [&](std::string_view pass, const plan::SequencePlan& s) {
    run.printed.push_back(fmt::format("{} {}", pass, s.name));
  };
  std::string text = kMlp;
  text.insert(text.find("recipe plain"), "recipe fp8c = current_scaling()\n");
  run.result = driver::compile_source("mlp.fuse", text, sources, diags, options);
  return run;
}

size_t launches_of_template(const plan::Plan& p, const std::string& name) {
  size_t n = 0;
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* l = std::get_if<plan::LaunchStep>(&step.body))
      n += p.find_kernel(l->kernel)->template_name == name;
  return n;
}

TEST(PlanPasses, EachStepIsNamedAndCanBeSkippedOrPrinted) {
  const auto names = driver::pass_names();
  for (const char* pass :
       {"fold-current-amax", "scale-update", "weight-cache", "inference-variants", "lifetimes"})
    EXPECT_NE(std::find(names.begin(), names.end(), pass), names.end()) << pass;

  const PlanPassRun all = compile_with({}, {"scale-update", "lifetimes"});
  ASSERT_EQ(all.result.status, driver::CompileStatus::Ok) << all.result.error;
  EXPECT_EQ(all.printed, (std::vector<std::string>{"scale-update mlp", "lifetimes mlp"}));
  EXPECT_EQ(launches_of_template(all.result.plan, "update_scales"), 1u);
  bool variants = false;
  for (const plan::Step& s : all.result.plan.sequences[0].steps)
    variants |= s.inference.has_value();
  EXPECT_TRUE(variants);

  const PlanPassRun none = compile_with({"scale-update", "inference-variants", "weight-cache"}, {});
  ASSERT_EQ(none.result.status, driver::CompileStatus::Ok) << none.result.error;
  EXPECT_EQ(launches_of_template(none.result.plan, "update_scales"), 0u);
  EXPECT_TRUE(none.result.plan.sequences[0].weight_cache_groups.empty());
  for (const plan::Step& s : none.result.plan.sequences[0].steps)
    EXPECT_FALSE(s.inference.has_value()) << s.what;

  const PlanPassRun required = compile_with({"lifetimes"}, {});
  EXPECT_EQ(required.result.status, driver::CompileStatus::UsageError);
  EXPECT_NE(required.result.error.find("'lifetimes' cannot be disabled"), std::string::npos)
      << required.result.error;
}

TEST(PlanPasses, WithoutFoldingEveryCurrentScaledCastMeasuresItsOwnAmax) {
  const PlanPassRun folded = compile_with({}, {}, "fp8c");
  const PlanPassRun separate = compile_with({"fold-current-amax"}, {}, "fp8c");
  ASSERT_EQ(folded.result.status, driver::CompileStatus::Ok) << folded.result.error;
  ASSERT_EQ(separate.result.status, driver::CompileStatus::Ok) << separate.result.error;
  const size_t quantizers = separate.result.plan.sequences[0].quantizers.size();
  // Weights are cast from parameters (no producing kernel): their amax_reduce stays either way.
  EXPECT_LT(launches_of_template(folded.result.plan, "amax_reduce"),
            launches_of_template(separate.result.plan, "amax_reduce"));
  EXPECT_EQ(launches_of_template(separate.result.plan, "amax_reduce"), quantizers);
}

}  // namespace
}  // namespace opfuse

namespace opfuse {
namespace {

// A high-precision fprop whose wgrad stays FP8: the input quantizer makes only the column-wise
// copy, and the layer still plans, runs in the CPU reference and keeps its bf16 fprop.
TEST(QuantSpecs, AHighPrecisionFpropKeepsOnlyTheWgradCopies) {
  const auto l = lower({keep_high_precision("fc1", GemmRole::Fprop)});
  const ir::QuantizerDecl* x = quantizer(l->seq(), "fc1.input");
  const ir::QuantizerDecl* w = quantizer(l->seq(), "fc1.weight");
  ASSERT_TRUE(x && w);
  EXPECT_EQ(x->usages, (plan::Usages{false, true}));
  EXPECT_EQ(w->usages, (plan::Usages{false, true}));
  const plan::Plan p = codegen::build_plan(l->program, {"sm_90a", &l->sources});
  const auto fprops = gemms_of(p.sequences.at(0), GemmRole::Fprop);
  ASSERT_EQ(fprops.size(), 2u);
  EXPECT_EQ(fprops[0]->a.dtype, plan::DType::BF16) << "fc1 fprop";
  EXPECT_TRUE(plan::dtype_is_fp8(fprops[1]->a.dtype)) << "fc2 fprop";
  cpu::ReferenceExecutor<float> ref(l->seq(), {{"tokens", 8}});
  cpu::init_params_from_seed(ref, 7);
  const auto y = ref.forward({cpu::seeded_normal({8, 64}, 3, 1.0)});
  const auto g = ref.backward({y.at(0)});
  EXPECT_EQ(g.inputs.at(0).data.size(), 8u * 64u);
}

}  // namespace
}  // namespace opfuse
