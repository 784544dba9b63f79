// The IR builder's last-dimension reductions in user-defined ops (docs/language.md, "User-defined
// ops"): sum_last, mean_last and max_last make an op norm-like. Each reduction lowers to a row
// scalar of the op's row program (compiler/ir/row_expr.h); a call of a norm-like op from another
// op is inlined, its reductions becoming the caller's; a use in a sequence becomes an op of kind
// OpKind::UserNorm whose attributes hold the forward and backward row programs. Split from
// builder_op_expressions.cpp, which lowers the rest of an op's expression.

#include <fmt/format.h>

#include "ir/builder_impl.h"
#include "ir/scalar_code.h"
#include "ir/user_op_support.h"

namespace opfuse::ir::builder_detail {

using user_ops::kMaxOpCallDepth;
using user_ops::kMaxOpNodes;

void Builder::reduction_error(const Expr& e, const OpScope& scope, const UserOp* callee) {
  const dsl::OpDecl& d = *scope.op->decl;
  const std::string what =
      callee != nullptr
          ? fmt::format("calls '{}', which reduces over the last dimension", callee->decl->name)
          : fmt::format("uses {}", e.text);
  switch (scope.reductions) {
    case Reductions::InGatedOp:
      op_error(
          scope, e.loc,
          fmt::format("gated op '{}' {}; reductions are supported in plain ops only", d.name, what),
          "reduce in a plain op used before or after it in the sequence");
      return;
    case Reductions::InBackward:
      op_error(
          scope, e.loc,
          fmt::format("the backward of op '{}' {}; a given backward is pointwise", d.name, what),
          "leave the backward out: the gradient of a norm-like op is derived");
      return;
    case Reductions::Allowed:
      return;
  }
}

std::optional<scalar::NodeId> Builder::lower_reduction(const Expr& e, RowReduce kind,
                                                       scalar::Graph& g, OpScope& scope) {
  const std::string& callee = e.text;
  for (size_t i = 0; i < e.arg_names.size(); ++i) {
    if (!e.arg_names[i].empty()) {
      op_error(scope, e.arg_name_locs[i], fmt::format("'{}' takes no named arguments", callee));
      return std::nullopt;
    }
  }
  if (e.operands.size() != 1) {
    op_error(scope, e.loc, fmt::format("'{}' takes 1 argument, got {}", callee, e.operands.size()),
             fmt::format("{}(EXPR) reduces one expression over the last dimension, e.g. "
                         "{}(x * x)",
                         callee, callee));
    return std::nullopt;
  }
  if (scope.stages == nullptr) {
    reduction_error(e, scope, nullptr);
    return std::nullopt;
  }
  const auto arg = lower(*e.operands[0], g, scope);
  if (!arg) return std::nullopt;
  // The same reduction of the same expression is one row scalar (a LayerNorm's mean_last(x)
  // written twice is reduced once).
  std::vector<RowStage>& stages = *scope.stages;
  for (size_t k = 0; k < stages.size(); ++k)
    if (stages[k].kind == kind && stages[k].root == *arg)
      return g.var(scope.reduction_base + int(k));
  if (stages.size() >= kMaxRowReductions) {
    op_error(scope, e.loc,
             fmt::format("op '{}' has more than {} different reductions", scope.op->decl->name,
                         kMaxRowReductions),
             "split it into several ops used one after another");
    return std::nullopt;
  }
  stages.push_back({kind, *arg});
  return g.var(scope.reduction_base + int(stages.size() - 1));
}

std::optional<scalar::NodeId> Builder::inline_row_call(const Expr& e, const UserOp& target,
                                                       const std::vector<scalar::NodeId>& in,
                                                       const std::vector<double>& values,
                                                       scalar::Graph& g, OpScope& scope) {
  if (scope.stages == nullptr) {
    reduction_error(e, scope, &target);
    return std::nullopt;
  }
  OpScope::InlineKey key{&target, values, in};
  if (scope.inlined != nullptr) {
    if (auto it = scope.inlined->find(key); it != scope.inlined->end()) return it->second;
  }
  // Each op lowered inside another is a level of recursion: bounded as in lower_user_call.
  if (op_call_depth_ >= kMaxOpCallDepth) {
    op_call_too_deep_ = true;
    return std::nullopt;
  }
  OpScope inner;
  inner.op = &target;
  inner.device = scope.device;
  inner.report = false;  // its body was checked at its definition
  inner.stages = scope.stages;
  inner.reduction_base = scope.reduction_base;
  inner.inlined = scope.inlined;
  size_t a = 0, i = 0;
  for (const dsl::OpParam& p : target.decl->params) {
    if (p.is_attr)
      inner.attrs[p.name] = values[a++];
    else
      inner.inputs[p.name] = in[i++];
  }
  ++op_call_depth_;
  const auto value = lower(*target.decl->body, g, inner);
  --op_call_depth_;
  if (op_call_too_deep_) {
    if (op_call_depth_ == 0) {
      op_call_too_deep_ = false;
      user_call_error(UserCallError::TooDeep, e, scope, target);
    }
    return std::nullopt;
  }
  if (inner.non_differentiable && !scope.non_differentiable) scope.non_differentiable = e.loc;
  if (!value) {
    // With the callee's defaults its body lowered; with these values only a limit can fail.
    op_error(scope, e.loc,
             fmt::format("op '{}' cannot inline '{}' here: together they have more than {} "
                         "reductions or {} operations",
                         scope.op->decl->name, target.decl->name, kMaxRowReductions, kMaxOpNodes),
             "split the op, or call the ops in sequence instead of inside one another");
    return std::nullopt;
  }
  if (g.size() > kMaxOpNodes) {
    user_call_error(UserCallError::TooBig, e, scope, target);
    return std::nullopt;
  }
  if (scope.inlined != nullptr) scope.inlined->emplace(std::move(key), *value);
  return value;
}

std::optional<AttrList> Builder::instantiate_row_op(const UserOp& op,
                                                    const std::vector<double>& attrs, bool report) {
  scalar::Graph g;
  std::pair<RowProgram, RowProgram> row;
  const auto value = lower_op(op, attrs, g, /*device=*/false, report, &row);
  if (!value) return std::nullopt;
  if (row.first.stages.empty()) return std::nullopt;  // not norm-like with these values
  if (!user_ops::op_graph_fits(*op.decl, g.size(), report, diags_)) return std::nullopt;
  return user_row_attrs(op.decl->name, encode_row_expression(g, row.first, row.second),
                        encode_row_stages(row.first.stages), encode_user_params(op.learned));
}

}  // namespace opfuse::ir::builder_detail
