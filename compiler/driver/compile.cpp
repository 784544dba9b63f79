#include "driver/compile.h"

#include <fmt/format.h>

#include <optional>

#include "codegen/kernel_source.h"
#include "debug_config/instrument.h"
#include "driver/frontend.h"
#include "passes/pipeline.h"
#include "plan/gemm_caps.h"

namespace opfuse::driver {

namespace {

// Names of plan passes (codegen::plan_passes(), note "Plan passes") are taken out of the IR pass
// manager's options: build_plan runs those.
std::set<std::string> without_plan_passes(const std::set<std::string>& names) {
  std::set<std::string> out;
  for (const std::string& n : names)
    if (codegen::find_plan_pass(n) == nullptr) out.insert(n);
  return out;
}

std::set<std::string> only_plan_passes(const std::set<std::string>& names) {
  std::set<std::string> out;
  for (const std::string& n : names)
    if (codegen::find_plan_pass(n) != nullptr) out.insert(n);
  return out;
}

// Stopping "after" a plan pass runs every IR pass and prints the plan after that plan pass.
bool stops_at_plan_pass(const CompileOptions& options) {
  return codegen::find_plan_pass(options.stop_after) != nullptr;
}

passes::PassOptions pass_options(const CompileOptions& options) {
  passes::PassOptions p;
  p.disabled = without_plan_passes(options.disabled_passes);
  p.print_after = without_plan_passes(options.print_after);
  if (!stops_at_plan_pass(options)) p.stop_after = options.stop_after;
  return p;
}

// Unknown pass names and disabled passes that a later pass needs are usage errors, found before
// any file is read.
bool options_are_valid(const passes::PassManager& manager, const CompileOptions& options,
                       CompileResult& result) {
  const passes::PassOptions p = pass_options(options);
  result.unknown_passes = manager.unknown_names(p);
  if (!result.unknown_passes.empty()) {
    result.status = CompileStatus::UsageError;
    result.error = fmt::format("unknown pass '{}'", result.unknown_passes.front());
    return false;
  }
  if (std::string broken = manager.broken_requirement(p); !broken.empty()) {
    result.status = CompileStatus::UsageError;
    result.error = std::move(broken);
    return false;
  }
  for (const std::string& name : only_plan_passes(options.disabled_passes)) {
    if (codegen::find_plan_pass(name)->required) {
      result.status = CompileStatus::UsageError;
      result.error = fmt::format(
          "plan pass '{}' cannot be disabled: the executor reads what it computes", name);
      return false;
    }
  }
  return true;
}

// Keeps only `name`'s sequence; false (with result.error) when the program has none of that name.
bool select_sequence(ir::Program& program, const std::string& name, const std::string& file,
                     CompileResult& result) {
  if (name.empty()) return true;
  const ir::Sequence* s = program.find_sequence(name);
  if (s == nullptr) {
    std::string names;
    for (const auto& seq : program.sequences) names += " " + seq.name;
    result.status = CompileStatus::UserError;
    result.error = fmt::format("no sequence '{}' in {}; sequences:{}", name, file, names);
    return false;
  }
  ir::Program only;
  only.recipes = program.recipes;
  only.fusions = program.fusions;
  only.sequences.push_back(*s);
  program = std::move(only);
  return true;
}

CompileResult finish_front_end(std::optional<ir::Program> program, const std::string& file,
                               const SourceManager& sources, DiagnosticEngine& diags,
                               const CompileOptions& options) {
  CompileResult result;
  if (!program) {
    result.status = CompileStatus::UserError;
    return result;
  }
  if (!select_sequence(*program, options.sequence, file, result)) return result;
  if (options.last_stage == Stage::FrontEnd) {
    result.program = std::move(*program);
    return result;
  }
  return compile_ir(std::move(*program), &sources, &diags, options);
}

// Note "Emulated block scaling" (docs/architecture.md): on a target without cuBLASLt's 1x128 and
// 128x128 block-scale modes (plan/gemm_caps.h), or when the options ask, plan-quantization gives
// Float8 block-scaled operands decoded copies instead of FP8 ones. A sequence planned already
// keeps its casts (codegen then reports a native block-scaled GEMM the target cannot run).
// `with fp8_weights` keeps nothing in FP8 there: its weights stay parameters, decoded every step
// as under the micro-scaled recipes (a warning says so).
void mark_emulated_block_scaling(ir::Program& program, const CompileOptions& options,
                                 DiagnosticEngine* diags) {
  const plan::GemmCaps& caps = plan::gemm_caps(options.arch);
  if (!options.emulate_block_scaling && caps.block_1d && caps.block_2d) return;
  for (ir::Sequence& s : program.sequences) {
    if (!s.quantizers.empty()) continue;
    s.emulate_block_scaling = true;
    if (s.fp8_weights && s.recipe.kind == ir::RecipeKind::Float8BlockScaling) {
      if (diags != nullptr) {
        diags->warning(s.loc,
                       fmt::format("fp8_weights has no effect: sequence '{}' runs "
                                   "float8_block_scaling emulated on {}, whose GEMMs read decoded "
                                   "copies that every step makes afresh",
                                   s.name, options.arch),
                       "the weights stay high-precision parameters here");
      }
      s.fp8_weights = false;
    }
  }
}

// Note "Quantized boundaries" (docs/architecture.md): a quantized input is read by FP8 GEMMs
// only, with FP8 copies. What the routing of a debug config or the target could change about that
// is refused here, before any pass: a GEMM of a linear reading it kept in high precision or its
// input modified, and float8 block scaling emulated (its GEMMs would read decoded copies).
struct BoundaryProblem {
  SourceLoc loc;
  std::string message;
};
std::optional<BoundaryProblem> quantized_boundary_problem(const ir::Program& program) {
  for (const ir::Sequence& s : program.sequences) {
    if (!s.quantized_input && !s.quantized_output) continue;
    const SourceLoc loc = s.quantized_input ? s.quantized_input->loc : s.quantized_output->loc;
    if (s.emulate_block_scaling && s.recipe.kind == ir::RecipeKind::Float8BlockScaling) {
      return BoundaryProblem{
          loc, fmt::format("sequence '{}' has a quantized input or output under "
                           "float8_block_scaling, which is emulated here (no block-scale GEMMs "
                           "on the target, or the compile options ask for emulation): its GEMMs "
                           "read decoded copies",
                           s.name)};
    }
    if (!s.quantized_input || (s.quant_overrides.empty() && s.modifications.empty())) continue;
    for (const ir::Operation& op : s.ops) {
      if (op.kind != ir::OpKind::Linear || op.operands.empty() || op.operands[0] != s.inputs[0])
        continue;
      for (const ir::QuantOverride& o : s.quant_overrides) {
        if (o.high_precision && (o.layer.empty() || o.layer == op.instance) &&
            (!o.gemm || *o.gemm != plan::GemmRole::Dgrad))
          return BoundaryProblem{
              loc, fmt::format("the debug config keeps a GEMM of linear '{}' in high precision, "
                               "but it reads the quantized input '{}' of sequence '{}'",
                               op.instance, s.value(s.inputs[0]).name, s.name)};
      }
      for (const ir::TensorModification& m : s.modifications) {
        if (m.layer == op.instance && m.tensor == ir::QuantizerRole::Input)
          return BoundaryProblem{
              loc, fmt::format("the debug config's feature '{}' modifies the input of linear "
                               "'{}', which is the quantized input '{}' of sequence '{}'",
                               m.feature, op.instance, s.value(s.inputs[0]).name, s.name)};
      }
    }
  }
  return std::nullopt;
}

ir::BuildOptions build_options(const CompileOptions& options, DiagnosticEngine& diags) {
  diags.set_warnings_as_errors(options.warnings_as_errors);
  ir::BuildOptions build;
  build.recipe_override = options.recipe;
  return build;
}

}  // namespace

CompileResult compile_file(const std::string& path, SourceManager& sources, DiagnosticEngine& diags,
                           const CompileOptions& options) {
  CompileResult invalid;
  if (!options_are_valid(passes::PassManager(passes::default_pipeline()), options, invalid))
    return invalid;
  auto program =
      load_program(path, sources, diags, build_options(options, diags), options.extra_sources);
  return finish_front_end(std::move(program), path, sources, diags, options);
}

CompileResult compile_source(const std::string& name, std::string text, SourceManager& sources,
                             DiagnosticEngine& diags, const CompileOptions& options) {
  CompileResult invalid;
  if (!options_are_valid(passes::PassManager(passes::default_pipeline()), options, invalid))
    return invalid;
  auto program = load_program_from_source(name, std::move(text), sources, diags,
                                          build_options(options, diags), options.extra_sources);
  return finish_front_end(std::move(program), name, sources, diags, options);
}

CompileResult compile_ir(ir::Program program, const SourceManager* sources, DiagnosticEngine* diags,
                         const CompileOptions& options) {
  CompileResult result;
  const passes::PassManager manager(passes::default_pipeline());
  if (!options_are_valid(manager, options, result)) return result;
  if (options.debug_routing) {
    const std::vector<std::string> refused = debug::apply_routing(program, *options.debug_routing);
    if (!refused.empty()) {
      result.status = CompileStatus::UserError;
      result.failed_stage = Stage::Passes;
      result.error = "the debug config routes what opfuse cannot do yet: " + refused.front();
      for (size_t i = 1; i < refused.size(); ++i) result.error += "; " + refused[i];
      result.program = std::move(program);
      return result;
    }
  }
  mark_emulated_block_scaling(program, options, diags);
  if (const auto problem = quantized_boundary_problem(program)) {
    if (diags != nullptr)
      diags->error(problem->loc, problem->message, "pass the tensor in bf16 here");
    result.status = CompileStatus::UserError;
    result.failed_stage = Stage::Passes;
    result.error = problem->message;
    result.program = std::move(program);
    return result;
  }
  if (options.print && options.print_after.count("all")) options.print("build", program);
  result.timings = manager.run(program, pass_options(options), options.print);
  result.program = std::move(program);
  // A pipeline stopped early has no plan: the plan needs every pass (the casts, the backward).
  const bool plan_pass_stop = stops_at_plan_pass(options);
  if ((options.last_stage == Stage::Passes && !plan_pass_stop) ||
      (!options.stop_after.empty() && !plan_pass_stop))
    return result;

  codegen::CodegenOptions codegen_options;
  codegen_options.arch = options.arch;
  codegen_options.sources = sources;
  codegen_options.fp8_fprop_fast_accum = options.fp8_fprop_fast_accum;
  codegen_options.fp8_backward_fast_accum = options.fp8_backward_fast_accum;
  codegen_options.disabled_plan_passes = only_plan_passes(options.disabled_passes);
  codegen_options.print_after = only_plan_passes(options.print_after);
  if (plan_pass_stop) codegen_options.print_after.insert(options.stop_after);
  codegen_options.print = options.print_plan;
  try {
    result.plan = codegen::build_plan(result.program, codegen_options);
  } catch (const codegen::CodegenError& e) {
    if (diags == nullptr) throw;
    diags->error(e.loc(), e.what(), e.hint());
    result.status = CompileStatus::UserError;
    result.failed_stage = Stage::Plan;
    return result;
  }
  if (diags != nullptr) {
    // Note "Emulated micro-scaling" (docs/architecture.md): say so, never a silent change of
    // what the GEMMs compute.
    for (const ir::Sequence& s : result.program.sequences) {
      if (s.emulate_block_scaling && s.recipe.kind == ir::RecipeKind::Float8BlockScaling) {
        const plan::GemmCaps& caps = plan::gemm_caps(options.arch);
        diags->note(
            s.loc,
            fmt::format("sequence '{}' runs float8_block_scaling emulated on {} ({}): each GEMM "
                        "operand is quantized with its blocks (1x128 row-wise, 128x1 column-wise, "
                        "128x128 where the recipe gives a tensor 2-D blocks) and decoded to its "
                        "own dtype, and the GEMMs run in that dtype",
                        s.name, options.arch,
                        caps.block_1d && caps.block_2d
                            ? "as the compile options ask"
                            : "cuBLASLt has no 1x128 / 128x128 block-scale GEMM there"));
      }
      if (!s.recipe.micro_scaled()) continue;
      diags->note(s.loc, fmt::format("sequence '{}' runs {} emulated on {}: each GEMM operand is "
                                     "quantized to the format and decoded to its own dtype, and "
                                     "the GEMMs run in that dtype (opfuse runs no MXFP8 or NVFP4 "
                                     "GEMM itself)",
                                     s.name, ir::recipe_kind_name(s.recipe.kind), options.arch));
    }
  }
  if (options.last_stage == Stage::KernelRequests && !plan_pass_stop)
    result.kernels = kernel_requests(result.plan, options.arch);
  return result;
}

CompileResult check_options(const CompileOptions& options) {
  CompileResult result;
  options_are_valid(passes::PassManager(passes::default_pipeline()), options, result);
  return result;
}

std::vector<std::string> pass_names() {
  std::vector<std::string> names;
  for (const passes::Pass& pass : passes::default_pipeline()) names.emplace_back(pass.name);
  for (const codegen::PlanPass& pass : codegen::plan_passes()) names.emplace_back(pass.name);
  return names;
}

std::vector<KernelRequest> kernel_requests(const codegen::Plan& plan, const std::string& arch) {
  std::vector<KernelRequest> requests;
  for (const codegen::Kernel& kernel : plan.kernels) {
    KernelRequest request;
    request.kernel_name = kernel.id;
    request.source = codegen::kernel_source(plan, kernel);
    request.name_expressions = {kernel.name_expression};
    request.arch = arch;
    requests.push_back(std::move(request));
  }
  return requests;
}

}  // namespace opfuse::driver
