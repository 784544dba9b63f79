#include "debug/stat_log.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>

namespace opfuse::debug {

namespace fs = std::filesystem;

namespace {

std::string errno_reason(int err) { return std::generic_category().message(err); }

[[noreturn]] void cannot_write(const fs::path& where, const std::string& reason) {
  throw DebugLogError(fmt::format("cannot write debug logs to '{}': {}", where.string(), reason));
}

}  // namespace

std::string asctime_now() {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::floor<std::chrono::seconds>(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - secs).count();
  const std::time_t t = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  localtime_r(&t, &tm);  // Python's logging stamps local time (time.localtime)
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{},{:03d}", buf, static_cast<int>(ms));
}

std::string format_stat_line(const StatRecord& r, std::string_view time, int precision) {
  // Python's "%.4f" writes every NaN as "nan"; fmt would write a NaN with the sign bit set as
  // "-nan". Infinities agree ("inf", "-inf").
  const std::string value =
      std::isnan(r.value) ? std::string("nan") : fmt::format("{:.{}f}", r.value, precision);
  return fmt::format("{} - INFO - {} \t\t\t\t iteration={:06d} \t\t\t\t value={}", time,
                     metric_name(r), r.iteration, value);
}

StatLog StatLog::open(const fs::path& dir, int rank, int precision, LogClock clock) {
  if (rank < 0) throw std::invalid_argument(fmt::format("debug log rank {} is negative", rank));
  if (precision < 0 || precision > 30) {
    throw std::invalid_argument(
        fmt::format("debug log precision {} is not in 0..30 decimals", precision));
  }
  StatLog log;
  log.dir_ = dir;
  log.precision_ = precision;
  log.clock_ = clock ? std::move(clock) : LogClock(asctime_now);
  const fs::path stats_dir = dir / "nvdlfw_inspect_statistics_logs";
  const fs::path json_dir = dir / "opfuse_statistics";
  const fs::path debug_dir = dir / "nvdlfw_inspect_logs";
  log.stats_path_ = stats_dir / fmt::format("nvdlfw_inspect_globalrank-{}.log", rank);
  log.json_path_ = json_dir / fmt::format("globalrank-{}.jsonl", rank);
  log.debug_path_ = debug_dir / fmt::format("nvdlfw_inspect_globalrank-{}.log", rank);
  for (const fs::path& d : {stats_dir, json_dir, debug_dir}) {
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) cannot_write(dir, ec.message());
  }
  // C stdio rather than std::ofstream: a failed open, write or flush leaves the reason in errno
  // ("No space left on device"), which an ofstream's failbit does not carry. fflush() hands the
  // bytes to the operating system, so they survive the process crashing (not the machine).
  const auto open_file = [&dir](const fs::path& path) {
    errno = 0;
    File f(std::fopen(path.c_str(), "a"));
    if (!f) cannot_write(dir, fmt::format("{}: {}", path.string(), errno_reason(errno)));
    return f;
  };
  log.stats_ = open_file(log.stats_path_);
  log.json_ = open_file(log.json_path_);
  log.debug_ = open_file(log.debug_path_);
  return log;
}

StatLog& StatLog::operator=(StatLog&& other) noexcept {
  if (this != &other) {
    try {
      write_pending();
    } catch (const DebugLogError&) {  // a destructor-like path: nowhere to report it
    }
    dir_ = std::move(other.dir_);
    precision_ = other.precision_;
    clock_ = std::move(other.clock_);
    stats_path_ = std::move(other.stats_path_);
    json_path_ = std::move(other.json_path_);
    debug_path_ = std::move(other.debug_path_);
    stats_ = std::move(other.stats_);
    json_ = std::move(other.json_);
    debug_ = std::move(other.debug_);
    pending_stats_ = std::exchange(other.pending_stats_, {});
    pending_json_ = std::exchange(other.pending_json_, {});
    pending_debug_ = std::exchange(other.pending_debug_, {});
  }
  return *this;
}

StatLog::~StatLog() {
  try {
    write_pending();
  } catch (const DebugLogError&) {  // a destructor cannot throw; the step is lost
  }
}

void StatLog::add(const StatRecord& r) {
  pending_stats_ += format_stat_line(r, clock_(), precision_);
  pending_stats_ += '\n';
  pending_json_ += format_json_line(r);
  pending_json_ += '\n';
}

void StatLog::debug_line(std::string_view message) {
  const std::string time = clock_();
  size_t start = 0;
  while (true) {
    const size_t end = message.find('\n', start);
    pending_debug_ += fmt::format("{} - INFO - {}\n", time, message.substr(start, end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
}

void StatLog::end_step() { write_pending(); }

void StatLog::write_pending() {
  if (!stats_) return;  // moved from
  // Taken out first: a failed write must not be repeated by the destructor.
  const std::pair<std::FILE*, std::string> parts[] = {
      {stats_.get(), std::exchange(pending_stats_, {})},
      {json_.get(), std::exchange(pending_json_, {})},
      {debug_.get(), std::exchange(pending_debug_, {})},
  };
  const fs::path* paths[] = {&stats_path_, &json_path_, &debug_path_};
  for (size_t i = 0; i < std::size(parts); ++i) {
    std::FILE* f = parts[i].first;
    const std::string& text = parts[i].second;
    errno = 0;
    if (!text.empty() && std::fwrite(text.data(), 1, text.size(), f) != text.size()) {
      cannot_write(*paths[i], errno_reason(errno));
    }
    if (std::fflush(f) != 0) cannot_write(*paths[i], errno_reason(errno));
  }
}

std::vector<StatRecord> read_stat_jsonl(const fs::path& file) {
  errno = 0;
  std::ifstream in(file);
  if (!in) {
    throw DebugLogError(
        fmt::format("{}: error: cannot read: {}", file.string(), errno_reason(errno)));
  }
  std::vector<StatRecord> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string error;
    auto r = parse_json_line(line, error);
    if (!r) throw DebugLogError(fmt::format("{}:{}: error: {}", file.string(), number, error));
    out.push_back(std::move(*r));
  }
  if (in.bad()) {
    throw DebugLogError(fmt::format("{}: error: cannot read: {}", file.string(), "read failed"));
  }
  return out;
}

}  // namespace opfuse::debug
