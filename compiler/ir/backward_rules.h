// The backward of every op in IR terms (note "Training graph" in docs/architecture.md):
// backward_rule maps each fixed user op to one rule here (a new fixed op adds a case), and every
// pointwise op to one shared rule whose backward op names the op's definition; the derivative
// itself comes from that definition (compiler/ir/pointwise_ops.h). The build-backward pass calls
// the rules in reverse op order through a BackwardBuilder, which owns the gradient bookkeeping.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace opfuse::ir {

class BackwardBuilder {
 public:
  virtual ~BackwardBuilder() = default;
  virtual const Sequence& sequence() const = 0;
  // The gradient flowing into `v`, summed over all its uses so far; kNoValue when none reached it.
  virtual ValueId grad(ValueId v) = 0;
  // Adds `g` to the gradient of `v` (a grad_add op when `v` already has one).
  virtual void accumulate(ValueId v, ValueId g) = 0;
  // Appends a backward op differentiating `forward` and returns its results.
  virtual std::vector<ValueId> emit(const Operation& forward, OpKind kind,
                                    std::vector<ValueId> operands,
                                    std::vector<TensorType> result_types, AttrList attrs) = 0;
  // Adds results to the forward op (saved statistics such as a norm's mean and rstd).
  virtual std::vector<ValueId> save_forward_results(const Operation& forward,
                                                    std::vector<TensorType> types) = 0;
};

// Emits the backward of `forward`, whose result's gradient is `dy` (never kNoValue).
using BackwardRule = void (*)(BackwardBuilder& builder, const Operation& forward, ValueId dy);

BackwardRule backward_rule(OpKind kind);

}  // namespace opfuse::ir
