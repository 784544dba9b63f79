// IR builder, verifier and printer on in-memory programs.
#include <gtest/gtest.h>

#include "driver/frontend.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace opfuse {
namespace {

struct Built {
  SourceManager sources;
  std::unique_ptr<DiagnosticEngine> diags;
  std::optional<ir::Program> program;
  std::string messages() const { return diags->format_all(); }
};

std::unique_ptr<Built> build(const std::string& text, ir::BuildOptions options = {}) {
  auto b = std::make_unique<Built>();
  b->diags = std::make_unique<DiagnosticEngine>(b->sources);
  b->program = load_program_from_source("t.fuse", text, b->sources, *b->diags, options);
  return b;
}

const char* kMlp = R"(const hidden = 64
const ffn = 256
recipe fp8 = delayed_scaling(margin = 1)
sequence mlp(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) uses fp8 {
  layernorm(hidden, eps = 1e-5)
  linear(hidden, ffn, bias = false) as fc1
  swiglu()
  linear(ffn / 2, hidden)
}
)";

TEST(IrBuilder, BuildsTheSeedMlpWithShapesAndParams) {
  auto b = build(kMlp);
  ASSERT_TRUE(b->program) << b->messages();
  ASSERT_EQ(b->program->sequences.size(), 1u);
  const ir::Sequence& s = b->program->sequences[0];
  ASSERT_EQ(s.ops.size(), 4u);
  EXPECT_EQ(s.ops[0].kind, ir::OpKind::LayerNorm);
  EXPECT_EQ(s.ops[0].instance, "layernorm_0");
  EXPECT_EQ(s.ops[1].instance, "fc1");
  EXPECT_EQ(s.ops[3].instance, "linear_0");
  EXPECT_EQ(ir::type_string(s.value(s.ops[1].results[0]).type), "bf16[tokens, 256]");
  EXPECT_EQ(ir::type_string(s.value(s.ops[2].results[0]).type), "bf16[tokens, 128]");
  EXPECT_EQ(ir::type_string(s.value(s.outputs[0].value).type), "bf16[tokens, 64]");
  // layernorm weight+bias, fc1 weight, linear_0 weight+bias.
  ASSERT_EQ(s.params.size(), 5u);
  EXPECT_EQ(s.value(s.params[2]).name, "fc1.weight");
  EXPECT_EQ(ir::type_string(s.value(s.params[2]).type), "bf16[256, 64]");
  EXPECT_EQ(s.value(s.params[4]).name, "linear_0.bias");
  EXPECT_EQ(s.recipe.kind, ir::RecipeKind::DelayedScaling);
  EXPECT_EQ(s.recipe.margin, 1);
  EXPECT_EQ(s.recipe.amax_history, 1024);
  EXPECT_EQ(s.symbols(), std::vector<std::string>{"tokens"});
  EXPECT_TRUE(ir::verify_sequence(s).empty());
}

// Every parameter carries the init its op declared: linear weights normal(0.02), biases 0, a
// norm's gamma 1, or 0 when it is stored minus one (zero_centered_gamma).
TEST(IrBuilder, ParamsCarryTheirDeclaredInit) {
  auto b = build(R"(const hidden = 64
sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) {
  layernorm(hidden)
  rmsnorm(hidden, zero_centered_gamma = true)
  linear(hidden, hidden)
  bias(hidden)
}
)");
  ASSERT_TRUE(b->program) << b->messages();
  const ir::Sequence& s = b->program->sequences[0];
  std::vector<std::string> inits;
  for (ir::ValueId id : s.params)
    inits.push_back(s.value(id).name + " " + ir::param_init_string(s.value(id).init));
  EXPECT_EQ(inits, (std::vector<std::string>{
                       "layernorm_0.weight constant(1)", "layernorm_0.bias constant(0)",
                       "rmsnorm_0.weight constant(0)", "linear_0.weight normal(0.02)",
                       "linear_0.bias constant(0)", "bias_0.bias constant(0)"}));
}

TEST(IrBuilder, DefaultAttributesComeFromTheOpTable) {
  auto b = build("sequence s(x: fp32[4, 8]) -> (y: fp32[4, 8]) { rmsnorm(8) }\n");
  ASSERT_TRUE(b->program) << b->messages();
  const auto& attrs = b->program->sequences[0].ops[0].attrs;
  EXPECT_DOUBLE_EQ(ir::attr_float(attrs, "eps"), 1e-5);
  EXPECT_FALSE(ir::attr_bool(attrs, "zero_centered_gamma"));
  EXPECT_EQ(b->program->sequences[0].recipe.kind, ir::RecipeKind::BF16);
}

TEST(IrBuilder, ExtraOutputAliasesAndExtraInputIsAnOperand) {
  auto b = build(R"(
sequence fc(x: bf16[t, 32], r: bf16[t, 32]) -> (y: bf16[t, 32], saved: bf16[t, 32]) {
  make_extra_output(saved)
  rmsnorm(32)
  add_extra_input(r)
}
)");
  ASSERT_TRUE(b->program) << b->messages();
  const ir::Sequence& s = b->program->sequences[0];
  EXPECT_EQ(s.outputs[1].name, "saved");
  EXPECT_EQ(s.outputs[1].value, s.ops[0].results[0]);
  const ir::Operation& add = s.ops[2];
  ASSERT_EQ(add.operands.size(), 2u);
  EXPECT_EQ(add.operands[1], s.inputs[1]);
  EXPECT_EQ(b->diags->warning_count(), 0u) << b->messages();
}

TEST(IrBuilder, RecipeOverrideReplacesEverySequencesRecipe) {
  ir::BuildOptions options;
  options.recipe_override = "bf16";
  auto b = build(kMlp, options);
  ASSERT_TRUE(b->program) << b->messages();
  EXPECT_EQ(b->program->sequences[0].recipe.kind, ir::RecipeKind::BF16);

  options.recipe_override = "nope";
  auto bad = build(kMlp, options);
  EXPECT_FALSE(bad->program);
  EXPECT_NE(bad->messages().find("--recipe 'nope' is not a recipe"), std::string::npos)
      << bad->messages();
}

TEST(IrBuilder, ReshapeInfersOneDimensionAndKeepsSymbols) {
  auto b = build(
      "sequence s(x: bf16[tokens, 128]) -> (y: bf16[tokens, 2, 64]) { reshape([tokens, -1, 64]) "
      "}\n");
  ASSERT_TRUE(b->program) << b->messages();
  auto bad = build("sequence s(x: bf16[tokens, 128]) -> (y: bf16[256]) { reshape([-1]) }\n");
  EXPECT_FALSE(bad->program);
  EXPECT_NE(bad->messages().find("must keep the symbolic dimensions"), std::string::npos)
      << bad->messages();
}

TEST(IrBuilder, ReportsLinearMismatchAtTheArgument) {
  auto b = build("sequence s(x: bf16[t, 64]) -> (y: bf16[t, 32]) {\n  linear(63, 32)\n}\n");
  EXPECT_FALSE(b->program);
  EXPECT_NE(b->messages().find(
                "t.fuse:2:10: error: in = 63 does not match the incoming last dimension 64"),
            std::string::npos)
      << b->messages();
  EXPECT_NE(b->messages().find("hint: set in = 64"), std::string::npos);
}

TEST(IrBuilder, ReportsErrorsInSeveralSequencesInOneRun) {
  auto b = build(R"(sequence a(x: bf16[t, 64]) -> (y: bf16[t, 64]) { linear(32, 64) }
sequence b(x: bf16[t, 63]) -> (y: bf16[t, 32]) { swiglu() }
sequence c(x: bf16[t, 8]) -> (y: bf16[t, 8]) { gelux() }
)");
  EXPECT_FALSE(b->program);
  EXPECT_EQ(b->diags->error_count(), 3u) << b->messages();
  EXPECT_NE(b->messages().find("did you mean 'gelu'?"), std::string::npos);
}

TEST(IrBuilder, Fp8LinearNeedsMultiplesOf16) {
  auto b = build(R"(recipe r = current_scaling()
sequence s(x: bf16[t, 64]) -> (y: bf16[t, 40]) uses r { linear(64, 40) }
)");
  EXPECT_FALSE(b->program);
  EXPECT_NE(b->messages().find("out = 40 is not a multiple of 16"), std::string::npos)
      << b->messages();
  // The same sequence without an FP8 recipe is fine.
  auto ok = build("sequence s(x: bf16[t, 64]) -> (y: bf16[t, 40]) { linear(64, 40) }\n");
  EXPECT_TRUE(ok->program) << ok->messages();
}

TEST(IrBuilder, ConstantArithmeticIsExactAndChecked) {
  auto b = build("const a = 9223372036854775807\nconst b = a + 1\n");
  EXPECT_NE(b->messages().find("t.fuse:2:13: error: integer overflow"), std::string::npos)
      << b->messages();
  auto c = build("const a = 7 / 2\n");
  EXPECT_NE(c->messages().find("7 / 2 is not a whole number"), std::string::npos) << c->messages();
  auto d = build("const a = 7 % 0\n");
  EXPECT_NE(d->messages().find("division by zero"), std::string::npos) << d->messages();
}

TEST(IrBuilder, WarnsAboutUnusedExtraInputAndMisspeltConstant) {
  auto b = build(R"(const hidden = 64
sequence s(x: bf16[t, hiden], r: bf16[t, 64]) -> (y: bf16[t, hiden]) { identity() }
)");
  ASSERT_TRUE(b->program) << b->messages();
  EXPECT_EQ(b->diags->warning_count(), 2u) << b->messages();  // the symbol warns once
  EXPECT_NE(b->messages().find("did you mean the constant 'hidden'?"), std::string::npos);
  EXPECT_NE(b->messages().find("extra input 'r' of sequence 's' is never used"), std::string::npos);
}

TEST(IrPrinter, PrintsDeterministicTextWithLocations) {
  auto b = build(kMlp);
  ASSERT_TRUE(b->program) << b->messages();
  const std::string text = ir::print_program(*b->program, &b->sources);
  EXPECT_EQ(text, ir::print_program(*b->program, &b->sources));
  EXPECT_NE(
      text.find("%1 = linear(%0, %fc1.weight) {in = 64, out = 256, bias = false} as \"fc1\" : "
                "bf16[tokens, 256]  // t.fuse:6"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("return %3"), std::string::npos) << text;
}

TEST(IrVerifier, CatchesUseBeforeDefinitionAndWrongResultType) {
  auto b = build(kMlp);
  ASSERT_TRUE(b->program);
  ir::Sequence broken = b->program->sequences[0];
  std::swap(broken.ops[0].operands[0], broken.ops[1].operands[0]);
  EXPECT_FALSE(ir::verify_sequence(broken).empty());

  ir::Sequence wrong = b->program->sequences[0];
  wrong.values[wrong.ops[2].results[0]].type.shape.back() = ir::Dim::known(7);
  const auto problems = ir::verify_sequence(wrong);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("shape rule gives"), std::string::npos) << problems[0];
}

}  // namespace
}  // namespace opfuse
