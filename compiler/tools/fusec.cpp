// fusec: the opfuse command-line compiler.
//
// Exit codes (also in --help and the README):
//   0  success
//   1  user error in a .fuse program (diagnostics printed)
//   2  usage error (bad command line)
//   3  internal error (a bug in opfuse; please report it with the input)
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "../../runtime/cpu/run_driver.h"
#include "driver/frontend.h"
#include "ir/printer.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "support/assert.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitUserError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 3;

constexpr const char* kExitCodeHelp =
    "Exit codes: 0 success, 1 errors in a .fuse program, 2 usage error, 3 internal error "
    "(a bug in opfuse).";

struct CommonOptions {
  std::string recipe;
  bool warnings_as_errors = false;
};

void add_common(CLI::App* cmd, CommonOptions& common) {
  cmd->add_option("--recipe", common.recipe,
                  "use this declared recipe (or bf16) for every sequence instead of its own");
  cmd->add_flag("--Werror", common.warnings_as_errors, "treat warnings as errors");
}

// Loads one file; prints its diagnostics. Returns nullopt on user errors.
std::optional<opfuse::ir::Program> load(const std::string& path, const CommonOptions& common,
                                        opfuse::SourceManager& sources) {
  opfuse::DiagnosticEngine diags(sources);
  diags.set_warnings_as_errors(common.warnings_as_errors);
  opfuse::ir::BuildOptions build;
  build.recipe_override = common.recipe;
  auto program = opfuse::load_program(path, sources, diags, build);
  std::fputs(diags.format_all().c_str(), stderr);
  if (diags.has_errors()) {
    std::fprintf(stderr, "%s: %zu error%s, %zu warning%s\n", path.c_str(), diags.error_count(),
                 diags.error_count() == 1 ? "" : "s", diags.warning_count(),
                 diags.warning_count() == 1 ? "" : "s");
    return std::nullopt;
  }
  return program;
}

int run_check(const std::vector<std::string>& files, const CommonOptions& common) {
  int status = kExitOk;
  for (const std::string& f : files) {
    opfuse::SourceManager sources;
    if (!load(f, common, sources)) status = kExitUserError;
  }
  return status;
}

struct IrOptions {
  std::string file;
  std::string sequence;
  std::string after;
  std::vector<std::string> disable;
  bool timings = false;
};

int run_ir(const IrOptions& opts, const CommonOptions& common) {
  opfuse::passes::PassManager manager(opfuse::passes::default_pipeline());
  opfuse::passes::PassOptions pass_options;
  pass_options.disabled.insert(opts.disable.begin(), opts.disable.end());
  if (opts.after == "all") {
    pass_options.print_after.insert("all");
  } else if (!opts.after.empty()) {
    pass_options.stop_after = opts.after;
  }
  if (auto unknown = manager.unknown_names(pass_options); !unknown.empty()) {
    std::string names;
    for (const auto& p : manager.passes()) names += fmt::format(" {}", p.name);
    std::fprintf(stderr, "fusec: error: unknown pass '%s'; passes:%s (or 'all' for --after)\n",
                 unknown[0].c_str(), names.c_str());
    return kExitUsage;
  }
  opfuse::SourceManager sources;
  auto program = load(opts.file, common, sources);
  if (!program) return kExitUserError;
  if (!opts.sequence.empty()) {
    const opfuse::ir::Sequence* s = program->find_sequence(opts.sequence);
    if (!s) {
      std::string names;
      for (const auto& seq : program->sequences) names += " " + seq.name;
      std::fprintf(stderr, "fusec: error: no sequence '%s' in %s; sequences:%s\n",
                   opts.sequence.c_str(), opts.file.c_str(), names.c_str());
      return kExitUserError;
    }
    opfuse::ir::Program only;
    only.recipes = program->recipes;
    only.sequences.push_back(*s);
    program = std::move(only);
  }
  auto print = [&](std::string_view title, const opfuse::ir::Program& p) {
    std::printf("// ----- IR after %.*s -----\n%s", int(title.size()), title.data(),
                opfuse::ir::print_program(p, &sources).c_str());
  };
  if (opts.after == "all") print("build", *program);
  const auto timings = manager.run(*program, pass_options, print);
  // --after all printed each change already; otherwise show the IR where the pipeline stopped.
  if (opts.after != "all")
    std::fputs(opfuse::ir::print_program(*program, &sources).c_str(), stdout);
  if (opts.timings) {
    std::fprintf(stderr, "%-24s %10s  %s\n", "pass", "ms", "result");
    for (const auto& t : timings)
      std::fprintf(stderr, "%-24s %10.3f  %s\n", t.name.c_str(), t.milliseconds,
                   t.skipped   ? "disabled"
                   : t.changed ? "changed"
                               : "no change");
  }
  return kExitOk;
}

struct RunCommandOptions {
  std::string file;
  std::string sequence;
  std::string device = "cpu";
  std::vector<std::string> binds;
  int steps = 1;
  uint64_t seed = 0;
  double lr = 0.01;
};

int run_run(const RunCommandOptions& opts, const CommonOptions& common) {
  if (opts.device == "gpu") {
    std::fprintf(stderr,
                 "fusec: error: --device gpu: the GPU runtime is not built yet; use --device cpu "
                 "(the CPU reference executor)\n");
    return kExitUserError;
  }
  opfuse::cpu::RunOptions run;
  for (const std::string& bind : opts.binds) {
    const size_t eq = bind.find('=');
    int64_t size = 0;
    bool ok = eq != std::string::npos && eq > 0 && eq + 1 < bind.size();
    if (ok) {
      try {
        size_t used = 0;
        size = std::stoll(bind.substr(eq + 1), &used);
        ok = used == bind.size() - eq - 1;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok) {
      std::fprintf(stderr, "fusec: error: --bind '%s' is not NAME=SIZE (e.g. --bind tokens=64)\n",
                   bind.c_str());
      return kExitUsage;
    }
    run.bindings[bind.substr(0, eq)] = size;
  }
  run.steps = opts.steps;
  run.seed = opts.seed;
  run.lr = opts.lr;
  opfuse::SourceManager sources;
  auto program = load(opts.file, common, sources);
  if (!program) return kExitUserError;
  const opfuse::ir::Sequence* seq = nullptr;
  std::string names;
  for (const auto& s : program->sequences) names += " " + s.name;
  if (!opts.sequence.empty()) {
    seq = program->find_sequence(opts.sequence);
    if (!seq) {
      std::fprintf(stderr, "fusec: error: no sequence '%s' in %s; sequences:%s\n",
                   opts.sequence.c_str(), opts.file.c_str(), names.c_str());
      return kExitUserError;
    }
  } else if (program->sequences.size() == 1) {
    seq = &program->sequences[0];
  } else {
    std::fprintf(stderr, "fusec: error: %s has %zu sequences; pick one with --sequence NAME:%s\n",
                 opts.file.c_str(), program->sequences.size(), names.c_str());
    return kExitUserError;
  }
  try {
    std::fputs(opfuse::cpu::run_reference_training(*seq, run).c_str(), stdout);
  } catch (const opfuse::cpu::ReferenceError& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fusec: compile .fuse programs of fused transformer ops into CUDA kernels", "fusec"};
  app.footer(kExitCodeHelp);
  app.set_version_flag("--version", std::string("fusec (opfuse) ") + OPFUSE_VERSION);
  app.require_subcommand(1);

  CommonOptions common;
  std::vector<std::string> check_files;
  CLI::App* check =
      app.add_subcommand("check", "parse and type-check .fuse files; report every error");
  check->add_option("files", check_files, ".fuse files")->required()->check(CLI::ExistingFile);
  add_common(check, common);
  check->footer(kExitCodeHelp);

  IrOptions ir_opts;
  CLI::App* ir = app.add_subcommand("ir", "print the IR of a .fuse file (after the passes)");
  ir->add_option("file", ir_opts.file, ".fuse file")->required()->check(CLI::ExistingFile);
  ir->add_option("--sequence", ir_opts.sequence, "print only this sequence");
  ir->add_option("--after", ir_opts.after,
                 "print the IR after this pass, or after every pass that changes it (all)");
  ir->add_option("--disable-pass", ir_opts.disable, "skip this pass (repeatable)")
      ->allow_extra_args(false);
  ir->add_flag("--timings", ir_opts.timings, "print the time each pass took (stderr)");
  add_common(ir, common);
  ir->footer(kExitCodeHelp);

  RunCommandOptions run_opts;
  CLI::App* run = app.add_subcommand(
      "run",
      "train a sequence for a few steps on the CPU reference executor from seeded random "
      "inputs and parameters; print the loss, gradient norms and quantizer state per step");
  run->add_option("file", run_opts.file, ".fuse file")->required()->check(CLI::ExistingFile);
  run->add_option("--sequence", run_opts.sequence,
                  "the sequence to run (needed when the file has several)");
  run->add_option("--device", run_opts.device,
                  "cpu (the reference executor) or gpu (not built yet)")
      ->check(CLI::IsMember({"cpu", "gpu"}))
      ->capture_default_str();
  run->add_option("--bind", run_opts.binds, "NAME=SIZE for a symbolic dimension (repeatable)")
      ->allow_extra_args(false);
  run->add_option("--steps", run_opts.steps, "training steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  run->add_option("--seed", run_opts.seed, "seed of the random inputs and parameters")
      ->capture_default_str();
  run->add_option("--lr", run_opts.lr, "SGD learning rate")->capture_default_str();
  add_common(run, common);
  run->footer(std::string(opfuse::cpu::kRunLossDescription) +
              ". Parameters: linear weights ~ N(0, 0.02), norm weights 1 (0 if zero-centered), "
              "biases 0; inputs ~ N(0, 1).\n" +
              kExitCodeHelp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  try {
    if (*check) return run_check(check_files, common);
    if (*ir) return run_ir(ir_opts, common);
    if (*run) return run_run(run_opts, common);
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
