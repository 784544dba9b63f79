#include "passes/fusion/patterns.h"

#include <array>

namespace opfuse::passes::fusion {

std::span<const FusionPattern* const> forward_patterns() {
  // Casts fold into elementwise producers first: a GELU followed by an FP8 cast is cheaper as
  // one activation+cast kernel than as a GELU_AUX_BIAS epilogue (which writes the bf16 output and
  // the aux) plus a separate cast. Longer GEMM epilogues are tried before their prefixes.
  static const std::array<const FusionPattern*, 6> order = {
      &norm_cast(),        &activation_cast(), &activation_block_cast(),
      &linear_bias_gelu(), &linear_residual(), &linear_bias()};
  return order;
}

std::span<const FusionPattern* const> backward_patterns() {
  // dact_cast takes its bias gradient along before cast_dbias could claim the pair alone.
  static const std::array<const FusionPattern*, 6> order = {
      &dgelu_bgrad(),   &dact_cast(), &dact_block_cast(), &cast_dbias(), &norm_backward_residual(),
      &dgrad_residual()};
  return order;
}

}  // namespace opfuse::passes::fusion
