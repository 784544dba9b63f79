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
  bool order_is_safe(const std::vector<int>& at) const {
    int first = INT32_MAX, last = -1;
    for (int i : at)
      if (i >= 0) first = std::min(first, i), last = std::max(last, i);
    for (int j = first + 1; j < last; ++j) {
      if (in_group(at, size_t(j))) continue;
      for (int i : at)
        if (i >= 0)
          for (ValueId r : s_.ops[size_t(i)].results)
            if (uses(s_.ops[size_t(j)], r)) return false;
    }
    return true;
  }

  const Sequence& s_;
  const FusionPattern& p_;
};

// Replaces the matched ops with one fused op at the last part's position.
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
  std::vector<Operation> ops;
  size_t fused_at = 0;
  for (size_t j = 0; j < s.ops.size(); ++j) {
    if (int(j) == at.back()) {
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
