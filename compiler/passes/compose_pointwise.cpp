#include "passes/compose_pointwise.h"

#include <fmt/format.h>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/pointwise_ops.h"
#include "ir/rewrite.h"
#include "ir/scalar_code.h"
#include "support/assert.h"

namespace opfuse::passes {

namespace {

using ir::scalar::NodeId;

// Within what scalar::decode accepts (4096 nodes) for the carrier's expression.
constexpr size_t kMaxComposedNodes = 4000;

// One op of the chain applied to `in` inside `g`; returns its value with the derivative hints of
// that value for each input: a built-in's own (its build sets them), or a user-defined op's
// gradients decoded with dy = 1 (a gradient is linear in dy).
NodeId apply(ir::scalar::Graph& g, const ir::PointwiseDef& def, const ir::AttrList& attrs,
             std::span<const NodeId> in, bool device) {
  if (!def.user_defined) return def.build(ir::PointwiseBuilder{g, in, attrs, device});
  const auto decoded = ir::scalar::decode(ir::attr_name(attrs, "expression"));
  OPFUSE_ASSERT(decoded && decoded->roots.size() == 2 * (in.size() + 1),
                "user op '{}': its expression is not {} roots", ir::attr_name(attrs, "op"),
                2 * (in.size() + 1));
  const auto half = std::span(decoded->roots).subspan(device ? in.size() + 1 : 0, in.size() + 1);
  std::vector<NodeId> vars(in.begin(), in.end());
  vars.push_back(g.constant(1));
  const std::vector<NodeId> roots = g.copy_from(decoded->graph, half, vars);
  const NodeId value = roots.front();
  // A hint needs its argument below the value (see Builder::lower_call).
  bool hints = true;
  for (const NodeId u : in) hints = hints && u < value;
  if (hints && in.size() == 2 && in[0] == in[1]) {
    g.hint_derivative(value, in[0], g.add(roots[1], roots[2]));
  } else if (hints) {
    for (size_t i = 0; i < in.size(); ++i) g.hint_derivative(value, in[i], roots[i + 1]);
  }
  return value;
}

struct Part {
  const ir::PointwiseDef* def;
  const ir::AttrList* attrs;
  SourceLoc loc;
};

// The chain as one carrier's attributes; nullopt when its expression would be too large.
std::optional<ir::AttrList> compose(std::span<const Part> chain, bool gated) {
  ir::scalar::Graph g;
  const int n = gated ? 2 : 1;
  std::vector<NodeId> roots;
  for (const bool device : {false, true}) {
    std::vector<NodeId> cur(size_t(n), 0);
    for (int i = 0; i < n; ++i) cur[size_t(i)] = g.var(i);
    for (const Part& p : chain) {
      if (p.def->gated) {
        cur = {apply(g, *p.def, *p.attrs, cur, device)};
      } else {
        // A plain op before the gated one applies to both halves.
        for (NodeId& v : cur) v = apply(g, *p.def, *p.attrs, std::span(&v, 1), device);
      }
    }
    OPFUSE_ASSERT(cur.size() == 1, "a composed chain ends in {} values", cur.size());
    const NodeId value = cur.front();
    const NodeId dy = g.var(n);
    roots.push_back(value);
    for (int i = 0; i < n; ++i) {
      const NodeId d = g.derivative(value, i);
      roots.push_back(g.is_constant(d, 0) ? d : g.is_constant(d, 1) ? dy : g.mul(d, dy));
    }
    if (g.size() > kMaxComposedNodes) return std::nullopt;
  }
  std::string name, parts;
  for (const Part& p : chain) {
    name += (name.empty() ? "" : "+") + std::string(ir::pointwise_op_name(*p.def, *p.attrs));
    // Each op with its line, for the kernel's comment (a composed op brings its own).
    const auto composed = ir::composed_parts(*p.def, *p.attrs);
    const std::string own =
        composed.empty() ? ir::composed_part_text(ir::pointwise_op_name(*p.def, *p.attrs), p.loc)
                         : ir::attr_name(*p.attrs, "parts");
    parts += (parts.empty() ? "" : "+") + own;
  }
  return ir::user_pointwise_attrs(name, ir::scalar::encode_roots(g, roots), parts);
}

bool run_on(ir::Sequence& s) {
  std::vector<int> uses(s.values.size(), 0);
  for (const ir::Operation& op : s.ops)
    for (const ir::ValueId v : op.operands) ++uses[v];
  for (const ir::SequenceOutput& o : s.outputs) ++uses[o.value];
  auto pointwise = [](const ir::Operation& op) {
    return op.phase == ir::Phase::Forward && ir::is_pointwise(op.kind) && op.operands.size() == 1 &&
           op.results.size() == 1 && op.parts.empty();
  };
  std::vector<bool> erase(s.ops.size(), false);
  bool any = false;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (erase[i] || !pointwise(s.ops[i])) continue;
    // The chain from op i: each next op the only reader of the last one's result.
    std::vector<size_t> chain = {i};
    bool gated = ir::pointwise_def(s.ops[i].kind)->gated;
    std::optional<ir::AttrList> composed;
    for (;;) {
      const ir::ValueId result = s.ops[chain.back()].results[0];
      if (uses[result] != 1) break;
      size_t next = chain.back() + 1;
      while (next < s.ops.size() &&
             !(s.ops[next].operands.size() == 1 && s.ops[next].operands[0] == result))
        ++next;
      if (next == s.ops.size() || !pointwise(s.ops[next])) break;
      const bool next_gated = ir::pointwise_def(s.ops[next].kind)->gated;
      if (gated && next_gated) break;
      std::vector<Part> parts;
      parts.reserve(chain.size() + 1);
      for (const size_t k : chain)
        parts.push_back({ir::pointwise_def(s.ops[k].kind), &s.ops[k].attrs, s.ops[k].loc});
      parts.push_back({ir::pointwise_def(s.ops[next].kind), &s.ops[next].attrs, s.ops[next].loc});
      auto attrs = compose(parts, gated || next_gated);
      if (!attrs) break;
      composed = std::move(attrs);
      gated = gated || next_gated;
      chain.push_back(next);
    }
    if (chain.size() < 2) continue;
    // The last op of the chain becomes the composition (its result keeps its uses); the others
    // go. It keeps the first op's layer name and line, where the chain starts.
    ir::Operation& last = s.ops[chain.back()];
    last.kind = ir::pointwise_kind(ir::user_pointwise_def(gated));
    last.attrs = std::move(*composed);
    last.operands = s.ops[chain.front()].operands;
    last.instance = s.ops[chain.front()].instance;
    last.loc = s.ops[chain.front()].loc;
    for (size_t k = 0; k + 1 < chain.size(); ++k) erase[chain[k]] = true;
    any = true;
  }
  if (any) ir::erase_ops(s, erase);
  return any;
}

}  // namespace

bool compose_pointwise(ir::Program& program) {
  bool changed = false;
  for (ir::Sequence& s : program.sequences) changed |= run_on(s);
  return changed;
}

}  // namespace opfuse::passes
