// The IR builder's user-defined ops, their expressions (docs/language.md, "User-defined ops"):
// constant folding of attribute values, and lowering an op's expression to a scalar expression
// (compiler/ir/scalar_expr.h), calls of math functions, built-in activations and earlier ops
// included. Split from builder_user_ops.cpp, which declares, checks and uses the ops.

#include <fmt/format.h>

#include <cmath>

#include "ir/builder_impl.h"
#include "ir/pointwise_ops.h"
#include "ir/scalar_code.h"
#include "ir/user_op_support.h"

namespace opfuse::ir::builder_detail {

using user_ops::find_math;
using user_ops::input_count;
using user_ops::kMathFunctions;
using user_ops::kMaxOpCallDepth;
using user_ops::kMaxOpNodes;
using user_ops::MathFunction;
using user_ops::plural;

namespace {

// Integer powers up to this are products (x ^ 2 is x * x, exact and cheap); others use pow.
constexpr double kMaxProductPower = 16;

// `a OP b ? then : otherwise` for a comparison operator as written, in the graph's three
// comparisons (< swaps the operands of >, != the branches of ==).
scalar::NodeId select_by(scalar::Graph& g, const std::string& op, scalar::NodeId a,
                         scalar::NodeId b, scalar::NodeId then, scalar::NodeId otherwise) {
  if (op == ">") return g.select(scalar::Cmp::Gt, a, b, then, otherwise);
  if (op == ">=") return g.select(scalar::Cmp::Ge, a, b, then, otherwise);
  if (op == "<=") return g.select(scalar::Cmp::Le, a, b, then, otherwise);
  if (op == "<") return g.select(scalar::Cmp::Gt, b, a, then, otherwise);
  if (op == "==") return g.select(scalar::Cmp::Eq, a, b, then, otherwise);
  return g.select(scalar::Cmp::Eq, a, b, otherwise, then);  // !=
}

std::string usage_of(const dsl::OpDecl& d) {
  std::string out = fmt::format("usage: {}(", d.name);
  for (size_t i = 0; i < d.params.size(); ++i) {
    out += i ? ", " : "";
    out += d.params[i].name;
    if (d.params[i].is_attr && d.params[i].default_value) out += " = ...";
  }
  return out + ")";
}

}  // namespace

std::optional<double> Builder::op_constant(const Expr& e, const OpScope& scope) const {
  switch (e.kind) {
    case Expr::Kind::Int:
      return double(e.int_value);
    case Expr::Kind::Float:
      return e.float_value;
    case Expr::Kind::Name: {
      if (auto it = scope.attrs.find(e.text); it != scope.attrs.end()) return it->second;
      if (scope.inputs.count(e.text)) return std::nullopt;
      if (auto it = consts_.find(e.text); it != consts_.end()) {
        if (const auto* i = std::get_if<int64_t>(&it->second)) return double(*i);
        if (const auto* v = std::get_if<double>(&it->second)) return *v;
      }
      return std::nullopt;
    }
    case Expr::Kind::Unary: {
      const auto v = op_constant(*e.operands.at(0), scope);
      if (!v) return std::nullopt;
      return -*v;
    }
    case Expr::Kind::Binary: {
      const auto a = op_constant(*e.operands.at(0), scope);
      const auto b = op_constant(*e.operands.at(1), scope);
      if (!a || !b) return std::nullopt;
      switch (e.op) {
        case '+':
          return *a + *b;
        case '-':
          return *a - *b;
        case '*':
          return *a * *b;
        case '/':
          return *a / *b;
        case '^':
          return std::pow(*a, *b);
        default:
          return std::nullopt;
      }
    }
    default:
      return std::nullopt;
  }
}

// Errors of op expressions, out of line: lower() recurses once per level of an expression (and
// through calls of other ops), so its frame stays small (no strings of its own); the messages
// are built here.
void Builder::op_expression_error(const Expr& e, const OpScope& scope) {
  const std::string& op_name = scope.op->decl->name;
  switch (e.kind) {
    case Expr::Kind::Name: {
      std::vector<std::string> names;
      for (const auto& [n, _] : scope.inputs) names.push_back(n);
      for (const auto& [n, _] : scope.attrs) names.push_back(n);
      for (const auto& [n, _] : consts_) names.push_back(n);
      std::string hint = did_you_mean(e.text, names);
      if (hint.empty() && (find_op(e.text) || user_ops_.count(e.text) || find_math(e.text) ||
                           find_row_reduce(e.text)))
        hint = fmt::format("'{}' is a function: call it, {}(x)", e.text, e.text);
      if (hint.empty())
        hint = fmt::format(
            "the names in op '{}' are its inputs and attributes and the program's "
            "constants",
            op_name);
      op_error(scope, e.loc, fmt::format("unknown name '{}' in op '{}'", e.text, op_name), hint);
      return;
    }
    case Expr::Kind::Binary:  // only '%' is not an operator of op expressions
      op_error(scope, e.loc,
               fmt::format("'%' is not defined in the expression of op '{}'", op_name));
      return;
    default:
      op_error(
          scope, e.loc,
          fmt::format("the expression of op '{}' computes one number: a {} is not allowed "
                      "here",
                      op_name,
                      e.kind == Expr::Kind::Bool     ? "bool"
                      : e.kind == Expr::Kind::String ? "string"
                                                     : "list"),
          e.kind == Expr::Kind::Bool ? "a condition is a comparison: select(x > 0, a, b)" : "");
      return;
  }
}

std::optional<scalar::NodeId> Builder::lower(const Expr& e, scalar::Graph& g, OpScope& scope) {
  switch (e.kind) {
    case Expr::Kind::Int:
      return g.constant(double(e.int_value));
    case Expr::Kind::Float:
      return g.constant(e.float_value);
    case Expr::Kind::Bool:
    case Expr::Kind::String:
    case Expr::Kind::List:
      op_expression_error(e, scope);
      return std::nullopt;
    case Expr::Kind::Name: {
      if (auto it = scope.inputs.find(e.text); it != scope.inputs.end()) return it->second;
      if (auto c = op_constant(e, scope)) return g.constant(*c);
      op_expression_error(e, scope);
      return std::nullopt;
    }
    case Expr::Kind::Unary: {
      const auto a = lower(*e.operands.at(0), g, scope);
      if (!a) return std::nullopt;
      return g.neg(*a);
    }
    case Expr::Kind::Binary:
      return lower_binary(e, g, scope);
    case Expr::Kind::Compare:
      return lower_compare(e, g, scope);
    case Expr::Kind::Call:
      return lower_call(e, g, scope);
  }
  return std::nullopt;
}

std::optional<scalar::NodeId> Builder::lower_binary(const Expr& e, scalar::Graph& g,
                                                    OpScope& scope) {
  if (e.op == '%') {
    op_expression_error(e, scope);
    return std::nullopt;
  }
  const auto a = lower(*e.operands.at(0), g, scope);
  if (!a) return std::nullopt;
  if (e.op == '^') {
    const auto k = op_constant(*e.operands.at(1), scope);
    if (k && *k == std::floor(*k) && std::abs(*k) <= kMaxProductPower) {
      // Integer powers as products: exact for the CPU reference and cheap on the device.
      scalar::NodeId p = g.constant(1);
      const int n = int(std::abs(*k));
      for (int i = 0; i < n; ++i) p = i == 0 ? *a : g.mul(p, *a);
      return *k < 0 ? g.div(g.constant(1), p) : p;
    }
  }
  const auto b = lower(*e.operands.at(1), g, scope);
  if (!b) return std::nullopt;
  switch (e.op) {
    case '+':
      return g.add(*a, *b);
    case '-':
      return g.sub(*a, *b);
    case '*':
      return g.mul(*a, *b);
    case '/':
      return g.div(*a, *b);
    case '^':
      return g.pow(*a, *b);
    default:
      return std::nullopt;
  }
}

std::optional<scalar::NodeId> Builder::lower_compare(const Expr& e, scalar::Graph& g,
                                                     OpScope& scope) {
  // A comparison used as a number is 1 or 0: its derivative is zero almost everywhere but it has
  // none at the step, so the op needs a backward of its own.
  if (!scope.non_differentiable) scope.non_differentiable = e.loc;
  const auto a = lower(*e.operands.at(0), g, scope);
  const auto b = lower(*e.operands.at(1), g, scope);
  if (!a || !b) return std::nullopt;
  return select_by(g, e.text, *a, *b, g.constant(1), g.constant(0));
}

std::optional<std::vector<double>> Builder::bind_op_attrs(
    const UserOp& op, const std::vector<const Expr*>& args, const std::vector<std::string>& names,
    const std::vector<SourceLoc>& name_locs, SourceLoc call_loc, const OpScope* scope) {
  const dsl::OpDecl& d = *op.decl;
  const bool report = scope == nullptr || scope->report;
  auto error = [&](SourceLoc loc, std::string message, std::string hint = {}) {
    if (report) diags_.error(loc, std::move(message), std::move(hint));
  };
  std::vector<const Expr*> bound(op.attrs.size(), nullptr);
  size_t positional = 0;
  bool ok = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (names[i].empty()) {
      if (positional >= op.attrs.size()) {
        error(args[i]->loc,
              fmt::format("'{}' takes {} and {}, got more arguments", d.name,
                          plural(input_count(d), "input"), plural(op.attrs.size(), "attribute")),
              usage_of(d));
        return std::nullopt;
      }
      bound[positional++] = args[i];
      continue;
    }
    size_t index = op.attrs.size();
    for (size_t k = 0; k < op.attrs.size(); ++k)
      if (op.attrs[k].name == names[i]) index = k;
    if (index == op.attrs.size()) {
      std::vector<std::string> known;
      for (const AttrSpec& s : op.attrs) known.emplace_back(s.name);
      std::string hint = did_you_mean(names[i], known);
      error(name_locs[i], fmt::format("'{}' has no attribute '{}'", d.name, names[i]),
            hint.empty() ? usage_of(d) : hint);
      ok = false;
      continue;
    }
    if (bound[index]) {
      error(name_locs[i], fmt::format("attribute '{}' of '{}' is given twice", names[i], d.name));
      ok = false;
      continue;
    }
    bound[index] = args[i];
  }
  if (!ok) return std::nullopt;
  std::vector<double> values;
  for (size_t k = 0; k < op.attrs.size(); ++k) {
    if (!bound[k]) {
      if (op.attrs[k].required) {
        error(call_loc,
              fmt::format("'{}' needs the attribute '{}', which has no default", d.name,
                          op.attrs[k].name),
              usage_of(d));
        ok = false;
      }
      values.push_back(op.defaults[k]);
      continue;
    }
    std::optional<double> v;
    if (scope != nullptr) {
      v = op_constant(*bound[k], *scope);
      if (!v)
        error(bound[k]->loc,
              fmt::format("attribute '{}' of '{}' must be a constant (numbers, attributes and "
                          "constants), not a value of the tensor",
                          op.attrs[k].name, d.name));
    } else {
      v = eval_number(*bound[k]);
    }
    if (!v) {
      ok = false;
      continue;
    }
    values.push_back(*v);
  }
  if (!ok) return std::nullopt;
  return values;
}

// A math function's call is well formed: positional arguments, as many as it takes, and a
// comparison first in select. Out of line, as op_expression_error.
bool Builder::math_call_ok(const Expr& e, const MathFunction& f, const OpScope& scope) {
  const std::string& callee = e.text;
  for (size_t i = 0; i < e.arg_names.size(); ++i) {
    if (!e.arg_names[i].empty()) {
      op_error(scope, e.arg_name_locs[i], fmt::format("'{}' takes no named arguments", callee));
      return false;
    }
  }
  const size_t given = e.operands.size();
  if (given != size_t(f.args)) {
    op_error(
        scope, e.loc,
        fmt::format("'{}' takes {}, got {}", callee, plural(size_t(f.args), "argument"), given));
    return false;
  }
  if (callee == "select" && e.operands[0]->kind != Expr::Kind::Compare) {
    op_error(scope, e.operands[0]->loc, "the first argument of select is a comparison",
             "write: select(x > 0, x, 0)");
    return false;
  }
  return true;
}

std::optional<scalar::NodeId> Builder::lower_call(const Expr& e, scalar::Graph& g, OpScope& scope) {
  if (const auto reduce = find_row_reduce(e.text)) return lower_reduction(e, *reduce, g, scope);
  if (const MathFunction* f = find_math(e.text)) return lower_math_call(e, *f, g, scope);
  if (const PointwiseDef* def = find_pointwise(e.text))
    return lower_builtin_call(e, *def, g, scope);
  return lower_user_call(e, g, scope);
}

std::optional<scalar::NodeId> Builder::lower_math_call(const Expr& e, const MathFunction& f,
                                                       scalar::Graph& g, OpScope& scope) {
  if (!math_call_ok(e, f, scope)) return std::nullopt;
  const std::string& callee = e.text;
  // Arguments are lowered where their kind is known: a select's condition is not a number.
  if (callee == "select") {
    const Expr& cond = *e.operands[0];
    const auto a = lower(*cond.operands.at(0), g, scope);
    const auto b = lower(*cond.operands.at(1), g, scope);
    const auto then = lower(*e.operands[1], g, scope);
    const auto otherwise = lower(*e.operands[2], g, scope);
    if (!a || !b || !then || !otherwise) return std::nullopt;
    return select_by(g, cond.text, *a, *b, *then, *otherwise);
  }
  const auto x = lower(*e.operands[0], g, scope);
  if (!x) return std::nullopt;
  if (f.args == 2) {
    const auto y = lower(*e.operands[1], g, scope);
    if (!y) return std::nullopt;
    return callee == "min" ? g.min(*x, *y) : g.max(*x, *y);
  }
  if (callee == "exp") return g.exp(*x);
  if (callee == "log") return g.log(*x);
  if (callee == "sqrt") return g.sqrt(*x);
  if (callee == "rsqrt") return g.rsqrt(*x);
  if (callee == "tanh") return g.tanh(*x);
  if (callee == "sigmoid") return g.sigmoid(*x);
  if (callee == "erf") return g.erf(*x);
  return g.abs(*x);
}

bool Builder::split_call_args(const Expr& e, size_t inputs, scalar::Graph& g, OpScope& scope,
                              CallArgs& out) {
  // Inputs come first, positionally; the rest are attributes.
  const std::string& callee = e.text;
  const size_t given = e.operands.size();
  if (given < inputs) {
    op_error(scope, e.loc,
             fmt::format("'{}' takes {}, got {} argument{}", callee, plural(inputs, "input"), given,
                         given == 1 ? "" : "s"));
    return false;
  }
  for (size_t i = 0; i < given; ++i) {
    const std::string name = i < e.arg_names.size() ? e.arg_names[i] : std::string();
    if (i < inputs) {
      if (!name.empty()) {
        op_error(scope, e.arg_name_locs[i],
                 fmt::format("the input{} of '{}' come{} first, unnamed", inputs == 1 ? "" : "s",
                             callee, inputs == 1 ? "s" : ""));
        return false;
      }
      const auto v = lower(*e.operands[i], g, scope);
      if (!v) return false;
      out.in.push_back(*v);
    } else {
      out.rest.push_back(e.operands[i].get());
      out.names.push_back(name);
      out.name_locs.push_back(i < e.arg_name_locs.size() ? e.arg_name_locs[i] : SourceLoc{});
    }
  }
  return true;
}

std::optional<scalar::NodeId> Builder::lower_builtin_call(const Expr& e, const PointwiseDef& def,
                                                          scalar::Graph& g, OpScope& scope) {
  const std::string& callee = e.text;
  CallArgs args;
  if (!split_call_args(e, def.gated ? 2 : 1, g, scope, args)) return std::nullopt;
  // The built-in's attributes, bound like a user op's (numbers, in order or by name).
  UserOp shim;
  dsl::OpDecl shim_decl;
  shim_decl.name = callee;
  for (const AttrSpec& spec : def.attrs) {
    shim.attrs.push_back(spec);
    shim.defaults.push_back(spec.default_value);
    shim_decl.params.push_back({std::string(spec.name), {}, true, nullptr});
  }
  shim.decl = &shim_decl;
  const auto values = bind_op_attrs(shim, args.rest, args.names, args.name_locs, e.loc, &scope);
  if (!values) return std::nullopt;
  AttrList attrs;
  for (size_t i = 0; i < def.attrs.size(); ++i) {
    const AttrSpec& spec = def.attrs[i];
    const double v = (*values)[i];
    if (v < spec.min || v > spec.max) {
      op_error(scope, args.rest.empty() ? e.loc : e.operands.at(e.operands.size() - 1)->loc,
               fmt::format("{} = {} is out of range for '{}'", spec.name, v, callee),
               fmt::format("{} must be between {} and {}", spec.name, spec.min, spec.max));
      return std::nullopt;
    }
    if (spec.type == AttrType::Int)
      attrs.push_back({std::string(spec.name), int64_t(v)});
    else if (spec.type == AttrType::Bool)
      attrs.push_back({std::string(spec.name), v != 0});
    else
      attrs.push_back({std::string(spec.name), v});
  }
  return def.build(PointwiseBuilder{g, args.in, attrs, scope.device});
}

void Builder::unknown_function(const Expr& e, const OpScope& scope) {
  const std::string& callee = e.text;
  std::vector<std::string> names;
  for (const MathFunction& f : kMathFunctions) names.emplace_back(f.name);
  for (const RowReduce r : {RowReduce::Sum, RowReduce::Mean, RowReduce::Max})
    names.emplace_back(row_reduce_name(r));
  for (const PointwiseDef* d : pointwise_defs()) names.emplace_back(d->name);
  for (const auto& [n, _] : user_ops_) names.push_back(n);
  std::string hint = did_you_mean(callee, names);
  if (hint.empty() && find_op(callee))
    hint = fmt::format("'{}' is not pointwise: it belongs in a sequence body", callee);
  if (hint.empty())
    hint =
        "op expressions call exp, log, sqrt, rsqrt, tanh, sigmoid, erf, abs, min, max, "
        "select, sum_last, mean_last, max_last, the built-in activations and earlier ops";
  op_error(scope, e.loc,
           fmt::format("unknown function '{}' in op '{}'", callee, scope.op->decl->name), hint);
}

void Builder::user_call_error(UserCallError which, const Expr& e, const OpScope& scope,
                              const UserOp& target) {
  const std::string& op_name = scope.op->decl->name;
  const std::string& callee = e.text;
  switch (which) {
    case UserCallError::CallsItself:
      op_error(scope, e.loc, fmt::format("op '{}' calls itself; ops cannot be recursive", op_name),
               "write the expression out, or define a helper op before it");
      return;
    case UserCallError::CallsLater:
      op_error(scope, e.loc,
               fmt::format("op '{}' calls '{}', which is defined after it", op_name, callee),
               fmt::format("define '{}' first (ops call only earlier ops, so no op is recursive)",
                           callee));
      if (scope.report) diags_.note(target.decl->loc, fmt::format("'{}' is defined here", callee));
      return;
    case UserCallError::TooDeep:
      op_error(scope, e.loc,
               fmt::format("op '{}' nests calls of ops more than {} deep through '{}'", op_name,
                           kMaxOpCallDepth, callee),
               "call the ops one after another in the sequence, or give the inner calls their "
               "attributes' defaults (such calls are lowered once)");
      return;
    case UserCallError::HasParameters:
      op_error(scope, e.loc,
               fmt::format("op '{}' calls '{}', which has learned parameters", op_name, callee),
               fmt::format("use '{}' in a sequence, or declare its parameters in '{}'", callee,
                           op_name));
      return;
    case UserCallError::TooBig:
      op_error(scope, e.loc,
               fmt::format("op '{}' grows past {} operations with this call of '{}'", op_name,
                           kMaxOpNodes, callee),
               "split the op, or call the ops in sequence instead of inside one another");
      return;
  }
}

std::optional<scalar::NodeId> Builder::lower_user_call(const Expr& e, scalar::Graph& g,
                                                       OpScope& scope) {
  auto it = user_ops_.find(e.text);
  if (it == user_ops_.end()) {
    unknown_function(e, scope);
    return std::nullopt;
  }
  const UserOp& target = it->second;
  if (&target == scope.op) {
    user_call_error(UserCallError::CallsItself, e, scope, target);
    return std::nullopt;
  }
  if (target.order > scope.op->order) {
    user_call_error(UserCallError::CallsLater, e, scope, target);
    return std::nullopt;
  }
  if (!target.valid) return std::nullopt;  // its own errors are reported at its definition
  if (!target.learned.empty()) {
    // Its parameters belong to a layer of a sequence; a call has no layer to own them.
    user_call_error(UserCallError::HasParameters, e, scope, target);
    return std::nullopt;
  }
  CallArgs args;
  if (!split_call_args(e, input_count(*target.decl), g, scope, args)) return std::nullopt;
  const std::vector<scalar::NodeId>& in = args.in;
  const auto values = bind_op_attrs(target, args.rest, args.names, args.name_locs, e.loc, &scope);
  if (!values) return std::nullopt;
  if (target.norm_like) return inline_row_call(e, target, in, *values, g, scope);
  // Each op lowered inside another is a level of recursion here: bounded, so that no program
  // overflows the compiler's stack, and reported at the outermost call.
  if (op_call_depth_ >= kMaxOpCallDepth) {
    op_call_too_deep_ = true;
    return std::nullopt;
  }
  struct Level {
    size_t& depth;
    explicit Level(size_t& d) : depth(d) { ++depth; }
    ~Level() { --depth; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;
  };
  const auto too_deep = [&]() {
    if (!op_call_too_deep_) return false;
    if (op_call_depth_ == 0) {
      op_call_too_deep_ = false;
      user_call_error(UserCallError::TooDeep, e, scope, target);
    }
    return true;
  };
  // The callee in this graph, its inputs replaced by the arguments. Its own backward, if given,
  // becomes the derivative hints of its value (dy = 1: a gradient is linear in dy). Lowered once
  // per attribute values and form: a chain of ops each calling the last twice stays linear.
  auto key = std::make_tuple(&target, scope.device, *values);
  auto cached = lowered_calls_.find(key);
  if (cached == lowered_calls_.end()) {
    LoweredCall call;
    {
      const Level level(op_call_depth_);
      call.roots = lower_op(target, *values, call.graph, scope.device, /*report=*/false);
    }
    if (too_deep()) return std::nullopt;
    cached = lowered_calls_.emplace(std::move(key), std::move(call)).first;
  }
  const scalar::Graph& callee_graph = cached->second.graph;
  const auto& roots = cached->second.roots;
  if (g.size() + callee_graph.size() > kMaxOpNodes) {
    user_call_error(UserCallError::TooBig, e, scope, target);
    return std::nullopt;
  }
  if (!roots) {
    // Only a comparison used as a number fails here (the definition reported it): the caller
    // cannot be differentiated through it either.
    if (!scope.non_differentiable) scope.non_differentiable = e.loc;
    const auto value_only = [&]() -> std::optional<scalar::NodeId> {
      OpScope inner;
      inner.op = &target;
      inner.device = scope.device;
      inner.report = false;
      size_t a = 0, i = 0;
      for (const dsl::OpParam& p : target.decl->params) {
        if (p.is_attr)
          inner.attrs[p.name] = (*values)[a++];
        else
          inner.inputs[p.name] = in[i++];
      }
      const Level level(op_call_depth_);
      return lower(*target.decl->body, g, inner);
    }();
    if (too_deep()) return std::nullopt;
    return value_only;
  }
  // dy = 1: each gradient root becomes d value / d input, the derivative hint of the copy (so a
  // given backward, or a built-in's own derivative form, survives the copy).
  std::vector<scalar::NodeId> vars = in;
  vars.push_back(g.constant(1));
  const std::vector<scalar::NodeId> copied = g.copy_from(callee_graph, *roots, vars);
  const scalar::NodeId value = copied.front();
  // A hint needs its argument below the value (ids grow with construction; an op that returns
  // its input, or ignores it, is differentiated through its expression instead), and the two
  // halves of a gated op given one argument twice add up.
  bool hints = true;
  for (const scalar::NodeId u : in) hints = hints && u < value;
  if (hints && in.size() == 2 && in[0] == in[1]) {
    g.hint_derivative(value, in[0], g.add(copied[1], copied[2]));
  } else if (hints) {
    for (size_t i = 0; i < in.size(); ++i) g.hint_derivative(value, in[i], copied[i + 1]);
  }
  return value;
}

}  // namespace opfuse::ir::builder_detail
