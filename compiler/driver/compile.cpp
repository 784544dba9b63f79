#include "driver/compile.h"

#include <fmt/format.h>

#include "codegen/kernel_source.h"
#include "debug_config/instrument.h"
#include "driver/frontend.h"
#include "passes/pipeline.h"

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
  auto program = load_program(path, sources, diags, build_options(options, diags));
  return finish_front_end(std::move(program), path, sources, diags, options);
}

CompileResult compile_source(const std::string& name, std::string text, SourceManager& sources,
                             DiagnosticEngine& diags, const CompileOptions& options) {
  CompileResult invalid;
  if (!options_are_valid(passes::PassManager(passes::default_pipeline()), options, invalid))
    return invalid;
  auto program = load_program_from_source(name, std::move(text), sources, diags,
                                          build_options(options, diags));
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
