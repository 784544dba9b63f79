// `fusec merge-state -o OUT RANK_FILES...`: the one-rank checkpoint of a tensor-parallel run from
// every rank's state file (docs/parallel.md, "Checkpoints").
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "api/state_file.h"
#include "commands.h"

namespace opfuse::fusec {

namespace {

struct MergeOptions {
  std::vector<std::string> files;
  std::string out;
  std::string program;
};

int run_merge(const MergeOptions& opts) {
  try {
    std::vector<api::StateFile> ranks;
    for (const std::string& f : opts.files) ranks.push_back(api::read_state_file(f));
    const api::StateFile merged = api::merge_state_shards(ranks, opts.program);
    api::write_state_file(opts.out, merged);
    std::printf("%s: %zu tensors and %zu quantizers of '%s' merged from %zu ranks (step %lld)\n",
                opts.out.c_str(), merged.tensors.size(), merged.quantizers.size(),
                merged.program.c_str(), ranks.size(), static_cast<long long>(merged.step));
  } catch (const Error& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

}  // namespace

Command add_merge_state_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<MergeOptions>();
  CLI::App* merge = app.add_subcommand(
      "merge-state",
      "merge the state files (Session::save) of every rank of a tensor-parallel run into one "
      "file of the whole parameters");
  merge->add_option("files", opts->files, "every rank's state file, in any order")
      ->required()
      ->check(CLI::ExistingFile);
  merge->add_option("-o,--output", opts->out, "the merged state file")->required();
  merge->add_option("--program", opts->program,
                    "the program the merged file is for, as FILE.fuse:SEQUENCE (default: the "
                    "ranks'), e.g. the one-rank program it will be loaded into");
  add_common(merge, common);
  merge->footer(kExitCodeHelp);
  return {merge, [opts] { return run_merge(*opts); }};
}

}  // namespace opfuse::fusec
