// fusec: the opfuse command-line compiler. Each command is one file (commands.h); exit codes are
// common.h's (also in --help and the README). Errors go to stderr as `file:line:col: error: ...`
// where they are in a .fuse program, else as `fusec: error: ...`; internal errors say so.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "launch.h"
#include "opfuse/error.h"
#include "opfuse/program.h"
#include "support/assert.h"

namespace opfuse::fusec {
namespace {

// Reports a bad command line in fusec's own words instead of CLI11's, and where its usage is.
// After a failed parse CLI11's list of parsed subcommands may be partial, so the command is read
// from argv: the top level takes only flags, so its first word is the command.
int report_usage_error(const CLI::ParseError& e, int argc, char** argv,
                       const std::vector<Command>& commands) {
  std::string_view word;
  for (int i = 1; i < argc && word.empty(); ++i)
    if (argv[i][0] != '-') word = argv[i];
  const CLI::App* given = nullptr;
  std::string names;
  for (const Command& command : commands) {
    names += " " + command.app->get_name();
    if (command.app->get_name() == word) given = command.app;
  }
  // CLI11 says "A subcommand is required" for a missing command and for a misspelt one.
  if (!word.empty() && given == nullptr)
    std::fprintf(stderr, "fusec: error: unknown command '%.*s'; commands:%s\n", int(word.size()),
                 word.data(), names.c_str());
  else if (word.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr)
    std::fprintf(stderr, "fusec: error: a command is required; commands:%s\n", names.c_str());
  else
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
  const std::string help =
      given != nullptr ? "fusec " + given->get_name() + " --help" : "fusec --help";
  std::fprintf(stderr, "fusec: run '%s' for usage\n", help.c_str());
  return kExitUsage;
}

}  // namespace
}  // namespace opfuse::fusec

int main(int argc, char** argv) {
  using namespace opfuse::fusec;
  CLI::App app{"fusec: compile .fuse programs of fused transformer ops into CUDA kernels", "fusec"};
  app.footer(kExitCodeHelp);
  app.set_version_flag("--version", std::string("fusec (opfuse) ") + OPFUSE_VERSION);
  app.require_subcommand(1);

  CommonOptions common;
  const std::vector<Command> commands = {
      add_check_command(app, common),        add_ir_command(app, common),
      add_run_command(app, common),          add_build_command(app, common),
      add_dump_kernels_command(app, common), add_bench_command(app, common),
      add_debug_plan_command(app, common),   add_debug_report_command(app, common),
      add_merge_state_command(app, common),  add_split_state_command(app, common),
      add_train_command(app, common),
  };

  set_process_args(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version: CLI11 prints them on stdout.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    return report_usage_error(e, argc, argv, commands);
  }

  try {
    for (const Command& command : commands)
      if (*command.app) return command.run();
  } catch (const opfuse::InternalError& e) {
    std::fprintf(stderr, "%s\nfusec: this is a bug in opfuse; please report it with the input.\n",
                 e.what());
    return kExitInternal;
  } catch (const opfuse::CompileError& e) {
    std::fputs(e.what(), stderr);
    return kExitUserError;
  } catch (const opfuse::Error& e) {
    // The runtime's errors (UsageError, CudaError) say what to change: not bugs in opfuse.
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusec: internal error: %s\n", e.what());
    return kExitInternal;
  }
  return kExitUsage;
}
