// Declared fusions (docs/language.md, "Declared fusions"): `fusion NAME(phase, priority) { ... }`
// in a .fuse file and CompileOptions::fusions in the embedding API, applied by the fuse passes
// beside the built-in patterns by priority, and lowered by the kernel shape their ops select
// (compiler/ir/kernel_shapes.h); TE's ForwardAxpy (constant_scale + add_extra_input) as one
// bias_add kernel that writes exactly what the two ops would.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../runtime/jit/nvrtc_compiler.h"
#include "codegen/kernel_source.h"
#include "codegen/plan.h"
#include "cpu/numerics.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "ir/kernel_shapes.h"
#include "ir/printer.h"
#include "opfuse/error.h"
#include "opfuse/program.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse {
namespace {

using ir::OpKind;

// `body` inside a sequence over bf16[tokens, 64] with an extra input r, under `recipe`.
std::string program_text(const std::string& decls, const std::string& body,
                         const std::string& recipe = "bf16()") {
  return fmt::format(
      "{}recipe r0 = {}\n"
      "sequence s(x: bf16[tokens, 64], r: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses r0 {{\n"
      "{}}}\n",
      decls, recipe, body);
}

struct Compiled {
  SourceManager sources;
  ir::Program program;
  std::string errors;
  bool ok = false;
};

std::unique_ptr<Compiled> compile(const std::string& text, driver::Stage stage,
                                  ExtraSources extra = {}, std::set<std::string> disabled = {}) {
  auto c = std::make_unique<Compiled>();
  DiagnosticEngine diags(c->sources);
  driver::CompileOptions options;
  options.last_stage = stage;
  options.extra_sources = std::move(extra);
  options.disabled_passes = std::move(disabled);
  driver::CompileResult result =
      driver::compile_source("main.fuse", text, c->sources, diags, options);
  c->ok = result.ok();
  c->errors = diags.format_all() + result.error;
  c->program = std::move(result.program);
  return c;
}

std::vector<const ir::Operation*> fused_ops(const ir::Sequence& s, const std::string& pattern) {
  std::vector<const ir::Operation*> out;
  for (const ir::Operation& op : s.ops)
    if (op.kind == OpKind::Fused && ir::attr_name(op.attrs, "pattern") == pattern)
      out.push_back(&op);
  return out;
}

constexpr const char* kAxpy = "fusion axpy { constant_scale; add_extra_input }\n";
constexpr const char* kAxpyBody = "  constant_scale(0.375)\n  add_extra_input(r)\n";

TEST(DeclaredFusions, TheDeclarationIsInTheProgramAsWritten) {
  const auto c = compile(program_text("op twice(x) = 2 * x\n"
                                      "fusion axpy { constant_scale; add_extra_input }\n"
                                      "fusion late(phase = backward, priority = -3) {\n"
                                      "  gelu\n  bias?; cast_fp8\n}\n"
                                      "fusion mine(priority = 7) { twice; cast_fp8 }\n",
                                      kAxpyBody),
                         driver::Stage::FrontEnd);
  ASSERT_TRUE(c->ok) << c->errors;
  const auto& f = c->program.fusions;
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(ir::print_fusion(f[0]),
            "fusion axpy(phase = forward, priority = 1) { constant_scale; add_extra_input }");
  // A forward op's name in a backward fusion is the op its backward runs as.
  EXPECT_EQ(f[1].phase, ir::Phase::Backward);
  EXPECT_EQ(f[1].priority, -3);
  ASSERT_EQ(f[1].steps.size(), 3u);
  EXPECT_TRUE(ir::is_pointwise_backward(f[1].steps[0].kind));
  EXPECT_EQ(f[1].steps[1].kind, OpKind::BiasGrad);
  EXPECT_TRUE(f[1].steps[1].optional);
  EXPECT_EQ(f[1].steps[2].kind, OpKind::CastFp8);
  EXPECT_EQ(f[2].steps[0].user_op, "twice");
  EXPECT_TRUE(ir::is_pointwise(f[2].steps[0].kind));
  // fusec ir prints them with the program.
  EXPECT_TRUE(test::contains(ir::print_program(c->program, &c->sources),
                             "fusion mine(phase = forward, priority = 7) { twice; cast_fp8 }  "
                             "// main.fuse:7"));
}

TEST(DeclaredFusions, AxpyBecomesOneFusedOpOnlyWhenDeclared) {
  const auto declared = compile(program_text(kAxpy, kAxpyBody), driver::Stage::Passes);
  ASSERT_TRUE(declared->ok) << declared->errors;
  const ir::Sequence& s = declared->program.sequences.at(0);
  const auto fused = fused_ops(s, "axpy");
  ASSERT_EQ(fused.size(), 1u);
  ASSERT_EQ(fused[0]->parts.size(), 2u);
  EXPECT_EQ(fused[0]->parts[0].kind, OpKind::ConstantScale);
  EXPECT_EQ(fused[0]->parts[1].kind, OpKind::AddExtraInput);
  const auto plain = compile(program_text("", kAxpyBody), driver::Stage::Passes);
  ASSERT_TRUE(plain->ok) << plain->errors;
  for (const ir::Operation& op : plain->program.sequences.at(0).ops)
    EXPECT_NE(op.kind, OpKind::Fused) << "without the declaration nothing fuses here";
}

TEST(DeclaredFusions, AxpyRunsAsOneBiasAddKernelThatScalesAndCompiles) {
  const auto c = compile(program_text(kAxpy, kAxpyBody), driver::Stage::KernelRequests);
  ASSERT_TRUE(c->ok) << c->errors;
  SourceManager sources;
  const codegen::Plan plan =
      codegen::build_plan(compile(program_text(kAxpy, kAxpyBody), driver::Stage::Passes)->program,
                          {"sm_90a", &sources});
  const codegen::SequencePlan& s = plan.sequences.at(0);
  std::vector<const codegen::LaunchStep*> forward;
  for (const codegen::Step& step : s.steps) {
    const auto* launch = std::get_if<codegen::LaunchStep>(&step.body);
    if (launch != nullptr && step.phase == ir::Phase::Forward) forward.push_back(launch);
  }
  ASSERT_EQ(forward.size(), 1u) << "one kernel for the scale and the add";
  const auto* kernel = plan.find_kernel(forward[0]->kernel);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(kernel->template_name, "bias_add");
  double factor = 0;
  for (const auto& p : forward[0]->params)
    if (p.field == "factor") factor = p.float_value;
  EXPECT_EQ(factor, 0.375);
  jit::CompileRequest r;
  r.kernel_name = kernel->id;
  r.source = codegen::kernel_source(plan, *kernel);
  r.name_expressions = {kernel->name_expression};
  r.arch = "sm_90a";
  const jit::CompileAllResult compiled = jit::compile_all({r}, nullptr);
  ASSERT_EQ(compiled.kernels.size(), 1u);
  EXPECT_EQ(compiled.kernels[0].lowered_names.count(kernel->name_expression), 1u);
}

// The CPU reference runs a fused op's parts in order in fp32 and rounds only its results, as
// the bias_add kernel does: fused, y = bf16(0.375 * x + r) exactly; unfused, the scaled value is
// rounded to bf16 first, which changes some outputs by a rounding. The backward is the same.
TEST(DeclaredFusions, AxpyOnTheCpuReferenceRoundsOnceAndUnfusedWithinARounding) {
  auto run = [](const std::string& decls, std::vector<float>* x, std::vector<float>* r) {
    const auto c = compile(program_text(decls, kAxpyBody), driver::Stage::Passes);
    EXPECT_TRUE(c->ok) << c->errors;
    cpu::ReferenceExecutor<float> exec(c->program.sequences.at(0), {{"tokens", 32}});
    auto in = std::vector{cpu::seeded_normal(exec.input_shapes()[0], 1, 1.0),
                          cpu::seeded_normal(exec.input_shapes()[1], 2, 1.0)};
    cpu::round_to_bf16(in[0].data);
    cpu::round_to_bf16(in[1].data);
    if (x != nullptr) *x = in[0].data;
    if (r != nullptr) *r = in[1].data;
    std::vector<float> all = exec.forward(in)[0].data;
    const auto grads = exec.backward({cpu::seeded_normal(exec.output_shapes()[0], 3, 1e-2)});
    for (const auto& g : grads.inputs) all.insert(all.end(), g.data.begin(), g.data.end());
    return all;
  };
  std::vector<float> x, r;
  const std::vector<float> fused = run(kAxpy, &x, &r), unfused = run("", nullptr, nullptr);
  ASSERT_EQ(fused.size(), 3 * x.size());
  ASSERT_EQ(unfused.size(), fused.size());
  size_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<float> want = {0.375f * x[i] + r[i]};
    cpu::round_to_bf16(want);
    EXPECT_EQ(fused[i], want[0]) << i;
    differ += fused[i] != unfused[i] ? 1 : 0;
    EXPECT_NEAR(unfused[i], fused[i], 1e-2 * (std::abs(fused[i]) + 1)) << i;
  }
  EXPECT_GT(differ, 0u) << "the rounding of the scaled value must show somewhere";
  for (size_t i = x.size(); i < fused.size(); ++i) EXPECT_EQ(fused[i], unfused[i]) << i;
}

// Priority orders a declared fusion against the built-in patterns: above 0 it claims ops a
// built-in pattern would (activation_cast), below 0 the built-in claims them first.
TEST(DeclaredFusions, PriorityDecidesAgainstTheBuiltInPatterns) {
  const std::string recipe = "delayed_scaling(amax_history = 4)";
  const std::string body = "  linear(64, 128) as up\n  gelu()\n  linear(128, 64) as down\n";
  for (const auto& [priority, winner] :
       std::vector<std::pair<int, std::string>>{{5, "mine"}, {-5, "activation_cast"}}) {
    const auto c = compile(
        program_text(fmt::format("fusion mine(priority = {}) {{ gelu; cast_fp8 }}\n", priority),
                     body, recipe),
        driver::Stage::Passes);
    ASSERT_TRUE(c->ok) << c->errors;
    const ir::Sequence& s = c->program.sequences.at(0);
    EXPECT_EQ(fused_ops(s, winner).size(), 1u) << "priority " << priority;
  }
  // A backward fusion of the same ops claims the gradient's cast before dact_cast (up without a
  // bias: a bias gradient would read the activation's gradient too, which a chain cannot hold).
  const auto back = compile(
      program_text("fusion dmine(phase = backward, priority = 2) { gelu; cast_fp8 }\n",
                   "  linear(64, 128, bias = false) as up\n  gelu()\n  linear(128, 64) as down\n",
                   recipe),
      driver::Stage::Passes);
  ASSERT_TRUE(back->ok) << back->errors;
  const auto d = fused_ops(back->program.sequences.at(0), "dmine");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->phase, ir::Phase::Backward);
  EXPECT_TRUE(fused_ops(back->program.sequences.at(0), "dact_cast").empty());
  EXPECT_EQ(ir::print_fusion(back->program.fusions.at(0)),
            "fusion dmine(phase = backward, priority = 2) { gelu; cast_fp8 }");
}

// A step naming a user-defined op matches that op only, not another op of its carrier.
TEST(DeclaredFusions, AUserOpStepMatchesThatOpOnly) {
  const std::string recipe = "delayed_scaling(amax_history = 4)";
  const std::string decls =
      "op twice(x) = 2 * x\nop thrice(x) = 3 * x\n"
      "fusion mine(priority = 5) { twice; cast_fp8 }\n";
  auto count = [&](const std::string& act) {
    const auto c = compile(
        program_text(decls, "  linear(64, 64) as a\n  " + act + "()\n  linear(64, 64) as b\n",
                     recipe),
        driver::Stage::Passes, {}, {"compose-pointwise"});
    EXPECT_TRUE(c->ok) << c->errors;
    return fused_ops(c->program.sequences.at(0), "mine").size();
  };
  EXPECT_EQ(count("twice"), 1u);
  EXPECT_EQ(count("thrice"), 0u);
}

TEST(DeclaredFusions, KernelShapesFollowCodegensDispatch) {
  const std::vector<OpKind> axpy = {OpKind::ConstantScale, OpKind::AddExtraInput};
  ASSERT_NE(ir::select_kernel_shape(axpy), nullptr);
  EXPECT_EQ(ir::select_kernel_shape(axpy)->shape, ir::KernelShape::BiasAdd);
  EXPECT_TRUE(ir::kernel_shape_allows(axpy));
  // A norm and a GEMM never share a kernel; aliases alone need none.
  EXPECT_FALSE(ir::kernel_shape_allows(std::vector<OpKind>{OpKind::LayerNorm, OpKind::Linear}));
  EXPECT_EQ(ir::select_kernel_shape(std::vector<OpKind>{OpKind::Identity, OpKind::Reshape})->shape,
            ir::KernelShape::Alias);
  EXPECT_TRUE(ir::kernel_shape_allows(
      std::vector<OpKind>{OpKind::LinearDgrad, OpKind::GradAdd, OpKind::BiasGrad}));
  EXPECT_FALSE(ir::kernel_shape_allows(std::vector<OpKind>{OpKind::LinearWgrad, OpKind::BiasGrad}));
}

// Through the embedding API: CompileOptions::fusions is checked like a declaration, its errors
// located in the declaration's text; names that are not identifiers are refused before that.
TEST(DeclaredFusions, TheEmbeddingApiDeclaresFusionsAndLocatesTheirErrors) {
  CompileOptions options;
  options.arch = "sm_90a";
  options.use_cache = false;
  options.fusions.push_back(
      {"axpy", FusionDeclaration::Phase::Forward, 1, {"constant_scale", "add_extra_input"}});
  const Program program = Program::compile(program_text("", kAxpyBody), "main.fuse", options);
  EXPECT_TRUE(test::contains(program.plan_json(), "\"pattern\": \"axpy\""))
      << "the scale and the add in one kernel";
  options.fusions.clear();
  EXPECT_FALSE(test::contains(
      Program::compile(program_text("", kAxpyBody), "main.fuse", options).plan_json(),
      "\"pattern\": \"axpy\""));
  options.fusions.push_back(
      {"axpy", FusionDeclaration::Phase::Forward, 1, {"constant_scale", "add_extra_input"}});

  options.fusions = {{"bad", FusionDeclaration::Phase::Forward, 1, {"constant_scal", "bias"}}};
  try {
    (void)Program::compile(program_text("", kAxpyBody), "main.fuse", options);
    FAIL() << "an unknown op must not compile";
  } catch (const CompileError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(test::contains(what, "<CompileOptions.fusions[0]>:1:"));
    EXPECT_TRUE(test::contains(what, "error: unknown op 'constant_scal' in fusion 'bad'"));
    EXPECT_TRUE(test::contains(what, "did you mean 'constant_scale'?"));
  }
  options.fusions = {{"two words", FusionDeclaration::Phase::Forward, 1, {"a", "b"}}};
  EXPECT_THROW((void)Program::compile(program_text("", kAxpyBody), "main.fuse", options),
               UsageError);
  options.fusions = {{"ok", FusionDeclaration::Phase::Forward, 1, {"bias;", "gelu"}}};
  EXPECT_THROW((void)Program::compile(program_text("", kAxpyBody), "main.fuse", options),
               UsageError);
}

}  // namespace
}  // namespace opfuse
