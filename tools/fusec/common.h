// What every fusec command shares: exit codes, the common options, loading a .fuse file with its
// diagnostics printed, and writing outputs. One file per command (check.cpp, ir.cpp, run.cpp,
// build.cpp, dump_kernels.cpp, bench.cpp, debug_report.cpp) registers its subcommand through
// commands.h.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "driver/compile.h"
#include "ir/graph.h"
#include "support/source_manager.h"

namespace opfuse::fusec {

// Exit codes (also in --help and the README):
//   0  success
//   1  user error in a .fuse program (diagnostics printed); for build, also a kernel that NVRTC
//      rejects (its name and log printed) or an output that cannot be written; for debug-report,
//      missing or malformed statistics logs (file:line: error: ...)
//   2  usage error (bad command line)
//   3  internal error (a bug in opfuse; please report it with the input)
constexpr int kExitOk = 0;
constexpr int kExitUserError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 3;

inline constexpr const char* kExitCodeHelp =
    "Exit codes: 0 success, 1 errors in a .fuse program, 2 usage error, 3 internal error "
    "(a bug in opfuse). build also exits 1 when a kernel fails to compile or an output cannot "
    "be written; debug-report when the statistics logs are missing or malformed.";

struct CommonOptions {
  std::string recipe;
  bool warnings_as_errors = false;
};

// A registered subcommand and what runs it once the command line is parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Adds --recipe and --Werror to `cmd`.
void add_common(CLI::App* cmd, CommonOptions& common);

// The compile driver's options for the common options (recipe, --Werror).
driver::CompileOptions driver_options(const CommonOptions& common);

// False after reporting a usage error in `options`' pass names (an unknown pass; a disabled pass
// that a later pass requires). `unknown_hint` follows the list of pass names.
bool pass_options_are_valid(const driver::CompileOptions& options,
                            std::string_view unknown_hint = "");

// Loads one file through the driver's front end, narrowed to `sequence` (empty: every sequence);
// prints its diagnostics. Returns nullopt on user errors.
std::optional<ir::Program> load(const std::string& path, const CommonOptions& common,
                                SourceManager& sources, const std::string& sequence = "");

// NAME=SIZE pairs; nullopt after reporting the first malformed one.
std::optional<std::map<std::string, int64_t>> parse_bindings(const std::vector<std::string>& binds);

using Clock = std::chrono::steady_clock;
double milliseconds_since(Clock::time_point start);

// Creates `dir` and its parents; false (reported) when that fails.
bool make_directory(const std::string& dir);
// Writes `bytes` to `path` atomically; false (reported) when that fails.
bool write_output(const std::string& path, std::string_view bytes);
// The same after creating the file's parent directories (make_directory).
bool write_output_with_parents(const std::string& path, std::string_view bytes);

}  // namespace opfuse::fusec
