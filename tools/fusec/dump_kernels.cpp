// `fusec dump-kernels FILE -o DIR`: readable kernel sources (clang-format'ed when it is on PATH),
// the IR before and after fusion, and the plan; compiles nothing.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "build_common.h"
#include "commands.h"
#include "ir/printer.h"

extern char** environ;  // posix_spawnp's environment

namespace opfuse::fusec {

namespace {

namespace fs = std::filesystem;

// The first `name` in $PATH that is an executable file; "" when none.
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "";
  for (size_t begin = 0; begin <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', begin), dirs.size());
    std::string candidate =
        (end > begin ? dirs.substr(begin, end - begin) : std::string(".")) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate;
    begin = end + 1;
  }
  return {};
}

// Runs clang-format over `source` (CUDA, the project's style); nullopt when it fails.
std::optional<std::string> clang_format(const std::string& exe, const std::string& source) {
  const fs::path tmp = fs::temp_directory_path();
  std::string in_path = (tmp / "fusec-format-in-XXXXXX").string();
  std::string out_path = (tmp / "fusec-format-out-XXXXXX").string();
  const int in_fd = ::mkstemp(in_path.data());
  const int out_fd = in_fd < 0 ? -1 : ::mkstemp(out_path.data());
  std::optional<std::string> formatted;
  if (in_fd >= 0 && out_fd >= 0 &&
      ::write(in_fd, source.data(), source.size()) == static_cast<ssize_t>(source.size())) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
    std::string style = "--style={BasedOnStyle: Google, ColumnLimit: 100}";
    std::string assume = "--assume-filename=kernel.cu";
    std::vector<char*> argv = {const_cast<char*>(exe.c_str()), style.data(), assume.data(),
                               in_path.data(), nullptr};
    pid_t pid = 0;
    int status = -1;
    if (posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ) == 0 &&
        ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      std::ifstream in(out_path, std::ios::binary);
      formatted = std::string{std::istreambuf_iterator<char>(in), {}};
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  if (in_fd >= 0) ::close(in_fd), ::unlink(in_path.c_str());
  if (out_fd >= 0) ::close(out_fd), ::unlink(out_path.c_str());
  return formatted;
}

int run_dump_kernels(const BuildCommandOptions& opts, const CommonOptions& common) {
  const driver::CompileOptions options = build_driver_options(opts, common);
  if (!pass_options_are_valid(options)) return kExitUsage;
  SourceManager sources;
  auto loaded = load(opts.file, common, sources, opts.sequence);
  if (!loaded) return kExitUserError;
  // The IR before fusion: the same pipeline with the fusion passes disabled.
  driver::CompileOptions no_fusion = options;
  no_fusion.disabled_passes.insert({"fuse-forward", "fuse-backward"});
  no_fusion.last_stage = driver::Stage::Passes;
  const ir::Program before = driver::compile_ir(*loaded, &sources, nullptr, no_fusion).program;
  auto compiled = compile_program(std::move(*loaded), options, sources);
  if (!compiled) return kExitUserError;
  const opfuse::codegen::Plan& plan = compiled->plan;

  const std::string kernels_dir = opts.out_dir + "/kernels";
  if (!make_directory(kernels_dir)) return kExitUserError;
  if (!write_output(opts.out_dir + "/ir_before_fusion.ir",
                    opfuse::ir::print_program(before, &sources)) ||
      !write_output(opts.out_dir + "/ir_after_fusion.ir",
                    opfuse::ir::print_program(compiled->program, &sources)) ||
      !write_output(opts.out_dir + "/plan.json", opfuse::codegen::plan_json_text(plan)))
    return kExitUserError;
  const std::string formatter = find_on_path("clang-format");
  bool formatted_all = !formatter.empty();
  for (const driver::KernelRequest& kernel : compiled->kernels) {
    std::string source = kernel.source;
    if (!formatter.empty()) {
      if (auto formatted = clang_format(formatter, source)) {
        source = std::move(*formatted);
      } else {
        formatted_all = false;
      }
    }
    if (!write_output(kernels_dir + "/" + kernel.kernel_name + ".cu", source))
      return kExitUserError;
  }
  remove_stale_kernels(kernels_dir, plan);
  if (!formatter.empty() && !formatted_all)
    std::fprintf(stderr, "fusec: warning: %s failed on some kernels; they are left unformatted\n",
                 formatter.c_str());
  std::printf(
      "fusec: wrote %zu kernels (%s), ir_before_fusion.ir, ir_after_fusion.ir and "
      "plan.json to %s\n",
      plan.kernels.size(),
      formatter.empty() ? "unformatted: clang-format is not on PATH"
                        : "formatted with clang-format",
      opts.out_dir.c_str());
  return kExitOk;
}

}  // namespace

Command add_dump_kernels_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<BuildCommandOptions>();
  CLI::App* dump = app.add_subcommand(
      "dump-kernels",
      "write readable sources for review: DIR/kernels/<kernel>.cu (formatted by clang-format "
      "when it is on PATH; Clang's libFormat is not linked into fusec, so no clang-format means "
      "unformatted sources), DIR/ir_before_fusion.ir, DIR/ir_after_fusion.ir and DIR/plan.json. "
      "Compiles nothing");
  add_build_options(dump, *opts, common);
  return {dump, [opts, &common] { return run_dump_kernels(*opts, common); }};
}

}  // namespace opfuse::fusec
