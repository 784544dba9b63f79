// fusec: the opfuse command-line compiler. Each command is one file (commands.h); exit codes are
// common.h's (also in --help and the README).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <vector>

#include "commands.h"
#include "support/assert.h"

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
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  try {
    for (const Command& command : commands)
      if (*command.app) return command.run();
  } catch (const opfuse::InternalError& e) {
    std::fprintf(stderr, "%s\nfusec: this is a bug in opfuse; please report it with the input.\n",
                 e.what());
    return kExitInternal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusec: internal error: %s\n", e.what());
    return kExitInternal;
  }
  return kExitUsage;
}
