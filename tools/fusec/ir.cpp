// `fusec ir FILE`: print the IR after the passes, after one pass, or after every pass that changes
// it; --disable-pass and --timings.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>
#include "commands.h"

#include "codegen/plan.h"
#include "ir/printer.h"

namespace opfuse::fusec {

namespace {

struct IrOptions {
  std::string file;
  std::string sequence;
  std::string after;
  std::vector<std::string> disable;
  bool timings = false;
};

int run_ir(const IrOptions& opts, const CommonOptions& common) {
  driver::CompileOptions options = driver_options(common);
  options.disabled_passes.insert(opts.disable.begin(), opts.disable.end());
  if (opts.after == "all") {
    options.print_after.insert("all");
  } else if (!opts.after.empty()) {
    options.stop_after = opts.after;
  }
  if (!pass_options_are_valid(options, " (or 'all' for --after)")) return kExitUsage;
  SourceManager sources;
  auto program = load(opts.file, common, sources, opts.sequence);
  if (!program) return kExitUserError;
  // --after all prints the IR as built and after each pass that changes it.
  options.print = [&](std::string_view title, const ir::Program& p) {
    std::printf("// ----- IR after %.*s -----\n%s", int(title.size()), title.data(),
                ir::print_program(p, &sources).c_str());
  };
  // After a plan pass (note "Plan passes" in compiler/codegen/plan.h): every IR pass runs, the
  // plan is built and each sequence's plan is printed after that pass, as plan.json spells it.
  const bool plan_pass = codegen::find_plan_pass(opts.after) != nullptr;
  options.print_plan = [&](std::string_view title, const codegen::SequencePlan& plan) {
    std::printf("// ----- plan of %s after %.*s -----\n%s\n", plan.name.c_str(), int(title.size()),
                title.data(), plan::sequence_plan_json(plan).dump(2).c_str());
  };
  options.last_stage = plan_pass ? driver::Stage::Plan : driver::Stage::Passes;
  DiagnosticEngine diags(sources);
  const driver::CompileResult result =
      driver::compile_ir(std::move(*program), &sources, &diags, options);
  if (result.status != driver::CompileStatus::Ok) {
    std::fputs(diags.format_all().c_str(), stderr);
    return kExitUserError;
  }
  // --after all printed each change already; otherwise show the IR where the pipeline stopped.
  if (opts.after != "all" && !plan_pass)
    std::fputs(ir::print_program(result.program, &sources).c_str(), stdout);
  if (opts.timings) {
    std::fprintf(stderr, "%-24s %10s  %s\n", "pass", "ms", "result");
    for (const auto& t : result.timings)
      std::fprintf(stderr, "%-24s %10.3f  %s\n", t.name.c_str(), t.milliseconds,
                   t.skipped   ? "disabled"
                   : t.changed ? "changed"
                               : "no change");
  }
  return kExitOk;
}

}  // namespace

Command add_ir_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<IrOptions>();
  CLI::App* ir = app.add_subcommand("ir", "print the IR of a .fuse file (after the passes)");
  ir->add_option("file", opts->file, ".fuse file")->required()->check(CLI::ExistingFile);
  ir->add_option("--sequence", opts->sequence, "print only this sequence");
  ir->add_option("--after", opts->after,
                 "print the IR after this pass, or after every pass that changes it (all); after "
                 "a plan pass, the plan");
  ir->add_option("--disable-pass", opts->disable, "skip this pass (repeatable)")
      ->allow_extra_args(false);
  ir->add_flag("--timings", opts->timings, "print the time each pass took (stderr)");
  add_common(ir, common);
  ir->footer(kExitCodeHelp);
  return {ir, [opts, &common] { return run_ir(*opts, common); }};
}

}  // namespace opfuse::fusec
