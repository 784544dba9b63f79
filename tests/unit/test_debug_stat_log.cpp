// The precision-debug log files (debug/stat_log.h): exact text of both statistics formats and the
// debug log under a fixed clock, the precision, appending across opens, nothing on disk before
// end_step(), an unwritable directory reported at open, and reading the JSON lines back.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "debug/stat_log.h"

namespace opfuse::debug {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A clock that gives 17:52:03,100 then ,101, ...: which line was stamped when shows in the text.
LogClock counting_clock() {
  auto n = std::make_shared<int>(100);
  return [n] { return fmt::format("2026-11-25 17:52:03,{:03d}", (*n)++); };
}

std::string value_part(const std::string& line) { return line.substr(line.rfind("value=")); }

const StatRecord kAct{"fc1", "activation", "", "max", 3, 1.25};
const StatRecord kMse{"fc1", "weight", "fprop", "mse", 3, 1.5e-6};
const StatRecord kGrad{"fc2", "gradient", "", "min", 12, -0.5};

class StatLogTest : public testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() /
           fmt::format("opfuse_test_stat_log_{}_{:08x}", ::getpid(), static_cast<unsigned>(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(StatLogTest, WritesTeTextJsonAndDebugLinesExactly) {
  {
    StatLog log = StatLog::open(dir_ / "logs", 3, 4, counting_clock());
    EXPECT_EQ(log.stats_path(),
              dir_ / "logs/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-3.log");
    EXPECT_EQ(log.json_path(), dir_ / "logs/opfuse_statistics/globalrank-3.jsonl");
    EXPECT_EQ(log.debug_path(), dir_ / "logs/nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-3.log");
    log.debug_line("fc1: fprop activation Quantize\nfc1: fprop weight High Precision");
    log.add(kAct);
    log.add(kMse);
    log.add(kGrad);
    log.end_step();
  }
  const fs::path logs = dir_ / "logs";
  EXPECT_EQ(slurp(logs / "nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-3.log"),
            "2026-11-25 17:52:03,101 - INFO - fc1_activation_max \t\t\t\t iteration=000003 "
            "\t\t\t\t value=1.2500\n"
            "2026-11-25 17:52:03,102 - INFO - fc1_weight_mse \t\t\t\t iteration=000003 "
            "\t\t\t\t value=0.0000\n"
            "2026-11-25 17:52:03,103 - INFO - fc2_gradient_min \t\t\t\t iteration=000012 "
            "\t\t\t\t value=-0.5000\n");
  EXPECT_EQ(
      slurp(logs / "opfuse_statistics/globalrank-3.jsonl"),
      R"({"layer":"fc1","tensor":"activation","gemm":null,"stat":"max","iteration":3,"value":1.25})"
      "\n"
      R"({"layer":"fc1","tensor":"weight","gemm":"fprop","stat":"mse","iteration":3,"value":1.5e-06})"
      "\n"
      R"({"layer":"fc2","tensor":"gradient","gemm":null,"stat":"min","iteration":12,"value":-0.5})"
      "\n");
  // One stamp for the message, a prefix per line.
  EXPECT_EQ(slurp(logs / "nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-3.log"),
            "2026-11-25 17:52:03,100 - INFO - fc1: fprop activation Quantize\n"
            "2026-11-25 17:52:03,100 - INFO - fc1: fprop weight High Precision\n");
}

TEST_F(StatLogTest, PrecisionSetsTheDecimalsOfTheTextOnly) {
  {
    StatLog log = StatLog::open(dir_, 0, 8, [] { return std::string("T"); });
    EXPECT_EQ(log.precision(), 8);
    log.add(kMse);
    log.add(kGrad);
    log.end_step();
  }
  EXPECT_EQ(slurp(dir_ / "nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log"),
            "T - INFO - fc1_weight_mse \t\t\t\t iteration=000003 \t\t\t\t value=0.00000150\n"
            "T - INFO - fc2_gradient_min \t\t\t\t iteration=000012 \t\t\t\t value=-0.50000000\n");
  // The JSON keeps the double, whatever the precision.
  EXPECT_EQ(read_stat_jsonl(dir_ / "opfuse_statistics/globalrank-0.jsonl"),
            (std::vector<StatRecord>{kMse, kGrad}));

  StatRecord r = kAct;
  EXPECT_EQ(value_part(format_stat_line(r, "T", 4)), "value=1.2500");
  EXPECT_EQ(value_part(format_stat_line(r, "T", 0)), "value=1");
  r.value = std::numeric_limits<double>::infinity();
  EXPECT_EQ(value_part(format_stat_line(r, "T", 4)), "value=inf");
  r.value = -r.value;
  EXPECT_EQ(value_part(format_stat_line(r, "T", 4)), "value=-inf");
  // Python writes every NaN as "nan", the sign bit notwithstanding.
  r.value = std::copysign(std::numeric_limits<double>::quiet_NaN(), -1.0);
  EXPECT_EQ(value_part(format_stat_line(r, "T", 4)), "value=nan");
  EXPECT_THROW(StatLog::open(dir_, 0, 31), std::invalid_argument);
  EXPECT_THROW(StatLog::open(dir_, 0, -1), std::invalid_argument);
  EXPECT_THROW(StatLog::open(dir_, -1, 4), std::invalid_argument);
}

TEST_F(StatLogTest, NothingReachesTheFilesBeforeEndStep) {
  StatLog log = StatLog::open(dir_, 1, 4, counting_clock());
  log.debug_line("plan");
  log.add(kAct);
  // Opened (so an unwritable directory shows at once) but still empty.
  for (const fs::path& p : {log.stats_path(), log.json_path(), log.debug_path()}) {
    ASSERT_TRUE(fs::exists(p)) << p;
    EXPECT_EQ(fs::file_size(p), 0u) << p;
  }
  log.end_step();
  const std::string step1 = slurp(log.stats_path());
  EXPECT_NE(step1.find("fc1_activation_max"), std::string::npos);
  EXPECT_EQ(read_stat_jsonl(log.json_path()), std::vector<StatRecord>{kAct});
  // The second step stays in memory until its own end_step(), then follows the first.
  log.add(kGrad);
  EXPECT_EQ(slurp(log.stats_path()), step1);
  log.end_step();
  EXPECT_EQ(read_stat_jsonl(log.json_path()), (std::vector<StatRecord>{kAct, kGrad}));
  // An end_step() with nothing added writes nothing.
  const std::string before = slurp(log.stats_path());
  log.end_step();
  EXPECT_EQ(slurp(log.stats_path()), before);
}

TEST_F(StatLogTest, ASecondOpenAppendsAndTheDestructorKeepsTheLastStep) {
  {
    StatLog log = StatLog::open(dir_, 2, 4, counting_clock());
    log.add(kAct);
    log.end_step();
  }
  {
    StatLog first = StatLog::open(dir_, 2, 4, counting_clock());
    first.add(kMse);  // no end_step(): the destructor writes it
    StatLog moved = std::move(first);
    moved.add(kGrad);
  }
  EXPECT_EQ(read_stat_jsonl(dir_ / "opfuse_statistics/globalrank-2.jsonl"),
            (std::vector<StatRecord>{kAct, kMse, kGrad}));
  // Each open's clock starts again at ,100; the moved-to log stamped kGrad.
  EXPECT_EQ(slurp(dir_ / "nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-2.log"),
            format_stat_line(kAct, "2026-11-25 17:52:03,100", 4) + "\n" +
                format_stat_line(kMse, "2026-11-25 17:52:03,100", 4) + "\n" +
                format_stat_line(kGrad, "2026-11-25 17:52:03,101", 4) + "\n");
  // Other ranks have their own files.
  {
    StatLog other = StatLog::open(dir_, 5, 4, counting_clock());
    other.add(kAct);
  }
  EXPECT_EQ(read_stat_jsonl(dir_ / "opfuse_statistics/globalrank-5.jsonl"),
            std::vector<StatRecord>{kAct});
}

TEST_F(StatLogTest, AnUnwritableDirectoryIsReportedAtOpen) {
  const fs::path plain = dir_ / "plain";
  std::ofstream(plain) << "a regular file\n";
  for (const fs::path& bad : {plain, plain / "logs"}) {
    try {
      StatLog::open(bad, 0);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const DebugLogError& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("cannot write debug logs to '{}': Not a directory", bad.string()));
    }
  }
  // A directory where the log file should be.
  fs::create_directories(dir_ / "d/nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-0.log");
  try {
    StatLog::open(dir_ / "d", 0);
    ADD_FAILURE() << "no error for a directory in the file's place";
  } catch (const DebugLogError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        fmt::format("cannot write debug logs to '{}': {}: Is a directory", (dir_ / "d").string(),
                    (dir_ / "d/nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-0.log").string()));
  }
}

TEST_F(StatLogTest, AsctimeHasPythonsLayout) {
  const std::string t = asctime_now();
  ASSERT_EQ(t.size(), 23u) << t;  // 2026-11-25 17:52:03,123
  for (const size_t i : {4u, 7u}) EXPECT_EQ(t[i], '-') << t;
  EXPECT_EQ(t[10], ' ') << t;
  for (const size_t i : {13u, 16u}) EXPECT_EQ(t[i], ':') << t;
  EXPECT_EQ(t[19], ',') << t;
  for (const size_t i :
       {0u, 1u, 2u, 3u, 5u, 6u, 8u, 9u, 11u, 12u, 14u, 15u, 17u, 18u, 20u, 21u, 22u}) {
    EXPECT_TRUE(t[i] >= '0' && t[i] <= '9') << t;
  }
}

TEST_F(StatLogTest, JsonLinesReadBackOrSayWhereTheyAreWrong) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<StatRecord> records = {kAct, kMse, kGrad,
                                           StatRecord{"fc2", "output", "", "cur_amax", 999999, inf},
                                           StatRecord{"fc2", "output", "", "std", 7, 0.1 + 0.2}};
  {
    StatLog log = StatLog::open(dir_, 0, 4, counting_clock());
    for (const StatRecord& r : records) log.add(r);
    log.end_step();
  }
  EXPECT_EQ(read_stat_jsonl(dir_ / "opfuse_statistics/globalrank-0.jsonl"), records);

  // Blank lines (and CRLF endings) pass; line 4 lacks "tensor".
  const fs::path bad = dir_ / "bad.jsonl";
  std::ofstream(bad) << format_json_line(kAct) << "\r\n\n   \n"
                     << R"({"layer":"fc1","gemm":null,"stat":"max","iteration":1,"value":1})"
                     << "\n";
  try {
    read_stat_jsonl(bad);
    ADD_FAILURE() << "no error for a malformed line";
  } catch (const DebugLogError& e) {
    EXPECT_EQ(std::string(e.what()), bad.string() + ":4: error: missing key \"tensor\"");
  }
  std::ofstream(bad) << format_json_line(kAct) << "\n"
                     << R"({"layer":"fc1","tens)";  // cut off
  try {
    read_stat_jsonl(bad);
    ADD_FAILURE() << "no error for a truncated last line";
  } catch (const DebugLogError& e) {
    EXPECT_EQ(std::string(e.what()), bad.string() + ":2: error: not a JSON object");
  }
  try {
    read_stat_jsonl(dir_ / "missing.jsonl");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const DebugLogError& e) {
    EXPECT_EQ(std::string(e.what()), (dir_ / "missing.jsonl").string() +
                                         ": error: cannot read: No such file or directory");
  }
}

}  // namespace
}  // namespace opfuse::debug
