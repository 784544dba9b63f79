// The precision-debug log files of one rank, in TE's layout under a log directory, plus a JSON
// twin of the statistics for tools (debug/stat_record.h):
//   {dir}/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-{rank}.log
//       TIME - INFO - {layer}_{tensor}_{stat} \t\t\t\t iteration={it:06d} \t\t\t\t value={v:.Nf}
//   {dir}/opfuse_statistics/globalrank-{rank}.jsonl      one format_json_line() per statistic
//   {dir}/nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-{rank}.log
//       TIME - INFO - {free text}                          (each layer's plan, notices)
// TIME is Python logging's asctime ("2026-11-25 17:52:03,123", local time), so a TE log and an
// opfuse log of the same run line up in the same tools. N is the precision: TE's 4 by default
// (which rounds a small MSE to 0.0000); `--debug-precision` raises it. The JSON file keeps the
// full double whatever N is.
//
// Lines are gathered per training step and written, in the order they were added, by end_step(),
// which then flushes every file to the operating system: a crash (of the process) loses at most
// the step in progress, and a step is never half written by us.
#pragma once

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "debug/stat_record.h"

namespace opfuse::debug {

// A log directory or file that cannot be created or written, or a statistics file that cannot be
// read back. The message is complete ("cannot write debug logs to '<dir>': <reason>",
// "<file>:<line>: error: <reason>").
class DebugLogError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The time stamp of a log line. Tests inject a fixed one to compare whole files.
using LogClock = std::function<std::string()>;

// Now, as Python logging's default asctime: "%Y-%m-%d %H:%M:%S,mmm" in local time.
std::string asctime_now();

// One line of TE's statistics log, without the newline.
std::string format_stat_line(const StatRecord& r, std::string_view time, int precision);

class StatLog {
 public:
  // Creates the directories and opens the three files of `rank` for appending (a resumed run adds
  // to the logs of the first). An unwritable `dir` is reported here, before any training step,
  // as DebugLogError "cannot write debug logs to '<dir>': <reason>". Throws std::invalid_argument
  // for a negative rank or a precision outside 0..30. A null clock means asctime_now.
  static StatLog open(const std::filesystem::path& dir, int rank, int precision = 4,
                      LogClock clock = asctime_now);

  StatLog(StatLog&&) noexcept = default;
  // Writes this log's pending lines (as the destructor) before taking the other's files.
  StatLog& operator=(StatLog&&) noexcept;
  // Writes what is still pending (as end_step(), errors swallowed): the last step of a run that
  // ends without calling end_step() is kept, not dropped.
  ~StatLog();

  // One statistic of this step, stamped now (the clock is read here).
  void add(const StatRecord& r);
  // Free-form text for the debug log of this step (a layer's plan), stamped now; each line of a
  // multi-line message gets its own prefix, so that every line of the file reads "TIME - INFO -".
  void debug_line(std::string_view message);
  // Writes the lines added since the last end_step() and flushes the files (fflush: the files are
  // C stdio streams, see stat_log.cpp). Throws DebugLogError "cannot write debug logs to '<file>':
  // <reason>" when a write fails (disk full: the reason says so); that step's lines are dropped.
  void end_step();

  int precision() const { return precision_; }
  const std::filesystem::path& stats_path() const { return stats_path_; }
  const std::filesystem::path& json_path() const { return json_path_; }
  const std::filesystem::path& debug_path() const { return debug_path_; }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  using File = std::unique_ptr<std::FILE, FileCloser>;

  StatLog() = default;
  void write_pending();

  std::filesystem::path dir_;
  int precision_ = 4;
  LogClock clock_;
  std::filesystem::path stats_path_, json_path_, debug_path_;
  File stats_, json_, debug_;
  // This step's text per file, in the order added.
  std::string pending_stats_, pending_json_, pending_debug_;
};

// The statistics of a JSON lines file written by StatLog, in file order. Blank lines are skipped;
// a malformed line throws DebugLogError "<file>:<line>: error: <reason>" (parse_json_line's
// reason), an unreadable file "<file>: error: cannot read: <reason>".
std::vector<StatRecord> read_stat_jsonl(const std::filesystem::path& file);

}  // namespace opfuse::debug
