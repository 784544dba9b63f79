// Loading a `fusec build` output directory (runtime/api/build_dir.h, opfuse::Program::load_build):
// plan.json reads back exactly, the manifest ties every binary to the plan, and a changed,
// truncated or missing file is refused with what to do.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "../../runtime/api/build_dir.h"
#include "codegen/plan.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "plan/sym_expr.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string{std::istreambuf_iterator<char>(in), {}};
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(SymExprParse, ReadsBackWhatTextWrites) {
  using codegen::SymExpr;
  const SymExpr tokens = SymExpr::symbol("tokens");
  for (const SymExpr& e : {tokens * 4096, SymExpr(448), tokens * SymExpr::symbol("batch") * 2,
                           codegen::min_of(codegen::ceil_div(tokens, 64), 65535) * 3,
                           codegen::max_of(tokens * 2, SymExpr::symbol("num_sms"))}) {
    EXPECT_EQ(SymExpr::parse(e.text()), e) << e.text();
  }
  EXPECT_EQ(SymExpr::parse("0 * tokens").value(), 0);
  EXPECT_THROW(SymExpr::parse("min(tokens, 4"), std::invalid_argument);
  EXPECT_THROW(SymExpr::parse("tokens * "), std::invalid_argument);
}

// Every example under each recipe: plan -> JSON -> plan -> JSON is the same text.
TEST(PlanJson, EveryExamplePlanReadsBackToTheSameText) {
  for (const auto& entry : fs::directory_iterator(test::source_path("dsl_examples"))) {
    for (const std::string recipe : {"", "bf16"}) {
      SourceManager sources;
      DiagnosticEngine diags(sources);
      driver::CompileOptions options;
      options.recipe = recipe;
      options.last_stage = driver::Stage::Plan;
      const driver::CompileResult result =
          driver::compile_file(entry.path().string(), sources, diags, options);
      ASSERT_TRUE(result.ok()) << diags.format_all() << result.error;
      const codegen::Plan& plan = result.plan;
      const std::string text = codegen::plan_json_text(plan);
      const codegen::Plan back = codegen::plan_from_json(nlohmann::ordered_json::parse(text));
      EXPECT_EQ(codegen::plan_json_text(back), text) << entry.path() << " " << recipe;
    }
  }
}

// FP8 GEMM accumulation follows CodegenOptions: TE's defaults (fast fprop, split dgrad/wgrad),
// or the opposite when asked; bf16 GEMMs never take the FP8 fast-accumulation flag.
TEST(PlanJson, Fp8AccumulationFollowsTheOptions) {
  for (const bool flip : {false, true}) {
    SourceManager sources;
    DiagnosticEngine diags(sources);
    driver::CompileOptions options;
    options.fp8_fprop_fast_accum = !flip;
    options.fp8_backward_fast_accum = flip;
    options.last_stage = driver::Stage::Plan;
    const driver::CompileResult result =
        driver::compile_file(test::source_path("dsl_examples/mlp.fuse"), sources, diags, options);
    ASSERT_TRUE(result.ok()) << diags.format_all() << result.error;
    const codegen::Plan& plan = result.plan;
    int gemms = 0;
    for (const codegen::Step& step : plan.sequences.at(0).steps) {
      const auto* gemm = std::get_if<codegen::GemmStep>(&step.body);
      if (gemm == nullptr) continue;
      ++gemms;
      const bool fprop = gemm->role == codegen::GemmRole::Fprop;
      EXPECT_EQ(gemm->fast_accum, fprop != flip) << step.what;
    }
    EXPECT_EQ(gemms, 6);
  }
}

TEST(PlanJson, AMalformedFieldIsNamedByItsPath) {
  nlohmann::ordered_json plan = {{"format", "opfuse-plan"},
                                 {"version", plan::kPlanFormatVersion},
                                 {"source", "x.fuse"},
                                 {"arch", "sm_90a"},
                                 {"sequences", nlohmann::ordered_json::array()},
                                 {"kernels", nlohmann::ordered_json::array()}};
  EXPECT_NO_THROW(codegen::plan_from_json(plan));
  plan["sequences"].push_back({{"name", "s"}, {"recipe", "bf16"}, {"fp8_weights", "no"}});
  try {
    codegen::plan_from_json(plan);
    ADD_FAILURE() << "a string fp8_weights was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("plan.sequences[0].fp8_weights"), std::string::npos)
        << e.what();
  }
  plan["version"] = plan::kPlanFormatVersion - 1;  // an older opfuse's plan
  EXPECT_THROW(codegen::plan_from_json(plan), std::invalid_argument);
}

class BuildDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("build_dir");
    const auto r =
        test::run_command("OPFUSE_CACHE_DIR=" + dir_ + "/cache " + test::fusec_path() + " build " +
                          test::source_path("dsl_examples/mlp.fuse") + " -o " + dir_ + "/out");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    out_ = dir_ + "/out";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The load's error message; empty when it loaded.
  std::string load_error() {
    try {
      api::load_build_dir(out_);
    } catch (const UsageError& e) {
      return e.what();
    }
    return {};
  }

  std::string dir_, out_;
};

TEST_F(BuildDir, LoadsThePlanAndEveryBinaryWithItsEntryName) {
  const api::LoadedBuild build = api::load_build_dir(out_);
  EXPECT_EQ(codegen::plan_json_text(build.plan), read(out_ + "/plan.json"));
  ASSERT_EQ(build.kernels.size(), build.plan.kernels.size());
  ASSERT_FALSE(build.kernels.empty());
  for (std::size_t i = 0; i < build.kernels.size(); ++i) {
    const auto& kernel = build.kernels[i];
    EXPECT_EQ(std::string(kernel.binary.data(), kernel.binary.size()),
              read(out_ + "/kernels/" + build.plan.kernels[i].id + ".cubin"));
    EXPECT_TRUE(kernel.lowered_names.contains(build.plan.kernels[i].name_expression));
  }
}

TEST_F(BuildDir, AChangedBinaryIsRefused) {
  const api::LoadedBuild build = api::load_build_dir(out_);
  const std::string cubin = out_ + "/kernels/" + build.plan.kernels[0].id + ".cubin";
  std::string bytes = read(cubin);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 1);
  write(cubin, bytes);
  const std::string error = load_error();
  EXPECT_NE(error.find(build.plan.kernels[0].id + ".cubin is not the file the build wrote"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("rebuild it with `fusec build"), std::string::npos) << error;
  write(cubin, bytes.substr(0, bytes.size() / 2));  // truncated
  EXPECT_NE(load_error().find("is not the file the build wrote"), std::string::npos);
}

TEST_F(BuildDir, AChangedPlanOrAMissingManifestIsRefused) {
  const std::string plan = read(out_ + "/plan.json");
  std::string edited = plan;
  edited.replace(edited.find("\"block\": 256"), 12, "\"block\": 512");
  write(out_ + "/plan.json", edited);
  EXPECT_NE(load_error().find("plan.json changed after the build"), std::string::npos);
  write(out_ + "/plan.json", plan);
  EXPECT_EQ(load_error(), "");
  fs::remove(out_ + "/kernels.json");
  EXPECT_NE(load_error().find("kernels.json"), std::string::npos);
}

}  // namespace
}  // namespace opfuse
