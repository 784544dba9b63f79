// Codegen (compiler/codegen): the plan of every example under FP8 delayed scaling, current
// scaling and bf16 (GEMMs and their operands, casts, the scale update, buffer lifetimes), the
// kernel sources (their .fuse lines, one kernel per instantiation, each compiling with NVRTC for
// sm_90a), constant_scale and quantize, plan expressions, errors for groups without a GPU kernel,
// the inference variants of forward launches (no transposed FP8 copies), and the goldens
// tests/golden/codegen/<example>/{plan.json,kernels/*.cu}
// (OPFUSE_UPDATE_GOLDEN=1 rewrites them; scripts/update_goldens.sh does that).
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "../../runtime/jit/nvrtc_compiler.h"
#include "codegen/kernel_source.h"
#include "codegen/kernel_templates.h"
#include "codegen/plan.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "ir/pointwise_ops.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;
using codegen::Buffer;
using codegen::GemmRole;
using codegen::GemmStep;
using codegen::LaunchStep;
using codegen::Plan;
using codegen::SequencePlan;
using codegen::Step;

// A program compiled through the whole pipeline, its plan, and the sources it was read from.
struct Compiled {
  SourceManager sources;
  ir::Program program;
  Plan plan;
};

// Every op its own group: the pipeline without the fusion passes.
constexpr bool kUnfused = false;

ir::Program load_and_run_passes(const std::string& path, const std::string& recipe,
                                SourceManager& sources, std::string text = {}, bool fused = true) {
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.recipe = recipe;
  if (!fused) options.disabled_passes = {"fuse-forward", "fuse-backward"};
  options.last_stage = driver::Stage::Passes;
  driver::CompileResult result =
      text.empty() ? driver::compile_file(path, sources, diags, options)
                   : driver::compile_source(path, std::move(text), sources, diags, options);
  EXPECT_TRUE(result.ok()) << diags.format_all() << result.error;
  if (!result.ok()) return {};
  return std::move(result.program);
}

std::unique_ptr<Compiled> compile_example(const std::string& name, const std::string& recipe = "",
                                          bool fused = true) {
  auto c = std::make_unique<Compiled>();
  c->program = load_and_run_passes(test::source_path("dsl_examples/" + name + ".fuse"), recipe,
                                   c->sources, {}, fused);
  c->plan = codegen::build_plan(c->program, {"sm_90a", &c->sources});
  return c;
}

std::vector<const GemmStep*> gemms(const SequencePlan& s, GemmRole role) {
  std::vector<const GemmStep*> found;
  for (const Step& step : s.steps)
    if (const auto* g = std::get_if<GemmStep>(&step.body); g && g->role == role) found.push_back(g);
  return found;
}

// The launches of one kernel template, with their steps.
std::vector<const Step*> launches_of(const Plan& plan, const SequencePlan& s,
                                     const std::string& template_name) {
  std::vector<const Step*> found;
  for (const Step& step : s.steps) {
    const auto* launch = std::get_if<LaunchStep>(&step.body);
    if (launch && plan.find_kernel(launch->kernel)->template_name == template_name)
      found.push_back(&step);
  }
  return found;
}

const codegen::ParamBinding& param(
    const Step& step, std::string_view field) {  // by value: note in test_quantized_boundary.cpp
  for (const auto& p : std::get<LaunchStep>(step.body).params)
    if (p.field == field) return p;
  static const codegen::ParamBinding none;
  ADD_FAILURE() << "no param " << field;
  return none;
}

const std::string& quantizer_of(const SequencePlan& s, const codegen::GemmOperand& o) {
  static const std::string none = "(none)";
  return o.scale_inv.quantizer >= 0 ? s.quantizers.at(size_t(o.scale_inv.quantizer)).name : none;
}

bool has_tag(const codegen::Buffer& b, plan::InterfaceKind kind, const std::string& name) {
  return std::find(b.interface.begin(), b.interface.end(), plan::InterfaceTag{kind, name}) !=
         b.interface.end();
}

int first_backward_step(const SequencePlan& s) {
  for (const Step& step : s.steps)
    if (step.phase == ir::Phase::Backward) return step.index;
  return int(s.steps.size());
}

std::vector<std::string> examples() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(test::source_path("dsl_examples")))
    if (e.path().extension() == ".fuse") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// (recipe override, fused): each example under its own recipe and bf16, with and without fusion.
std::vector<std::pair<std::string, bool>> variants() {
  return {{"", true}, {"bf16", true}, {"", kUnfused}, {"bf16", kUnfused}};
}

// ---- GEMMs --------------------------------------------------------------------------------------

TEST(CodegenPlan, MlpHasTheSixGemmsOfTwoLinearsWithTeAccumulationDefaults) {
  const auto c = compile_example("mlp");
  ASSERT_EQ(c->plan.sequences.size(), 1u);
  const SequencePlan& s = c->plan.sequences[0];
  ASSERT_EQ(gemms(s, GemmRole::Fprop).size(), 2u);
  ASSERT_EQ(gemms(s, GemmRole::Dgrad).size(), 2u);
  ASSERT_EQ(gemms(s, GemmRole::Wgrad).size(), 2u);
  for (const GemmStep* g : gemms(s, GemmRole::Fprop)) {
    EXPECT_TRUE(g->fast_accum);
    EXPECT_EQ(g->a.dtype, ir::DType::E4M3);
    EXPECT_EQ(g->b.dtype, ir::DType::E4M3);
  }
  for (const GemmRole role : {GemmRole::Dgrad, GemmRole::Wgrad}) {
    for (const GemmStep* g : gemms(s, role)) {
      EXPECT_FALSE(g->fast_accum) << plan::name(role);
      EXPECT_EQ(g->a.dtype, ir::DType::E5M2) << "gradients are E5M2 under HYBRID";
    }
  }
  // fc1: y[tokens, 28672] = x[tokens, 4096] W^T.
  const GemmStep& fc1 = *gemms(s, GemmRole::Fprop)[0];
  EXPECT_EQ(fc1.m.text(), "tokens");
  EXPECT_EQ(fc1.n.value(), 28672);
  EXPECT_EQ(fc1.k.value(), 4096);
}

TEST(CodegenPlan, Fp8GemmsReadColumnwiseCopiesInTheTnLayout) {
  const auto c = compile_example("mlp");
  const SequencePlan& s = c->plan.sequences[0];
  for (const GemmStep* g : gemms(s, GemmRole::Dgrad)) {
    EXPECT_EQ(g->a.usage, plan::CopyUsage::Rowwise);
    EXPECT_EQ(g->b.usage, plan::CopyUsage::Columnwise) << "dgrad reads W^T";
    EXPECT_TRUE(g->b_transposed) << "the column-wise copy is stored transposed on sm_90";
    EXPECT_EQ(s.buffers.at(size_t(g->b.buffer)).usage, plan::CopyUsage::Columnwise);
    EXPECT_EQ(s.buffers.at(size_t(g->b.buffer)).layout, plan::CopyLayout::Transposed);
    EXPECT_TRUE(quantizer_of(s, g->b).ends_with(".weight")) << quantizer_of(s, g->b);
    EXPECT_TRUE(quantizer_of(s, g->a).ends_with(".grad_output")) << quantizer_of(s, g->a);
  }
  for (const GemmStep* g : gemms(s, GemmRole::Wgrad)) {
    EXPECT_EQ(g->a.usage, plan::CopyUsage::Columnwise) << "wgrad reads dy^T";
    EXPECT_EQ(g->b.usage, plan::CopyUsage::Columnwise) << "wgrad reads x^T";
    EXPECT_TRUE(quantizer_of(s, g->a).ends_with(".grad_output")) << quantizer_of(s, g->a);
    EXPECT_TRUE(quantizer_of(s, g->b).ends_with(".input")) << quantizer_of(s, g->b);
    EXPECT_EQ(g->k.text(), "tokens");
  }
  for (const Step& step : s.steps) {
    if (const auto* g = std::get_if<GemmStep>(&step.body)) {
      EXPECT_FALSE(g->a_transposed) << step.what << ": cuBLASLt FP8 takes TN only";
      EXPECT_TRUE(g->b_transposed) << step.what;
    }
  }
  const std::string json = codegen::plan_json_text(c->plan);
  EXPECT_NE(json.find("\"layout\": \"TN\""), std::string::npos);
  EXPECT_EQ(json.find("\"layout\": \"NN\""), std::string::npos);
}

TEST(CodegenPlan, Bf16HasNoCastsNoQuantizersAndRowMajorBackwardLayouts) {
  const auto c = compile_example("mlp", "bf16");
  const SequencePlan& s = c->plan.sequences[0];
  EXPECT_TRUE(s.quantizers.empty());
  for (const auto& kernel : c->plan.kernels) {
    EXPECT_NE(kernel.template_name, "cast_transpose") << kernel.id;
    EXPECT_NE(kernel.template_name, "amax_reduce") << kernel.id;
    EXPECT_NE(kernel.template_name, "update_scales") << kernel.id;
    EXPECT_EQ(kernel.name_expression.find("fp8"), std::string::npos) << kernel.id;
  }
  EXPECT_EQ(gemms(s, GemmRole::Fprop).size() + gemms(s, GemmRole::Dgrad).size() +
                gemms(s, GemmRole::Wgrad).size(),
            6u);
  for (const GemmStep* g : gemms(s, GemmRole::Dgrad)) {
    EXPECT_FALSE(g->b_transposed) << "bf16 dgrad reads W [out, in] as [k, n]";
    EXPECT_FALSE(g->fast_accum);
  }
  for (const GemmStep* g : gemms(s, GemmRole::Wgrad)) {
    EXPECT_TRUE(g->a_transposed) << "bf16 wgrad reads dy [tokens, out] as [k, m]";
    EXPECT_FALSE(g->b_transposed);
  }
  for (const GemmStep* g : gemms(s, GemmRole::Fprop)) EXPECT_FALSE(g->fast_accum);
}

// ---- quantizers ---------------------------------------------------------------------------------

TEST(CodegenPlan, DelayedScalingUpdatesEveryQuantizerInOneLaunchAtTheEndOfTheStep) {
  const auto c = compile_example("mlp");
  const SequencePlan& s = c->plan.sequences[0];
  const auto updates = launches_of(c->plan, s, "update_scales");
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0]->index, int(s.steps.size()) - 1);
  EXPECT_EQ(updates[0]->phase, ir::Phase::Backward);
  const auto& records = param(*updates[0], "records").records;
  EXPECT_EQ(records.size(), s.quantizers.size());
  EXPECT_EQ(records.size(), 6u);
  // Every cast raises its quantizer's amax (history slot 0) for that update.
  for (const auto& q : s.quantizers) {
    EXPECT_EQ(q.spec.scaling, plan::ScalingKind::Delayed) << q.name;
    EXPECT_EQ(q.spec.amax_compute, plan::AmaxCompute::Max) << q.name;
  }
  size_t amax_writers = 0;
  for (const Step& step : s.steps) {
    if (!std::holds_alternative<LaunchStep>(step.body)) continue;
    for (const auto& p : std::get<LaunchStep>(step.body).params)
      amax_writers += p.field == "amax" && p.kind == plan::ParamKind::Quantizer;
  }
  EXPECT_EQ(amax_writers, s.quantizers.size());
}

TEST(CodegenPlan, CurrentScalingMeasuresTheAmaxAndScaleBeforeEachCast) {
  const auto c = compile_example("rmsnorm_swiglu");  // current_scaling(power_of_2_scale = true)
  const SequencePlan& s = c->plan.sequences[0];
  const auto casts = launches_of(c->plan, s, "cast_transpose");
  ASSERT_EQ(casts.size(), s.quantizers.size());
  // Who measures each quantizer's amax (and derives its scale): the kernel that produces the
  // cast's input where one does, else amax_reduce (weights, the incoming gradient).
  const std::map<std::string, std::string> measured_by = {
      {"gate_up_proj.input", "rmsnorm_fwd"},
      {"gate_up_proj.weight", "amax_reduce"},
      {"down_proj.input", "gated_activation_fwd"},
      {"down_proj.weight", "amax_reduce"},
      {"down_proj.grad_output", "amax_reduce"},
      {"gate_up_proj.grad_output", "gated_activation_bwd"}};
  for (const Step* cast : casts) {
    const int q = param(*cast, "scale").quantizer;
    const std::string& name = s.quantizers.at(size_t(q)).name;
    ASSERT_GE(cast->index, 1);
    const Step& measure = s.steps[size_t(cast->index - 1)];
    ASSERT_TRUE(std::holds_alternative<LaunchStep>(measure.body)) << measure.what;
    EXPECT_EQ(c->plan.find_kernel(std::get<LaunchStep>(measure.body).kernel)->template_name,
              measured_by.at(name))
        << name;
    EXPECT_EQ(param(measure, "amax").quantizer, q) << name;
    EXPECT_EQ(param(measure, "amax").quantizer_value, plan::QuantizerValue::RunningAmax) << name;
    EXPECT_EQ(param(measure, "scale_record").records, std::vector<int>{q}) << name;
    EXPECT_EQ(param(*cast, "amax").kind, plan::ParamKind::Null)
        << "the amax was measured before the cast";
  }
  for (const auto& q : s.quantizers) {
    EXPECT_EQ(q.spec.scaling, plan::ScalingKind::Current) << q.name;
    EXPECT_TRUE(q.spec.power_of_2_scale) << q.name;
  }
  // The measuring kernels derive the scales: no update_scales launch at all.
  EXPECT_TRUE(launches_of(c->plan, s, "update_scales").empty());
}

TEST(CodegenPlan, CurrentScalingProducerMeasuresOnlyForACastOfItsOwnPhase) {
  // The layernorm's output feeds the cast (measured by the layernorm); the bias_add's output is
  // the sequence's result, which no cast reads (no amax).
  auto c = std::make_unique<Compiled>();
  c->program =
      load_and_run_passes("producer.fuse", "", c->sources, R"(recipe cur = current_scaling()
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 32]) uses cur {
  layernorm(64)
  linear(64, 32, bias = false) as fc
  bias(32)
}
)");
  c->plan = codegen::build_plan(c->program, {"sm_90a", &c->sources});
  const SequencePlan& s = c->plan.sequences[0];
  const auto norms = launches_of(c->plan, s, "layernorm_fwd");
  ASSERT_EQ(norms.size(), 1u);
  EXPECT_EQ(s.quantizers.at(size_t(param(*norms[0], "amax").quantizer)).name, "fc.input");
  for (const Step* bias : launches_of(c->plan, s, "bias_add")) {
    EXPECT_EQ(param(*bias, "amax").kind, plan::ParamKind::Null) << bias->what;
    EXPECT_EQ(param(*bias, "scale_record").kind, plan::ParamKind::Null);
  }
  // No amax_reduce or update_scales for fc.input: the layernorm measured it.
  EXPECT_TRUE(launches_of(c->plan, s, "update_scales").empty());
  for (const Step* reduce : launches_of(c->plan, s, "amax_reduce")) {
    EXPECT_NE(s.quantizers.at(size_t(param(*reduce, "amax").quantizer)).name, "fc.input");
  }
}

// ---- buffers ------------------------------------------------------------------------------------

TEST(CodegenPlan, BufferLifetimesAreOrderedAndSavedActivationsLiveIntoBackward) {
  for (const std::string& name : examples()) {
    for (const auto& [recipe, fused] : variants()) {
      const auto c = compile_example(name, recipe, fused);
      for (const SequencePlan& s : c->plan.sequences) {
        const std::string where = name + "/" + s.name + " " + recipe + (fused ? "" : " unfused");
        const int backward = first_backward_step(s);
        std::map<int, int> first_write;
        for (const Step& step : s.steps)
          for (int b : step.writes) first_write.emplace(b, step.index);
        for (const Buffer& b : s.buffers) {
          EXPECT_LE(b.first_use, b.last_use) << where << " " << b.name;
          if (b.saved) {
            EXPECT_LT(b.first_use, backward) << where << " " << b.name;
            EXPECT_GE(b.last_use, backward) << where << " " << b.name;
          }
        }
        // A result is read only after the step that writes it (aliases read their root).
        for (const Step& step : s.steps) {
          for (int id : step.reads) {
            int root = id;
            while (s.buffers[size_t(root)].alias_of >= 0) root = s.buffers[size_t(root)].alias_of;
            const Buffer& b = s.buffers[size_t(root)];
            if (b.role != codegen::BufferRole::Result && b.role != codegen::BufferRole::Workspace)
              continue;
            ASSERT_TRUE(first_write.count(root)) << where << ": " << b.name << " is never written";
            EXPECT_LT(first_write[root], step.index) << where << ": " << step.what;
          }
        }
      }
    }
  }
}

TEST(CodegenPlan, NormStatisticsAndTheSwigluInputAreSavedForBackward) {
  const auto c = compile_example("mlp");
  const SequencePlan& s = c->plan.sequences[0];
  std::vector<const Buffer*> stats;
  for (const Buffer& b : s.buffers)
    if (b.dtype == ir::DType::FP32 && b.role == codegen::BufferRole::Result) stats.push_back(&b);
  ASSERT_EQ(stats.size(), 2u) << "layernorm's mean and rstd";
  for (const Buffer* b : stats) EXPECT_TRUE(b->saved) << b->name;
  // fc1's output [tokens, 28672] is the SwiGLU input its backward reads.
  const auto it = std::find_if(s.buffers.begin(), s.buffers.end(), [](const Buffer& b) {
    return b.dtype == ir::DType::BF16 && b.shape.size() == 2 && b.shape[1].value() == 28672;
  });
  ASSERT_NE(it, s.buffers.end());
  EXPECT_TRUE(it->saved);
  EXPECT_EQ(codegen::evaluate(it->bytes.text(), {{"tokens", 8}}), 8 * 28672 * 2);
}

TEST(CodegenPlan, ExtraOutputIsAnAliasAndResidualsAccumulateInTheGemm) {
  const auto c = compile_example("mlp_residual");
  ASSERT_EQ(c->plan.sequences.size(), 2u);
  const SequencePlan& fc1 = c->plan.sequences[0];
  const auto residual = std::find_if(fc1.buffers.begin(), fc1.buffers.end(), [](const Buffer& b) {
    return has_tag(b, plan::InterfaceKind::Output, "residual");
  });
  ASSERT_NE(residual, fc1.buffers.end());
  ASSERT_GE(residual->alias_of, 0) << "make_extra_output copies nothing";
  EXPECT_EQ(fc1.buffers[size_t(residual->alias_of)].name, "%x");
  // The norm backward adds the residual's gradient (norm_backward_residual).
  const auto norm_bwd = launches_of(c->plan, fc1, "layernorm_bwd");
  ASSERT_EQ(norm_bwd.size(), 1u);
  EXPECT_EQ(fc1.buffers[size_t(param(*norm_bwd[0], "dresidual").buffers.at(0))].name, "%dresidual");
  // fc2: y = h W^T + residual through beta = 1.
  const SequencePlan& fc2 = c->plan.sequences[1];
  const GemmStep& fprop = *gemms(fc2, GemmRole::Fprop).at(0);
  EXPECT_TRUE(fprop.accumulate);
  ASSERT_GE(fprop.c, 0);
  EXPECT_EQ(fc2.buffers[size_t(fprop.c)].name, "%residual");
}

TEST(CodegenPlan, GeluFusionsBecomeGemmEpilogues) {
  const auto c = compile_example("gelu_bias_mlp", "plain");  // bf16: GELU stays in the GEMMs
  const SequencePlan& s = c->plan.sequences[0];
  const GemmStep& fc = *gemms(s, GemmRole::Fprop).at(0);
  EXPECT_EQ(fc.epilogue, plan::GemmEpilogue::GeluAuxBias);
  ASSERT_GE(fc.aux, 0);
  EXPECT_TRUE(s.buffers[size_t(fc.aux)].saved) << "the pre-activation is saved for backward";
  EXPECT_EQ(gemms(s, GemmRole::Fprop).at(1)->epilogue, plan::GemmEpilogue::Bias);
  bool dgelu = false;
  for (const GemmStep* g : gemms(s, GemmRole::Dgrad)) {
    if (g->epilogue != plan::GemmEpilogue::DGeluBiasGrad) continue;
    dgelu = true;
    EXPECT_EQ(g->aux, fc.aux) << "DGELU reads the aux the forward GEMM wrote";
    EXPECT_TRUE(has_tag(s.buffers[size_t(g->bias)], plan::InterfaceKind::ParamGrad, "c_fc.bias"));
  }
  EXPECT_TRUE(dgelu);
}

TEST(CodegenPlan, UnfusedOpsRunTheirOwnKernels) {
  // mlp: the norm writes bf16 and a cast_transpose makes the FP8 copies.
  const auto mlp = compile_example("mlp", "", kUnfused);
  const SequencePlan& s = mlp->plan.sequences[0];
  EXPECT_EQ(launches_of(mlp->plan, s, "cast_transpose").size(), 6u) << "one per quantizer";
  ASSERT_NE(mlp->plan.find_kernel("layernorm_fwd_bf16_bf16_4096"), nullptr);
  ASSERT_NE(mlp->plan.find_kernel("gated_activation_bwd_swiglu_bf16_bf16"), nullptr);
  // gelu_bias_mlp: bias_grad is dbias partial sums, then their column reduction.
  const auto gelu = compile_example("gelu_bias_mlp", "", kUnfused);
  const auto dbias = launches_of(gelu->plan, gelu->plan.sequences[0], "dbias_partial");
  ASSERT_EQ(dbias.size(), 2u);
  const Step& reduce = gelu->plan.sequences[0].steps.at(size_t(dbias[0]->index + 1));
  EXPECT_EQ(param(reduce, "partials").buffers.at(0), param(*dbias[0], "dbias_partial").buffers[0]);
  // rmsnorm_swiglu: add_extra_input is a bias_add with the residual only.
  const auto llama = compile_example("rmsnorm_swiglu", "", kUnfused);
  const auto adds = launches_of(llama->plan, llama->plan.sequences[0], "bias_add");
  ASSERT_EQ(adds.size(), 1u);
  EXPECT_EQ(std::get<LaunchStep>(adds[0]->body).name_expression,
            "opfuse::bias_add<__nv_bfloat16, __nv_bfloat16, false, true, false>");
  EXPECT_EQ(param(*adds[0], "bias").kind, plan::ParamKind::Null);
}

// ---- inference variants -------------------------------------------------------------------------

// The buffers a launch binds to its transposed-copy pointers (y_t, dx_t).
std::vector<int> transposed_copies(const LaunchStep& launch) {
  std::vector<int> ids;
  for (const auto& p : launch.params)
    if ((p.field == "y_t" || p.field == "dx_t") && p.kind == plan::ParamKind::Buffer)
      ids.push_back(p.buffers.at(0));
  return ids;
}

std::vector<const Step*> steps_with_variants(const SequencePlan& s) {
  std::vector<const Step*> found;
  for (const Step& step : s.steps)
    if (step.inference) found.push_back(&step);
  return found;
}

// The value of the template parameter `name` in `kernel`'s instantiation.
std::string template_arg(const codegen::Kernel& kernel, std::string_view name) {
  const codegen::KernelTemplate* t = codegen::find_kernel_template(kernel.template_name);
  EXPECT_NE(t, nullptr) << kernel.template_name;
  for (size_t i = 0; t != nullptr && i < t->params.size() && i < kernel.template_args.size(); ++i)
    if (t->params[i].name == name) return kernel.template_args[i];
  return "(none)";
}

TEST(CodegenInference, Fp8MlpVariantsDropOnlyTheTransposedCopiesOfTheNormAndSwiglu) {
  const auto c = compile_example("mlp");  // FP8 delayed scaling
  const SequencePlan& s = c->plan.sequences[0];
  const auto variants = steps_with_variants(s);
  ASSERT_EQ(variants.size(), 2u) << "the weight casts get none: the executor caches them";
  EXPECT_EQ(variants[0]->what, "layernorm bf16 -> e4m3 + transposed copy");
  EXPECT_EQ(variants[1]->what, "swiglu bf16 -> e4m3 + transposed copy");
  // What the variants write, for reports of inference forwards (fusec bench's step lines).
  EXPECT_EQ(variants[0]->inference->what, "layernorm bf16 -> e4m3");
  EXPECT_EQ(variants[1]->inference->what, "swiglu bf16 -> e4m3");
  for (const Step* step : variants) {
    SCOPED_TRACE(step->what);
    EXPECT_EQ(step->phase, ir::Phase::Forward);
    const auto& trained = std::get<LaunchStep>(step->body);
    const LaunchStep& inference = step->inference->launch;
    const codegen::Kernel* kernel = c->plan.find_kernel(inference.kernel);
    ASSERT_NE(kernel, nullptr) << inference.kernel;
    EXPECT_NE(inference.kernel, trained.kernel);
    EXPECT_EQ(kernel->name_expression, inference.name_expression);
    EXPECT_EQ(kernel->template_name, c->plan.find_kernel(trained.kernel)->template_name);
    EXPECT_EQ(template_arg(*kernel, "kWriteTranspose"), "false");
    EXPECT_EQ(template_arg(*c->plan.find_kernel(trained.kernel), "kWriteTranspose"), "true");
    ASSERT_EQ(kernel->uses.size(), 1u);
    EXPECT_NE(kernel->uses[0].what.find("(inference: without the transposed copy)"),
              std::string::npos)
        << kernel->uses[0].what;
    // The same bindings, but the transposed copy's pointer is null and the copy is not written.
    const std::vector<int> copies = transposed_copies(trained);
    ASSERT_EQ(copies.size(), 1u);
    EXPECT_EQ(s.buffers.at(size_t(copies[0])).usage, plan::CopyUsage::Columnwise);
    EXPECT_EQ(param(*step, "y_t").kind, plan::ParamKind::Buffer);
    ASSERT_EQ(inference.params.size(), trained.params.size());
    for (size_t i = 0; i < trained.params.size(); ++i) {
      const auto& want = trained.params[i];
      const auto& got = inference.params[i];
      EXPECT_EQ(got.field, want.field);
      if (want.field == "y_t") {
        EXPECT_EQ(got.kind, plan::ParamKind::Null);
        continue;
      }
      EXPECT_EQ(got.kind, want.kind) << want.field;
      EXPECT_EQ(got.buffers, want.buffers) << want.field;
      EXPECT_EQ(got.quantizer, want.quantizer) << want.field;
      EXPECT_EQ(got.quantizer_value, want.quantizer_value) << want.field << ": amax kept";
    }
    std::vector<int> writes = step->writes;
    writes.erase(std::find(writes.begin(), writes.end(), copies[0]));
    EXPECT_EQ(step->inference->writes, writes);
  }
  // The norm's plain grid is not its transposing one (no staged tile in shared memory).
  const Step& norm = *variants[0];
  EXPECT_EQ(std::get<LaunchStep>(norm.body).grid.rule, "norm_fwd_transpose");
  EXPECT_GT(std::get<LaunchStep>(norm.body).dynamic_smem_bytes, 0);
  EXPECT_EQ(norm.inference->launch.grid.rule, "norm_fwd");
  EXPECT_EQ(norm.inference->launch.dynamic_smem_bytes, 0);
  EXPECT_EQ(norm.inference->launch.kernel, "layernorm_fwd_bf16_e4m3_4096");
  EXPECT_EQ(variants[1]->inference->launch.kernel, "gated_activation_fwd_swiglu_bf16_e4m3");
}

TEST(CodegenInference, EveryVariantIsAForwardLaunchWhoseDroppedCopiesOnlyBackwardReads) {
  for (const std::string& name : examples()) {
    for (const bool fused : {true, kUnfused}) {
      const auto c = compile_example(name, "", fused);
      for (const SequencePlan& s : c->plan.sequences) {
        const std::string where = name + "/" + s.name + (fused ? "" : " unfused");
        // A sequence whose only activation cast is a quantized input's (given, not made) has
        // nothing to drop.
        const bool quantized_input = std::any_of(s.quantizers.begin(), s.quantizers.end(),
                                                 [](const auto& q) { return q.boundary; });
        EXPECT_NE(steps_with_variants(s).empty(), !quantized_input) << where;
        for (const Step* step : steps_with_variants(s)) {
          ASSERT_EQ(step->phase, ir::Phase::Forward) << where << ": " << step->what;
          for (int copy : transposed_copies(std::get<LaunchStep>(step->body))) {
            // Only a quantized output's column-wise copy is read back (after training forwards).
            for (const plan::InterfaceTag& tag : s.buffers.at(size_t(copy)).interface)
              EXPECT_TRUE(tag.kind == plan::InterfaceKind::Output &&
                          tag.name.ends_with(".columnwise"))
                  << where << ": " << plan::interface_string(tag);
            for (const Step& reader : s.steps) {
              const bool reads =
                  std::find(reader.reads.begin(), reader.reads.end(), copy) != reader.reads.end();
              if (reads) {
                EXPECT_EQ(reader.phase, ir::Phase::Backward) << where << ": " << reader.what;
              }
            }
          }
          const std::vector<int>& reads = step->reads;
          EXPECT_FALSE(std::all_of(
              reads.begin(), reads.end(),
              [&](int id) { return s.buffers.at(size_t(id)).role == codegen::BufferRole::Param; }))
              << where << ": a weight cast has a variant: " << step->what;
        }
      }
    }
  }
}

TEST(CodegenInference, Bf16PlansHaveNoVariants) {
  for (const std::string& name : examples()) {
    for (const bool fused : {true, kUnfused}) {
      const auto c = compile_example(name, "bf16", fused);
      for (const SequencePlan& s : c->plan.sequences)
        EXPECT_TRUE(steps_with_variants(s).empty()) << name << "/" << s.name;
      for (const auto& k : c->plan.kernels)
        for (const auto& use : k.uses) EXPECT_EQ(use.what.find("inference"), std::string::npos);
    }
  }
}

// No example reads a transposed copy in forward or returns one, so the test makes both: the
// unfused mlp's fc1 input cast (a plain cast_transpose) loses its variant either way, while the
// fc2 input cast keeps its own.
TEST(CodegenInference, ACopyReadInForwardOrReturnedHasNoVariant) {
  const auto c = compile_example("mlp", "", kUnfused);
  const ir::Sequence& original = c->program.sequences[0];
  const auto fc1_cast = std::find_if(original.ops.begin(), original.ops.end(), [](const auto& op) {
    return op.kind == ir::OpKind::CastFp8 && op.instance == "fc1.input";
  });
  ASSERT_NE(fc1_cast, original.ops.end());
  ASSERT_TRUE(ir::attr_bool(fc1_cast->attrs, "columnwise"));
  const ir::ValueId copy = fc1_cast->results.back();
  auto cast_variants = [&](const ir::Sequence& seq) {
    std::vector<std::string> instances;
    const Plan plan = codegen::build_plan(seq, {"sm_90a", &c->sources});
    for (const Step* step : steps_with_variants(plan.sequences[0]))
      instances.push_back(step->ops.at(0).instance);
    return instances;
  };
  EXPECT_EQ(cast_variants(original), (std::vector<std::string>{"fc1.input", "fc2.input"}));

  ir::Sequence read_in_forward = original;  // fc1's forward GEMM reads the transposed copy
  for (ir::Operation& op : read_in_forward.ops)
    if (op.kind == ir::OpKind::Linear && op.instance == "fc1") op.operands.at(0) = copy;
  EXPECT_EQ(cast_variants(read_in_forward), std::vector<std::string>{"fc2.input"});

  ir::Sequence returned = original;  // the copy is a sequence output
  returned.outputs.push_back({"x_t", copy, {}});
  EXPECT_EQ(cast_variants(returned), std::vector<std::string>{"fc2.input"});
}

TEST(CodegenInference, VariantsReadBackFromJsonExactly) {
  for (const std::string& name : examples()) {
    const auto c = compile_example(name);
    const std::string text = codegen::plan_json_text(c->plan);
    const Plan back = codegen::plan_from_json(nlohmann::ordered_json::parse(text));
    EXPECT_EQ(codegen::plan_json_text(back), text) << name;
    for (size_t q = 0; q < c->plan.sequences.size(); ++q) {
      const SequencePlan& want = c->plan.sequences[q];
      const SequencePlan& got = back.sequences.at(q);
      for (size_t i = 0; i < want.steps.size(); ++i) {
        ASSERT_EQ(got.steps.at(i).inference.has_value(), want.steps[i].inference.has_value());
        if (!want.steps[i].inference) continue;
        EXPECT_EQ(got.steps[i].inference->writes, want.steps[i].inference->writes);
        EXPECT_EQ(got.steps[i].inference->what, want.steps[i].inference->what);
        EXPECT_FALSE(want.steps[i].inference->what.empty()) << want.steps[i].what;
        EXPECT_EQ(got.steps[i].inference->launch.kernel, want.steps[i].inference->launch.kernel);
        EXPECT_EQ(got.steps[i].inference->launch.grid.x, want.steps[i].inference->launch.grid.x);
      }
    }
  }
}

// The message plan_from_json throws for `json`, or "" when it reads.
std::string load_error(const nlohmann::ordered_json& json) {
  try {
    codegen::plan_from_json(json);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(CodegenInference, AMalformedVariantIsRejectedNamingItsPath) {
  const auto c = compile_example("mlp");
  const auto plan = nlohmann::ordered_json::parse(codegen::plan_json_text(c->plan));
  const std::string step = "plan.sequences[0].phases[0].steps[0]";
  ASSERT_TRUE(plan["sequences"][0]["phases"][0]["steps"][0].contains("inference"));
  ASSERT_EQ(load_error(plan), "");
  auto edited = [&](auto edit) {
    nlohmann::ordered_json copy = plan;
    edit(copy["sequences"][0]["phases"][0]["steps"]);
    return load_error(copy);
  };
  EXPECT_EQ(edited([](auto& steps) { steps[0]["inference"] = "none"; }),
            step + ".inference: not an object");
  EXPECT_EQ(edited([](auto& steps) { steps[0]["inference"].erase("writes"); }),
            step + ".inference: missing \"writes\"");
  EXPECT_EQ(edited([](auto& steps) { steps[0]["inference"]["grid"]["x"] = true; }),
            step + ".inference.grid.x: not an integer or a plan expression");
  EXPECT_EQ(edited([](auto& steps) { steps[0]["inference"]["writes"].push_back(0); }),
            step + ".inference.writes: buffer 0 is not one the step writes");
  // Step 2 is fc1's forward GEMM.
  EXPECT_EQ(edited([](auto& steps) { steps[2]["inference"] = steps[0]["inference"]; }),
            "plan.sequences[0].phases[0].steps[2].inference: only a forward launch has an "
            "inference variant");
}

// ---- kernels and their sources ------------------------------------------------------------------

TEST(CodegenKernels, OneKernelPerInstantiationSharedByEveryUse) {
  const auto c = compile_example("mlp");
  std::set<std::string> ids, expressions;
  for (const auto& k : c->plan.kernels) {
    EXPECT_TRUE(ids.insert(k.id).second) << k.id;
    EXPECT_TRUE(expressions.insert(k.name_expression).second) << k.name_expression;
  }
  const codegen::Kernel* weights = c->plan.find_kernel("cast_transpose_bf16_e4m3_t");
  ASSERT_NE(weights, nullptr);
  ASSERT_EQ(weights->uses.size(), 2u) << "the casts of both weights share one kernel";
  const std::string source = codegen::kernel_source(c->plan, *weights);
  EXPECT_NE(source.find("cast_fp8 \"fc1.weight\" (mlp.fuse:15)"), std::string::npos) << source;
  EXPECT_NE(source.find("cast_fp8 \"fc2.weight\" (mlp.fuse:17)"), std::string::npos) << source;
}

TEST(CodegenKernels, SourcesNameTheirOpsWithFuseLinesPhaseDtypesAndQuantizers) {
  const auto c = compile_example("mlp");
  const codegen::Kernel* norm = c->plan.find_kernel("layernorm_fwd_bf16_e4m3_4096_t");
  ASSERT_NE(norm, nullptr);
  const std::string source = codegen::kernel_source(c->plan, *norm);
  const std::string instantiation =
      "template __global__ void opfuse::layernorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 4096, false, "
      "true>(opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);";
  for (const std::string& want :
       {std::string("sequence mlp, forward, fused norm_cast"),
        std::string("layernorm \"layernorm_0\" (mlp.fuse:14)"),
        std::string("cast_fp8 \"fc1.input\" (mlp.fuse:15)"),
        std::string("bf16 -> e4m3 + transposed copy"), std::string("quantizers: fc1.input (e4m3)"),
        std::string("#include \"norm.cuh\""), instantiation}) {
    EXPECT_NE(source.find(want), std::string::npos) << want << "\n" << source;
  }
  // Every step's ops appear with their lines in the kernel it launches.
  for (const Step& step : c->plan.sequences[0].steps) {
    const auto* launch = std::get_if<LaunchStep>(&step.body);
    if (!launch) continue;
    const std::string text = codegen::kernel_source(c->plan, *c->plan.find_kernel(launch->kernel));
    for (const auto& op : step.ops) {
      EXPECT_EQ(op.location.rfind("mlp.fuse:", 0), 0u) << op.location;
      EXPECT_NE(text.find("(" + op.location + ")"), std::string::npos) << launch->kernel;
    }
  }
}

TEST(CodegenKernels, EveryEmittedKernelCompilesWithNvrtcForSm90a) {
  // Every distinct kernel of every example under its recipe and bf16, fused and unfused.
  std::map<std::string, jit::CompileRequest> requests;
  for (const std::string& name : examples()) {
    for (const auto& [recipe, fused] : variants()) {
      const auto c = compile_example(name, recipe, fused);
      for (const auto& k : c->plan.kernels) {
        jit::CompileRequest r;
        r.kernel_name = k.id;
        r.source = codegen::kernel_source(c->plan, k);
        r.name_expressions = {k.name_expression};
        r.arch = "sm_90a";
        requests.emplace(k.name_expression, std::move(r));
      }
    }
  }
  std::vector<jit::CompileRequest> list;
  for (auto& [expression, r] : requests) list.push_back(std::move(r));
  ASSERT_GE(list.size(), 10u);
  const jit::CompileAllResult result = jit::compile_all(list, nullptr);
  ASSERT_EQ(result.kernels.size(), list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const jit::CompiledKernel& k = result.kernels[i];
    EXPECT_FALSE(k.is_ptx) << k.kernel_name;
    EXPECT_EQ(k.lowered_names.count(list[i].name_expressions[0]), 1u) << k.kernel_name;
    EXPECT_EQ(k.spill_store_bytes, 0) << k.kernel_name << " spills";
  }
}

// Every pointwise op (compiler/ir/pointwise_defs.cpp: a new one is covered with no change here)
// between two FP8 linears: its forward kernel writes the next GEMM's E4M3 input (+ transposed
// copy) itself, its backward kernel the E5M2 gradient (+ transposed copy, + dbias), each through
// the op's generated functor with its attributes; and every such kernel compiles with NVRTC.
TEST(CodegenKernels, EveryPointwiseOpCastsToFp8InItsOwnKernelAndCompiles) {
  std::vector<jit::CompileRequest> requests;
  for (const ir::PointwiseDef* def : ir::pointwise_defs()) {
    const std::string text = fmt::format(R"(recipe fp8 = delayed_scaling()
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {{
  linear(64, 128) as up
  {}()
  linear({}, 64) as down
}}
)",
                                         def->name, def->gated ? 64 : 128);
    auto c = std::make_unique<Compiled>();
    c->program = load_and_run_passes("pointwise.fuse", "", c->sources, text);
    c->plan = codegen::build_plan(c->program, {"sm_90a", &c->sources});
    ir::AttrList attrs;
    for (const ir::AttrSpec& spec : def->attrs)
      attrs.push_back({std::string(spec.name), spec.default_value});
    const std::string functor = ir::pointwise_functor_name(*def, attrs);
    const std::string prefix = def->gated ? "opfuse::gated_activation_" : "opfuse::activation_";
    std::set<std::string> expressions;
    for (const codegen::Kernel& k : c->plan.kernels) {
      if (k.name_expression.find(functor) == std::string::npos) continue;
      expressions.insert(k.name_expression);
      jit::CompileRequest r;
      r.kernel_name = k.id;
      r.source = codegen::kernel_source(c->plan, k);
      EXPECT_NE(r.source.find("struct " + functor.substr(8) + " {"), std::string::npos) << r.source;
      r.name_expressions = {k.name_expression};
      r.arch = "sm_90a";
      requests.push_back(std::move(r));
    }
    EXPECT_TRUE(
        expressions.contains(prefix + "fwd<" + functor + ", __nv_bfloat16, __nv_fp8_e4m3, true>"))
        << def->name << ": " << fmt::format("{}", fmt::join(expressions, " | "));
    EXPECT_TRUE(expressions.contains(prefix + "bwd<" + functor +
                                     ", __nv_bfloat16, __nv_fp8_e5m2, true, true>"))
        << def->name << ": " << fmt::format("{}", fmt::join(expressions, " | "));
  }
  const jit::CompileAllResult result = jit::compile_all(requests, nullptr);
  ASSERT_EQ(result.kernels.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_FALSE(result.kernels[i].is_ptx) << requests[i].kernel_name;
    EXPECT_EQ(result.kernels[i].lowered_names.count(requests[i].name_expressions[0]), 1u)
        << requests[i].kernel_name;
    EXPECT_EQ(result.kernels[i].spill_store_bytes, 0) << requests[i].kernel_name << " spills";
  }
}

// ---- constant_scale and quantize ---------------------------------------------------------------

// Every form of the two ops: quantize forward and backward (two quantizers), forward only, backward
// only (forward = false: the identity forward), under a declared delayed and current recipe.
constexpr const char* kScaleQuantize = R"(recipe delayed = delayed_scaling(amax_history = 16)
recipe current = current_scaling()
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses delayed {
  constant_scale(0.5)
  quantize(forward = true, backward = true) as both
  quantize(forward = false, backward = true) as grad_only
  quantize(forward = true, backward = false) as forward_only
}
)";

std::unique_ptr<Compiled> compile_scale_quantize(const std::string& recipe) {
  auto c = std::make_unique<Compiled>();
  c->program = load_and_run_passes("scale_quantize.fuse", recipe, c->sources, kScaleQuantize);
  c->plan = codegen::build_plan(c->program, {"sm_90a", &c->sources});
  return c;
}

const std::string& quantizer_name(const SequencePlan& s, const Step& step,
                                  const std::string& field) {
  return s.quantizers.at(size_t(param(step, field).quantizer)).name;
}

TEST(CodegenScaleQuantize, ConstantScaleRunsItsKernelForwardAndBackward) {
  const auto c = compile_scale_quantize("");
  const SequencePlan& s = c->plan.sequences.at(0);
  const auto scales = launches_of(c->plan, s, "constant_scale");
  ASSERT_EQ(scales.size(), 2u);
  EXPECT_EQ(scales[0]->phase, ir::Phase::Forward);
  EXPECT_EQ(scales[1]->phase, ir::Phase::Backward);
  for (const Step* step : scales) {
    EXPECT_EQ(std::get<LaunchStep>(step->body).name_expression,
              "opfuse::constant_scale<__nv_bfloat16, __nv_bfloat16, false>");
    EXPECT_EQ(param(*step, "factor").kind, plan::ParamKind::Float);
    EXPECT_EQ(param(*step, "factor").float_value, 0.5);
    EXPECT_EQ(param(*step, "cols").int_value.value(), 64);
    EXPECT_EQ(param(*step, "rows").int_value.text(), "tokens");
    EXPECT_EQ(param(*step, "amax").kind, plan::ParamKind::Null);
    EXPECT_EQ(std::get<LaunchStep>(step->body).grid.x.value(), 1);
  }
  // The backward one writes the input gradient.
  const Buffer& dx = s.buffers.at(size_t(param(*scales[1], "y").buffers.at(0)));
  EXPECT_EQ(dx.interface, (std::vector<plan::InterfaceTag>{{plan::InterfaceKind::InputGrad, "x"}}));
}

TEST(CodegenScaleQuantize, DelayedScalingFakeQuantizesWithEachQuantizerAndRaisesItsAmax) {
  const auto c = compile_scale_quantize("");
  const SequencePlan& s = c->plan.sequences.at(0);
  ASSERT_EQ(s.quantizers.size(), 4u);
  const auto fakes = launches_of(c->plan, s, "fake_quantize");
  ASSERT_EQ(fakes.size(), 4u);
  std::vector<std::string> names;
  for (const Step* step : fakes) {
    const std::string q = quantizer_name(s, *step, "scale");
    names.push_back(q);
    EXPECT_EQ(quantizer_name(s, *step, "scale_inv"), q);
    EXPECT_EQ(quantizer_name(s, *step, "amax"), q) << "delayed scaling raises history slot 0";
    EXPECT_EQ(param(*step, "scale_inv").quantizer_value, plan::QuantizerValue::ScaleInv);
    const bool gradient = q.ends_with(".grad_input");
    EXPECT_EQ(step->phase, gradient ? ir::Phase::Backward : ir::Phase::Forward) << q;
    EXPECT_EQ(std::get<LaunchStep>(step->body).name_expression,
              gradient ? "opfuse::fake_quantize<__nv_bfloat16, __nv_fp8_e5m2>"
                       : "opfuse::fake_quantize<__nv_bfloat16, __nv_fp8_e4m3>");
  }
  EXPECT_EQ(names, (std::vector<std::string>{"both.output", "forward_only.output",
                                             "grad_only.grad_input", "both.grad_input"}));
  // grad_only's forward is the identity: its result views the buffer of its operand.
  const Step& forward_only = *fakes[1];
  const Buffer& read = s.buffers.at(size_t(param(forward_only, "x").buffers.at(0)));
  EXPECT_GE(read.alias_of, 0) << read.name;
  EXPECT_EQ(read.alias_of, param(*fakes[0], "y").buffers.at(0));
  // One end-of-step update covers the four quantizers.
  const auto updates = launches_of(c->plan, s, "update_scales");
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(param(*updates[0], "records").records, (std::vector<int>{0, 1, 2, 3}));
}

TEST(CodegenScaleQuantize, CurrentScalingMeasuresTheAmaxBeforeEachFakeQuantize) {
  const auto c = compile_scale_quantize("current");
  const SequencePlan& s = c->plan.sequences.at(0);
  const auto fakes = launches_of(c->plan, s, "fake_quantize");
  ASSERT_EQ(fakes.size(), 4u);
  for (const Step* step : fakes) {
    const int q = param(*step, "scale").quantizer;
    ASSERT_GE(step->index, 1);
    const Step& amax = s.steps[size_t(step->index - 1)];
    ASSERT_TRUE(std::holds_alternative<LaunchStep>(amax.body)) << amax.what;
    EXPECT_EQ(c->plan.find_kernel(std::get<LaunchStep>(amax.body).kernel)->template_name,
              "amax_reduce");
    EXPECT_EQ(param(amax, "amax").quantizer, q);
    EXPECT_EQ(param(amax, "scale_record").records, std::vector<int>{q}) << "derives the scale";
    EXPECT_EQ(param(amax, "x").buffers, param(*step, "x").buffers);
    EXPECT_EQ(param(*step, "amax").kind, plan::ParamKind::Null);
  }
  EXPECT_TRUE(launches_of(c->plan, s, "update_scales").empty());
}

TEST(CodegenScaleQuantize, Bf16QuantizeIsTheIdentityAndConstantScaleStillRuns) {
  const auto c = compile_scale_quantize("bf16");
  const SequencePlan& s = c->plan.sequences.at(0);
  EXPECT_TRUE(s.quantizers.empty());
  EXPECT_TRUE(launches_of(c->plan, s, "fake_quantize").empty());
  EXPECT_EQ(launches_of(c->plan, s, "constant_scale").size(), 2u);
  EXPECT_EQ(s.steps.size(), 2u);
  // The output y views the forward constant_scale's result through three aliases.
  const Step& forward = *launches_of(c->plan, s, "constant_scale")[0];
  const int scaled = param(forward, "y").buffers.at(0);
  for (const Buffer& b : s.buffers) {
    if (has_tag(b, plan::InterfaceKind::Output, "y")) {
      EXPECT_EQ(b.alias_of, scaled) << b.name;
    }
  }
}

TEST(CodegenScaleQuantize, EveryKernelCompilesWithNvrtcForSm90a) {
  std::map<std::string, jit::CompileRequest> requests;
  for (const std::string recipe : {"", "current", "bf16"}) {
    const auto c = compile_scale_quantize(recipe);
    for (const auto& k : c->plan.kernels) {
      jit::CompileRequest r;
      r.kernel_name = k.id;
      r.source = codegen::kernel_source(c->plan, k);
      r.name_expressions = {k.name_expression};
      r.arch = "sm_90a";
      requests.emplace(k.name_expression, std::move(r));
    }
  }
  std::vector<jit::CompileRequest> list;
  list.reserve(requests.size());
  for (auto& [expression, r] : requests) list.push_back(std::move(r));
  // constant_scale, fake_quantize e4m3 and e5m2, update_scales, amax_reduce.
  ASSERT_EQ(list.size(), 5u);
  const jit::CompileAllResult result = jit::compile_all(list, nullptr);
  ASSERT_EQ(result.kernels.size(), list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const jit::CompiledKernel& k = result.kernels[i];
    EXPECT_FALSE(k.is_ptx) << k.kernel_name;
    EXPECT_EQ(k.lowered_names.count(list[i].name_expressions[0]), 1u) << k.kernel_name;
    EXPECT_EQ(k.spill_store_bytes, 0) << k.kernel_name << " spills";
  }
}

// ---- errors -------------------------------------------------------------------------------------

TEST(CodegenErrors, ConstantScaleOfARowThatIsNotWholeVectorsIsReportedAtItsLocation) {
  SourceManager sources;
  const std::string text =
      "sequence s(x: bf16[t, 12]) -> (y: bf16[t, 12]) {\n  identity()\n  constant_scale(2.0)\n}\n";
  const ir::Program program = load_and_run_passes("ops.fuse", "", sources, text);
  try {
    codegen::build_plan(program, {"sm_90a", &sources});
    ADD_FAILURE() << "built";
  } catch (const codegen::CodegenError& e) {
    EXPECT_EQ(e.loc().line, 3u);
    EXPECT_NE(std::string(e.what()).find("constant_scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a multiple of 8"), std::string::npos) << e.what();
  }
}

TEST(CodegenErrors, FusedGroupWithoutAKernelShapeNamesItsPatternAndParts) {
  auto c = compile_example("mlp", "bf16");
  ir::Sequence s = c->program.sequences[0];
  // Fold layernorm and the fc1 linear into one group: no kernel runs a norm inside a GEMM.
  ir::Operation fused;
  fused.kind = ir::OpKind::Fused;
  fused.attrs = {{"pattern", std::string("norm_into_gemm")}};
  fused.parts = {s.ops[0], s.ops[1]};
  fused.operands = s.ops[0].operands;
  fused.results = s.ops[1].results;
  fused.instance = s.ops[0].instance;
  fused.loc = s.ops[0].loc;
  s.ops.erase(s.ops.begin(), s.ops.begin() + 2);
  s.ops.insert(s.ops.begin(), fused);
  try {
    codegen::build_plan(s, {"sm_90a", &c->sources});
    ADD_FAILURE() << "built";
  } catch (const codegen::CodegenError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'norm_into_gemm'"), std::string::npos) << what;
    EXPECT_NE(what.find("layernorm (layernorm_0), linear (fc1)"), std::string::npos) << what;
    EXPECT_EQ(e.loc().line, 14u);
  }
}

// ---- plan expressions ---------------------------------------------------------------------------

TEST(CodegenExpressions, KnownPartsFoldAndTheRestEvaluatesWithBindings) {
  using codegen::SymExpr;
  const SymExpr rows = SymExpr::symbol("batch") * SymExpr::symbol("seq");
  EXPECT_EQ((rows * 4096 * 2).text(), "batch * seq * 8192");
  EXPECT_EQ((SymExpr(3) * 5).value(), 15);
  EXPECT_EQ(codegen::ceil_div(rows * 128, 64).text(), "batch * seq * 2");
  EXPECT_EQ(codegen::ceil_div(130, 64).value(), 3);
  const SymExpr grid = codegen::min_of(codegen::ceil_div(rows, 64), 65535);
  EXPECT_EQ(grid.text(), "min(ceil_div(batch * seq, 64), 65535)");
  EXPECT_EQ(codegen::evaluate(grid.text(), {{"batch", 2}, {"seq", 100}}), 4);
  EXPECT_EQ(codegen::evaluate(grid.text(), {{"batch", 4096}, {"seq", 4096}}), 65535);
  EXPECT_EQ(codegen::evaluate("max(num_sms * 2, 7)", {{"num_sms", 3}}), 7);
  EXPECT_THROW(codegen::evaluate("tokens * 2", {}), std::invalid_argument);
  EXPECT_THROW(codegen::evaluate("ceil_div(4, 0)", {}), std::invalid_argument);
  EXPECT_THROW(codegen::evaluate("2 +", {}), std::invalid_argument);
}

TEST(CodegenPlan, JsonIsDeterministicAndHasNoAbsolutePaths) {
  const std::string first = codegen::plan_json_text(compile_example("rmsnorm_swiglu")->plan);
  const std::string second = codegen::plan_json_text(compile_example("rmsnorm_swiglu")->plan);
  EXPECT_EQ(first, second);
  EXPECT_EQ(first.find(test::source_path("")), std::string::npos);
  EXPECT_NE(first.find("\"source\": \"rmsnorm_swiglu.fuse\""), std::string::npos);
}

// ---- goldens ------------------------------------------------------------------------------------

std::string golden_dir(const std::string& example) {
  return test::source_path("tests/golden/codegen/" + example);
}

bool update_goldens() {
  const char* v = std::getenv("OPFUSE_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class CodegenGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CodegenGolden, PlanAndKernelsMatchTheGolden) {
  const auto c = compile_example(GetParam());
  const std::string dir = golden_dir(GetParam());
  std::map<std::string, std::string> files = {{"plan.json", codegen::plan_json_text(c->plan)}};
  for (const auto& k : c->plan.kernels)
    files["kernels/" + k.id + ".cu"] = codegen::kernel_source(c->plan, k);
  if (update_goldens()) {
    fs::remove_all(dir);
    fs::create_directories(dir + "/kernels");
    for (const auto& [name, text] : files) write_file(dir + "/" + name, text);
    return;
  }
  ASSERT_TRUE(fs::is_directory(dir))
      << "no goldens in " << dir << "; run scripts/update_goldens.sh";
  std::set<std::string> on_disk;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) on_disk.insert(fs::relative(e.path(), dir).generic_string());
  for (const auto& [name, text] : files) {
    EXPECT_TRUE(on_disk.erase(name)) << "missing golden " << dir << "/" << name;
    EXPECT_TRUE(test::read_text(dir + "/" + name) == text)
        << dir << "/" << name << " differs; scripts/update_goldens.sh regenerates it after a "
        << "deliberate change";
  }
  EXPECT_TRUE(on_disk.empty()) << "stale golden " << dir << "/" << *on_disk.begin();
}

INSTANTIATE_TEST_SUITE_P(DslExamples, CodegenGolden, ::testing::ValuesIn(examples()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(CodegenGoldens, EveryGoldenDirectoryBelongsToAnExample) {
  const auto names = examples();
  for (const auto& e : fs::directory_iterator(test::source_path("tests/golden/codegen"))) {
    EXPECT_TRUE(std::binary_search(names.begin(), names.end(), e.path().filename().string()))
        << e.path() << " has no dsl_examples/" << e.path().filename().string() << ".fuse";
  }
}

}  // namespace
}  // namespace opfuse
