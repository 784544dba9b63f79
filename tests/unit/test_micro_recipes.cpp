// mxfp8_block_scaling and nvfp4_block_scaling on the CPU (docs/language.md; note "Emulated
// micro-scaling" in docs/architecture.md): the recipes and their specs by role and GEMM, the plan
// (one micro_scale_cast per copy, NVFP4's tensor-scale measurements, BF16 GEMMs over the decoded
// copies, the inference variant) and the CPU reference's casts against the oracle of
// runtime/cpu/micro_scaling.h. The numerics of one block are test_micro_scaling.cpp's; the GPU's
// kernels against the oracle are test_micro_scale_gpu.cpp's.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/plan.h"
#include "cpu/micro_scaling.h"
#include "cpu/numerics.h"
#include "driver/compile.h"
#include "gpu/binding_check.h"
#include "opfuse/error.h"
#include "plan/gemm_caps.h"
#include "plan/plan.h"
#include "plan/quant_spec.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "support/diagnostics.h"

namespace opfuse {
namespace {

using plan::ScalingKind;

constexpr const char* kMlp = R"(
recipe mx = mxfp8_block_scaling()
recipe mx_hybrid = mxfp8_block_scaling(format = hybrid)
recipe fp4 = nvfp4_block_scaling(seed = 77)
recipe fp4_plain = nvfp4_block_scaling(rht = false, stochastic_rounding = false, w_2d = false)
recipe plain = bf16()
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses mx {
  layernorm(256)
  linear(256, 384, bias = true) as fc1
  gelu()
  linear(384, 256, bias = false) as fc2
}
)";

// One linear: its fprop, dgrad and wgrad recomputed from the oracle.
constexpr const char* kOne = R"(
recipe mx = mxfp8_block_scaling()
recipe fp4 = nvfp4_block_scaling(seed = 5)
recipe plain = bf16()
sequence one(x: bf16[tokens, 256]) -> (y: bf16[tokens, 128]) uses mx {
  linear(256, 128, bias = false) as fc
}
)";

driver::CompileResult compile(const std::string& recipe, const char* text = kMlp) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.recipe = recipe;
  options.last_stage = driver::Stage::Plan;
  return driver::compile_source(text == kOne ? "one.fuse" : "mlp.fuse", text, sources, diags,
                                options);
}

const plan::QuantizerPlan* find(const plan::SequencePlan& s, std::string_view name) {
  for (const plan::QuantizerPlan& q : s.quantizers)
    if (q.name == name) return &q;
  return nullptr;
}
// Why string_view: a reference parameter bound to a temporary string makes GCC 13's
// -Wdangling-reference warn at every `const QuantizerPlan& q = quantizer(s, "...")`.
const plan::QuantizerPlan& quantizer(const plan::SequencePlan& s, std::string_view name) {
  const plan::QuantizerPlan* q = find(s, name);
  if (q == nullptr) throw std::runtime_error("no quantizer " + std::string(name));
  return *q;
}

std::vector<const plan::LaunchStep*> launches(const plan::Plan& p, const std::string& name) {
  std::vector<const plan::LaunchStep*> out;
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* l = std::get_if<plan::LaunchStep>(&step.body))
      if (p.find_kernel(l->kernel)->template_name == name) out.push_back(l);
  return out;
}

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = cpu::bf16_to_float(cpu::float_to_bf16(x));
  return v;
}

TEST(MicroRecipes, Mxfp8GivesEveryOperand32ElementBlocksWithE8m0Scales) {
  const driver::CompileResult r = compile("");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  const plan::SequencePlan& s = r.plan.sequences.at(0);
  EXPECT_EQ(s.recipe, "mxfp8_block_scaling(format = e4m3)");
  for (const char* name : {"fc1.input", "fc1.weight", "fc1.grad_output", "fc2.grad_output"}) {
    const plan::QuantizerPlan& q = quantizer(s, name);
    EXPECT_EQ(q.spec.scaling, ScalingKind::MicroScaled) << name;
    EXPECT_EQ(q.spec.block, (plan::BlockShape{1, 32})) << name;
    EXPECT_EQ(q.spec.scale_dtype, plan::ScaleDType::E8M0) << name;
    EXPECT_EQ(q.spec.format, plan::DType::E4M3) << name;
    EXPECT_TRUE(q.usages.rowwise && q.usages.columnwise) << name << ": one quantizer, two copies";
    EXPECT_EQ(q.columnwise_layout, plan::CopyLayout::AsIs) << name;
  }
  const driver::CompileResult h = compile("mx_hybrid");
  ASSERT_EQ(h.status, driver::CompileStatus::Ok) << h.error;
  EXPECT_EQ(quantizer(h.plan.sequences.at(0), "fc2.grad_output").spec.format, plan::DType::E5M2);
  EXPECT_EQ(quantizer(h.plan.sequences.at(0), "fc2.input").spec.format, plan::DType::E4M3);
}

// NVFP4: 16-element blocks (weights 16 x 16), E4M3 block scales; the wgrad copies of inputs and
// gradients are Hadamard-transformed, so they get quantizers of their own (their tensor scale is
// the transformed values' amax), named by the GEMM; gradients round stochastically.
TEST(MicroRecipes, Nvfp4SplitsTheHadamardCopiesIntoQuantizersOfTheirOwn) {
  const driver::CompileResult r = compile("fp4");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  const plan::SequencePlan& s = r.plan.sequences.at(0);
  EXPECT_EQ(s.recipe,
            "nvfp4_block_scaling(rht = true, stochastic_rounding = true, w_2d = true, seed = 77)");
  const plan::QuantizerPlan& x = quantizer(s, "fc1.input");
  EXPECT_EQ(x.spec.format, plan::DType::E2M1);
  EXPECT_EQ(x.spec.block, (plan::BlockShape{1, 16}));
  EXPECT_EQ(x.spec.scale_dtype, plan::ScaleDType::E4M3);
  EXPECT_TRUE(x.usages.rowwise && !x.usages.columnwise);
  EXPECT_FALSE(x.spec.rht || x.spec.stochastic_rounding);
  const plan::QuantizerPlan& xt = quantizer(s, "fc1.input.wgrad");
  EXPECT_TRUE(!xt.usages.rowwise && xt.usages.columnwise);
  EXPECT_TRUE(xt.spec.rht);
  EXPECT_FALSE(xt.spec.stochastic_rounding);
  const plan::QuantizerPlan& w = quantizer(s, "fc1.weight");
  EXPECT_EQ(w.spec.block, (plan::BlockShape{16, 16}));
  EXPECT_TRUE(w.usages.rowwise && w.usages.columnwise) << "no transform on dgrad's copy";
  const plan::QuantizerPlan& dy = quantizer(s, "fc2.grad_output");
  EXPECT_TRUE(dy.spec.stochastic_rounding && !dy.spec.rht);
  EXPECT_EQ(dy.spec.seed, 77u);
  const plan::QuantizerPlan& dyt = quantizer(s, "fc2.grad_output.wgrad");
  EXPECT_TRUE(dyt.spec.stochastic_rounding && dyt.spec.rht);
  EXPECT_EQ(s.quantizers.size(), 10u) << "x, x^T, W, dy, dy^T of two linears";

  const driver::CompileResult p = compile("fp4_plain");
  ASSERT_EQ(p.status, driver::CompileStatus::Ok) << p.error;
  const plan::SequencePlan& ps = p.plan.sequences.at(0);
  EXPECT_EQ(ps.quantizers.size(), 6u) << "without the transform each tensor has one quantizer";
  EXPECT_EQ(quantizer(ps, "fc1.weight").spec.block, (plan::BlockShape{1, 16}));
  EXPECT_FALSE(quantizer(ps, "fc1.grad_output").spec.stochastic_rounding);
  EXPECT_EQ(find(ps, "fc1.input.wgrad"), nullptr);
}

// Hopper runs no MXFP8 / NVFP4 GEMM: each copy is one micro_scale_cast writing the decoded
// values, and the six GEMMs are BF16 GEMMs over them (no scale pointers).
TEST(MicroRecipes, TheGemmsReadDecodedCopiesInBf16) {
  for (const char* recipe : {"", "fp4"}) {
    const driver::CompileResult r = compile(recipe);
    ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    const plan::SequencePlan& s = r.plan.sequences.at(0);
    // 2 linears x 3 operands x 2 copies; under MXFP8 the norm writes fc1's input row-wise copy,
    // the GELU fc2's and the GELU's backward fc1's gradient's.
    EXPECT_EQ(launches(r.plan, "micro_scale_cast").size(), recipe[0] == 0 ? 9u : 12u) << recipe;
    EXPECT_EQ(launches(r.plan, "activation_micro_bwd").size(), recipe[0] == 0 ? 1u : 0u) << recipe;
    EXPECT_EQ(launches(r.plan, "layernorm_micro_fwd").size(), recipe[0] == 0 ? 1u : 0u) << recipe;
    EXPECT_EQ(launches(r.plan, "activation_micro_fwd").size(), recipe[0] == 0 ? 1u : 0u) << recipe;
    EXPECT_TRUE(launches(r.plan, "cast_transpose").empty()) << recipe;
    EXPECT_TRUE(launches(r.plan, "block_cast_transpose").empty()) << recipe;
    size_t gemms = 0;
    for (const plan::Step& step : s.steps) {
      const auto* g = std::get_if<plan::GemmStep>(&step.body);
      if (g == nullptr) continue;
      ++gemms;
      for (const plan::GemmOperand* o : {&g->a, &g->b}) {
        EXPECT_EQ(o->dtype, plan::DType::BF16) << recipe << ": " << step.what;
        EXPECT_LT(o->scale_inv.quantizer, 0) << step.what;
        EXPECT_LT(o->scale_inv.buffer, 0) << step.what;
      }
    }
    EXPECT_EQ(gemms, 6u) << recipe;
  }
  const driver::CompileResult mx = compile("");
  EXPECT_TRUE(launches(mx.plan, "amax_reduce").empty()) << "MXFP8 keeps no tensor scale";
  EXPECT_TRUE(launches(mx.plan, "update_scales").empty());
  // NVFP4: the tensor scales of the two transformed copies per linear come from the Hadamard
  // amax kernel; the others are measured by their producer or an amax_reduce, once per tensor.
  const driver::CompileResult fp4 = compile("fp4");
  EXPECT_EQ(launches(fp4.plan, "micro_scale_rht_amax").size(), 4u);
  // One measurement per tensor scale: the weights' two copies share theirs (two amax_reduce
  // launches, fc1.weight and fc2.weight; the inputs' and gradients' row-wise scales are measured
  // by their producers or an amax_reduce of their own).
  size_t weight_amaxes = 0;
  for (const plan::Step& step : fp4.plan.sequences.at(0).steps)
    weight_amaxes +=
        step.what.find("amax of bf16 and the scale of quantizer fc1.weight") != std::string::npos ||
        step.what.find("amax of bf16 and the scale of quantizer fc2.weight") != std::string::npos;
  EXPECT_EQ(weight_amaxes, 2u);
  for (const plan::LaunchStep* l : launches(fp4.plan, "micro_scale_cast")) {
    for (const plan::ParamBinding& p : l->params) {
      if (p.field == "tensor_scale") {
        EXPECT_EQ(p.kind, plan::ParamKind::Quantizer);
        EXPECT_EQ(p.quantizer_value, plan::QuantizerValue::Scale);
      }
      if (p.field == "codes" || p.field == "scales") {
        EXPECT_EQ(p.kind, plan::ParamKind::Null);
      }
    }
  }
}

// The stochastic-rounding step is the quantizer's measurement count; the seed and a stream per
// quantizer and copy are the kernel's arguments.
TEST(MicroRecipes, StochasticRoundingBindsTheSeedStreamAndMeasurementCount) {
  const driver::CompileResult r = compile("fp4");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  const plan::SequencePlan& s = r.plan.sequences.at(0);
  size_t stochastic = 0;
  for (const plan::LaunchStep* l : launches(r.plan, "micro_scale_cast")) {
    int quantizer = -1;
    const plan::ParamBinding* step = nullptr;
    const plan::ParamBinding* seed = nullptr;
    const plan::ParamBinding* stream = nullptr;
    for (const plan::ParamBinding& p : l->params) {
      if (p.field == "tensor_scale") quantizer = p.quantizer;
      if (p.field == "step") step = &p;
      if (p.field == "seed") seed = &p;
      if (p.field == "stream") stream = &p;
    }
    ASSERT_GE(quantizer, 0);
    ASSERT_TRUE(step && seed && stream);
    const plan::QuantSpec& spec = s.quantizers.at(size_t(quantizer)).spec;
    if (!spec.stochastic_rounding) {
      EXPECT_EQ(step->kind, plan::ParamKind::Null);
      continue;
    }
    ++stochastic;
    EXPECT_EQ(step->quantizer_value, plan::QuantizerValue::Measurements);
    EXPECT_EQ(step->quantizer, quantizer);
    EXPECT_EQ(seed->int_value.value(), 77);
    const bool columnwise = l->name_expression.find(", 2, true,") != std::string::npos;
    EXPECT_EQ(stream->int_value.value(), 2 * quantizer + (columnwise ? 1 : 0))
        << l->name_expression;
  }
  EXPECT_EQ(stochastic, 4u) << "dy and dy^T of two linears";
}

// An inference forward makes no column-wise copy: those casts run with an empty grid.
TEST(MicroRecipes, TheInferenceVariantMakesNoColumnwiseCopy) {
  const driver::CompileResult r = compile("");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  size_t dropped = 0;
  for (const plan::Step& step : r.plan.sequences.at(0).steps) {
    if (!step.inference) continue;
    const plan::LaunchStep& launch = step.inference->launch;
    if (r.plan.find_kernel(launch.kernel)->template_name != "micro_scale_cast") continue;
    ++dropped;
    EXPECT_EQ(launch.grid.x.value(), 0) << step.what;
    EXPECT_TRUE(step.inference->writes.empty()) << step.what;
  }
  EXPECT_EQ(dropped, 2u) << "x^T of fc1 and fc2 (the weights' copies are cached instead)";
}

// Pattern norm_micro_cast: under MXFP8 the norm kernel writes fc1's decoded 1x32 row-wise input
// copy (the operand of fc1's fprop GEMM) and, for the column-wise copy's cast, its own output; the
// inference variant writes the decoded copy only. The E5M2 of a hybrid recipe is the gradients'.
TEST(MicroRecipes, TheNormWritesTheDecodedRowwiseCopy) {
  for (const char* recipe : {"", "mx_hybrid"}) {
    const driver::CompileResult r = compile(recipe);
    ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    const plan::SequencePlan& s = r.plan.sequences.at(0);
    const std::vector<const plan::LaunchStep*> norms = launches(r.plan, "layernorm_micro_fwd");
    ASSERT_EQ(norms.size(), 1u) << recipe;
    EXPECT_EQ(norms[0]->name_expression,
              "opfuse::layernorm_micro_fwd<__nv_bfloat16, 0, 256, false, true>");
    auto bound = [&](const plan::LaunchStep& l, std::string_view field) {
      for (const plan::ParamBinding& p : l.params)
        if (p.field == field) return p.kind == plan::ParamKind::Buffer ? p.buffers.at(0) : -1;
      return -2;
    };
    const int copy = bound(*norms[0], "y"), output = bound(*norms[0], "y_hp");
    ASSERT_GE(copy, 0);
    ASSERT_GE(output, 0);
    EXPECT_NE(copy, output);
    const plan::Step* norm_step = nullptr;
    bool fprop_reads_copy = false, columnwise_reads_output = false;
    for (const plan::Step& step : s.steps) {
      if (std::holds_alternative<plan::GemmStep>(step.body)) {
        if (step.what.find("fprop GEMM of fc1") != std::string::npos)
          fprop_reads_copy =
              std::find(step.reads.begin(), step.reads.end(), copy) != step.reads.end();
        continue;
      }
      const auto& l = std::get<plan::LaunchStep>(step.body);
      if (&l == norms[0]) norm_step = &step;
      if (r.plan.find_kernel(l.kernel)->template_name == "micro_scale_cast" &&
          bound(l, "x") == output) {
        EXPECT_NE(l.name_expression.find(", true,"), std::string::npos)
            << "only the column-wise cast reads the norm's output: " << l.name_expression;
        columnwise_reads_output = true;
      }
    }
    EXPECT_TRUE(fprop_reads_copy) << recipe;
    EXPECT_TRUE(columnwise_reads_output) << recipe;
    ASSERT_NE(norm_step, nullptr);
    ASSERT_TRUE(norm_step->inference.has_value());
    EXPECT_EQ(norm_step->inference->launch.name_expression,
              "opfuse::layernorm_micro_fwd<__nv_bfloat16, 0, 256, false, false>");
    const std::vector<int>& writes = norm_step->inference->writes;
    EXPECT_NE(std::find(writes.begin(), writes.end(), copy), writes.end());
    EXPECT_EQ(std::find(writes.begin(), writes.end(), output), writes.end());
  }
  const driver::CompileResult fp4 = compile("fp4");
  ASSERT_EQ(fp4.status, driver::CompileStatus::Ok) << fp4.error;
  EXPECT_TRUE(launches(fp4.plan, "layernorm_micro_fwd").empty()) << "NVFP4 needs the amax first";
  EXPECT_EQ(launches(fp4.plan, "layernorm_fwd").size(), 1u);
}

// NVFP4's Hadamard-transformed copies are wgrad's: an inference forward makes none, so it measures
// no amax for them either (the micro_scale_rht_amax launches of the forward get an empty-grid
// variant). The backward's (the gradients' transformed copies) have no variant.
TEST(MicroRecipes, TheInferenceForwardLaunchesNoHadamardAmax) {
  const driver::CompileResult r = compile("fp4");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  size_t forward_amaxes = 0, backward_amaxes = 0, inference_runs = 0;
  for (const plan::Step& step : r.plan.sequences.at(0).steps) {
    const auto* launch = std::get_if<plan::LaunchStep>(&step.body);
    if (launch == nullptr) continue;
    const bool rht_amax =
        r.plan.find_kernel(launch->kernel)->template_name == "micro_scale_rht_amax";
    if (step.phase == plan::Phase::Backward) {
      backward_amaxes += rht_amax;
      if (rht_amax) {
        EXPECT_FALSE(step.inference.has_value()) << step.what;
      }
      continue;
    }
    // What an inference forward runs: the variant where the step has one (an empty grid runs
    // nothing), else the launch itself.
    const plan::LaunchStep& runs = step.inference ? step.inference->launch : *launch;
    const bool launched = runs.grid.x.value() != std::optional<int64_t>(0);
    if (rht_amax) {
      ++forward_amaxes;
      EXPECT_FALSE(launched) << step.what;
      EXPECT_TRUE(step.inference.has_value()) << step.what;
    }
    inference_runs +=
        launched && r.plan.find_kernel(runs.kernel)->template_name == "micro_scale_rht_amax";
  }
  EXPECT_EQ(forward_amaxes, 2u) << "x^T of fc1 and fc2";
  EXPECT_EQ(backward_amaxes, 2u) << "dy^T of fc1 and fc2";
  EXPECT_EQ(inference_runs, 0u);
  // Without the transform no such launch exists at all.
  const driver::CompileResult plain = compile("fp4_plain");
  ASSERT_EQ(plain.status, driver::CompileStatus::Ok) << plain.error;
  EXPECT_TRUE(launches(plain.plan, "micro_scale_rht_amax").empty());
}

// Note "Block summaries": each decoded copy's buffer names its quantizer and copy (plan.json's
// `emulates`), which the one launch writing it casts (its Philox stream is 2 * quantizer +
// column-wise); the field survives plan.json.
TEST(MicroRecipes, EveryDecodedCopyNamesItsQuantizerAndCopy) {
  for (const std::string recipe : {"", "fp4"}) {
    const driver::CompileResult r = compile(recipe);
    ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    const plan::SequencePlan& s = r.plan.sequences.at(0);
    size_t copies = 0;
    for (const plan::Buffer& b : s.buffers) {
      if (b.emulated_quantizer < 0) continue;
      ++copies;
      const bool columnwise = b.usage == plan::CopyUsage::Columnwise;
      std::vector<const plan::Step*> writers;
      for (const plan::Step& step : s.steps)
        if (std::find(step.writes.begin(), step.writes.end(), b.id) != step.writes.end())
          writers.push_back(&step);
      ASSERT_EQ(writers.size(), 1u) << b.name;
      const auto& launch = std::get<plan::LaunchStep>(writers[0]->body);
      // Under MXFP8 the producers write three row-wise copies: the norm fc1's input's (pattern
      // norm_micro_cast), the GELU fc2's (activation_micro_cast), its backward fc1's gradient's
      // (dact_micro_cast).
      const std::string& writer = r.plan.find_kernel(launch.kernel)->template_name;
      if (recipe.empty() && !columnwise) {
        const int q = b.emulated_quantizer;
        const std::string producer = q == quantizer(s, "fc1.input").index   ? "layernorm_micro_fwd"
                                     : q == quantizer(s, "fc2.input").index ? "activation_micro_fwd"
                                     : q == quantizer(s, "fc1.grad_output").index
                                         ? "activation_micro_bwd"
                                         : "";
        if (!producer.empty()) {
          EXPECT_EQ(writer, producer) << b.name;
          continue;
        }
      }
      EXPECT_EQ(writer, "micro_scale_cast") << b.name;
      for (const plan::ParamBinding& p : launch.params) {
        if (p.field == "stream") {
          EXPECT_EQ(p.int_value.value(), 2 * b.emulated_quantizer + (columnwise ? 1 : 0)) << b.name;
        }
      }
    }
    // Two linears, each with an input, a weight and a grad_output copied both ways.
    EXPECT_EQ(copies, 12u) << recipe;
    const plan::Plan back = plan::plan_from_json(plan::plan_to_json(r.plan));
    for (size_t i = 0; i < s.buffers.size(); ++i) {
      EXPECT_EQ(back.sequences.at(0).buffers.at(i).emulated_quantizer,
                s.buffers[i].emulated_quantizer);
      if (s.buffers[i].emulated_quantizer >= 0) {
        EXPECT_EQ(back.sequences.at(0).buffers.at(i).usage, s.buffers[i].usage);
      }
    }
  }
}

// The CPU reference's fprop, dgrad and wgrad are BF16 GEMMs over the oracle's decoded copies.
TEST(MicroRecipes, TheReferenceGemmsReadTheOraclesDecodedCopies) {
  constexpr int64_t kTokens = 64;
  for (const char* recipe : {"", "fp4"}) {
    const driver::CompileResult r = compile(recipe, kOne);
    ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    cpu::ReferenceExecutor<float> ref(r.program.sequences.at(0), {{"tokens", kTokens}});
    cpu::init_params_from_seed(ref, 11);
    cpu::Tensor<float> x = cpu::seeded_normal({kTokens, 256}, 5, 1.0);
    x.data = bf16_rounded(x.data);
    const std::vector<cpu::Tensor<float>> y = ref.forward({x});
    const std::vector<float> w = ref.param("fc.weight").data;
    const bool fp4 = std::string(recipe) == "fp4";
    auto amax = [](const std::vector<float>& v) {
      float m = 0;
      for (float f : v) m = std::fmax(m, std::fabs(f));
      return m;
    };
    cpu::Nvfp4Params weight_params;
    weight_params.two_d = true;
    const std::vector<float> qx = bf16_rounded(
        fp4 ? cpu::nvfp4_fake_quantize(x.data, kTokens, 256, cpu::nvfp4_tensor_scale(amax(x.data)),
                                       {})
            : cpu::mxfp8_fake_quantize(x.data, kTokens, 256, cpu::Fp8Format::E4M3, false));
    const std::vector<float> qw = bf16_rounded(
        fp4 ? cpu::nvfp4_fake_quantize(w, 128, 256, cpu::nvfp4_tensor_scale(amax(w)), weight_params)
            : cpu::mxfp8_fake_quantize(w, 128, 256, cpu::Fp8Format::E4M3, false));
    double worst = 0;
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int64_t n = 0; n < 128; ++n) {
        double want = 0, scale = 0;
        for (int64_t k = 0; k < 256; ++k) {
          want += double(qx[size_t(t * 256 + k)]) * qw[size_t(n * 256 + k)];
          scale += std::fabs(double(qx[size_t(t * 256 + k)]) * qw[size_t(n * 256 + k)]);
        }
        // y is the fp32 sum in some order, rounded to bf16: within a bf16 ulp of the exact sum.
        const double got = y.at(0).data[size_t(t * 128 + n)];
        worst = std::max(worst, std::fabs(got - want) / (std::fabs(want) * 0x1p-8 + scale * 1e-6));
      }
    }
    EXPECT_LE(worst, 1.0) << (fp4 ? "nvfp4" : "mxfp8");
  }
}

// What each format costs against BF16 on one training step of the MLP (reference): the output,
// the input gradient and a weight gradient within bounds that a wrong cast (an untransformed
// operand against a transformed one, a copy left undecoded) exceeds.
TEST(MicroRecipes, OneTrainingStepStaysCloseToBf16) {
  constexpr int64_t kTokens = 64;
  const cpu::Bindings bindings{{"tokens", kTokens}};
  cpu::Tensor<float> x = cpu::seeded_normal({kTokens, 256}, 3, 1.0);
  x.data = bf16_rounded(x.data);
  cpu::Tensor<float> dy = cpu::seeded_normal({kTokens, 256}, 4, 1.0);
  dy.data = bf16_rounded(dy.data);
  struct Result {
    std::vector<float> y, dx, dw;
  };
  auto run = [&](const std::string& recipe) {
    const driver::CompileResult r = compile(recipe);
    EXPECT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    cpu::ReferenceExecutor<float> ref(r.program.sequences.at(0), bindings);
    cpu::init_params_from_seed(ref, 21);
    Result out;
    out.y = ref.forward({x}).at(0).data;
    const cpu::Gradients<float> g = ref.backward({dy});
    out.dx = g.inputs.at(0).data;
    const std::vector<std::string> names = ref.param_names();
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == "fc1.weight") out.dw = g.params.at(i).data;
    return out;
  };
  auto error = [](const std::vector<float>& got, const std::vector<float>& want) {
    double e = 0, n = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      n += double(want[i]) * want[i];
    }
    return std::sqrt(e / n);
  };
  const Result bf16 = run("plain");
  for (const auto& [recipe, bound] :
       std::vector<std::pair<std::string, double>>{{"", 0.08}, {"fp4", 0.35}}) {
    const Result q = run(recipe);
    const double ey = error(q.y, bf16.y), edx = error(q.dx, bf16.dx), edw = error(q.dw, bf16.dw);
    std::cout << "[ errors   ] " << (recipe.empty() ? "mxfp8" : "nvfp4") << " vs bf16: y " << ey
              << ", dx " << edx << ", dW(fc1) " << edw << "\n";
    EXPECT_GT(ey, 0.0) << recipe << ": the casts must change something";
    EXPECT_LT(ey, bound) << recipe;
    EXPECT_LT(edx, bound) << recipe;
    EXPECT_LT(edw, bound) << recipe;
  }
}

// The tokens a column-wise copy's blocks run down must be whole blocks: refused when bound, before
// anything runs, naming the step and the multiple (32 for MXFP8, 16 for NVFP4).
TEST(MicroRecipes, BoundTokensMustFillTheColumnwiseBlocks) {
  auto error_for = [](const std::string& recipe, int64_t tokens) -> std::string {
    const driver::CompileResult r = compile(recipe);
    EXPECT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    try {
      (void)gpu::check_binding(r.plan.sequences.at(0), {{"tokens", tokens}},
                               plan::gemm_caps("sm_90a"), 132);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_for("", 64), "");
  const std::string mx = error_for("", 48);
  EXPECT_NE(mx.find("MXFP8 column-wise copy"), std::string::npos) << mx;
  EXPECT_NE(mx.find("its rows tokens = 48 are not a multiple of 32"), std::string::npos) << mx;
  EXPECT_EQ(error_for("fp4", 48), "");
  const std::string fp4 = error_for("fp4", 40);
  EXPECT_NE(fp4.find("are not a multiple of 16"), std::string::npos) << fp4;
}

// `with fp8_weights` keeps no FP8 weight under an emulated recipe (a warning, as under bf16), so
// a program written for FP8 weights still runs under --recipe mx.
TEST(MicroRecipes, Fp8WeightsHaveNoEffectUnderAnEmulatedRecipe) {
  constexpr const char* kWeights = R"(
recipe mx = mxfp8_block_scaling()
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses mx with fp8_weights {
  linear(64, 64)
}
)";
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Plan;
  const driver::CompileResult r =
      driver::compile_source("w.fuse", kWeights, sources, diags, options);
  ASSERT_TRUE(r.ok()) << r.error << diags.format_all();
  EXPECT_FALSE(r.plan.sequences.at(0).fp8_weights);
  // Never a silent change of what the GEMMs compute: the compile says the recipe is emulated.
  EXPECT_NE(diags.format_all().find("note: sequence 's' runs mxfp8_block_scaling emulated on "
                                    "sm_90a: each GEMM operand is quantized to the format and "
                                    "decoded to its own dtype"),
            std::string::npos)
      << diags.format_all();
  EXPECT_NE(diags.format_all().find("w.fuse:3:71: warning: fp8_weights has no effect: sequence "
                                    "'s' uses mxfp8_block_scaling"),
            std::string::npos)
      << diags.format_all();
}

// Stochastic rounding draws fresh bits at every cast: the step is the tensor-scale measurement
// count, so two backward passes over the same gradient round it differently; without it they
// are identical.
TEST(MicroRecipes, StochasticRoundingDrawsFreshBitsAtEveryCast) {
  constexpr int64_t kTokens = 32;
  cpu::Tensor<float> x = cpu::seeded_normal({kTokens, 256}, 8, 1.0);
  x.data = bf16_rounded(x.data);
  cpu::Tensor<float> dy = cpu::seeded_normal({kTokens, 256}, 9, 1.0);
  dy.data = bf16_rounded(dy.data);
  for (const char* recipe : {"fp4", "fp4_plain"}) {
    const driver::CompileResult r = compile(recipe);
    ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    cpu::ReferenceExecutor<float> ref(r.program.sequences.at(0), {{"tokens", kTokens}});
    cpu::init_params_from_seed(ref, 2);
    (void)ref.forward({x});
    const std::vector<float> first = ref.backward({dy}).inputs.at(0).data;
    (void)ref.forward({x});
    const std::vector<float> second = ref.backward({dy}).inputs.at(0).data;
    const bool stochastic = std::string(recipe) == "fp4";
    EXPECT_EQ(first != second, stochastic) << recipe;
    // Every tensor scale was measured: the amax of its tensor, S_enc = 2688 / amax.
    for (const cpu::QuantizerInfo& q : ref.quantizers()) {
      ASSERT_EQ(q.amax_history.size(), 1u) << q.name;
      EXPECT_GT(q.amax_history[0], 0.0f) << recipe << " " << q.name;
      EXPECT_EQ(q.scale, cpu::nvfp4_tensor_scale(q.amax_history[0])) << q.name;
    }
  }
}

}  // namespace
}  // namespace opfuse
