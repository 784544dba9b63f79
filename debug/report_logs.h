// Reading the statistics log back for `fusec debug-report`: every
// {log_dir}/opfuse_statistics/globalrank-{rank}.jsonl, one StatRecord per line (stat_record.h).
// The rank comes from the file name (the records do not carry it), so several ranks' files of
// one run can be drawn side by side.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "debug/stat_record.h"

namespace opfuse::debug {

// One record of one rank's log.
struct RankedRecord {
  int rank = 0;
  StatRecord record;
  friend bool operator==(const RankedRecord&, const RankedRecord&) = default;
};

// A problem with the logs. `line` 0: the whole file (or, with `file` empty, the log directory).
struct LogError {
  std::string file;
  int64_t line = 0;
  std::string message;
};
// "file:line: error: message", "file: error: message" or "error: message".
std::string format_log_error(const LogError& e);

struct StatisticsLogs {
  std::vector<std::string> files;     // the globalrank-*.jsonl read, in rank order
  std::vector<RankedRecord> records;  // rank order, then line order
  // At most kMaxReportedErrors of them; `malformed_lines` counts every malformed line, so a
  // file that is not a log at all does not print a million errors.
  std::vector<LogError> errors;
  int64_t malformed_lines = 0;
  bool ok() const { return errors.empty(); }
};
inline constexpr size_t kMaxReportedErrors = 20;

// The folder under a log directory that holds the JSON lines.
inline constexpr const char* kStatisticsFolder = "opfuse_statistics";

// Reads every globalrank-{rank}.jsonl under {log_dir}/opfuse_statistics. A missing folder, a
// folder without such files, files without a single record, an unreadable file and every
// malformed line (with parse_json_line's reason) are errors. Other file names are ignored (the
// folder may hold other logs beside them).
StatisticsLogs read_statistics_logs(const std::string& log_dir);

}  // namespace opfuse::debug
