// The one compile driver: a .fuse file (or text) -> front end (parse, imports, IR) -> the pass
// pipeline (passes/pipeline.cpp) -> the plan (codegen::build_plan) -> one kernel request per plan
// kernel (its CUDA source and name expression). fusec's commands, opfuse::Program::compile, the CPU
// reference's run driver and the tests all compile through it, so that they compile alike.
// It compiles nothing with NVRTC (the compiler library has no NVRTC): the runtime and the tools
// turn the kernel requests into binaries.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/plan.h"
#include "ir/graph.h"
#include "passes/pass_manager.h"
#include "support/diagnostics.h"

namespace opfuse::debug {
struct Routing;
}

namespace opfuse::driver {

// How far compile() goes; each stage includes the ones before it.
enum class Stage {
  FrontEnd,        // the IR as built, verified
  Passes,          // the IR after the pass pipeline
  Plan,            // and its plan
  KernelRequests,  // and the kernel requests (the default)
};

struct CompileOptions {
  // Front end.
  std::string recipe;  // a recipe declared in the file, or "bf16", for every sequence; empty: own
  bool warnings_as_errors = false;
  std::string sequence;  // keep only this sequence; empty: all of them
  // More source text after the program's modules: (name, text) pairs (frontend.h, ExtraSources).
  std::vector<std::pair<std::string, std::string>> extra_sources;
  // Passes (names as in passes/pipeline.cpp).
  std::set<std::string> disabled_passes;
  std::set<std::string> print_after;  // pass names, or "all" (then also the IR as built)
  std::string stop_after;             // no pass after this one runs (and no plan is built)
  // Called with (pass name, program) after a pass named in print_after changed the program, and
  // with ("build", program) first when print_after has "all".
  std::function<void(std::string_view, const ir::Program&)> print;
  // Plan passes (codegen::plan_passes()) share the names above: disabled_passes skips one that is
  // not required, print_after (or stop_after) one calls print_plan with the sequence's plan after
  // it ("all" covers the IR passes only).
  std::function<void(std::string_view, const codegen::SequencePlan&)> print_plan;
  // Plan.
  std::string arch = "sm_90a";  // explicit: the compiler never queries a device
  // Runs float8_block_scaling emulated (note "Emulated block scaling" in docs/architecture.md)
  // even where `arch` has cuBLASLt's block-scale modes: each GEMM operand quantized with its
  // blocks and decoded, BF16 GEMMs. Targets without the modes always emulate. For comparing the
  // two paths on one GPU (the GPU tests run the emulated path on an H100 this way).
  bool emulate_block_scaling = false;
  bool fp8_fprop_fast_accum = true;
  bool fp8_backward_fast_accum = false;
  Stage last_stage = Stage::KernelRequests;
  // A precision-debug plan variant: one iteration's routing of a debug config
  // (compiler/debug_config/instrument.h), applied to the program before the passes. nullptr: the
  // plain plan.
  const debug::Routing* debug_routing = nullptr;
};

// One kernel to compile: what runtime/jit's CompileRequest needs, without depending on it.
struct KernelRequest {
  std::string kernel_name;  // the plan kernel's id
  std::string source;       // full CUDA source (includes templates/)
  std::vector<std::string> name_expressions;
  std::string arch;
};

enum class CompileStatus {
  Ok,
  UserError,   // diagnostics in the DiagnosticEngine, or `error` (no such sequence)
  UsageError,  // bad options: `error` says which (unknown passes also in unknown_passes)
};

struct CompileResult {
  CompileStatus status = CompileStatus::Ok;
  Stage failed_stage = Stage::FrontEnd;     // where a UserError stopped it
  std::string error;                        // a one-line message where diagnostics have none
  std::vector<std::string> unknown_passes;  // names in the options that are not passes
  ir::Program program;                      // after the passes that ran
  codegen::Plan plan;                       // from Stage::Plan on
  std::vector<KernelRequest> kernels;       // Stage::KernelRequests: plan.kernels order
  std::vector<passes::PassTiming> timings;

  bool ok() const { return status == CompileStatus::Ok; }
};

// Compiles the file at `path` (its imports resolved from its directory). User errors go to `diags`
// (created over `sources`); the caller prints them.
CompileResult compile_file(const std::string& path, SourceManager& sources, DiagnosticEngine& diags,
                           const CompileOptions& options);
// Same, from text in memory; `name` is the file name diagnostics show.
CompileResult compile_source(const std::string& name, std::string text, SourceManager& sources,
                             DiagnosticEngine& diags, const CompileOptions& options);
// From the passes on, for IR that is already built (the CPU reference, tests). `sources` (may be
// null) gives plan locations their file:line; codegen errors go to `diags` when it is not null,
// else they are thrown as codegen::CodegenError.
CompileResult compile_ir(ir::Program program, const SourceManager* sources, DiagnosticEngine* diags,
                         const CompileOptions& options);

// Checks the pass options alone (what compile_* checks before reading anything): UsageError for
// a name that is no pass, or a disabled pass that a later pass requires
// (passes::PassManager::broken_requirement); else Ok.
CompileResult check_options(const CompileOptions& options);

// The pipeline's pass names, in order (for usage messages).
std::vector<std::string> pass_names();

// One request per plan kernel (plan.kernels order), for `arch`.
std::vector<KernelRequest> kernel_requests(const codegen::Plan& plan, const std::string& arch);

}  // namespace opfuse::driver
