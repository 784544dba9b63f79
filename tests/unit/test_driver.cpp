// The compile driver (driver/compile.h): its stages, options and errors.
#include <gtest/gtest.h>

#include "driver/compile.h"
#include "test_support.h"

namespace opfuse {
namespace {

constexpr const char* kTwo = R"(recipe fp8 = delayed_scaling()
sequence a(x: bf16[t, 64]) -> (y: bf16[t, 64]) uses fp8 {
  rmsnorm(64)
  linear(64, 64, bias = false) as fc
}
sequence b(x: bf16[t, 64]) -> (y: bf16[t, 64]) {
  gelu()
}
)";

driver::CompileResult compile(const std::string& text, const driver::CompileOptions& options,
                              std::string* diagnostics = nullptr) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileResult result = driver::compile_source("two.fuse", text, sources, diags, options);
  if (diagnostics) *diagnostics = diags.format_all();
  return result;
}

TEST(CompileDriver, CompilesToOneKernelRequestPerPlanKernel) {
  driver::CompileOptions options;
  options.arch = "sm_89";
  const driver::CompileResult result = compile(kTwo, options);
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.plan.sequences.size(), 2u);
  EXPECT_EQ(result.plan.arch, "sm_89");
  ASSERT_EQ(result.kernels.size(), result.plan.kernels.size());
  ASSERT_FALSE(result.kernels.empty());
  for (size_t i = 0; i < result.kernels.size(); ++i) {
    EXPECT_EQ(result.kernels[i].kernel_name, result.plan.kernels[i].id);
    EXPECT_EQ(result.kernels[i].arch, "sm_89");
    EXPECT_EQ(result.kernels[i].name_expressions,
              std::vector<std::string>{result.plan.kernels[i].name_expression});
    EXPECT_FALSE(result.kernels[i].source.empty());
  }
  // One timing per IR pass; pass_names() also lists the plan passes (note "Plan passes").
  EXPECT_EQ(result.timings.size() + codegen::plan_passes().size(), driver::pass_names().size());
}

TEST(CompileDriver, StopsAtTheLastStageAsked) {
  driver::CompileOptions options;
  options.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult result = compile(kTwo, options);
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result.program.sequences.at(0).has_backward);
  EXPECT_TRUE(result.timings.empty());
  EXPECT_TRUE(result.plan.sequences.empty());

  options.last_stage = driver::Stage::Passes;
  result = compile(kTwo, options);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result.program.sequences.at(0).has_backward);
  EXPECT_TRUE(result.plan.sequences.empty());

  options.last_stage = driver::Stage::Plan;
  result = compile(kTwo, options);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.plan.sequences.size(), 2u);
  EXPECT_TRUE(result.kernels.empty());
}

TEST(CompileDriver, KeepsOnlyTheSequenceAskedFor) {
  driver::CompileOptions options;
  options.sequence = "b";
  driver::CompileResult result = compile(kTwo, options);
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.plan.sequences.size(), 1u);
  EXPECT_EQ(result.plan.sequences[0].name, "b");

  options.sequence = "c";
  result = compile(kTwo, options);
  EXPECT_EQ(result.status, driver::CompileStatus::UserError);
  EXPECT_EQ(result.error, "no sequence 'c' in two.fuse; sequences: a b");
}

TEST(CompileDriver, ReportsUserErrorsThroughTheDiagnostics) {
  std::string diagnostics;
  const driver::CompileResult result =
      compile("sequence s(x: bf16[t, 64]) -> (y: bf16[t, 64]) { nope() }\n", {}, &diagnostics);
  EXPECT_EQ(result.status, driver::CompileStatus::UserError);
  EXPECT_EQ(result.failed_stage, driver::Stage::FrontEnd);
  EXPECT_NE(diagnostics.find("two.fuse:1:"), std::string::npos) << diagnostics;
}

TEST(CompileDriver, BadPassOptionsAreUsageErrorsFoundBeforeReading) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.disabled_passes = {"nope"};
  driver::CompileResult result =
      driver::compile_file("/no/such/file.fuse", sources, diags, options);
  EXPECT_EQ(result.status, driver::CompileStatus::UsageError);
  EXPECT_EQ(result.unknown_passes, std::vector<std::string>{"nope"});
  EXPECT_EQ(diags.error_count(), 0u);

  options.disabled_passes = {"build-backward"};
  result = driver::check_options(options);
  EXPECT_EQ(result.status, driver::CompileStatus::UsageError);
  EXPECT_NE(result.error.find("'plan-quantization' requires the 'backward'"), std::string::npos)
      << result.error;
}

TEST(CompileDriver, CompilesBuiltIrFromThePassesOn) {
  driver::CompileOptions front;
  front.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult built = compile(kTwo, front);
  ASSERT_TRUE(built.ok());
  driver::CompileOptions options;
  options.disabled_passes = {"fuse-forward", "fuse-backward"};
  const driver::CompileResult unfused =
      driver::compile_ir(built.program, nullptr, nullptr, options);
  const driver::CompileResult fused = driver::compile_ir(built.program, nullptr, nullptr, {});
  ASSERT_TRUE(unfused.ok());
  ASSERT_TRUE(fused.ok());
  // Sequence a's norm fuses with the FP8 cast of its output: one launch fewer.
  EXPECT_GT(unfused.plan.sequences.at(0).steps.size(), fused.plan.sequences.at(0).steps.size());
}

}  // namespace
}  // namespace opfuse
