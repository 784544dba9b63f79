// Every fusion pattern, one per file in this directory, and the priority order of each phase's.
#pragma once

#include <span>

#include "passes/fusion/pattern.h"

namespace opfuse::passes::fusion {

// Forward.
const FusionPattern& norm_cast();
const FusionPattern& norm_block_cast();
const FusionPattern& norm_micro_cast();
const FusionPattern& activation_cast();
const FusionPattern& activation_block_cast();
const FusionPattern& activation_micro_cast();
const FusionPattern& linear_bias_gelu();
const FusionPattern& linear_residual();
const FusionPattern& linear_bias();
// Backward.
const FusionPattern& dact_cast();
const FusionPattern& dact_block_cast();
const FusionPattern& dact_micro_cast();
const FusionPattern& cast_dbias();
const FusionPattern& norm_backward_residual();
const FusionPattern& dgrad_residual();
const FusionPattern& dgelu_bgrad();

// In the order they are tried (patterns.cpp says why).
std::span<const FusionPattern* const> forward_patterns();
std::span<const FusionPattern* const> backward_patterns();

}  // namespace opfuse::passes::fusion
