// How a tensor-parallel sequence's values lie over its ranks (docs/parallel.md): the builder
// checks every op against it, build-backward reads it to sum the gradients of replicated
// parameters that each rank computed from its share of the tokens.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace opfuse::ir {

enum class Layout : uint8_t {
  Replicated,     // every rank holds the whole tensor
  SplitTokens,    // rank r holds the r-th share of dim 0 (sequence parallelism)
  SplitFeatures,  // rank r holds the r-th share of the last dim (a column-parallel linear's output)
  Partial,        // every rank holds a summand of the tensor (a row-parallel linear's output)
};
std::string_view layout_name(Layout layout);  // "replicated", "split over the ranks on its ..."

// The layout of the op's first result, given the layouts of the values before it (indexed by
// value id); an error (with a hint) where the op cannot take its operand's layout. Every value is
// replicated in a sequence without `with parallel`.
struct LayoutResult {
  Layout layout = Layout::Replicated;
  std::string error;
  std::string hint;
};
LayoutResult result_layout(const Sequence& s, const Operation& op, std::span<const Layout> layouts);

// The layout of every value the forward ops make (per value id); inputs are split on their tokens
// under sequence parallelism, replicated otherwise. Assumes the builder's checks passed.
std::vector<Layout> forward_layouts(const Sequence& s);

// Replicated parameters whose gradient each rank computes from its share of the tokens (norm
// weights, biases after a reduce_scatter, plain linears under sequence parallelism): backward
// sums them over the ranks (Megatron's sequence-parallel gradient all-reduce).
std::vector<ValueId> params_summed_over_ranks(const Sequence& s);

}  // namespace opfuse::ir
