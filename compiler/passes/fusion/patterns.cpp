#include "passes/fusion/patterns.h"

#include <algorithm>
#include <array>

namespace opfuse::passes::fusion {

std::span<const FusionPattern* const> forward_patterns() {
  // Casts fold into elementwise producers first: a GELU followed by an FP8 cast is cheaper as
  // one activation+cast kernel than as a GELU_AUX_BIAS epilogue (which writes the bf16 output and
  // the aux) plus a separate cast. Longer GEMM epilogues are tried before their prefixes.
  static const std::array<const FusionPattern*, 9> order = {
      &norm_cast(),        &norm_block_cast(),       &norm_micro_cast(),
      &activation_cast(),  &activation_block_cast(), &activation_micro_cast(),
      &linear_bias_gelu(), &linear_residual(),       &linear_bias()};
  return order;
}

std::span<const FusionPattern* const> backward_patterns() {
  // dact_cast takes its bias gradient along before cast_dbias could claim the pair alone.
  static const std::array<const FusionPattern*, 7> order = {
      &dgelu_bgrad(),     &dact_cast(),  &dact_block_cast(),
      &dact_micro_cast(), &cast_dbias(), &norm_backward_residual(),
      &dgrad_residual()};
  return order;
}

std::vector<const FusionPattern*> patterns_in_order(const ir::Program& program, ir::Phase phase,
                                                    DeclaredPatterns& storage) {
  const auto builtins = phase == ir::Phase::Forward ? forward_patterns() : backward_patterns();
  storage = {};
  size_t declared = 0;
  for (const ir::DeclaredFusion& f : program.fusions) declared += f.phase == phase ? 1 : 0;
  // The patterns point at their steps and the order at the patterns: no reallocation.
  storage.steps.reserve(declared);
  storage.patterns.reserve(declared);
  std::vector<std::pair<int, const FusionPattern*>> order;
  for (const FusionPattern* p : builtins) order.emplace_back(0, p);
  for (const ir::DeclaredFusion& f : program.fusions) {
    if (f.phase != phase) continue;
    std::vector<Step>& steps = storage.steps.emplace_back();
    for (size_t k = 0; k < f.steps.size(); ++k) {
      const ir::DeclaredFusion::Step& d = f.steps[k];
      Step step;
      step.kinds = std::span(&d.kind, 1);
      step.link = k == 0 ? Link::Start : Link::Consumes;
      step.from = k == 0 ? 0 : int(k) - 1;
      step.optional = d.optional;
      step.user_op = d.user_op;
      // The rule every built-in pattern keeps: a current-scaled cast measures the amax of the
      // whole tensor first, so it never folds into its producer.
      if (d.kind == ir::OpKind::CastFp8) step.when = cast_can_fold;
      steps.push_back(step);
    }
    const FusionPattern& p = storage.patterns.emplace_back(
        FusionPattern{f.name, phase, steps, nullptr, "declared in the program"});
    order.emplace_back(f.priority, &p);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<const FusionPattern*> out;
  out.reserve(order.size());
  for (const auto& [_, p] : order) out.push_back(p);
  return out;
}

}  // namespace opfuse::passes::fusion
