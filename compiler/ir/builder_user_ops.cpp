// The IR builder's user-defined ops (docs/language.md, "User-defined ops"; the Builder class is
// in builder_impl.h): declaring and checking `op` definitions, lowering their expressions to a
// scalar expression (compiler/ir/scalar_expr.h) with the backward derived or given, and the ops
// of a sequence that use them. A use becomes an op of one of the two carrier kinds
// (ir::user_pointwise_def) whose attributes hold the instantiated expression, so nothing past
// the front end needs the definition (note "User-defined ops" in docs/architecture.md).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "ir/builder_impl.h"
#include "ir/pointwise_ops.h"
#include "ir/scalar_code.h"
#include "ir/user_op_support.h"

namespace opfuse::ir::builder_detail {

using user_ops::find_math;
using user_ops::input_count;
using user_ops::kMaxOpNodes;
using user_ops::plural;

bool user_ops::op_graph_fits(const dsl::OpDecl& d, size_t nodes, bool report,
                             DiagnosticEngine& diags) {
  if (nodes <= kMaxOpNodes) return true;
  if (report)
    diags.error(
        d.loc,
        fmt::format("op '{}' and its backward take more than {} operations", d.name, kMaxOpNodes),
        "split it into several ops used one after another");
  return false;
}

void Builder::op_error(const OpScope& scope, SourceLoc loc, std::string message, std::string hint) {
  if (scope.report) diags_.error(loc, std::move(message), std::move(hint));
}

void Builder::declare_op(const dsl::OpDecl& d) {
  if (find_op(d.name) != nullptr || find_math(d.name) != nullptr || find_row_reduce(d.name)) {
    diags_.error(d.loc,
                 fmt::format("op '{}' shadows the built-in {} '{}'", d.name,
                             find_op(d.name) ? "op" : "function", d.name),
                 "choose another name; built-in ops and functions cannot be redefined");
    return;
  }
  auto [it, inserted] = globals_.emplace(d.name, GlobalName{GlobalName::Kind::Op, d.loc});
  if (!inserted) {
    diags_.error(
        d.loc,
        it->second.kind == GlobalName::Kind::Op
            ? fmt::format("op '{}' is already defined", d.name)
            : fmt::format("'{}' is already defined as a {}", d.name, kind_word(it->second.kind)),
        "choose another name");
    diags_.note(it->second.loc, fmt::format("'{}' was defined here", d.name));
    return;
  }
  UserOp op;
  op.decl = &d;
  op.order = user_ops_.size();
  user_ops_.emplace(d.name, std::move(op));
}

void Builder::check_op(const dsl::OpDecl& d) {
  auto it = user_ops_.find(d.name);
  if (it == user_ops_.end() || it->second.decl != &d) return;  // a reported redefinition
  UserOp& op = it->second;
  const size_t inputs = input_count(d);
  bool ok = true;
  if (d.gated && inputs != 2) {
    diags_.error(d.loc,
                 fmt::format("gated op '{}' takes two inputs (the gate and the value halves), "
                             "not {}",
                             d.name, inputs),
                 fmt::format("write: gated op {}(a, b) = ...", d.name));
    ok = false;
  } else if (!d.gated && inputs != 1) {
    diags_.error(d.loc, fmt::format("op '{}' takes one input, not {}", d.name, inputs),
                 inputs == 2 ? "an op of two halves [gate | value] is declared `gated op`"
                             : fmt::format("write: op {}(x) = ...", d.name));
    ok = false;
  }
  std::map<std::string, SourceLoc> seen;
  for (const dsl::OpParam& p : d.params) {
    if (auto [at, inserted] = seen.emplace(p.name, p.loc); !inserted) {
      diags_.error(p.loc, fmt::format("'{}' is declared twice in op '{}'", p.name, d.name));
      ok = false;
      continue;
    }
    if (!p.is_attr) continue;
    double value = 1;  // a required attribute is checked with a stand-in value
    if (p.default_value) {
      const auto v = eval_number(*p.default_value);
      if (!v) {
        ok = false;
        continue;
      }
      value = *v;
    }
    op.attrs.push_back(AttrSpec{p.name, AttrType::Float, !p.default_value, value, -3.4e38, 3.4e38,
                                "an attribute of a user-defined op"});
    op.defaults.push_back(value);
  }
  if (!check_learned_params(d, op, seen)) ok = false;
  for (const dsl::OpLearnedParam& p : d.learned) seen.emplace(p.name, p.loc);
  if (d.has_backward) {
    const size_t want = inputs + 1;
    if (d.backward_params.size() != want) {
      diags_.error(
          d.backward_loc,
          fmt::format("the backward of '{}' takes {} (the op's input{} and the incoming "
                      "gradient), not {}",
                      d.name, plural(want, "input"), inputs == 1 ? "" : "s",
                      d.backward_params.size()),
          d.gated ? "write: backward(a, b, dy) = [d_a, d_b]" : "write: backward(x, dy) = EXPR");
      ok = false;
    } else {
      size_t i = 0;
      for (const dsl::OpParam& p : d.params) {
        if (p.is_attr) continue;
        const dsl::OpParam& b = d.backward_params[i++];
        if (b.name != p.name) {
          diags_.error(b.loc,
                       fmt::format("the backward's input {} is '{}', but the op's is '{}'", i,
                                   b.name, p.name),
                       "name the backward's inputs as the op's, then the gradient");
          ok = false;
        }
      }
      const std::string& dy = d.backward_params.back().name;
      if (seen.count(dy)) {
        diags_.error(d.backward_params.back().loc,
                     fmt::format("the gradient '{}' of the backward has the name of one of the "
                                 "op's inputs, attributes or parameters",
                                 dy),
                     "call it dy");
        ok = false;
      }
    }
    if (d.backward && ok) {
      const bool list = d.backward->kind == Expr::Kind::List;
      const size_t grads = inputs + d.learned.size();
      if (!d.learned.empty() && (!list || d.backward->operands.size() != grads)) {
        // Every gradient is given: the inputs', then each parameter's share at one element
        // (the sum over rows is the compiler's).
        std::vector<std::string> names;
        for (const dsl::OpParam& p : d.params)
          if (!p.is_attr) names.push_back("d_" + p.name);
        for (const dsl::OpLearnedParam& p : d.learned) names.push_back("d_" + p.name);
        diags_.error(
            d.backward->loc,
            fmt::format(
                "the backward of op '{}' gives {} as a list: the input{} "
                "then each parameter's, in order{}",
                d.name, plural(grads, "gradient"), inputs == 1 ? "'s" : "s'",
                list ? fmt::format(" (this list has {})", d.backward->operands.size()) : ""),
            fmt::format("write: backward({}, dy) = [{}] (a parameter's gradient is its "
                        "share at one element, d value / d {} * dy; opfuse sums it over "
                        "the rows)",
                        d.gated ? "a, b" : "x", fmt::join(names, ", "), d.learned.front().name));
        ok = false;
      } else if (!d.learned.empty()) {
        // A list of the right length: checked below as a gradient each.
      } else if (d.gated && (!list || d.backward->operands.size() != 2)) {
        diags_.error(d.backward->loc,
                     fmt::format("the backward of gated op '{}' gives the gradients of both "
                                 "halves as a list [d_gate, d_value]",
                                 d.name),
                     "write: backward(a, b, dy) = [d_a, d_b]");
        ok = false;
      } else if (!d.gated && list) {
        diags_.error(d.backward->loc,
                     fmt::format("the backward of op '{}' gives one gradient, not a list", d.name),
                     "write: backward(x, dy) = EXPR");
        ok = false;
      }
    }
  }
  if (!ok) return;
  // Lower it once in each form with the defaults: every name, call and arity error is found
  // here, at the definition, whether or not a sequence uses it.
  LoweredCall reference;
  op.valid = true;  // lower_op refuses invalid ops; a failure below clears it
  std::pair<RowProgram, RowProgram> row;
  reference.roots =
      lower_op(op, op.defaults, reference.graph, /*device=*/false, /*report=*/true, &row);
  if (!reference.roots) {
    op.valid = false;
    return;
  }
  if (!row.first.stages.empty()) {
    // Norm-like: a call from another op inlines it (Builder::inline_row_call), nothing to keep.
    op.norm_like = true;
    if (!instantiate_row_op(op, op.defaults, /*report=*/true)) op.valid = false;
    return;
  }
  // Both forms with the defaults are what later calls with the defaults reuse
  // (Builder::lower_user_call): a chain of such ops is lowered one level at a time.
  LoweredCall device;
  device.roots = lower_op(op, op.defaults, device.graph, /*device=*/true, /*report=*/false);
  lowered_calls_.emplace(std::make_tuple(&op, false, op.defaults), std::move(reference));
  lowered_calls_.emplace(std::make_tuple(&op, true, op.defaults), std::move(device));
}

bool Builder::check_learned_params(const dsl::OpDecl& d, UserOp& op,
                                   const std::map<std::string, SourceLoc>& seen) {
  bool ok = true;
  if (d.has_learned && d.learned.empty()) {
    diags_.error(d.learned_loc, fmt::format("op '{}' has an empty params(...)", d.name),
                 "declare a parameter, params(scale: fp32[] = 1.0), or leave params out");
    return false;
  }
  if (d.learned.size() > kMaxUserParams) {
    diags_.error(d.learned.at(kMaxUserParams).loc,
                 fmt::format("op '{}' has more than {} parameters", d.name, kMaxUserParams),
                 "split it into several ops used one after another");
    return false;
  }
  std::map<std::string, SourceLoc> names;
  for (const dsl::OpLearnedParam& p : d.learned) {
    if (auto it = seen.find(p.name); it != seen.end()) {
      diags_.error(p.loc,
                   fmt::format("parameter '{}' of op '{}' has the name of one of its inputs or "
                               "attributes",
                               p.name, d.name),
                   "give the parameter another name");
      diags_.note(it->second, fmt::format("'{}' is declared here", p.name));
      ok = false;
      continue;
    }
    if (auto [it, inserted] = names.emplace(p.name, p.loc); !inserted) {
      diags_.error(p.loc,
                   fmt::format("parameter '{}' is declared twice in op '{}'", p.name, d.name));
      ok = false;
      continue;
    }
    UserParam param;
    param.name = p.name;
    const auto dtype = parse_user_dtype(p.type.dtype);
    if (!dtype) {
      diags_.error(p.type.loc,
                   fmt::format("unknown element type '{}' for parameter '{}' of op '{}'",
                               p.type.dtype, p.name, d.name),
                   "parameters are bf16, fp16 or fp32: " + p.name + ": fp32[] = 1.0");
      ok = false;
    } else {
      param.dtype = *dtype;
    }
    if (p.type.dims.size() > 1) {
      diags_.error(p.type.loc,
                   fmt::format("parameter '{}' of op '{}' has {} dimensions; a parameter is a "
                               "scalar or one value per feature",
                               p.name, d.name, p.type.dims.size()),
                   fmt::format("write {0}: {1}[] = ... (a scalar) or {0}: {1}[features] = ... "
                               "(one per feature of the last dimension)",
                               p.name, p.type.dtype));
      ok = false;
    } else if (p.type.dims.size() == 1) {
      const Expr& dim = *p.type.dims.front();
      if (dim.kind == Expr::Kind::Name && !consts_.count(dim.text)) {
        diags_.error(dim.loc,
                     fmt::format("the size of parameter '{}' of op '{}' is '{}', which is not a "
                                 "constant",
                                 p.name, d.name, dim.text),
                     "a per-feature parameter has a known size, the features of the last "
                     "dimension: an integer or a constant (symbols such as tokens vary)");
        ok = false;
      } else if (const auto size = eval_int(dim)) {
        if (*size < 1 || *size > (int64_t(1) << 40)) {
          diags_.error(dim.loc,
                       fmt::format("parameter '{}' of op '{}' has size {}; it must be from 1 to "
                                   "2^40",
                                   p.name, d.name, *size),
                       fmt::format("write {}: {}[] = ... for a scalar", p.name, p.type.dtype));
          ok = false;
        } else {
          param.size = *size;
        }
      } else {
        ok = false;
      }
    }
    if (p.init && (p.init->kind == Expr::Kind::Bool || p.init->kind == Expr::Kind::String ||
                   p.init->kind == Expr::Kind::List)) {
      diags_.error(
          p.init->loc,
          fmt::format("the start value of parameter '{}' of op '{}' is not a number", p.name,
                      d.name),
          fmt::format("every element starts at a number: {}: {}[...] = 1.0", p.name, p.type.dtype));
      ok = false;
    } else if (p.init) {
      if (const auto init = eval_number(*p.init))
        param.init = *init;
      else
        ok = false;
    }
    op.learned.push_back(std::move(param));
  }
  return ok;
}

std::optional<std::vector<scalar::NodeId>> Builder::lower_op(
    const UserOp& op, const std::vector<double>& attrs, scalar::Graph& g, bool device, bool report,
    std::pair<RowProgram, RowProgram>* row) {
  if (!op.valid) return std::nullopt;
  const dsl::OpDecl& d = *op.decl;
  OpScope scope;
  scope.op = &op;
  scope.device = device;
  scope.report = report;
  // A plain op may reduce over the last dimension; its row scalars follow x, dy, the learned
  // parameters and the row's length (ir::RowVars).
  std::vector<RowStage> stages;
  scope.stages = d.gated ? nullptr : &stages;
  scope.reduction_base = RowVars{int(d.learned.size())}.scalar(0);
  scope.reductions = d.gated ? Reductions::InGatedOp : Reductions::Allowed;
  std::map<OpScope::InlineKey, scalar::NodeId> inlined;
  scope.inlined = &inlined;
  std::vector<scalar::NodeId> vars;
  size_t a = 0;
  for (const dsl::OpParam& p : d.params) {
    if (p.is_attr) {
      scope.attrs[p.name] = attrs.at(a++);
    } else {
      const auto v = g.var(int(vars.size()));
      vars.push_back(v);
      scope.inputs[p.name] = v;
    }
  }
  // Learned parameters after the inputs and dy: var(inputs + 1 + j).
  std::vector<scalar::NodeId> learned;
  for (size_t j = 0; j < d.learned.size(); ++j) {
    learned.push_back(g.var(int(vars.size() + 1 + j)));
    scope.inputs[d.learned[j].name] = learned.back();
  }
  const auto value = lower(*d.body, g, scope);
  if (!value) return std::nullopt;
  const scalar::NodeId dy = g.var(int(vars.size()));
  std::vector<scalar::NodeId> roots = {*value};
  if (!stages.empty()) {
    // Norm-like: the backward is derived through the reductions (ir::derive_row_backward).
    if (d.has_backward) {
      if (report)
        diags_.error(d.backward_loc,
                     fmt::format("op '{}' reduces over the last dimension; a given backward is "
                                 "not supported for such an op",
                                 d.name),
                     "leave the backward out: its gradient is derived through the reductions");
      return std::nullopt;
    }
    if (scope.non_differentiable) {
      if (report)
        diags_.error(*scope.non_differentiable,
                     fmt::format("op '{}' cannot be differentiated: this comparison is used as a "
                                 "number",
                                 d.name),
                     "use select(condition, a, b)");
      return std::nullopt;
    }
    if (row == nullptr) return std::nullopt;  // callers of norm-like ops inline them instead
    row->first.stages = std::move(stages);
    row->first.outputs = {*value};
    row->second = derive_row_backward(g, row->first, int(d.learned.size()));
    return roots;
  }
  if (d.has_backward) {
    OpScope back = scope;
    back.non_differentiable.reset();
    back.inputs.clear();
    back.stages = nullptr;
    back.reductions = Reductions::InBackward;
    for (size_t i = 0; i < vars.size(); ++i) back.inputs[d.backward_params[i].name] = vars[i];
    for (size_t j = 0; j < learned.size(); ++j) back.inputs[d.learned[j].name] = learned[j];
    back.inputs[d.backward_params.back().name] = dy;
    if (d.backward->kind == Expr::Kind::List) {
      for (const auto& e : d.backward->operands) {
        const auto grad = lower(*e, g, back);
        if (!grad) return std::nullopt;
        roots.push_back(*grad);
      }
    } else {
      const auto grad = lower(*d.backward, g, back);
      if (!grad) return std::nullopt;
      roots.push_back(*grad);
    }
    return roots;
  }
  if (scope.non_differentiable) {
    if (report)
      diags_.error(*scope.non_differentiable,
                   fmt::format("op '{}' cannot be differentiated: this comparison is used as a "
                               "number",
                               d.name),
                   fmt::format("use select(condition, a, b), or give the gradient yourself: "
                               "backward({}, dy) = ...",
                               d.gated ? "a, b" : "x"));
    return std::nullopt;
  }
  // d value / d input * dy per input, then d value / d parameter * dy per learned parameter.
  for (size_t i = 0; i < vars.size() + 1 + learned.size(); ++i) {
    if (i == vars.size()) continue;  // dy
    const scalar::NodeId dv = g.derivative(*value, int(i));
    roots.push_back(g.is_constant(dv, 0) ? dv : g.is_constant(dv, 1) ? dy : g.mul(dv, dy));
  }
  return roots;
}

std::optional<std::string> Builder::instantiate_op(const UserOp& op,
                                                   const std::vector<double>& attrs, bool report) {
  scalar::Graph g;
  const auto reference = lower_op(op, attrs, g, /*device=*/false, report);
  const auto device = lower_op(op, attrs, g, /*device=*/true, report);
  if (!reference || !device) return std::nullopt;
  if (!user_ops::op_graph_fits(*op.decl, g.size(), report, diags_)) return std::nullopt;
  std::vector<scalar::NodeId> roots = *reference;
  roots.insert(roots.end(), device->begin(), device->end());
  return scalar::encode_roots(g, roots);
}

std::optional<ValueId> Builder::build_user_op(SequenceScope& sc, const dsl::OpStmt& stmt,
                                              const UserOp& op, ValueId cur,
                                              const std::string& instance) {
  if (!op.valid) return std::nullopt;  // reported at the definition
  std::vector<const Expr*> args;
  std::vector<std::string> names;
  std::vector<SourceLoc> name_locs;
  for (const dsl::Arg& a : stmt.args) {
    if (!a.value) return std::nullopt;
    if (!a.name && !names.empty() && !names.back().empty()) {
      diags_.error(a.value->loc, "a positional argument cannot follow a named one",
                   "write positional arguments first");
      return std::nullopt;
    }
    args.push_back(a.value.get());
    names.push_back(a.name.value_or(std::string()));
    name_locs.push_back(a.name_loc);
  }
  const auto values = bind_op_attrs(op, args, names, name_locs, stmt.loc, nullptr);
  if (!values) return std::nullopt;
  Sequence& s = sc.seq;
  if (!op.learned.empty() && s.parallel.active()) {
    // Per-feature parameters would need a shard per rank of the features they follow.
    diags_.error(stmt.loc,
                 fmt::format("op '{}' has learned parameters, which a tensor-parallel sequence "
                             "does not support yet",
                             op.decl->name),
                 "use it in a sequence without `with parallel(...)`, or make its parameters "
                 "attributes");
    return std::nullopt;
  }
  if (op.norm_like) {
    auto attrs = instantiate_row_op(op, *values, /*report=*/true);
    if (!attrs) return std::nullopt;
    return add_builder_op(sc, OpKind::UserNorm, std::move(*attrs), cur, instance, stmt.loc);
  }
  const auto text = instantiate_op(op, *values, /*report=*/true);
  if (!text) return std::nullopt;
  const PointwiseDef& carrier = user_pointwise_def(op.decl->gated);
  const auto result = add_builder_op(
      sc, pointwise_kind(carrier),
      user_pointwise_attrs(op.decl->name, *text, /*parts=*/{}, encode_user_params(op.learned)), cur,
      instance, stmt.loc);
  if (result && op.decl->gated && s.parallel.active() &&
      sc.layouts.at(cur) == Layout::SplitFeatures) {
    cut_gated_producer(s, cur);  // as for a built-in gated activation (Builder::build_op)
  }
  return result;
}

}  // namespace opfuse::ir::builder_detail
