// `fusec check FILE...`: parse and type-check; report every error.
#include "commands.h"

#include <memory>

namespace opfuse::fusec {

Command add_check_command(CLI::App& app, CommonOptions& common) {
  auto files = std::make_shared<std::vector<std::string>>();
  CLI::App* check =
      app.add_subcommand("check", "parse and type-check .fuse files; report every error");
  check->add_option("files", *files, ".fuse files")->required()->check(CLI::ExistingFile);
  add_common(check, common);
  check->footer(kExitCodeHelp);
  return {check, [files, &common] {
            int status = kExitOk;
            for (const std::string& f : *files) {
              SourceManager sources;
              if (!load(f, common, sources)) status = kExitUserError;
            }
            return status;
          }};
}

}  // namespace opfuse::fusec
