// Must-fail inputs: every tests/errors/*.fuse goes through `fusec check` and must fail with the
// diagnostics its `# expect:` lines declare, each shown with its source line and a caret.
// Also: warnings that --Werror turns into errors (warning-only inputs do not belong in
// tests/errors, which holds inputs that fail without flags).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "test_support.h"

namespace opfuse {
namespace {

using test::shell_quoted;

namespace fs = std::filesystem;

constexpr size_t kMinErrorInputs = 45;
// DiagnosticEngine shows lines up to this long in full (longer ones around the caret).
constexpr size_t kFullyShownLine = 160;

std::string errors_dir() { return test::source_path("tests/errors"); }

// Base names (without .fuse) of the must-fail inputs, sorted so test order is stable.
std::vector<std::string> error_inputs() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(errors_dir(), ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".fuse")
      names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      if (start < text.size()) lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

struct Expectation {
  std::string text;  // "file.fuse:line:col: error: message prefix"
  std::string file;  // base name
  uint32_t line = 0;
  uint32_t col = 0;
};

std::vector<Expectation> read_expectations(const std::vector<std::string>& lines) {
  static const std::regex kExpect(R"(^# expect: (([^:/]+\.fuse):(\d+):(\d+): error: .+)$)");
  std::vector<Expectation> out;
  for (const std::string& line : lines) {
    std::smatch m;
    if (!std::regex_match(line, m, kExpect)) continue;
    out.push_back({m[1], m[2], static_cast<uint32_t>(std::stoul(m[3])),
                   static_cast<uint32_t>(std::stoul(m[4]))});
  }
  return out;
}

// fusec prints the paths it was given; the expectations use base names. Drops the errors
// directory everywhere (messages quote import paths relative to it) and any directory left in
// front of a `file.fuse:line:col:` location.
std::vector<std::string> normalized_output(const std::string& output) {
  std::string text = output;
  const std::string dir = errors_dir() + "/";
  for (size_t at = text.find(dir); at != std::string::npos; at = text.find(dir, at))
    text.erase(at, dir.size());
  static const std::regex kLocatedLine(R"(^[^\s:]*/([^/\s:]+\.fuse:\d+:\d+: .*)$)");
  std::vector<std::string> lines = split_lines(text);
  for (std::string& line : lines) {
    std::smatch m;
    if (std::regex_match(line, m, kLocatedLine)) line = m[1];
  }
  return lines;
}

// The text of a file the expectations name: the input itself or one of the files it imports.
std::string find_source(const std::string& base_name) {
  for (const char* sub : {"", "imports/"}) {
    const fs::path p = fs::path(errors_dir()) / (std::string(sub) + base_name);
    if (fs::is_regular_file(p)) return test::read_text(p.string());
  }
  ADD_FAILURE() << "no file " << base_name << " under " << errors_dir();
  return {};
}

// Spaces up to 1-based byte column `col`: one per character (UTF-8 continuation bytes take none).
std::string caret_pad(const std::string& line, uint32_t col) {
  std::string pad;
  for (size_t i = 0; i + 1 < col && i < line.size(); ++i)
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80) pad.push_back(' ');
  return pad;
}

class ErrorInput : public ::testing::TestWithParam<std::string> {};

TEST_P(ErrorInput, FailsWithTheExpectedDiagnostics) {
  const std::string path = errors_dir() + "/" + GetParam() + ".fuse";
  const std::vector<std::string> source = split_lines(test::read_text(path));
  ASSERT_GE(source.size(), 3u);
  EXPECT_TRUE(source[0].starts_with("# ") && !source[0].starts_with("# expect:"))
      << "line 1 must be a comment saying what is wrong";
  EXPECT_TRUE(source[1].starts_with("# expect: ")) << "line 2 must declare the expected error";
  const std::vector<Expectation> expected = read_expectations(source);
  ASSERT_FALSE(expected.empty()) << "no well-formed '# expect: file:line:col: error: ...' line";

  const auto result = test::run_command(test::fusec_path() + " check " + shell_quoted(path));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  const std::vector<std::string> out = normalized_output(result.output);

  // One mistake per input: no errors beyond the expected ones.
  static const std::regex kErrorLine(R"(^[^\s:]+\.fuse:\d+:\d+: error: .*$)");
  const auto errors = std::count_if(out.begin(), out.end(), [](const std::string& line) {
    return std::regex_match(line, kErrorLine);
  });
  EXPECT_EQ(static_cast<size_t>(errors), expected.size()) << result.output;

  for (const Expectation& e : expected) {
    const auto it = std::find_if(out.begin(), out.end(),
                                 [&](const std::string& line) { return line.starts_with(e.text); });
    ASSERT_NE(it, out.end()) << "missing: " << e.text << "\noutput:\n" << result.output;
    const size_t at = static_cast<size_t>(it - out.begin());
    ASSERT_LT(at + 2, out.size()) << "no source line and caret after " << e.text;
    const std::vector<std::string> file = split_lines(find_source(e.file));
    const std::string line_text = e.line <= file.size() ? file[e.line - 1] : std::string();
    if (line_text.size() <= kFullyShownLine && line_text.find('\t') == std::string::npos) {
      EXPECT_EQ(out[at + 1], "  " + line_text) << result.output;
      EXPECT_EQ(out[at + 2], "  " + caret_pad(line_text, e.col) + "^") << result.output;
    } else {
      // A long line is shown as an excerpt around the caret.
      EXPECT_NE(out[at + 1].find("..."), std::string::npos) << result.output;
      EXPECT_TRUE(std::regex_match(out[at + 2], std::regex(R"(^ +\^$)"))) << result.output;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MustFail, ErrorInput, ::testing::ValuesIn(error_inputs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(ErrorInputs, DirectoryHoldsAtLeast45Inputs) {
  EXPECT_GE(error_inputs().size(), kMinErrorInputs) << errors_dir();
}

TEST(ErrorInputs, CycleImportPartnersAreNotInputsThemselves) {
  // Only the top file of the cycle is an input; its partners live one directory down.
  const auto names = error_inputs();
  EXPECT_EQ(std::count(names.begin(), names.end(), "cycle_a"), 0);
  EXPECT_TRUE(fs::is_regular_file(errors_dir() + "/imports/cycle_a.fuse"));
  EXPECT_TRUE(fs::is_regular_file(errors_dir() + "/imports/cycle_b.fuse"));
}

// ---- warnings under --Werror ------------------------------------------------------------------

struct WarningCase {
  const char* name;
  const char* source;
  const char* message;  // the warning's message prefix, after "warning: " / "error: "
};

const WarningCase kWarningCases[] = {
    {"symbol_like_a_constant",
     "const hidden = 64\n"
     "sequence s(x: bf16[hiddn, hidden]) -> (y: bf16[hiddn, hidden]) {\n  rmsnorm(hidden)\n}\n",
     "2:20: {}: 'hiddn' is taken as a symbolic dimension"},
    {"unused_extra_input",
     "sequence s(x: bf16[t, 64], r: bf16[t, 64]) -> (y: bf16[t, 64]) {\n  rmsnorm(64)\n}\n",
     "1:28: {}: extra input 'r' of sequence 's' is never used"},
    {"fp8_weights_without_fp8_recipe",
     "sequence s(x: bf16[t, 64]) -> (y: bf16[t, 64]) with fp8_weights {\n  rmsnorm(64)\n}\n",
     "1:53: {}: fp8_weights has no effect: sequence 's' uses the bf16 recipe"},
    {"quantized_under_bf16",
     "sequence s(h: e4m3[t, 64] quantized(rowwise, columnwise)) -> (y: bf16[t, 64]) {\n"
     "  linear(64, 64)\n}\n",
     "1:27: {}: the quantized input 'h' of sequence 's' passes in bf16: the sequence uses the bf16 "
     "recipe"},
    {"extra_output_is_main_output",
     "sequence s(x: bf16[t, 64]) -> (y: bf16[t, 64], z: bf16[t, 64]) {\n"
     "  rmsnorm(64)\n  make_extra_output(z)\n}\n",
     "1:48: {}: extra output 'z' is the same tensor as the main output 'y'"},
};

std::string with_severity(const char* pattern, const char* severity) {
  std::string s = pattern;
  s.replace(s.find("{}"), 2, severity);
  return s;
}

TEST(WarningInputs, WarnWithoutWerrorAndFailWithIt) {
  const std::string dir = test::make_temp_dir("werror");
  for (const WarningCase& c : kWarningCases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir + "/" + c.name + ".fuse";
    std::ofstream(path, std::ios::binary) << c.source;
    const std::string located = std::string(c.name) + ".fuse:";

    const auto plain = test::run_command(test::fusec_path() + " check " + shell_quoted(path));
    EXPECT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_NE(plain.output.find(located + with_severity(c.message, "warning")), std::string::npos)
        << plain.output;
    EXPECT_EQ(plain.output.find(": error: "), std::string::npos) << plain.output;

    const auto strict =
        test::run_command(test::fusec_path() + " check --Werror " + shell_quoted(path));
    EXPECT_EQ(strict.exit_code, 1) << strict.output;
    EXPECT_NE(strict.output.find(located + with_severity(c.message, "error")), std::string::npos)
        << strict.output;
    EXPECT_NE(strict.output.find("1 error, 0 warnings"), std::string::npos) << strict.output;
  }
}

}  // namespace
}  // namespace opfuse
