#include "ir/scalar_expr.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "support/assert.h"

namespace opfuse::ir::scalar {

namespace {

std::string float_literal(double value) {
  // The float the CPU reference uses (T(value) with T = float), spelled so it reads back exactly.
  std::string s = fmt::format("{}", static_cast<float>(value));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

std::string_view cmp_spelling(Cmp c) {
  switch (c) {
    case Cmp::Gt:
      return ">";
    case Cmp::Ge:
      return ">=";
    case Cmp::Le:
      return "<=";
    case Cmp::Eq:
      return "==";
  }
  return "?";
}

template <typename T>
bool compare(Cmp c, T a, T b) {
  switch (c) {
    case Cmp::Gt:
      return a > b;
    case Cmp::Ge:
      return a >= b;
    case Cmp::Le:
      return a <= b;
    case Cmp::Eq:
      return a == b;
  }
  return false;
}

}  // namespace

size_t Graph::Hash::operator()(const Node& n) const {
  const double v = n.value == 0 ? 0.0 : n.value;  // +0 and -0 compare equal: hash them alike
  uint64_t h = std::bit_cast<uint64_t>(v);
  for (uint64_t x : {uint64_t(n.op), uint64_t(n.cmp), uint64_t(n.var), uint64_t(n.a), uint64_t(n.b),
                     uint64_t(n.c), uint64_t(n.d)})
    h = (h ^ x) * 0x100000001b3ull + (h >> 29);
  return size_t(h);
}

NodeId Graph::intern(const Node& n) {
  auto it = index_.find(n);
  if (it != index_.end()) return it->second;
  const NodeId id = NodeId(nodes_.size());
  nodes_.push_back(n);
  index_.emplace(n, id);
  return id;
}

NodeId Graph::constant(double value) { return intern({Op::Const, Cmp::Gt, value, 0, 0, 0, 0, 0}); }
NodeId Graph::var(int index) { return intern({Op::Var, Cmp::Gt, 0, index, 0, 0, 0, 0}); }
NodeId Graph::add(NodeId a, NodeId b) { return intern({Op::Add, Cmp::Gt, 0, 0, a, b, 0, 0}); }
NodeId Graph::sub(NodeId a, NodeId b) { return intern({Op::Sub, Cmp::Gt, 0, 0, a, b, 0, 0}); }
NodeId Graph::mul(NodeId a, NodeId b) { return intern({Op::Mul, Cmp::Gt, 0, 0, a, b, 0, 0}); }
NodeId Graph::div(NodeId a, NodeId b) { return intern({Op::Div, Cmp::Gt, 0, 0, a, b, 0, 0}); }
NodeId Graph::neg(NodeId a) { return intern({Op::Neg, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::exp(NodeId a) { return intern({Op::Exp, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::tanh(NodeId a) { return intern({Op::Tanh, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::sigmoid(NodeId a) { return intern({Op::Sigmoid, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::select(Cmp cmp, NodeId a, NodeId b, NodeId then, NodeId otherwise) {
  return intern({Op::Select, cmp, 0, 0, a, b, then, otherwise});
}

NodeId Graph::log(NodeId a) { return intern({Op::Log, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::sqrt(NodeId a) { return intern({Op::Sqrt, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::rsqrt(NodeId a) { return intern({Op::Rsqrt, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::abs(NodeId a) { return intern({Op::Abs, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::erf(NodeId a) { return intern({Op::Erf, Cmp::Gt, 0, 0, a, 0, 0, 0}); }
NodeId Graph::pow(NodeId a, NodeId b) { return intern({Op::Pow, Cmp::Gt, 0, 0, a, b, 0, 0}); }

std::vector<NodeId> Graph::copy_from(const Graph& other, std::span<const NodeId> roots,
                                     std::span<const NodeId> vars) {
  std::vector<NodeId> map(other.size(), 0);
  for (const NodeId id : other.schedule(roots)) {
    Node n = other.node(id);
    if (n.op == Op::Var) {
      map[id] = size_t(n.var) < vars.size() ? vars[size_t(n.var)] : var(n.var);
      continue;
    }
    // Children precede parents in a schedule, so their new ids are known; operand fields an op
    // does not use stay 0, as the constructors above make them.
    const bool binary = n.op == Op::Add || n.op == Op::Sub || n.op == Op::Mul || n.op == Op::Div ||
                        n.op == Op::Pow || n.op == Op::Select;
    if (n.op != Op::Const) {
      n.a = map[n.a];
      n.b = binary ? map[n.b] : 0;
      if (n.op == Op::Select) {
        n.c = map[n.c];
        n.d = map[n.d];
      }
    }
    map[id] = intern(n);
  }
  std::vector<NodeId> out;
  out.reserve(roots.size());
  for (const NodeId r : roots) out.push_back(map[r]);
  return out;
}

bool Graph::is_constant(NodeId id, double value) const {
  return nodes_.at(id).op == Op::Const && nodes_.at(id).value == value;
}

void Graph::hint_derivative(NodeId f, NodeId u, NodeId derivative) {
  // A node built twice (hash-consed: gelu(x) in two places) is hinted twice: keep one.
  for (const auto& [key, _] : hints_)
    if (key.f == f && key.u == u) return;
  hints_.push_back({{f, u}, derivative});
}

NodeId Graph::derivative(NodeId root, int index) {
  const uint64_t key = (uint64_t(root) << 8) | uint64_t(index);
  if (auto it = derivative_memo_.find(key); it != derivative_memo_.end()) return it->second;
  // Folding helpers: only derived terms are folded, a definition's own expressions never are.
  const NodeId zero = constant(0), one = constant(1);
  auto fmul = [&](NodeId a, NodeId b) {
    if (is_constant(a, 0) || is_constant(b, 0)) return zero;
    if (is_constant(a, 1)) return b;
    if (is_constant(b, 1)) return a;
    return mul(a, b);
  };
  auto fadd = [&](NodeId a, NodeId b) {
    if (is_constant(a, 0)) return b;
    if (is_constant(b, 0)) return a;
    return add(a, b);
  };
  auto fsub = [&](NodeId a, NodeId b) {
    if (is_constant(b, 0)) return a;
    if (is_constant(a, 0)) return neg(b);
    return sub(a, b);
  };
  auto fdiv = [&](NodeId a, NodeId b) { return is_constant(a, 0) ? zero : div(a, b); };
  NodeId result = zero;
  bool hinted = false;
  for (size_t i = 0; i < hints_.size(); ++i) {
    const auto [hint_key, hint] = hints_[i];  // a copy: nothing below may move it
    if (hint_key.f != root) continue;
    // A node of several arguments (a user-defined gated op with its own backward) has a hint
    // per argument: the chain rule sums them.
    result = fadd(result, fmul(hint, derivative(hint_key.u, index)));
    hinted = true;
  }
  if (hinted) {
    derivative_memo_.emplace(key, result);
    return result;
  }
  const Node n = nodes_.at(root);  // a copy: nodes_ grows below
  switch (n.op) {
    case Op::Const:
      result = zero;
      break;
    case Op::Var:
      result = n.var == index ? one : zero;
      break;
    case Op::Add:
      result = fadd(derivative(n.a, index), derivative(n.b, index));
      break;
    case Op::Sub:
      result = fsub(derivative(n.a, index), derivative(n.b, index));
      break;
    case Op::Mul:
      result = fadd(fmul(derivative(n.a, index), n.b), fmul(n.a, derivative(n.b, index)));
      break;
    case Op::Div: {
      const NodeId da = derivative(n.a, index), db = derivative(n.b, index);
      const NodeId quotient = fmul(n.a, db);
      result = is_constant(quotient, 0) ? (is_constant(da, 0) ? zero : div(da, n.b))
                                        : div(fsub(fmul(da, n.b), quotient), mul(n.b, n.b));
      break;
    }
    case Op::Neg: {
      const NodeId da = derivative(n.a, index);
      result = is_constant(da, 0) ? zero : neg(da);
      break;
    }
    case Op::Exp:
      result = fmul(root, derivative(n.a, index));
      break;
    case Op::Tanh:
      result = fmul(sub(one, mul(root, root)), derivative(n.a, index));
      break;
    case Op::Sigmoid:
      result = fmul(mul(root, sub(one, root)), derivative(n.a, index));
      break;
    case Op::Select: {
      const NodeId dc = derivative(n.c, index), dd = derivative(n.d, index);
      result = dc == dd ? dc : select(n.cmp, n.a, n.b, dc, dd);
      break;
    }
    case Op::Log:
      result = fdiv(derivative(n.a, index), n.a);
      break;
    case Op::Sqrt:
      result = fdiv(derivative(n.a, index), mul(constant(2), root));
      break;
    case Op::Rsqrt:  // d a^-1/2 = -1/2 a^-3/2 = -1/2 r r r
      result = fmul(mul(constant(-0.5), mul(root, mul(root, root))), derivative(n.a, index));
      break;
    case Op::Abs: {
      // sign(a) da, 0 at a = 0 (as torch's abs and TE's relu-like kinks).
      const NodeId da = derivative(n.a, index);
      result = is_constant(da, 0)
                   ? zero
                   : select(Cmp::Gt, n.a, zero, da, select(Cmp::Gt, zero, n.a, neg(da), zero));
      break;
    }
    case Op::Erf:  // 2/sqrt(pi) exp(-a^2)
      result =
          fmul(mul(constant(1.1283791670955126), exp(neg(mul(n.a, n.a)))), derivative(n.a, index));
      break;
    case Op::Pow: {
      // d a^b = b a^(b-1) da + a^b log(a) db (the second term only where b varies).
      const NodeId da = derivative(n.a, index), db = derivative(n.b, index);
      NodeId term = zero;
      if (!is_constant(da, 0)) {
        const Node& b = nodes_.at(n.b);
        const NodeId lower = b.op == Op::Const ? constant(b.value - 1) : sub(n.b, one);
        term = fmul(mul(n.b, pow(n.a, lower)), da);
      }
      if (!is_constant(db, 0)) term = fadd(term, fmul(mul(root, log(n.a)), db));
      result = term;
      break;
    }
  }
  derivative_memo_.emplace(key, result);
  return result;
}

std::vector<NodeId> Graph::schedule(std::span<const NodeId> roots) const {
  std::vector<bool> needed(nodes_.size(), false);
  for (NodeId r : roots) needed.at(r) = true;
  // Children have smaller ids than their parents, so one backward sweep marks everything.
  for (size_t i = nodes_.size(); i-- > 0;) {
    if (!needed[i]) continue;
    const Node& n = nodes_[i];
    switch (n.op) {
      case Op::Const:
      case Op::Var:
        break;
      case Op::Select:
        needed[n.c] = needed[n.d] = true;
        [[fallthrough]];
      case Op::Add:
      case Op::Sub:
      case Op::Mul:
      case Op::Div:
      case Op::Pow:
        needed[n.b] = true;
        [[fallthrough]];
      default:
        needed[n.a] = true;
    }
  }
  std::vector<NodeId> order;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (needed[i]) order.push_back(NodeId(i));
  return order;
}

template <typename T>
void Graph::evaluate(std::span<const NodeId> order, std::span<const T> vars,
                     std::span<T> scratch) const {
  for (NodeId id : order) {
    const Node& n = nodes_[id];
    T& out = scratch[id];
    switch (n.op) {
      case Op::Const:
        out = T(n.value);
        break;
      case Op::Var:
        out = vars[size_t(n.var)];
        break;
      case Op::Add:
        out = scratch[n.a] + scratch[n.b];
        break;
      case Op::Sub:
        out = scratch[n.a] - scratch[n.b];
        break;
      case Op::Mul:
        out = scratch[n.a] * scratch[n.b];
        break;
      case Op::Div:
        out = scratch[n.a] / scratch[n.b];
        break;
      case Op::Neg:
        out = -scratch[n.a];
        break;
      case Op::Exp:
        out = std::exp(scratch[n.a]);
        break;
      case Op::Tanh:
        out = std::tanh(scratch[n.a]);
        break;
      case Op::Sigmoid:
        out = T(1) / (T(1) + std::exp(-scratch[n.a]));
        break;
      case Op::Select:
        out = compare(n.cmp, scratch[n.a], scratch[n.b]) ? scratch[n.c] : scratch[n.d];
        break;
      case Op::Log:
        out = std::log(scratch[n.a]);
        break;
      case Op::Sqrt:
        out = std::sqrt(scratch[n.a]);
        break;
      case Op::Rsqrt:
        out = T(1) / std::sqrt(scratch[n.a]);
        break;
      case Op::Abs:
        out = std::abs(scratch[n.a]);
        break;
      case Op::Erf:
        out = std::erf(scratch[n.a]);
        break;
      case Op::Pow:
        out = std::pow(scratch[n.a], scratch[n.b]);
        break;
    }
  }
}

template void Graph::evaluate<float>(std::span<const NodeId>, std::span<const float>,
                                     std::span<float>) const;
template void Graph::evaluate<double>(std::span<const NodeId>, std::span<const double>,
                                      std::span<double>) const;

std::string Graph::cuda(std::span<const NodeId> roots, std::span<const std::string> var_names,
                        std::span<const std::string> out_names) const {
  OPFUSE_ASSERT(roots.size() == out_names.size(), "{} roots, {} names", roots.size(),
                out_names.size());
  auto t = [](NodeId id) { return fmt::format("t{}", id); };
  std::string out;
  for (NodeId id : schedule(roots)) {
    const Node& n = nodes_[id];
    std::string e;
    switch (n.op) {
      case Op::Const:
        e = float_literal(n.value);
        break;
      case Op::Var:
        e = var_names[size_t(n.var)];
        break;
      case Op::Add:
        e = fmt::format("{} + {}", t(n.a), t(n.b));
        break;
      case Op::Sub:
        e = fmt::format("{} - {}", t(n.a), t(n.b));
        break;
      case Op::Mul:
        e = fmt::format("{} * {}", t(n.a), t(n.b));
        break;
      case Op::Div:  // the hardware approximation, as templates/common/scalar_math.cuh explains
        e = fmt::format("__fdividef({}, {})", t(n.a), t(n.b));
        break;
      case Op::Neg:
        e = fmt::format("-{}", t(n.a));
        break;
      case Op::Exp:
        e = fmt::format("__expf({})", t(n.a));
        break;
      case Op::Tanh:
        e = fmt::format("tanhf({})", t(n.a));
        break;
      case Op::Sigmoid:
        e = fmt::format("opfuse::sigmoid({})", t(n.a));
        break;
      case Op::Select:
        e = fmt::format("{} {} {} ? {} : {}", t(n.a), cmp_spelling(n.cmp), t(n.b), t(n.c), t(n.d));
        break;
      case Op::Log:
        e = fmt::format("logf({})", t(n.a));
        break;
      case Op::Sqrt:
        e = fmt::format("sqrtf({})", t(n.a));
        break;
      case Op::Rsqrt:
        e = fmt::format("rsqrtf({})", t(n.a));
        break;
      case Op::Abs:
        e = fmt::format("fabsf({})", t(n.a));
        break;
      case Op::Erf:
        e = fmt::format("erff({})", t(n.a));
        break;
      case Op::Pow:
        e = fmt::format("powf({}, {})", t(n.a), t(n.b));
        break;
    }
    out += fmt::format("const float {} = {};\n", t(id), e);
  }
  for (size_t i = 0; i < roots.size(); ++i)
    out += fmt::format("{} = {};\n", out_names[i], t(roots[i]));
  return out;
}

}  // namespace opfuse::ir::scalar
