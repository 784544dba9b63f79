// Norm-like user-defined ops (docs/language.md, "User-defined ops", last-dimension reductions):
// an op whose expression uses sum_last, mean_last or max_last computes, per row of its input,
// a few row scalars (the reductions) and then every element from the element, its learned
// parameters and those scalars. Such an op is a *row program* over one scalar graph
// (compiler/ir/scalar_expr.h):
//
//   stage k:  s_k = REDUCE_k over the row's elements of root_k(x, params, n, s_0 .. s_{k-1})
//   outputs:  out_j = root_j(x, dy, params, n, s_0 .. s_{K-1}) per element
//
// The forward is one program (its stages the reductions as written, innermost first; one
// output, the value); its backward is another over the same graph, derived in reverse mode
// (derive_row_backward): it recomputes the forward's stages, counts the ties of each max, sums
// each reduction's adjoint over the row (last stage first), then writes dx and each learned
// parameter's per-element share of its gradient. The IR carries both as the attributes of one
// op of kind OpKind::UserNorm (note "User-defined ops" in docs/architecture.md): the CPU
// reference (reference/row_ops.cpp) and the CUDA functor of templates/row_expr.cuh
// (row_functor_source) are made from those attributes alone.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/op_table.h"
#include "ir/pointwise_ops.h"
#include "ir/scalar_expr.h"

namespace opfuse::ir {

enum class RowReduce : uint8_t { Sum, Mean, Max };

// The reductions an op expression may call, by name (nullopt for other names).
std::optional<RowReduce> find_row_reduce(std::string_view name);
std::string_view row_reduce_name(RowReduce r);  // "sum_last", ...

struct RowStage {
  RowReduce kind = RowReduce::Sum;
  scalar::NodeId root = 0;
};

struct RowProgram {
  std::vector<RowStage> stages;
  std::vector<scalar::NodeId> outputs;
};

// The most reductions one op may hold (its forward; the backward has up to three times as many
// stages).
inline constexpr size_t kMaxRowReductions = 16;

// The vars of a row program's graph, for an op with `params` learned parameters: x, dy, the
// parameters (as a pointwise user op's), the row's length n (a number), then the row scalars
// s_k (the forward's are a prefix of the backward's).
struct RowVars {
  int params = 0;
  static constexpr int x() { return 0; }
  static constexpr int dy() { return 1; }
  int param(int j) const { return 2 + j; }
  int count() const { return 2 + params; }
  int scalar(int k) const { return 3 + params + k; }
};

// The backward of a forward program (one output, the value) over the same graph: see the
// header comment. max_last passes the gradient to the maxima, split evenly between tied ones
// (PyTorch's amax convention). Outputs: dx, then per parameter d value / d parameter * dy plus
// the reductions' shares (one element's share of its gradient, before the sum over rows).
RowProgram derive_row_backward(scalar::Graph& g, const RowProgram& forward, int params);

// The carrier's attributes: the op's name, scalar::encode_roots of [forward stage roots, value,
// backward stage roots, backward outputs], the forward's reduction kinds as letters
// (s: sum, m: mean, x: max; the backward's follow from them), and encode_user_params.
AttrList user_row_attrs(std::string_view op_name, std::string_view expression,
                        std::string_view stages, std::string_view params);
std::string encode_row_stages(std::span<const RowStage> stages);
std::string encode_row_expression(const scalar::Graph& g, const RowProgram& forward,
                                  const RowProgram& backward);

// A carrier's attributes decoded (a hostile or malformed attribute is an internal error: the
// front end made them).
class RowExpr {
 public:
  explicit RowExpr(const AttrList& attrs);
  int params() const { return int(learned_.size()); }
  const std::vector<UserParam>& learned() const { return learned_; }
  const scalar::Graph& graph() const { return graph_; }
  const RowProgram& forward() const { return forward_; }
  const RowProgram& backward() const { return backward_; }
  RowVars vars() const { return RowVars{params()}; }

  // Runs `p` over every row of x ([rows, cols] flattened): `dy` empty for the forward; `params`
  // are the learned parameters' whole tensors (one element for a scalar, cols for per feature);
  // `outputs` take one value per element each (p.outputs.size() of them). Sums accumulate in
  // double; a max propagates NaN.
  template <typename T>
  void run(const RowProgram& p, std::span<const T> x, std::span<const T> dy,
           std::span<const std::span<const T>> params, int64_t cols,
           std::span<const std::span<T>> outputs) const;

 private:
  scalar::Graph graph_;
  std::vector<UserParam> learned_;
  RowProgram forward_, backward_;
};

// The op's value for readers (the IR printer): "x * rsqrt(sum_last(x * x) + 1e-06)".
std::string describe_row_value(const AttrList& attrs);

// The CUDA functor templates/row_expr.cuh instantiates for a carrier: its name spells the
// attributes (opfuse::row_user_<length>_<name>_<stages>_L<params>_<expression>), so that the
// name alone gives the source (row_functor_source; nullopt for other names).
std::string row_functor_name(const AttrList& attrs);
std::optional<std::string> row_functor_source(std::string_view functor_name);

}  // namespace opfuse::ir
