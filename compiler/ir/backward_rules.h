// The backward of every op in IR terms (note "Training graph" in docs/architecture.md). Each rule
// is a function in namespace backward below; the op's entry in compiler/ir/op_table.cpp names it
// (OpInfo::backward), so a new fixed op adds its rule here and that name to its entry. Every
// pointwise op shares one rule whose backward op names the op's definition; the derivative itself
// comes from that definition (compiler/ir/pointwise_ops.h). The build-backward pass calls the
// rules in reverse op order through a BackwardBuilder, which owns the gradient bookkeeping.
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

// The rules, one signature (BackwardRule, ir/op_table.h).
namespace backward {
void layernorm(BackwardBuilder& b, const Operation& f, ValueId dy);
void rmsnorm(BackwardBuilder& b, const Operation& f, ValueId dy);
void linear(BackwardBuilder& b, const Operation& f, ValueId dy);
void bias(BackwardBuilder& b, const Operation& f, ValueId dy);
void add_extra_input(BackwardBuilder& b, const Operation& f, ValueId dy);
void pass_through(BackwardBuilder& b, const Operation& f, ValueId dy);  // aliases
void quantize(BackwardBuilder& b, const Operation& f, ValueId dy);
void constant_scale(BackwardBuilder& b, const Operation& f, ValueId dy);
void reshape(BackwardBuilder& b, const Operation& f, ValueId dy);
void pointwise(BackwardBuilder& b, const Operation& f, ValueId dy);  // every pointwise op
void user_norm(BackwardBuilder& b, const Operation& f, ValueId dy);  // norm-like user ops
void all_reduce(BackwardBuilder& b, const Operation& f, ValueId dy);
void all_gather(BackwardBuilder& b, const Operation& f, ValueId dy);
void reduce_scatter(BackwardBuilder& b, const Operation& f, ValueId dy);
void dropout(BackwardBuilder& b, const Operation& f, ValueId dy);
}  // namespace backward

// Dropout's saved mask of a value of type x: 32 bits a word, ceil(n / 32) words per row of n
// elements (bit c % 32 of word c / 32 is element c: 1 kept). The IR has no integer element type,
// so it is typed fp32 (4 bytes a word); nothing reads its words as numbers.
TensorType dropout_mask_type(const TensorType& x);

// op_info(kind).backward; an internal error naming the op when its entry has none.
BackwardRule backward_rule(OpKind kind);

}  // namespace opfuse::ir
