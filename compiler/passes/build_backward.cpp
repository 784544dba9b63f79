#include "passes/build_backward.h"

#include <fmt/format.h>

#include <algorithm>

#include "ir/backward_rules.h"
#include "ir/op_table.h"
#include "ir/parallel.h"
#include "ir/rewrite.h"
#include "support/assert.h"

namespace opfuse::passes {

namespace {

using namespace opfuse::ir;

class Builder final : public BackwardBuilder {
 public:
  explicit Builder(Sequence& s) : s_(s), grads_(s.values.size(), kNoValue) {}

  const Sequence& sequence() const override { return s_; }

  ValueId grad(ValueId v) override { return v < grads_.size() ? grads_[v] : kNoValue; }

  void accumulate(ValueId v, ValueId g) override {
    if (grads_.size() < s_.values.size()) grads_.resize(s_.values.size(), kNoValue);
    if (grads_[v] == kNoValue) {
      grads_[v] = g;
      return;
    }
    // A value used twice (a residual branch, an extra output) sums its gradients.
    Operation add;
    add.kind = OpKind::GradAdd;
    add.phase = Phase::Backward;
    add.operands = {grads_[v], g};
    add.instance = current_instance_;
    add.loc = current_loc_;
    grads_[v] = append(std::move(add), {s_.value(v).type})[0];
  }

  std::vector<ValueId> emit(const Operation& forward, OpKind kind, std::vector<ValueId> operands,
                            std::vector<TensorType> types, AttrList attrs) override {
    Operation op;
    op.kind = kind;
    op.phase = Phase::Backward;
    op.operands = std::move(operands);
    op.attrs = std::move(attrs);
    op.instance = forward.instance;
    op.loc = forward.loc;
    return append(std::move(op), types);
  }

  std::vector<ValueId> save_forward_results(const Operation& forward,
                                            std::vector<TensorType> types) override {
    Operation& op = s_.ops.at(forward_index_);
    OPFUSE_ASSERT(op.instance == forward.instance, "saved results requested for another op");
    std::vector<ValueId> ids;
    for (TensorType& t : types) {
      const ValueId id = s_.add_value(ValueKind::Result, std::move(t));
      s_.values[id].producer = int32_t(forward_index_);
      op.results.push_back(id);
      ids.push_back(id);
    }
    return ids;
  }

  void run() {
    for (size_t k = 0; k < s_.outputs.size(); ++k) {
      const ValueId out = s_.outputs[k].value;
      const ValueId seed =
          s_.add_value(ValueKind::OutputGrad, s_.value(out).type, s_.outputs[k].name);
      s_.output_grads.push_back(seed);
      accumulate(out, seed);
    }
    const std::vector<ValueId> summed = params_summed_over_ranks(s_);
    // Backward ops are appended to s_.ops while we walk the forward ops; index, never iterate.
    const size_t forward_count = s_.ops.size();
    for (size_t i = forward_count; i-- > 0;) {
      forward_index_ = i;
      const ValueId y = s_.ops[i].results[0];
      const ValueId dy = grad(y);
      if (dy == kNoValue) continue;  // nothing downstream needs this op's gradient
      current_instance_ = s_.ops[i].instance;
      current_loc_ = s_.ops[i].loc;
      const Operation forward = s_.ops[i];  // a copy: rules append to s_.ops
      backward_rule(forward.kind)(*this, forward, dy);
    }
    for (ValueId in : s_.inputs) s_.input_grads.push_back(grad(in));
    for (ValueId p : s_.params) {
      ValueId g = grad(p);
      OPFUSE_ASSERT(g != kNoValue, "parameter '{}' got no gradient", s_.value(p).name);
      if (std::ranges::find(summed, p) != summed.end()) {
        // Each rank's gradient covers its share of the tokens: every rank gets the sum.
        const auto owner = std::ranges::find_if(s_.ops, [&](const Operation& op) {
          return op.phase == Phase::Forward &&
                 std::ranges::find(op.operands, p) != op.operands.end();
        });
        const Operation forward = *owner;
        g = emit(forward, OpKind::AllReduce, {g}, {s_.value(p).type}, {})[0];
      }
      s_.param_grads.push_back(g);
    }
    hoist_collectives(forward_count);
    s_.has_backward = true;
  }

 private:
  // Each backward collective moves up to just after the op that makes its operand, so the ops
  // that do not need its result run while it is on the wire (the runtime overlaps them: note
  // "Overlapped collectives" in runtime/gpu/executor_run.cpp). The rules emit a linear's dgrad
  // and wgrad together, so the reduce_scatter that sums a sequence-parallel dgrad (the backward
  // of the all_gather before the linear) would otherwise come after the wgrad GEMM; hoisted, it
  // overlaps it, as TE's column-parallel Linear overlaps its dgrad collective with the wgrad.
  // Dependencies hold: the operand is made before the new place, the consumers follow the old.
  void hoist_collectives(size_t forward_count) {
    for (size_t j = forward_count; j < s_.ops.size(); ++j) {
      if (op_info(s_.ops[j].kind).family != KernelFamily::Collective) continue;
      size_t target = forward_count;
      for (ValueId operand : s_.ops[j].operands) {
        const int32_t producer = s_.value(operand).producer;
        if (producer >= 0) target = std::max(target, size_t(producer) + 1);
      }
      if (target >= j) continue;
      std::rotate(s_.ops.begin() + std::ptrdiff_t(target), s_.ops.begin() + std::ptrdiff_t(j),
                  s_.ops.begin() + std::ptrdiff_t(j) + 1);
      recompute_producers(s_);
    }
  }

  std::vector<ValueId> append(Operation op, const std::vector<TensorType>& types) {
    const int32_t index = int32_t(s_.ops.size());
    for (const TensorType& t : types) {
      const ValueId id = s_.add_value(ValueKind::Result, t);
      s_.values[id].producer = index;
      op.results.push_back(id);
    }
    s_.ops.push_back(std::move(op));
    return s_.ops.back().results;
  }

  Sequence& s_;
  std::vector<ValueId> grads_;
  size_t forward_index_ = 0;
  std::string current_instance_;
  SourceLoc current_loc_;
};

}  // namespace

bool build_backward(Program& program) {
  bool changed = false;
  for (Sequence& s : program.sequences) {
    if (s.has_backward) continue;
    Builder(s).run();
    changed = true;
  }
  return changed;
}

}  // namespace opfuse::passes
