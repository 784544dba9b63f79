// Building the execution plan (plan/plan.h) from the IR: the codegen side of the plan contract.
// Pure: no device, no files.
#pragma once

#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "plan/plan.h"
#include "support/source_manager.h"

namespace opfuse::codegen {

// Codegen writes the plan library's types; its code names them unqualified.
using namespace opfuse::plan;

// Note "Plan passes": after every group is emitted, build_plan runs named steps over the
// sequence's plan, in this order; `fusec ir --after NAME` prints the plan after one and
// `--disable-pass NAME` skips one that is not required.
struct PlanPass {
  std::string_view name;
  std::string_view description;
  bool required;  // the executor reads what it computes: it cannot be disabled
};
const std::vector<PlanPass>& plan_passes();
const PlanPass* find_plan_pass(std::string_view name);

struct CodegenOptions {
  std::string arch = "sm_90a";  // the target the kernels are compiled for (never queried)
  // Turns op locations into `mlp.fuse:14`; nullptr leaves them out.
  const SourceManager* sources = nullptr;
  // FP8 GEMM accumulation, TE's defaults: fast (FP8-rate) accumulation in the forward GEMMs,
  // split (promoted to fp32 at intervals) in dgrad and wgrad, where gradients need the precision.
  bool fp8_fprop_fast_accum = true;
  bool fp8_backward_fast_accum = false;
  // Plan passes (plan_passes()) to skip; never a required one (build_plan asserts it).
  std::set<std::string> disabled_plan_passes = {};
  // Called with (pass name, sequence plan) after each plan pass named here.
  std::set<std::string> print_after = {};
  std::function<void(std::string_view, const SequencePlan&)> print = nullptr;
};

// A user error: an op or fused group with no GPU kernel, or a shape the kernel templates cannot
// run. Carries the op's .fuse location for the diagnostics engine.
class CodegenError : public std::runtime_error {
 public:
  CodegenError(SourceLoc loc, const std::string& message, std::string hint = {})
      : std::runtime_error(message), loc_(loc), hint_(std::move(hint)) {}
  SourceLoc loc() const { return loc_; }
  const std::string& hint() const { return hint_; }

 private:
  SourceLoc loc_;
  std::string hint_;
};

// Product of the dimensions of `shape` (begin..end), e.g. rows of [batch, seq, 4096] = batch * seq.
SymExpr dim_expr(const ir::Dim& d);  // `tokens / 2`: exact_div(tokens, 2)
SymExpr shape_product(const ir::Shape& shape, size_t begin, size_t end);
SymExpr element_count_expr(const ir::Shape& shape);

// Throws CodegenError for the first op or group that has no GPU kernel.
Plan build_plan(const ir::Sequence& sequence, const CodegenOptions& options);
Plan build_plan(const ir::Program& program, const CodegenOptions& options);

}  // namespace opfuse::codegen
