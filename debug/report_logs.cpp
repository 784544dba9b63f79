#include "debug/report_logs.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

namespace opfuse::debug {

namespace fs = std::filesystem;

std::string format_log_error(const LogError& e) {
  if (e.file.empty()) return "error: " + e.message;
  if (e.line == 0) return fmt::format("{}: error: {}", e.file, e.message);
  return fmt::format("{}:{}: error: {}", e.file, e.line, e.message);
}

namespace {

constexpr std::string_view kPrefix = "globalrank-";
constexpr std::string_view kSuffix = ".jsonl";

// The rank of "globalrank-{rank}.jsonl"; -1 for a name of another shape, -2 for a name of this
// shape whose rank is not a (small) non-negative integer.
int rank_of(const std::string& name) {
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix))
    return -1;
  const std::string digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  // Nine digits keep it an int; no rank count comes near that.
  if (digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c) != 0; }))
    return -2;
  return std::stoi(digits);
}

void add_error(StatisticsLogs& logs, LogError error) {
  if (logs.errors.size() < kMaxReportedErrors) logs.errors.push_back(std::move(error));
}

void read_file(const std::string& path, int rank, StatisticsLogs& logs) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    add_error(logs, {path, 0, "cannot read the file"});
    return;
  }
  const std::string contents = text.str();
  int64_t line_number = 0;
  size_t begin = 0;
  // The writer ends every line with '\n': a last piece without one is a line too (a run killed
  // mid-write leaves a cut-off line, which parse_json_line then rejects).
  while (begin < contents.size()) {
    size_t end = contents.find('\n', begin);
    if (end == std::string::npos) end = contents.size();
    std::string_view line(contents.data() + begin, end - begin);
    if (line.ends_with('\r')) line.remove_suffix(1);  // a log copied through Windows
    ++line_number;
    std::string reason;
    if (auto record = parse_json_line(line, reason)) {
      logs.records.push_back({rank, std::move(*record)});
    } else {
      ++logs.malformed_lines;
      add_error(logs, {path, line_number, reason});
    }
    begin = end + 1;
  }
}

}  // namespace

StatisticsLogs read_statistics_logs(const std::string& log_dir) {
  StatisticsLogs logs;
  const fs::path dir = fs::path(log_dir) / kStatisticsFolder;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    add_error(logs, {"", 0,
                     fmt::format("no statistics logs: {} is not a directory (the statistics log "
                                 "writes globalrank-{{rank}}.jsonl there)",
                                 dir.string())});
    return logs;
  }
  std::vector<std::pair<int, std::string>> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int rank = rank_of(name);
    if (rank == -1) continue;
    if (rank == -2) {
      add_error(logs, {it->path().string(), 0, "the file name is not globalrank-{rank}.jsonl"});
      continue;
    }
    std::error_code file_ec;  // not `ec`: that one ends the listing
    if (!it->is_regular_file(file_ec)) {
      add_error(logs, {it->path().string(), 0, "not a regular file"});
      continue;
    }
    files.emplace_back(rank, it->path().string());
  }
  if (ec) {
    add_error(logs, {dir.string(), 0, "cannot list the directory: " + ec.message()});
    return logs;
  }
  // Rank order (numeric: rank 10 after rank 9), so the records and the page do not depend on
  // the order the directory lists its files in.
  std::sort(files.begin(), files.end());
  if (files.empty() && logs.errors.empty()) {
    add_error(logs, {dir.string(), 0, "no statistics logs: no globalrank-{rank}.jsonl files"});
    return logs;
  }
  for (const auto& file : files) {
    logs.files.push_back(file.second);
    read_file(file.second, file.first, logs);
  }
  if (logs.records.empty() && logs.errors.empty()) {
    add_error(logs, {dir.string(), 0,
                     fmt::format("no statistics logs: {} globalrank-{{rank}}.jsonl file{} without "
                                 "a single record",
                                 files.size(), files.size() == 1 ? "" : "s")});
  }
  return logs;
}

}  // namespace opfuse::debug
