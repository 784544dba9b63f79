#include "ir/scalar_code.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <vector>

namespace opfuse::ir::scalar {

namespace {

// Expressions a feature builds are small; the bound keeps a hostile name from growing a graph.
constexpr size_t kMaxNodes = 4096;
// Vars: a pointwise op's inputs, dy and learned parameters; a norm-like op's also the row's
// length and its row scalars (compiler/ir/row_expr.h: 3 + 8 parameters + 3 * 16 stages).
constexpr size_t kMaxVars = 64;

std::string_view select_name(Cmp c) {
  switch (c) {
    case Cmp::Gt:
      return "gt";
    case Cmp::Ge:
      return "ge";
    case Cmp::Le:
      return "le";
    case Cmp::Eq:
      return "eq";
  }
  return "gt";
}

// Splits "12x3x4" into positions; nullopt unless exactly `count` numbers.
std::optional<std::vector<size_t>> positions(std::string_view s, size_t count) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find('x', start), s.size());
    const std::string_view part = s.substr(start, end - start);
    if (part.empty() || part.size() > 6) return std::nullopt;
    size_t v = 0;
    for (const char c : part) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + size_t(c - '0');
    }
    out.push_back(v);
    start = end + 1;
  }
  if (out.size() != count) return std::nullopt;
  return out;
}

std::string encode_nodes(const Graph& graph, std::span<const NodeId> roots, bool list_roots);

}  // namespace

std::string encode_number(double v) {
  std::string out;
  for (const char c : fmt::format("{}", v)) {
    if (c == '.')
      out += 'p';
    else if (c == '-')
      out += 'm';
    else if (c != '+')
      out += c;
  }
  return out;
}

std::optional<double> decode_number(std::string_view s) {
  std::string text;
  for (const char c : s) text += c == 'p' ? '.' : c == 'm' ? '-' : c;
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

std::string encode(const Graph& graph, NodeId value) {
  const NodeId roots[] = {value};
  return encode_nodes(graph, roots, /*list_roots=*/false);
}

std::string encode_roots(const Graph& graph, std::span<const NodeId> roots) {
  return encode_nodes(graph, roots, /*list_roots=*/true);
}

namespace {

std::string encode_nodes(const Graph& graph, std::span<const NodeId> roots, bool list_roots) {
  const std::vector<NodeId> order = graph.schedule(roots);
  std::map<NodeId, size_t> position;
  std::string out;
  for (const NodeId id : order) {
    const Node& n = graph.node(id);
    auto at = [&](NodeId child) { return position.at(child); };
    std::string token;
    switch (n.op) {
      case Op::Const:
        token = "c" + encode_number(n.value);
        break;
      case Op::Var:
        token = fmt::format("v{}", n.var);
        break;
      case Op::Add:
        token = fmt::format("add{}x{}", at(n.a), at(n.b));
        break;
      case Op::Sub:
        token = fmt::format("sub{}x{}", at(n.a), at(n.b));
        break;
      case Op::Mul:
        token = fmt::format("mul{}x{}", at(n.a), at(n.b));
        break;
      case Op::Div:
        token = fmt::format("div{}x{}", at(n.a), at(n.b));
        break;
      case Op::Neg:
        token = fmt::format("neg{}", at(n.a));
        break;
      case Op::Exp:
        token = fmt::format("exp{}", at(n.a));
        break;
      case Op::Tanh:
        token = fmt::format("tanh{}", at(n.a));
        break;
      case Op::Sigmoid:
        token = fmt::format("sig{}", at(n.a));
        break;
      case Op::Select:
        token =
            fmt::format("{}{}x{}x{}x{}", select_name(n.cmp), at(n.a), at(n.b), at(n.c), at(n.d));
        break;
      case Op::Log:
        token = fmt::format("log{}", at(n.a));
        break;
      case Op::Sqrt:
        token = fmt::format("sqrt{}", at(n.a));
        break;
      case Op::Rsqrt:
        token = fmt::format("rsqrt{}", at(n.a));
        break;
      case Op::Abs:
        token = fmt::format("abs{}", at(n.a));
        break;
      case Op::Erf:
        token = fmt::format("erf{}", at(n.a));
        break;
      case Op::Pow:
        token = fmt::format("pow{}x{}", at(n.a), at(n.b));
        break;
    }
    position[id] = position.size();
    out += (out.empty() ? "" : "_") + token;
  }
  if (list_roots) {
    std::string token = "out";
    for (size_t i = 0; i < roots.size(); ++i)
      token += fmt::format("{}{}", i ? "x" : "", position.at(roots[i]));
    out += "_" + token;
  }
  return out;
}

}  // namespace

std::optional<Decoded> decode(std::string_view text) {
  Decoded d;
  std::vector<NodeId> nodes;
  size_t start = 0;
  while (start < text.size()) {
    if (nodes.size() >= kMaxNodes) return std::nullopt;
    const size_t end = std::min(text.find('_', start), text.size());
    const std::string_view token = text.substr(start, end - start);
    start = end + 1;
    auto args = [&](std::string_view prefix, size_t count) -> std::optional<std::vector<NodeId>> {
      const auto p = positions(token.substr(prefix.size()), count);
      if (!p) return std::nullopt;
      std::vector<NodeId> out;
      for (const size_t i : *p) {
        if (i >= nodes.size()) return std::nullopt;  // children come first
        out.push_back(nodes[i]);
      }
      return out;
    };
    if (token.starts_with("out") && start >= text.size()) {
      // The last token of encode_roots: the roots by position.
      const size_t count = size_t(std::count(token.begin(), token.end(), 'x')) + 1;
      const auto p = positions(token.substr(3), count);
      if (!p || nodes.empty()) return std::nullopt;
      for (const size_t i : *p) {
        if (i >= nodes.size()) return std::nullopt;
        d.roots.push_back(nodes[i]);
      }
      d.value = d.roots.front();
      return d;
    }
    std::optional<NodeId> made;
    if (token.starts_with("c")) {
      if (const auto v = decode_number(token.substr(1))) made = d.graph.constant(*v);
    } else if (token.starts_with("v")) {
      if (const auto p = positions(token.substr(1), 1); p && (*p)[0] < kMaxVars)
        made = d.graph.var(int((*p)[0]));
    } else {
      struct Binary {
        std::string_view name;
        NodeId (Graph::*make)(NodeId, NodeId);
      };
      static constexpr Binary kBinary[] = {{"add", &Graph::add},
                                           {"sub", &Graph::sub},
                                           {"mul", &Graph::mul},
                                           {"div", &Graph::div},
                                           {"pow", &Graph::pow}};
      struct Unary {
        std::string_view name;
        NodeId (Graph::*make)(NodeId);
      };
      static constexpr Unary kUnary[] = {
          {"neg", &Graph::neg},     {"exp", &Graph::exp}, {"tanh", &Graph::tanh},
          {"sig", &Graph::sigmoid}, {"log", &Graph::log}, {"sqrt", &Graph::sqrt},
          {"rsqrt", &Graph::rsqrt}, {"abs", &Graph::abs}, {"erf", &Graph::erf}};
      for (const Binary& b : kBinary) {
        if (made || !token.starts_with(b.name)) continue;
        if (const auto a = args(b.name, 2)) made = (d.graph.*b.make)((*a)[0], (*a)[1]);
      }
      for (const Unary& u : kUnary) {
        if (made || !token.starts_with(u.name)) continue;
        if (const auto a = args(u.name, 1)) made = (d.graph.*u.make)((*a)[0]);
      }
      for (const Cmp c : {Cmp::Gt, Cmp::Ge, Cmp::Le, Cmp::Eq}) {
        if (made || !token.starts_with(select_name(c))) continue;
        if (const auto a = args(select_name(c), 4))
          made = d.graph.select(c, (*a)[0], (*a)[1], (*a)[2], (*a)[3]);
      }
    }
    if (!made) return std::nullopt;
    nodes.push_back(*made);
  }
  if (nodes.empty()) return std::nullopt;
  d.value = nodes.back();
  d.roots = {d.value};
  return d;
}

namespace {

// A DAG printed as a tree can grow exponentially (shared subexpressions are repeated): past
// `budget` printed nodes the rest prints as "...".
std::string describe_within(const Graph& graph, NodeId value, size_t& budget,
                            std::span<const std::string> names) {
  if (budget == 0) return "...";
  --budget;
  const Node& n = graph.node(value);
  auto sub = [&](NodeId id) { return describe_within(graph, id, budget, names); };
  switch (n.op) {
    case Op::Const:
      return fmt::format("{}", n.value);
    case Op::Var:
      if (size_t(n.var) < names.size() && !names[size_t(n.var)].empty())
        return names[size_t(n.var)];
      return n.var == 0 ? "x" : fmt::format("x{}", n.var);
    case Op::Add:
      return fmt::format("({} + {})", sub(n.a), sub(n.b));
    case Op::Sub:
      return fmt::format("({} - {})", sub(n.a), sub(n.b));
    case Op::Mul:
      return fmt::format("{} * {}", sub(n.a), sub(n.b));
    case Op::Div:
      return fmt::format("{} / {}", sub(n.a), sub(n.b));
    case Op::Neg:
      return fmt::format("-{}", sub(n.a));
    case Op::Exp:
      return fmt::format("exp({})", sub(n.a));
    case Op::Tanh:
      return fmt::format("tanh({})", sub(n.a));
    case Op::Sigmoid:
      return fmt::format("sigmoid({})", sub(n.a));
    case Op::Select: {
      const std::string_view cmp = n.cmp == Cmp::Gt   ? ">"
                                   : n.cmp == Cmp::Ge ? ">="
                                   : n.cmp == Cmp::Le ? "<="
                                                      : "==";
      return fmt::format("({} {} {} ? {} : {})", sub(n.a), cmp, sub(n.b), sub(n.c), sub(n.d));
    }
    case Op::Log:
      return fmt::format("log({})", sub(n.a));
    case Op::Sqrt:
      return fmt::format("sqrt({})", sub(n.a));
    case Op::Rsqrt:
      return fmt::format("rsqrt({})", sub(n.a));
    case Op::Abs:
      return fmt::format("abs({})", sub(n.a));
    case Op::Erf:
      return fmt::format("erf({})", sub(n.a));
    case Op::Pow:
      return fmt::format("{} ^ {}", sub(n.a), sub(n.b));
  }
  return "?";
}

}  // namespace

std::string describe(const Graph& graph, NodeId value, std::span<const std::string> var_names) {
  size_t budget = 512;
  return describe_within(graph, value, budget, var_names);
}

}  // namespace opfuse::ir::scalar
