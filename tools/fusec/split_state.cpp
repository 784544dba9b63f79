// `fusec split-state FILE --program TP_FILE.fuse --sequence SEQ -o DIR`: a one-rank checkpoint
// cut into the state files of a tensor-parallel program's ranks (docs/parallel.md,
// "Checkpoints"), the inverse of merge-state: DIR/rank<r>.state, each of which the program's
// rank r loads.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/state_file.h"
#include "commands.h"
#include "common.h"
#include "gpu/binding_check.h"

namespace opfuse::fusec {

namespace {

struct SplitOptions {
  std::string file;
  std::string program_path;
  std::string sequence;
  std::string out;
  std::string program_name;
};

// The state file layout rank `rank` of `plan` loads (api::plan_state_layout, as its session
// does): parameter sizes are the plan's, which must not depend on bound symbols.
api::StateFile rank_layout(const plan::SequencePlan& plan, const std::string& program, int rank) {
  return api::plan_state_layout(plan, program, rank, [&](const plan::Buffer& buffer) {
    std::vector<std::int64_t> shape;
    for (const plan::SymExpr& dim : buffer.shape) {
      const std::optional<std::int64_t> size = dim.value();
      if (!size) {
        throw UsageError(fmt::format(
            "parameter '{}' of {} has the size '{}', which depends on a bound symbol: its shards "
            "have no size before the run",
            gpu::ir_name(buffer.name), program, dim.text()));
      }
      shape.push_back(*size);
    }
    return shape;
  });
}

int run_split(const SplitOptions& opts, const CommonOptions& common) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options = driver_options(common);
  options.sequence = opts.sequence;
  options.last_stage = driver::Stage::Plan;
  const driver::CompileResult compiled =
      driver::compile_file(opts.program_path, sources, diags, options);
  std::fputs(diags.format_all().c_str(), stderr);
  if (!compiled.ok()) {
    if (!diags.has_errors()) std::fprintf(stderr, "fusec: error: %s\n", compiled.error.c_str());
    return compiled.status == driver::CompileStatus::UsageError ? kExitUsage : kExitUserError;
  }
  if (compiled.plan.sequences.size() != 1) {
    std::vector<std::string> names;
    for (const plan::SequencePlan& s : compiled.plan.sequences) names.push_back(s.name);
    std::fprintf(stderr, "fusec: error: %s has %zu sequences; name one with --sequence: %s\n",
                 opts.program_path.c_str(), names.size(),
                 fmt::format("{}", fmt::join(names, ", ")).c_str());
    return kExitUsage;
  }
  const plan::SequencePlan& plan = compiled.plan.sequences.front();
  const std::string program = opts.program_name.empty()
                                  ? fmt::format("{}:{}", compiled.plan.source, plan.name)
                                  : opts.program_name;
  try {
    if (!plan.parallel.active()) {
      throw UsageError(fmt::format(
          "sequence '{}' of {} is not tensor-parallel (no `with parallel(tp = N)`): a one-rank "
          "state file loads into it as it is",
          plan.name, opts.program_path));
    }
    const api::StateFile whole = api::read_state_file(opts.file);
    std::map<std::string, plan::ShardSpec> shards;
    const api::StateFile layout0 = rank_layout(plan, program, 0);
    for (const api::StateTensor& t : layout0.tensors) shards[t.name] = t.shard;
    const std::vector<api::StateFile> ranks =
        api::split_state_file(whole, plan.parallel.tp, shards, program);
    // Each file must load into its rank as Session::load checks it, before any is written.
    std::vector<std::string> paths;
    for (const api::StateFile& rank : ranks) {
      paths.push_back(fmt::format("{}/rank{}.state", opts.out, rank.rank));
      api::StateFile expected = rank_layout(plan, program, rank.rank);
      if (whole.quantizers_only) {
        expected.tensors.clear();
        expected.quantizers_only = true;
      }
      api::require_state_fits(rank, expected, paths.back());
    }
    if (!make_directory(opts.out)) return kExitUserError;
    for (std::size_t r = 0; r < ranks.size(); ++r) api::write_state_file(paths[r], ranks[r]);
    std::printf(
        "%s: %zu tensors and %zu quantizers of '%s' (step %lld) split into %zu ranks' "
        "files for '%s': %s/rank0.state ... rank%zu.state\n",
        opts.file.c_str(), whole.tensors.size(), whole.quantizers.size(), whole.program.c_str(),
        static_cast<long long>(whole.step), ranks.size(), program.c_str(), opts.out.c_str(),
        ranks.size() - 1);
  } catch (const Error& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

}  // namespace

Command add_split_state_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<SplitOptions>();
  CLI::App* split = app.add_subcommand(
      "split-state",
      "split a one-rank state file (Session::save) into the state files of a tensor-parallel "
      "program's ranks, DIR/rank<r>.state; the inverse of merge-state");
  split->add_option("file", opts->file, "the one-rank state file")
      ->required()
      ->check(CLI::ExistingFile);
  split
      ->add_option("--program", opts->program_path,
                   "the tensor-parallel .fuse file whose ranks will load the files")
      ->required()
      ->check(CLI::ExistingFile);
  split->add_option("--sequence", opts->sequence,
                    "its tensor-parallel sequence (needed when the file has several)");
  split->add_option("-o,--output", opts->out, "the directory for rank0.state, rank1.state, ...")
      ->required();
  split->add_option("--program-name", opts->program_name,
                    "the program name the files carry, as the sessions that load them name it "
                    "(default: FILE.fuse:SEQUENCE, the name of a Program compiled from the file)");
  add_common(split, common);
  split->footer(kExitCodeHelp);
  return {split, [opts, &common] { return run_split(*opts, common); }};
}

}  // namespace opfuse::fusec
