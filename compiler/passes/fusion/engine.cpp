#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <set>

#include "ir/rewrite.h"
#include "passes/fusion/pattern.h"
#include "support/assert.h"

namespace opfuse::passes::fusion {

namespace {

using namespace opfuse::ir;

bool uses(const Operation& op, ValueId v) {
  if (std::find(op.operands.begin(), op.operands.end(), v) != op.operands.end()) return true;
  for (const Operation& part : op.parts)
    if (uses(part, v)) return true;
  return false;
}

// Used by the sequence's interface (outputs, gradients handed back) rather than an op.
bool used_by_interface(const Sequence& s, ValueId v) {
  for (const SequenceOutput& o : s.outputs)
    if (o.value == v) return true;
  if (s.quantized_output && s.quantized_output->columnwise == v) return true;
  return std::find(s.input_grads.begin(), s.input_grads.end(), v) != s.input_grads.end() ||
         std::find(s.param_grads.begin(), s.param_grads.end(), v) != s.param_grads.end();
}

bool step_accepts(const Sequence& s, const Step& step, const Operation& op) {
  if (op.kind == OpKind::Fused) return false;
  const bool kind_ok = step.is != nullptr ? step.is(op.kind)
                                          : std::find(step.kinds.begin(), step.kinds.end(),
                                                      op.kind) != step.kinds.end();
  if (!kind_ok) return false;
  if (!step.user_op.empty() && ir::attr_name(op.attrs, "op") != step.user_op) return false;
  return step.when == nullptr || step.when(s, op);
}

// Where the fused op of the parts `at` (op indices; -1 for absent steps) can stand: the last
// part's index when no op between the parts reads a part's result (the usual case: a producer
// and its consumers), else the first part's when no part reads a result of an op between them (a
// gradient that a bias gradient reads before its cast: the group moves up to the producer); -1
// when neither holds.
int fuse_position(const Sequence& s, const std::vector<int>& at) {
  int first = INT32_MAX, last = -1;
  for (int i : at)
    if (i >= 0) first = std::min(first, i), last = std::max(last, i);
  auto in_group = [&](int j) { return std::find(at.begin(), at.end(), j) != at.end(); };
  bool later_read = false, earlier_needed = false;
  for (int j = first + 1; j < last; ++j) {
    if (in_group(j)) continue;
    const Operation& between = s.ops[size_t(j)];
    for (int i : at) {
      if (i < 0) continue;
      for (ValueId r : s.ops[size_t(i)].results) later_read = later_read || uses(between, r);
      for (ValueId r : between.results)
        earlier_needed = earlier_needed || uses(s.ops[size_t(i)], r);
    }
  }
  if (!later_read) return last;
  return earlier_needed ? -1 : first;
}

class Matcher {
 public:
  Matcher(const Sequence& s, const FusionPattern& p) : s_(s), p_(p) {}

  // Indices (into s.ops, one per step, -1 when absent) of a match anchored at op `start`, then
  // those of the statistics ops that join it (Step::stats_ok).
  std::optional<std::vector<int>> match(size_t start) const {
    const auto& steps = p_.steps;
    if (s_.ops[start].phase != p_.phase || !step_accepts(s_, steps[0], s_.ops[start]))
      return std::nullopt;
    std::vector<int> at(steps.size(), -1);
    at[0] = int(start);
    for (size_t k = 1; k < steps.size(); ++k) {
      const Step& step = steps[k];
      // An absent optional step is skipped in the chain: link to the step it linked to.
      int from_step = step.from;
      while (from_step > 0 && at.at(size_t(from_step)) < 0)
        from_step = steps[size_t(from_step)].from;
      const int from = at.at(size_t(from_step));
      if (from >= 0) at[k] = find_step(step, s_.ops[size_t(from)], at);
      if (at[k] < 0 && !step.optional) return std::nullopt;
    }
    // The statistics ops the kernel computes of its steps' results join the group.
    std::vector<int> group = at;
    for (size_t k = 0; k < steps.size(); ++k) {
      if (at[k] < 0 || !steps[k].stats_ok) continue;
      const int stats = foldable_stats_of(s_.ops[size_t(at[k])].results.at(0));
      if (stats >= 0) group.push_back(stats);
    }
    if (!escapes_are_allowed(at, group) || !order_is_safe(group)) return std::nullopt;
    if (p_.accept) {
      Match m;
      for (int i : at) m.push_back(i >= 0 ? &s_.ops[size_t(i)] : nullptr);
      if (!p_.accept(s_, m)) return std::nullopt;
    }
    return group;
  }

 private:
  int find_step(const Step& step, const Operation& from, const std::vector<int>& taken) const {
    for (size_t j = 0; j < s_.ops.size(); ++j) {
      const Operation& op = s_.ops[j];
      if (op.phase != p_.phase || std::find(taken.begin(), taken.end(), int(j)) != taken.end())
        continue;
      if (!step_accepts(s_, step, op)) continue;
      const bool linked = step.link == Link::Consumes
                              ? uses(op, from.results[0])
                              : !op.operands.empty() && op.operands[0] == from.operands[0];
      if (linked) return int(j);
    }
    return -1;
  }

  bool in_group(const std::vector<int>& at, size_t j) const {
    return std::find(at.begin(), at.end(), int(j)) != at.end();
  }

  // The first statistics op of the pattern's phase that a kernel could compute of `v`; -1: none.
  int foldable_stats_of(ValueId v) const {
    for (size_t j = 0; j < s_.ops.size(); ++j) {
      const Operation& op = s_.ops[j];
      if (op.phase == p_.phase && stats_can_fold(s_, op) && op.operands.at(0) == v) return int(j);
    }
    return -1;
  }

  // A result another step reads may leave the group only where the step allows it.
  bool escapes_are_allowed(const std::vector<int>& at, const std::vector<int>& group) const {
    for (size_t k = 0; k < at.size(); ++k) {
      if (at[k] < 0 || p_.steps[k].escapes_ok) continue;
      const ValueId v = s_.ops[size_t(at[k])].results[0];
      bool linked = false;
      for (size_t m = 1; m < at.size(); ++m)
        linked |=
            at[m] >= 0 && p_.steps[m].link == Link::Consumes && uses(s_.ops[size_t(at[m])], v);
      if (!linked) continue;
      if (used_by_interface(s_, v)) return false;
      for (size_t j = 0; j < s_.ops.size(); ++j)
        if (!in_group(group, j) && uses(s_.ops[j], v)) return false;
    }
    return true;
  }

  // The fused op takes the place of the last part: no op between the first and the last part
  // may read a part's result.
  // The fused op replaces its parts at the last part's position, or at the first where an op
  // between them reads a part's result (fuse_position); either way no op may move past one whose
  // values it needs.
  bool order_is_safe(const std::vector<int>& at) const { return fuse_position(s_, at) >= 0; }

  const Sequence& s_;
  const FusionPattern& p_;
};

// Replaces the matched ops with one fused op at fuse_position.
void fuse(Sequence& s, const FusionPattern& p, std::vector<int> at) {
  at.erase(std::remove(at.begin(), at.end(), -1), at.end());
  std::sort(at.begin(), at.end());
  Operation fused;
  fused.kind = OpKind::Fused;
  fused.phase = p.phase;
  fused.attrs = {{"pattern", std::string(p.name)}};
  fused.instance = s.ops[size_t(at.front())].instance;
  fused.loc = s.ops[size_t(at.front())].loc;
  std::set<ValueId> made;
  for (int i : at) {
    const Operation& part = s.ops[size_t(i)];
    for (ValueId v : part.operands)
      if (!made.count(v) &&
          std::find(fused.operands.begin(), fused.operands.end(), v) == fused.operands.end())
        fused.operands.push_back(v);
    made.insert(part.results.begin(), part.results.end());
    fused.parts.push_back(part);
  }
  const std::set<int> group(at.begin(), at.end());
  for (const Operation& part : fused.parts) {
    for (ValueId r : part.results) {
      bool outside = used_by_interface(s, r);
      for (size_t j = 0; j < s.ops.size() && !outside; ++j)
        outside = !group.count(int(j)) && uses(s.ops[j], r);
      if (outside) fused.results.push_back(r);
    }
  }
  const int position = fuse_position(s, at);
  OPFUSE_ASSERT(position >= 0, "pattern '{}' matched parts that cannot be placed", p.name);
  std::vector<Operation> ops;
  size_t fused_at = 0;
  for (size_t j = 0; j < s.ops.size(); ++j) {
    if (int(j) == position) {
      fused_at = ops.size();
    } else if (!group.count(int(j))) {
      ops.push_back(std::move(s.ops[j]));
    }
  }
  ops.insert(ops.begin() + std::ptrdiff_t(fused_at), std::move(fused));
  s.ops = std::move(ops);
  recompute_producers(s);
}

}  // namespace

bool apply_patterns(Sequence& seq, Phase phase, std::span<const FusionPattern* const> patterns) {
  bool changed = false;
  for (const FusionPattern* p : patterns) {
    OPFUSE_ASSERT(p->phase == phase, "pattern '{}' is for the other phase", p->name);
    OPFUSE_ASSERT(!p->steps.empty() && p->steps[0].link == Link::Start,
                  "pattern '{}' does not start with a Start step", p->name);
    for (size_t i = 0; i < seq.ops.size();) {
      const auto at = Matcher(seq, *p).match(i);
      if (!at) {
        ++i;
        continue;
      }
      fuse(seq, *p, *at);
      changed = true;
      i = 0;  // indices moved; patterns are few and sequences short
    }
  }
  return changed;
}

bool cast_can_fold(const Sequence& seq, const Operation& cast) {
  return cast.quantizer >= 0 && size_t(cast.quantizer) < seq.quantizers.size() &&
         seq.quantizers[size_t(cast.quantizer)].spec.delayed();
}

bool mxfp8_rowwise_decoded(const Sequence& seq, const Operation& cast) {
  if (cast.quantizer < 0 || size_t(cast.quantizer) >= seq.quantizers.size()) return false;
  const plan::QuantSpec& spec = seq.quantizers[size_t(cast.quantizer)].spec;
  return spec.micro_scaled() && !spec.nvfp4() && !ir::attr_bool(cast.attrs, "columnwise") &&
         seq.value(cast.results.at(0)).quantizer < 0;
}

}  // namespace opfuse::passes::fusion
