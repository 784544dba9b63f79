#include "common.h"

#include <cstdio>
#include <exception>
#include <filesystem>

#include "support/atomic_file.h"
#include "support/diagnostics.h"

namespace opfuse::fusec {

void add_common(CLI::App* cmd, CommonOptions& common) {
  cmd->add_option("--recipe", common.recipe,
                  "use this declared recipe (or bf16) for every sequence instead of its own");
  cmd->add_flag("--Werror", common.warnings_as_errors, "treat warnings as errors");
}

driver::CompileOptions driver_options(const CommonOptions& common) {
  driver::CompileOptions options;
  options.recipe = common.recipe;
  options.warnings_as_errors = common.warnings_as_errors;
  return options;
}

bool pass_options_are_valid(const driver::CompileOptions& options, std::string_view unknown_hint) {
  const driver::CompileResult checked = driver::check_options(options);
  if (checked.ok()) return true;
  if (!checked.unknown_passes.empty()) {
    std::string names;
    for (const std::string& name : driver::pass_names()) names += " " + name;
    std::fprintf(stderr, "fusec: error: unknown pass '%s'; passes:%s%.*s\n",
                 checked.unknown_passes[0].c_str(), names.c_str(), int(unknown_hint.size()),
                 unknown_hint.data());
  } else {
    std::fprintf(stderr, "fusec: error: %s\n", checked.error.c_str());
  }
  return false;
}

std::optional<ir::Program> load(const std::string& path, const CommonOptions& common,
                                SourceManager& sources, const std::string& sequence) {
  DiagnosticEngine diags(sources);
  driver::CompileOptions options = driver_options(common);
  options.sequence = sequence;
  options.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult result = driver::compile_file(path, sources, diags, options);
  std::fputs(diags.format_all().c_str(), stderr);
  if (result.ok()) return std::move(result.program);
  if (diags.has_errors()) {
    std::fprintf(stderr, "%s: %zu error%s, %zu warning%s\n", path.c_str(), diags.error_count(),
                 diags.error_count() == 1 ? "" : "s", diags.warning_count(),
                 diags.warning_count() == 1 ? "" : "s");
  } else {
    std::fprintf(stderr, "fusec: error: %s\n", result.error.c_str());  // no such sequence
  }
  return std::nullopt;
}

std::optional<std::map<std::string, int64_t>> parse_bindings(
    const std::vector<std::string>& binds) {
  std::map<std::string, int64_t> bindings;
  for (const std::string& bind : binds) {
    const size_t eq = bind.find('=');
    bool ok = eq != std::string::npos && eq > 0 && eq + 1 < bind.size();
    if (ok) {
      try {
        size_t used = 0;
        bindings[bind.substr(0, eq)] = std::stoll(bind.substr(eq + 1), &used);
        ok = used == bind.size() - eq - 1;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok) {
      std::fprintf(stderr, "fusec: error: --bind '%s' is not NAME=SIZE (e.g. --bind tokens=64)\n",
                   bind.c_str());
      return std::nullopt;
    }
  }
  return bindings;
}

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool make_directory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    std::fprintf(stderr, "fusec: error: cannot create the output directory %s: %s\n", dir.c_str(),
                 error ? error.message().c_str() : "not a directory");
    return false;
  }
  return true;
}

// Every output is written atomically: a reader (or a concurrent build) sees a whole file. Not
// fsync'd: a rebuild recreates outputs, and fsyncs were most of a warm build's time.
bool write_output(const std::string& path, std::string_view bytes) {
  const std::string failure = write_file_atomically(path, bytes, Durability::VisibleOnly);
  if (failure.empty()) return true;
  std::fprintf(stderr, "fusec: error: cannot write %s: %s\n", path.c_str(), failure.c_str());
  return false;
}

bool write_output_with_parents(const std::string& path, std::string_view bytes) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !make_directory(parent.string())) return false;
  return write_output(path, bytes);
}

}  // namespace opfuse::fusec
