// `fusec debug-report LOG_DIR -o report.html [--title TEXT]`: the statistics logged by a
// precision-debug run (LOG_DIR/opfuse_statistics/globalrank-*.jsonl) drawn as one self-contained
// HTML page (debug/report.h). Malformed logs are reported as file:line: error: ... and write
// nothing, so a stale page is never mistaken for the current run's.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "debug/report.h"
#include "debug/report_logs.h"

namespace opfuse::fusec {

namespace {

struct DebugReportOptions {
  std::string log_dir;
  std::string output;
  debug::ReportOptions report;
};

int run_debug_report(const DebugReportOptions& options) {
  const debug::StatisticsLogs logs = debug::read_statistics_logs(options.log_dir);
  if (!logs.ok()) {
    for (const debug::LogError& e : logs.errors) {
      const std::string message = debug::format_log_error(e);
      std::fprintf(stderr, "%s%s\n", e.file.empty() ? "fusec: " : "", message.c_str());
    }
    const int64_t unshown = logs.malformed_lines - int64_t(logs.errors.size());
    if (unshown > 0)
      std::fprintf(stderr, "fusec: error: %lld more malformed lines not shown\n",
                   static_cast<long long>(unshown));
    return kExitUserError;
  }
  const std::string html = debug::render_report(logs.records, options.report);
  return write_output_with_parents(options.output, html) ? kExitOk : kExitUserError;
}

}  // namespace

Command add_debug_report_command(CLI::App& app, CommonOptions& /*common*/) {
  auto options = std::make_shared<DebugReportOptions>();
  CLI::App* cmd =
      app.add_subcommand("debug-report",
                         "draw the statistics of a precision-debug run (LOG_DIR/opfuse_statistics/"
                         "globalrank-*.jsonl) as one self-contained HTML page");
  cmd->add_option("log_dir", options->log_dir, "the run's log directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("-o,--output", options->output, "the HTML file to write")->required();
  cmd->add_option("--title", options->report.title, "the page's title")
      ->default_str(options->report.title);
  cmd->footer(kExitCodeHelp);
  return {cmd, [options] { return run_debug_report(*options); }};
}

}  // namespace opfuse::fusec
