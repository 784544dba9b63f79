#include "ir/parallel.h"

#include <fmt/format.h>

#include <algorithm>

namespace opfuse::ir {

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::Replicated:
      return "replicated on every rank";
    case Layout::SplitTokens:
      return "split over the ranks on its tokens (dim 0)";
    case Layout::SplitFeatures:
      return "split over the ranks on its features (last dim)";
    case Layout::Partial:
      return "a partial sum on each rank";
  }
  return "?";
}

namespace {

LayoutResult fail(std::string_view op, Layout in, std::string hint) {
  return {in, fmt::format("'{}' cannot take a tensor {}", op, layout_name(in)), std::move(hint)};
}

}  // namespace

LayoutResult result_layout(const Sequence& s, const Operation& op,
                           std::span<const Layout> layouts) {
  if (!s.parallel.active() || op.operands.empty()) return {};
  const Layout x = layouts[op.operands[0]];
  const std::string_view name = op_info(op.kind).name;
  switch (op.kind) {
    case OpKind::AllGather:
      if (x == Layout::SplitTokens) return {Layout::Replicated, {}, {}};
      return fail(name, x, "all_gather joins the ranks' shares of the tokens");
    case OpKind::ReduceScatter:
      if (x == Layout::Partial) return {Layout::SplitTokens, {}, {}};
      return fail(name, x, "reduce_scatter sums partial tensors (a row-parallel linear's output)");
    case OpKind::AllReduce:
      if (x == Layout::Partial) return {Layout::Replicated, {}, {}};
      return fail(name, x, "all_reduce sums partial tensors (a row-parallel linear's output)");
    case OpKind::Linear:
      switch (linear_parallel(op.attrs)) {
        case LinearParallel::Column:
          if (x == Layout::Replicated) return {Layout::SplitFeatures, {}, {}};
          return fail("linear(parallel = column)", x,
                      "a column-parallel linear reads the whole tensor on every rank");
        case LinearParallel::Row:
          if (x == Layout::SplitFeatures) return {Layout::Partial, {}, {}};
          return fail("linear(parallel = row)", x,
                      "a row-parallel linear reads a column-parallel linear's share of the "
                      "features");
        default:
          if (x == Layout::Replicated || x == Layout::SplitTokens) return {x, {}, {}};
          return fail(name, x,
                      x == Layout::SplitFeatures ? "make it row-parallel: parallel = row"
                                                 : "sum the parts first: all_reduce()");
      }
    case OpKind::LayerNorm:
    case OpKind::RMSNorm:
    case OpKind::UserNorm:
      if (x == Layout::Replicated || x == Layout::SplitTokens) return {x, {}, {}};
      return fail(name, x, "a norm reads every feature of a token: normalize before splitting");
    case OpKind::ConstantScale:
    case OpKind::Identity:
    case OpKind::MakeExtraOutput:
      return {x, {}, {}};
    case OpKind::Reshape: {
      const Shape& in = s.value(op.operands[0]).type.shape;
      const Shape& out = s.value(op.results[0]).type.shape;
      const bool keeps = (x == Layout::SplitTokens && out.front() == in.front()) ||
                         (x == Layout::SplitFeatures && out.back() == in.back()) ||
                         x == Layout::Replicated || x == Layout::Partial;
      if (keeps) return {x, {}, {}};
      return fail(name, x, "keep the split dimension as it is");
    }
    case OpKind::AddExtraInput: {
      const Layout extra = layouts[op.operands.back()];
      if (x == extra) return {x, {}, {}};
      return {x,
              fmt::format("add_extra_input adds a tensor {} to one {}", layout_name(extra),
                          layout_name(x)),
              x == Layout::Partial ? "sum the parts first: all_reduce() or reduce_scatter()"
                                   : "add it where the stream is laid out like the input"};
    }
    case OpKind::Bias:
      if (x == Layout::Replicated || x == Layout::SplitTokens) return {x, {}, {}};
      return fail(name, x,
                  x == Layout::Partial ? "add the bias after all_reduce() or reduce_scatter()"
                                       : "give the column-parallel linear bias = true instead");
    default:
      if (x == Layout::Partial)
        return fail(name, x, "sum the parts first: all_reduce() or reduce_scatter()");
      return {x, {}, {}};
  }
}

std::vector<Layout> forward_layouts(const Sequence& s) {
  std::vector<Layout> layouts(s.values.size(), Layout::Replicated);
  if (!s.parallel.active()) return layouts;
  for (ValueId v : s.inputs) layouts[v] = s.parallel.sp ? Layout::SplitTokens : Layout::Replicated;
  for (const Operation& op : s.ops) {
    if (op.phase != Phase::Forward || op.results.empty()) continue;
    const Layout l = result_layout(s, op, layouts).layout;
    for (ValueId r : op.results) layouts[r] = l;
  }
  return layouts;
}

std::vector<ValueId> params_summed_over_ranks(const Sequence& s) {
  std::vector<ValueId> out;
  if (!s.parallel.active()) return out;
  const std::vector<Layout> layouts = forward_layouts(s);
  for (const Operation& op : s.ops) {
    if (op.phase != Phase::Forward || op.operands.empty()) continue;
    if (layouts[op.operands[0]] != Layout::SplitTokens) continue;
    for (ValueId v : op.operands) {
      const Value& value = s.value(v);
      if (value.kind == ValueKind::Param && !value.shard.sharded() &&
          std::ranges::find(out, v) == out.end())
        out.push_back(v);
    }
  }
  return out;
}

}  // namespace opfuse::ir
