// Scalar expressions: how a pointwise op is defined once (compiler/ir/pointwise_ops.h). A
// hash-consed DAG over a few primitives: building the same node twice returns the same id, so
// common subexpressions (a sigmoid used by a value and its derivative) exist once. Derivatives are
// derived symbolically (or taken from a hint where a definition gives its own form), and the
// same DAG is evaluated on the CPU (float or double, one IEEE operation per node, children before
// parents: the operation order is the order the definition wrote) and printed as CUDA.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace opfuse::ir::scalar {

using NodeId = uint32_t;

enum class Op : uint8_t {
  Const,    // value
  Var,      // var-th input
  Add,      // a + b
  Sub,      // a - b
  Mul,      // a * b
  Div,      // a / b
  Neg,      // -a
  Exp,      // exp(a)
  Tanh,     // tanh(a)
  Sigmoid,  // 1 / (1 + exp(-a)); on the GPU templates/common/scalar_math.cuh's fast form
  Select,   // (a cmp b) ? c : d; NaN compares false
  // For user-defined ops (docs/language.md, "User-defined ops"); on the GPU the CUDA math
  // library's accurate forms (logf, sqrtf, rsqrtf, fabsf, erff, powf).
  Log,    // log(a)
  Sqrt,   // sqrt(a)
  Rsqrt,  // 1 / sqrt(a)
  Abs,    // |a|
  Erf,    // erf(a)
  Pow,    // a ^ b (real powers; integer powers are built as products)
};

enum class Cmp : uint8_t { Gt, Ge, Le, Eq };

struct Node {
  Op op = Op::Const;
  Cmp cmp = Cmp::Gt;
  double value = 0;  // Const
  int var = 0;       // Var
  NodeId a = 0, b = 0, c = 0, d = 0;
  friend bool operator==(const Node&, const Node&) = default;
};

class Graph {
 public:
  NodeId constant(double value);
  NodeId var(int index);
  NodeId add(NodeId a, NodeId b);
  NodeId sub(NodeId a, NodeId b);
  NodeId mul(NodeId a, NodeId b);
  NodeId div(NodeId a, NodeId b);
  NodeId neg(NodeId a);
  NodeId exp(NodeId a);
  NodeId tanh(NodeId a);
  NodeId sigmoid(NodeId a);
  NodeId select(Cmp cmp, NodeId a, NodeId b, NodeId then, NodeId otherwise);
  NodeId log(NodeId a);
  NodeId sqrt(NodeId a);
  NodeId rsqrt(NodeId a);
  NodeId abs(NodeId a);
  NodeId erf(NodeId a);
  NodeId pow(NodeId a, NodeId b);
  NodeId min(NodeId a, NodeId b) { return select(Cmp::Le, a, b, a, b); }  // fminf for non-NaN
  NodeId max(NodeId a, NodeId b) { return select(Cmp::Ge, a, b, a, b); }

  // d f / d u = derivative for a node f of argument u: the definition's own form of its
  // derivative, used instead of the derived one (chain rule: derivative * du; a node with hints
  // for several arguments sums them).
  void hint_derivative(NodeId f, NodeId u, NodeId derivative);
  // d root / d var(index), derived by the chain rule, with x*1, x*0, x+0 folded (exact for
  // finite values; the terms dropped are those of inputs the root does not depend on).
  NodeId derivative(NodeId root, int index);

  const Node& node(NodeId id) const { return nodes_.at(id); }
  size_t size() const { return nodes_.size(); }
  bool is_constant(NodeId id, double value) const;

  // Copies the nodes `roots` need from `other` into this graph, var(i) becoming vars[i] (a var
  // past vars.size() stays var(i)); returns the roots' ids here. Hash-consing shares what this
  // graph already has. Derivative hints are not copied (callers copy derived gradients).
  std::vector<NodeId> copy_from(const Graph& other, std::span<const NodeId> roots,
                                std::span<const NodeId> vars);

  // The nodes the roots need, ascending (children before parents).
  std::vector<NodeId> schedule(std::span<const NodeId> roots) const;

  // Evaluates `order` (a schedule) with the inputs; scratch has size() entries, read back by id.
  template <typename T>
  void evaluate(std::span<const NodeId> order, std::span<const T> vars, std::span<T> scratch) const;

  // CUDA statements computing the roots into `out_names` from inputs named `var_names`:
  // one `const float tN = ...;` per scheduled node, constants as float literals.
  std::string cuda(std::span<const NodeId> roots, std::span<const std::string> var_names,
                   std::span<const std::string> out_names) const;

 private:
  NodeId intern(const Node& n);
  struct Hash {
    size_t operator()(const Node& n) const;
  };
  std::vector<Node> nodes_;
  std::unordered_map<Node, NodeId, Hash> index_;
  struct HintKey {
    NodeId f, u;
  };
  std::vector<std::pair<HintKey, NodeId>> hints_;
  std::unordered_map<uint64_t, NodeId> derivative_memo_;  // (root << 8 | index) -> id
};

}  // namespace opfuse::ir::scalar
