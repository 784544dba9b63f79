// `fusec debug-report LOG_DIR -o FILE`: the page from several ranks' logs, malformed lines
// reported with their file and line (and nothing written), missing logs as errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "debug/stat_record.h"
#include "test_support.h"

namespace opfuse {
namespace {

using test::contains;
using test::count;
using test::fusec;
using test::shell_quoted;

namespace fs = std::filesystem;

constexpr int kExitOk = 0;
constexpr int kExitUserError = 1;
constexpr int kExitUsage = 2;

// A log directory with ranks 0 and 1 logging fc1's activation max and fc2's weight underflows%
// for iterations 0..4; `extra` is appended to rank 1's file.
std::string make_log_dir(const std::string& extra = "") {
  const std::string dir = test::make_temp_dir("fusec-debug-report");
  fs::create_directories(dir + "/opfuse_statistics");
  for (const int rank : {0, 1}) {
    std::ofstream out(dir + "/opfuse_statistics/globalrank-" + std::to_string(rank) + ".jsonl");
    for (int64_t i = 0; i < 5; ++i) {
      out << debug::format_json_line({"fc1", "activation", "", "max", i, 1.0 + rank + i}) << "\n";
      out << debug::format_json_line({"fc2", "weight", "fprop", "underflows%", i, 0.5}) << "\n";
    }
    if (rank == 1) out << extra;
  }
  return dir;
}

TEST(FusecDebugReport, WritesOnePageForEveryRank) {
  const std::string dir = make_log_dir();
  const std::string page = dir + "/out/report.html";  // the parent is created
  const auto r = fusec("debug-report " + shell_quoted(dir) + " -o " + shell_quoted(page) +
                       " --title 'Run <7>'");
  ASSERT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_EQ(r.output, "");
  const std::string html = test::read_text(page);
  EXPECT_EQ(count(html, "<svg "), 2u);
  EXPECT_TRUE(contains(html, "20 records from 2 ranks (0, 1)")) << html.substr(0, 2000);
  EXPECT_TRUE(contains(html, "<h1>Run &lt;7&gt;</h1>"));
  EXPECT_EQ(count(html, "class=\"series\" data-rank=\"1\""), 2u);
  // The same logs give the same bytes; no temp file is left beside the page.
  ASSERT_EQ(fusec("debug-report " + shell_quoted(dir) + " -o " + shell_quoted(page) +
                  " --title 'Run <7>'")
                .exit_code,
            kExitOk);
  EXPECT_EQ(test::read_text(page), html);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir + "/out"), fs::directory_iterator()), 1);
}

TEST(FusecDebugReport, MalformedLineIsLocatedAndWritesNothing) {
  const std::string dir = make_log_dir(
      R"({"layer":"fc1","tensor":"activation","gemm":null,"stat":"max","iteration":5,"value":true})"
      "\n");
  const std::string page = dir + "/report.html";
  const auto r = fusec("debug-report " + shell_quoted(dir) + " -o " + shell_quoted(page));
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_TRUE(contains(r.output, dir + "/opfuse_statistics/globalrank-1.jsonl:11: error: "
                                       "\"value\" must be a number or one of \"nan\", \"inf\", "
                                       "\"-inf\""))
      << r.output;
  EXPECT_FALSE(fs::exists(page));
  // An existing page stays as it was.
  std::ofstream(page) << "old";
  EXPECT_EQ(fusec("debug-report " + shell_quoted(dir) + " -o " + shell_quoted(page)).exit_code,
            kExitUserError);
  EXPECT_EQ(test::read_text(page), "old");
}

TEST(FusecDebugReport, MissingLogsAreErrors) {
  const std::string page = test::make_temp_dir("fusec-debug-report") + "/report.html";
  const auto missing = fusec("debug-report /nonexistent/opfuse-no-logs -o " + shell_quoted(page));
  EXPECT_EQ(missing.exit_code, kExitUsage) << missing.output;
  EXPECT_TRUE(contains(missing.output, "/nonexistent/opfuse-no-logs")) << missing.output;

  const std::string empty = test::make_temp_dir("fusec-debug-report");
  const auto no_folder = fusec("debug-report " + shell_quoted(empty) + " -o " + shell_quoted(page));
  EXPECT_EQ(no_folder.exit_code, kExitUserError) << no_folder.output;
  EXPECT_TRUE(contains(no_folder.output, "fusec: error: no statistics logs: " + empty +
                                             "/opfuse_statistics is not a directory"))
      << no_folder.output;
  EXPECT_FALSE(fs::exists(page));

  const auto no_output = fusec("debug-report " + shell_quoted(empty));
  EXPECT_EQ(no_output.exit_code, kExitUsage) << no_output.output;
  EXPECT_TRUE(contains(no_output.output, "--output is required")) << no_output.output;
}

TEST(FusecDebugReport, HelpNamesTheCommand) {
  const auto r = fusec("--help");
  EXPECT_TRUE(contains(r.output, "debug-report")) << r.output;
  const auto sub = fusec("debug-report --help");
  EXPECT_EQ(sub.exit_code, kExitOk) << sub.output;
  EXPECT_TRUE(contains(sub.output, "opfuse_statistics")) << sub.output;
}

}  // namespace
}  // namespace opfuse
