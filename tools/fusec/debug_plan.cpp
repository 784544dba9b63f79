// `fusec debug-plan FILE --debug-config CONFIG`: a dry run of a precision-debug config against a
// program (docs/debugging.md, "Dry run"): which section each layer gets; per layer, GEMM and
// tensor, whether it is quantized, kept in high precision, modified or inspected at an iteration;
// and over a range of iterations, which plan variants run when.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "debug/stats.h"
#include "debug_config/routing.h"
#include "driver/compile.h"

namespace opfuse::fusec {

namespace {

struct DebugPlanOptions {
  std::string file;
  std::string config;
  int64_t iteration = 0;
  int64_t iterations = 20;
};

// "0, 5-9, 12" for sorted iterations.
std::string ranges(const std::vector<int64_t>& its) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < its.size();) {
    size_t j = i;
    while (j + 1 < its.size() && its[j + 1] == its[j] + 1) ++j;
    parts.push_back(i == j ? fmt::format("{}", its[i]) : fmt::format("{}-{}", its[i], its[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// The layers a variant changes and how, in one line.
std::string summary(const debug::Routing& r) {
  std::vector<std::string> parts;
  for (const debug::LayerRouting& l : r.layers) {
    if (!l.active()) continue;
    std::vector<std::string> what;
    for (const auto t : plan::all_values<debug::TensorKind>()) {
      if (!l.inspectors[size_t(t)].empty())
        what.push_back(fmt::format("{} inspected", plan::name(t)));
    }
    for (size_t g = 0; g < 3; ++g) {
      const auto& gr = l.gemms[g];
      if (l.recipe_quantized && !gr.quantized)
        what.push_back(fmt::format("{} high precision", plan::name(plan::GemmRole(g))));
      for (size_t k = 0; k < 2; ++k) {
        if (gr.modifiers[k]) {
          what.push_back(fmt::format("{} {} modified", plan::name(plan::GemmRole(g)),
                                     plan::name(debug::operands_of(plan::GemmRole(g))[k])));
        }
      }
    }
    parts.push_back(fmt::format("{}: {}", l.layer, fmt::join(what, ", ")));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

// A fused step as a reader names it: "norm_cast (layernorm_0, fc1.input)". The statistics a
// kernel computes besides are not part of its fusion (docs/debugging.md, "Statistics fused into
// kernels"): a pattern that keeps them is not undone, and a kernel that only gained them is none.
std::string fusion_name(const plan::Step& s) {
  std::vector<std::string> ops;
  for (const plan::OpRef& op : s.ops)
    if (op.op != "tensor_stats") ops.push_back(op.instance);
  return fmt::format("{} ({})", s.pattern, fmt::join(ops, ", "));
}

// A step of a fusion pattern (not a kernel that only gained statistics: pattern "stats").
bool is_fusion(const plan::Step& s) { return !s.pattern.empty() && s.pattern != "stats"; }

// Which kernel computes the statistics op `instance` (passes/debug_instrument.cpp names it):
// one of its own, or the kernel of a step that reads or writes its tensor anyway.
std::string computed_by(const plan::SequencePlan& p, const std::string& instance) {
  for (const plan::Step& s : p.steps) {
    const bool here = std::any_of(s.ops.begin(), s.ops.end(), [&](const plan::OpRef& op) {
      return op.op == "tensor_stats" && op.instance == instance;
    });
    if (!here) continue;
    for (const plan::OpRef& op : s.ops)
      if (op.op != "tensor_stats") return fmt::format(" (in the kernel of {})", op.instance);
    return " (a kernel of its own)";
  }
  return "";
}

// What the variant of `at` compiles to against the plain plan: the fusions it undoes and the
// statistics launches it adds, per sequence. False after printing a compile error.
bool print_variant_changes(const ir::Program& program, const debug::Routing& at,
                           const CommonOptions& common, SourceManager& sources) {
  driver::CompileOptions options = driver_options(common);
  options.last_stage = driver::Stage::Plan;
  DiagnosticEngine diags(sources);
  const driver::CompileResult plain = driver::compile_ir(program, &sources, &diags, options);
  options.debug_routing = &at;
  const driver::CompileResult variant = driver::compile_ir(program, &sources, &diags, options);
  for (const driver::CompileResult* r : {&plain, &variant}) {
    if (r->ok()) continue;
    std::fputs(diags.format_all().c_str(), stderr);
    if (!r->error.empty()) std::fprintf(stderr, "fusec: error: %s\n", r->error.c_str());
    return false;
  }
  std::printf("\nplan of iteration %lld against the plain plan\n",
              static_cast<long long>(at.iteration));
  for (size_t i = 0; i < plain.plan.sequences.size(); ++i) {
    const plan::SequencePlan& p = plain.plan.sequences[i];
    const plan::SequencePlan& v = variant.plan.sequences.at(i);
    std::vector<std::string> fused, undone;
    for (const plan::Step& s : v.steps)
      if (is_fusion(s)) fused.push_back(fusion_name(s));
    for (const plan::Step& s : p.steps) {
      if (!is_fusion(s)) continue;
      const std::string name = fusion_name(s);
      if (std::find(fused.begin(), fused.end(), name) == fused.end()) undone.push_back(name);
    }
    std::printf("  sequence %s: %zu steps (plain %zu), %zu statistics records\n", p.name.c_str(),
                v.steps.size(), p.steps.size(), v.stat_slots.size());
    for (const std::string& u : undone) std::printf("    fusion undone: %s\n", u.c_str());
    // The launches computing modified GEMM operands (compiler/passes/debug_modify.h).
    for (const plan::Step& st : v.steps) {
      for (const plan::OpRef& op : st.ops) {
        if (op.op == "modify_tensor")
          std::printf("    modified operand %s: %s\n", op.instance.c_str(), st.what.c_str());
      }
    }
    for (size_t i = 0; i < v.stat_slots.size(); ++i) {
      const plan::StatSlot& slot = v.stat_slots[i];
      // A histogram's parts are written with the record before them (said there).
      if (slot.record == plan::StatRecordKind::ExponentHistogram) continue;
      std::string what;
      if (slot.record == plan::StatRecordKind::Quantized) {
        // LogFp8TensorStats: which cast, and its scale blocks.
        what = fmt::format(" cast by {}", plan::name(slot.cast));
        if (slot.block_size > 0) {
          what += slot.dims == 2    ? fmt::format(" ({0}x{0} blocks)", slot.block_size)
                  : slot.columnwise ? fmt::format(" ({}x1 blocks)", slot.block_size)
                                    : fmt::format(" (1x{} blocks)", slot.block_size);
        }
        if (slot.exponent_histogram)
          what += fmt::format(", with its scale-exponent histogram (records {}-{})", i + 1,
                              i + size_t(debug::kExponentHistogramRecords));
      } else if (slot.block_size > 0) {
        what = fmt::format(" (blocks of {}, {}-D)", slot.block_size, slot.dims);
      }
      what += computed_by(v, fmt::format("{}.{}_stats{}", slot.layer, slot.tensor, i));
      std::printf("    statistics: %s %s%s\n", slot.layer.c_str(), slot.tensor.c_str(),
                  what.c_str());
    }
    for (const plan::CaptureSlot& slot : v.capture_slots) {
      std::string what;
      if (slot.quantized) {
        // The FP8 copy a GEMM reads (docs/debugging.md, "Tensor captures").
        const auto tensor = plan::parse<debug::TensorKind>(slot.tensor);
        const std::string gemm =
            tensor ? std::string(plan::name(debug::gemms_of(*tensor)[slot.columnwise ? 1 : 0]))
                   : "?";
        what = fmt::format(" ({}FP8 copy as {} reads it, {}, {})",
                           slot.columnwise ? "column-wise " : "", gemm, plan::name(slot.format),
                           slot.block.rows > 0 ? fmt::format("{}x{} blocks and their scale grid",
                                                             slot.block.rows, slot.block.cols)
                                               : std::string("and its scale_inv"));
      }
      std::printf("    capture: %s %s%s\n", slot.layer.c_str(), slot.tensor.c_str(), what.c_str());
    }
  }
  return true;
}

int run_debug_plan(const DebugPlanOptions& opts, const CommonOptions& common) {
  SourceManager sources;
  auto program = load(opts.file, common, sources);
  if (!program) return kExitUserError;
  DiagnosticEngine diags(sources);
  diags.set_warnings_as_errors(common.warnings_as_errors);
  const auto registry =
      std::make_shared<const debug::FeatureRegistry>(debug::FeatureRegistry::with_builtins());
  auto config = debug::load_debug_config(opts.config, sources, registry, diags);
  std::vector<debug::LayerBinding> bindings;
  if (config) bindings = debug::bind_layers(*config, debug::program_layers(*program), diags);
  std::fputs(diags.format_all().c_str(), stderr);
  if (diags.has_errors()) return kExitUserError;

  const debug::Routing at = debug::route(bindings, opts.iteration);
  for (const std::string& c : at.conflicts) std::fprintf(stderr, "fusec: error: %s\n", c.c_str());
  if (!at.conflicts.empty()) return kExitUserError;
  std::printf("iteration %lld%s\n", static_cast<long long>(opts.iteration),
              at.next_change == debug::kNever
                  ? " (the same for every later iteration)"
                  : fmt::format(" (holds until iteration {})", at.next_change - 1).c_str());
  for (const debug::LayerRouting& l : at.layers)
    std::fputs(debug::describe(l, sources).c_str(), stdout);
  if (!print_variant_changes(*program, at, common, sources)) return kExitUserError;

  // The schedule: variants in order of first use, with the iterations each runs.
  std::vector<std::string> keys;
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> variants;
  for (int64_t it = 0; it < opts.iterations;) {
    const debug::Routing r = debug::route(bindings, it);
    const std::string key = r.variant_key();
    auto [pos, added] = variants.try_emplace(key, summary(r), std::vector<int64_t>{});
    if (added) keys.push_back(key);
    const int64_t until = std::min(r.next_change, opts.iterations);
    for (int64_t k = it; k < until; ++k) pos->second.second.push_back(k);
    it = until;
  }
  std::printf("\nplan variants over iterations 0-%lld: %zu\n",
              static_cast<long long>(opts.iterations - 1), keys.size());
  for (const std::string& key : keys) {
    const auto& [text, its] = variants.at(key);
    std::printf("  %s: iterations %s\n", key.empty() ? "plain" : text.c_str(), ranges(its).c_str());
  }
  return kExitOk;
}

}  // namespace

Command add_debug_plan_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<DebugPlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "debug-plan",
      "dry run of a precision-debug config: per layer, GEMM and tensor what the features do, and "
      "which plan variants run at which iterations");
  cmd->add_option("file", opts->file, ".fuse file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--debug-config", opts->config, "the config (TE's config.yaml schema)")
      ->required();
  cmd->add_option("--iteration", opts->iteration, "show the routing at this iteration (default 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--iterations", opts->iterations,
                  "list the plan variants of iterations 0 to N-1 (default 20)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add_common(cmd, common);
  cmd->footer(kExitCodeHelp);
  return {cmd, [opts, &common] { return run_debug_plan(*opts, common); }};
}

}  // namespace opfuse::fusec
