// `fusec train` on the CPU reference (tools/fusec/train.cpp, reference/train_driver.h) at a tiny
// size: the bf16 run learns, runs repeat exactly, every recipe starts from the same parameters
// and data, the JSON has its documented fields, and bad input gives one-line errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>

#include "test_support.h"

namespace opfuse {
namespace {

using test::contains;
using test::shell_quoted;

constexpr int kExitOk = 0;
constexpr int kExitUserError = 1;
constexpr int kExitUsage = 2;

struct Files {
  std::string dir = test::make_temp_dir("fusec_train");
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
    return dir + "/" + name;
  }
};

const std::string kTrain = " --device cpu --bind tokens=128 --steps 40 --eval-every 10 --lr 2";

test::CommandResult fusec_stdout(const std::string& args) {
  return test::run_command("{ " + test::fusec_path() + " " + args + " 2>/dev/null; }");
}

nlohmann::json train_json(const Files& files, const std::string& args) {
  const std::string json = files.dir + "/curves.json";
  const auto r = test::fusec("train " + shell_quoted(files.write("stack.fuse", test::kTrainStack)) +
                             kTrain + " --json " + shell_quoted(json) + args);
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  return nlohmann::json::parse(test::read_text(json));
}

TEST(FusecTrain, Bf16LossDecreasesTowardTheNoiseFloor) {
  const Files files;
  const nlohmann::json j = train_json(files, " --recipe bf16");
  ASSERT_EQ(j["recipes"].size(), 1u);
  const nlohmann::json& bf16 = j["recipes"][0];
  EXPECT_EQ(bf16["name"], "bf16");
  const auto losses = bf16["eval_loss"].get<std::vector<double>>();
  EXPECT_EQ(bf16["steps"].get<std::vector<int>>(), (std::vector<int>{0, 10, 20, 30, 40}));
  ASSERT_EQ(losses.size(), 5u);
  const double floor = j["noise_floor"].get<double>();
  EXPECT_NEAR(floor, 0.125, 0.01);  // 0.5 * 0.5^2 over 4096 draws
  // The untrained student is a random network of the teacher's scale: its loss starts above
  // 0.5 * (1 + noise^2) (measured 0.769) and falls (measured to 0.611 after 40 steps at lr 2).
  EXPECT_NEAR(j["teacher"]["output_rms"].get<double>(), 1.0, 0.02);
  EXPECT_GT(losses.front(), 0.7);
  EXPECT_LT(losses.back(), 0.85 * losses.front());
  EXPECT_GT(losses.back(), floor);
  for (std::size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]);
}

TEST(FusecTrain, SameSeedPrintsTheSameCurvesAndAnotherSeedDoesNot) {
  const Files files;
  const std::string file = shell_quoted(files.write("stack.fuse", test::kTrainStack));
  const auto a = fusec_stdout("train " + file + kTrain + " --recipe fp8");
  const auto b = fusec_stdout("train " + file + kTrain + " --recipe fp8");
  const auto c = fusec_stdout("train " + file + kTrain + " --recipe fp8 --seed 1");
  ASSERT_EQ(a.exit_code, kExitOk) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
  EXPECT_TRUE(contains(a.output, "final eval loss (change vs bf16):")) << a.output;
  EXPECT_TRUE(contains(a.output, "  fp8 ")) << a.output;
}

TEST(FusecTrain, RecipesStartFromTheSameParametersAndData) {
  const Files files;
  const nlohmann::json j = train_json(files, " --recipe fp8 --recipe cur");
  ASSERT_EQ(j["recipes"].size(), 3u);  // bf16 first, as the reference
  EXPECT_EQ(j["recipes"][0]["name"], "bf16");
  const double first = j["recipes"][0]["eval_loss"][0].get<double>();
  const double last = j["recipes"][0]["final_eval_loss"].get<double>();
  for (const auto& r : j["recipes"]) {
    // The same parameters and batch; only the recipe's quantization of the first forward moves
    // the loss (measured: fp8 0.7634 against bf16's 0.7686, -0.7%).
    EXPECT_NEAR(r["eval_loss"][0].get<double>(), first, 0.02 * first) << r["name"];
    EXPECT_NEAR(r["train_loss"][0].get<double>(), j["recipes"][0]["train_loss"][0].get<double>(),
                0.02 * first);
  }
  for (std::size_t i = 1; i < 3; ++i) {
    const auto& r = j["recipes"][i];
    EXPECT_NE(r["final_eval_loss"].get<double>(), last) << "is the recipe applied? " << r["name"];
    EXPECT_NEAR(r["final_eval_loss"].get<double>(), last, 0.05 * last) << r["name"];
    EXPECT_NEAR(r["vs_bf16_percent"].get<double>(),
                100 * (r["final_eval_loss"].get<double>() / last - 1), 1e-9);
    EXPECT_TRUE(contains(r["recipe"].get<std::string>(), i == 1 ? "delayed_scaling" : "current"));
  }
}

TEST(FusecTrain, EveryRecipesFinalWeightsAreAlsoEvaluatedInBf16) {
  const Files files;
  const nlohmann::json j = train_json(files, " --recipe fp8 --recipe cur");
  // bf16's own forward is the bf16 forward: the same loss to the last bit.
  const auto& bf16 = j["recipes"][0];
  EXPECT_EQ(bf16["final_bf16_forward_loss"].get<double>(), bf16["final_eval_loss"].get<double>());
  EXPECT_EQ(bf16["bf16_forward_vs_bf16_percent"].get<double>(), 0.0);
  const double reference = bf16["final_bf16_forward_loss"].get<double>();
  for (std::size_t i = 1; i < 3; ++i) {
    const auto& r = j["recipes"][i];
    const double in_bf16 = r["final_bf16_forward_loss"].get<double>();
    // The recipe's own trained weights (not bf16's: those would give `reference`), without its
    // forward's FP8 quantization (which the recipe's final eval loss has).
    EXPECT_NE(in_bf16, reference) << r["name"];
    EXPECT_NE(in_bf16, r["final_eval_loss"].get<double>()) << r["name"];
    EXPECT_NEAR(in_bf16, r["final_eval_loss"].get<double>(), 0.05 * in_bf16) << r["name"];
    EXPECT_NEAR(r["bf16_forward_vs_bf16_percent"].get<double>(), 100 * (in_bf16 / reference - 1),
                1e-9);
  }
  const auto out = fusec_stdout("train " + shell_quoted(files.write("s.fuse", test::kTrainStack)) +
                                kTrain + " --recipe fp8");
  EXPECT_TRUE(contains(out.output, "final weights, eval loss with the forward in bf16"))
      << out.output;
}

TEST(FusecTrain, JsonHasTheDocumentedFields) {
  const Files files;
  const nlohmann::json j = train_json(files, " --recipe cur --momentum 0.5 --noise 0.25");
  EXPECT_EQ(j["command"], "fusec train");
  EXPECT_EQ(j["sequence"], "stack");
  EXPECT_EQ(j["device"], "cpu (reference executor)");
  const auto& s = j["settings"];
  EXPECT_EQ(s["bindings"]["tokens"], 128);
  EXPECT_EQ(s["steps"], 40);
  EXPECT_EQ(s["eval_every"], 10);
  EXPECT_EQ(s["lr"], 2.0);
  EXPECT_EQ(s["momentum"], 0.5);
  EXPECT_EQ(s["noise"], 0.25);
  EXPECT_EQ(s["seed"], 0);
  EXPECT_EQ(j["teacher"]["recipe"], "bf16");
  EXPECT_EQ(j["teacher"]["seed"], 1);
  EXPECT_NEAR(j["noise_floor"].get<double>(), 0.5 * 0.25 * 0.25, 0.005);
  for (const auto& r : j["recipes"]) {
    for (const char* key : {"name", "recipe", "steps", "eval_loss", "train_loss", "diverged",
                            "diverged_step", "final_eval_loss", "vs_bf16_percent", "seconds",
                            "final_bf16_forward_loss", "bf16_forward_vs_bf16_percent"})
      EXPECT_TRUE(r.contains(key)) << key;
    EXPECT_EQ(r["steps"].size(), r["eval_loss"].size());
    EXPECT_EQ(r["steps"].size(), r["train_loss"].size());
    EXPECT_FALSE(r["diverged"].get<bool>());
    EXPECT_TRUE(r["diverged_step"].is_null());
  }
  EXPECT_EQ(j["recipes"][0]["vs_bf16_percent"], 0.0);
}

TEST(FusecTrain, DivergingRecipeStopsAndIsReported) {
  const Files files;
  const std::string json = files.dir + "/curves.json";
  const auto r = test::fusec("train " + shell_quoted(files.write("stack.fuse", test::kTrainStack)) +
                             " --device cpu --bind tokens=128 --steps 40 --eval-every 10 "
                             "--lr 1e6 --json " +
                             shell_quoted(json));
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_TRUE(contains(r.output, "fusec: error: recipe 'bf16' diverged: non-finite loss at step "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "diverged: non-finite loss at step")) << r.output;
  const nlohmann::json j = nlohmann::json::parse(test::read_text(json));
  for (const auto& recipe : j["recipes"]) {
    EXPECT_TRUE(recipe["diverged"].get<bool>()) << recipe["name"];
    EXPECT_LT(recipe["diverged_step"].get<int>(), 40);
    EXPECT_TRUE(recipe["final_eval_loss"].is_null());
    EXPECT_TRUE(recipe["final_bf16_forward_loss"].is_null());
  }
}

TEST(FusecTrain, BadInputGivesOneLineErrors) {
  const Files files;
  const std::string file = shell_quoted(files.write("stack.fuse", test::kTrainStack));
  const std::string none = shell_quoted(files.write(
      "none.fuse", "sequence s(x: bf16[tokens, 32]) -> (y: bf16[tokens, 32]) {\n  gelu()\n}\n"));
  struct Case {
    std::string args;
    int exit_code;
    std::string message;
  };
  const Case cases[] = {
      {file + " --recipe fp9" + kTrain, kExitUserError,
       "--recipe 'fp9' is not a recipe of this program"},
      {none + kTrain, kExitUserError, "fusec: error: sequence 's' has no parameters to train"},
      {file + " --device cpu --steps 3", kExitUserError, "tokens"},
      {file + " --device cpu --bind tokens=128 --lr 0", kExitUsage,
       "fusec: error: --lr must be a positive number"},
      {file + kTrain + " --noise -1", kExitUsage, "fusec: error: --noise must be a number >= 0"},
      {file + " --device cpu --bind tokens=128 --steps 0", kExitUsage, "--steps"},
      {file + kTrain + " --sequence nope", kExitUserError, "no sequence 'nope'"},
  };
  for (const Case& c : cases) {
    const auto r = test::fusec("train " + c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.message)) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace opfuse
