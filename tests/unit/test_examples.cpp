// Every dsl_examples/*.fuse checks clean and prints exactly its golden IR after every pass
// (tests/golden/ir/<example>.ir; scripts/update_goldens.sh regenerates them).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace opfuse {
namespace {

using test::shell_quoted;

namespace fs = std::filesystem;

std::string examples_dir() { return test::source_path("dsl_examples"); }
std::string goldens_dir() { return test::source_path("tests/golden/ir"); }

// Stems of the files in `dir` ending in `extension`, sorted.
std::vector<std::string> stems(const std::string& dir, const std::string& extension) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == extension)
      names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> examples() { return stems(examples_dir(), ".fuse"); }

// `diff -u` of the golden against the actual text, for the failure message.
std::string unified_diff(const std::string& golden_path, const std::string& actual,
                         const std::string& name) {
  const std::string dir = test::make_temp_dir("golden-diff");
  const std::string actual_path = dir + "/" + name + ".ir";
  std::ofstream(actual_path, std::ios::binary) << actual;
  return test::run_command("diff -u " + shell_quoted(golden_path) + " " + shell_quoted(actual_path))
      .output;
}

class Example : public ::testing::TestWithParam<std::string> {
 protected:
  std::string path() const { return examples_dir() + "/" + GetParam() + ".fuse"; }
};

TEST_P(Example, ChecksCleanWithNoOutput) {
  const auto result = test::run_command(test::fusec_path() + " check " + shell_quoted(path()));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "");
}

TEST_P(Example, IrMatchesGolden) {
  const std::string golden_path = goldens_dir() + "/" + GetParam() + ".ir";
  ASSERT_TRUE(fs::is_regular_file(golden_path))
      << "no golden " << golden_path << "; run scripts/update_goldens.sh";
  // The IR as built and after every pass that changes it (docs/design.md, "Testing": IR after each
  // pass).
  const auto result =
      test::run_command(test::fusec_path() + " ir --after all " + shell_quoted(path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string golden = test::read_text(golden_path);
  EXPECT_TRUE(result.output == golden)
      << "fusec ir --after all " << path() << " differs from its golden (scripts/update_goldens.sh "
      << "regenerates it after a deliberate change):\n"
      << unified_diff(golden_path, result.output, GetParam());
}

INSTANTIATE_TEST_SUITE_P(DslExamples, Example, ::testing::ValuesIn(examples()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(Examples, EveryGoldenBelongsToAnExample) {
  const auto example_names = examples();
  ASSERT_FALSE(example_names.empty()) << examples_dir();
  for (const std::string& golden : stems(goldens_dir(), ".ir")) {
    EXPECT_TRUE(std::binary_search(example_names.begin(), example_names.end(), golden))
        << "tests/golden/ir/" << golden << ".ir has no dsl_examples/" << golden << ".fuse";
  }
}

TEST(Examples, GoldensLocateOpsByBaseName) {
  // Goldens must not depend on where the checkout lives: ops cite `file.fuse:line`.
  const std::string golden = test::read_text(goldens_dir() + "/mlp.ir");
  EXPECT_NE(golden.find(" as \"fc1\" : bf16[tokens, 28672]  // mlp.fuse:"), std::string::npos)
      << golden;
  EXPECT_EQ(golden.find(examples_dir()), std::string::npos) << golden;
}

}  // namespace
}  // namespace opfuse
