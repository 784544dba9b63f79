// Pointwise ops (activations, plain and gated), each defined once as a scalar expression
// (compiler/ir/scalar_expr.h): its value over its inputs, the derivative where the definition
// gives its own form (otherwise derived), and an optional device form that is mathematically
// equal to the reference form. Everything else comes from that definition: the op table entry
// (name, attributes, shape rule, kernel family), the backward op, the CPU reference
// (PointwiseExpr::forward/backward) and the CUDA functor of the generated kernels
// (pointwise_functor_source). docs/architecture.md, "Adding an op", lists what a new one touches.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/op_table.h"
#include "ir/scalar_expr.h"
#include "support/source_manager.h"

namespace opfuse::ir {

// What the expression builder sees: the graph, its inputs (x; gated: gate, linear), the op's
// attributes (compile-time constants of the program) and whether the device form is wanted.
struct PointwiseBuilder {
  scalar::Graph& g;
  std::span<const scalar::NodeId> inputs;
  const AttrList& attrs;
  bool device;
  // Where a definition gives its gradients whole (a user-defined op, whose front end derived or
  // was given them): one per input, with dy = g.var(inputs.size()). Left empty: derived.
  std::vector<scalar::NodeId>* gradients = nullptr;
};

struct PointwiseDef {
  std::string_view name{};  // as written in .fuse
  // Gated (TE convention): [..., 2n] -> [..., n], the first half is the gate, the second the
  // linear part; inputs are (gate, linear). Plain: [...] -> [...], one input.
  bool gated = false;
  std::span<const AttrSpec> attrs{};
  std::string_view doc{};  // one sentence for docs/language.md and `fusec ops`
  // Traits codegen and the fusions select on.
  bool cublaslt_gelu_epilogue = false;  // cuBLASLt's GELU_AUX / DGELU epilogues compute it
  // One of the two carriers of user-defined ops (note "User-defined ops" in
  // docs/architecture.md): the op's expression is its `expression` attribute, not C++ here.
  bool user_defined = false;
  // Returns the value node; may hint derivatives (scalar::Graph::hint_derivative).
  scalar::NodeId (*build)(const PointwiseBuilder& b) = nullptr;
};

// The built-in definitions (activations a .fuse program names directly).
std::span<const PointwiseDef* const> pointwise_defs();
const PointwiseDef* find_pointwise(std::string_view name);
// The built-in definitions followed by the two carriers of user-defined ops (plain, gated): the
// definitions the pointwise OpKinds index (compiler/ir/op_table.h).
std::span<const PointwiseDef* const> all_pointwise_defs();
const PointwiseDef& user_pointwise_def(bool gated);
// A learned parameter of a user-defined op (docs/language.md, "User-defined ops", `params(...)`):
// a scalar (size 0, stored as one element) or one value per output feature (size = the features
// of the op's output's last dimension). In the op's expression it is var(inputs + 1 + index),
// after the inputs and dy; its gradient root follows the inputs' (note "User-defined ops" in
// docs/architecture.md).
struct UserParam {
  std::string name;
  DType dtype = DType::FP32;
  int64_t size = 0;  // 0: a scalar
  double init = 0;   // every element starts at it (ParamInit::constant)
  friend bool operator==(const UserParam&, const UserParam&) = default;
};
// The carrier's `params` attribute: "name:dtype:size:init" joined by ',' (init as
// scalar::encode_number), "" for none; decode refuses any other text.
std::string encode_user_params(std::span<const UserParam> params);
std::optional<std::vector<UserParam>> decode_user_params(std::string_view text);
// The learned parameters of a pointwise op or of its backward (empty for built-in ops).
std::vector<UserParam> user_params(const PointwiseDef& def, const AttrList& attrs);
// How scalar::describe names an op's expression vars: "" for the inputs and dy (x, x1, ...), then
// the learned parameters by name.
std::vector<std::string> expression_var_names(const PointwiseDef& def, const AttrList& attrs);
// The most learned parameters one op may declare (the expression's vars stay below 16).
inline constexpr size_t kMaxUserParams = 8;

// A user-defined op as its carrier's attributes: the op's name and the text of its value and
// gradients (scalar::encode_roots of [reference value, reference gradients..., device value,
// device gradients...], dy = var(inputs); the gradients are the inputs', then the learned
// parameters' (per element, before the sum over rows)).
// `parts`: a composed chain's ops (compiler/passes/compose_pointwise.h), empty otherwise.
// `params`: encode_user_params of its learned parameters.
AttrList user_pointwise_attrs(std::string_view op_name, std::string_view expression,
                              std::string_view parts = {}, std::string_view params = {});
// The ops a composed chain was made of, with their source locations (empty for other ops).
struct ComposedPart {
  std::string name;
  SourceLoc loc;
};
std::vector<ComposedPart> composed_parts(const PointwiseDef& def, const AttrList& attrs);
std::string composed_part_text(std::string_view name, SourceLoc loc);
// The op a pointwise op is as written: the definition's name, or a user-defined op's own name.
std::string_view pointwise_op_name(const PointwiseDef& def, const AttrList& attrs);
// An op's name for readers (kernel comments, plans, messages): op_info(kind).name, except that a
// user-defined op is called by its own name.
std::string_view written_op_name(OpKind kind, const AttrList& attrs);
// A pointwise op, or its backward, with the cublaslt_gelu_epilogue trait.
bool has_gelu_epilogue(OpKind kind);
// The gated activations the fused GEMM epilogues are compiled for (runtime/cutlass/fused_gemm.h,
// its functors generated by gen_gated_functors): the built-in ones without attributes.
bool fused_gemm_activation(const PointwiseDef& def);

// A definition instantiated with its attributes: the value and, per input, d value / d input
// times the incoming gradient dy (scalar::Graph::var(inputs)); then, per learned parameter of a
// user-defined op, d value / d parameter times dy (one element's share of its gradient).
class PointwiseExpr {
 public:
  PointwiseExpr(const PointwiseDef& def, const AttrList& attrs, bool device);
  int inputs() const { return inputs_; }
  int params() const { return params_; }  // learned parameters (user-defined ops)
  const scalar::Graph& graph() const { return graph_; }
  scalar::NodeId value() const { return value_; }
  std::span<const scalar::NodeId> gradients() const { return gradients_; }

  // CPU evaluation in the definition's operation order; `scratch` has graph().size() entries.
  // `params`: the learned parameters' values at this element (params() of them); `grads` takes
  // inputs() + params() gradients.
  template <typename T>
  T forward(std::span<const T> in, std::span<T> scratch) const {
    return forward<T>(in, {}, scratch);
  }
  template <typename T>
  T forward(std::span<const T> in, std::span<const T> params, std::span<T> scratch) const;
  template <typename T>
  void backward(std::span<const T> in, T dy, std::span<T> grads, std::span<T> scratch) const {
    backward<T>(in, {}, dy, grads, scratch);
  }
  template <typename T>
  void backward(std::span<const T> in, std::span<const T> params, T dy, std::span<T> grads,
                std::span<T> scratch) const;

 private:
  scalar::Graph graph_;
  int inputs_ = 1;
  int params_ = 0;
  scalar::NodeId value_ = 0;
  std::vector<scalar::NodeId> gradients_;
  std::vector<scalar::NodeId> forward_order_, backward_order_;
};

// The CUDA functor type a kernel instantiates for the op with these attributes, e.g.
// "opfuse::pointwise_gelu" or "opfuse::pointwise_clamped_swiglu_limit_7_alpha_1p702": the
// attribute values are spelled into the name, so one name means one functor. A user-defined op:
// "opfuse::pointwise_user_<length of its name>_<name>_<expression text>".
std::string pointwise_functor_name(const PointwiseDef& def, const AttrList& attrs);
// The functor's CUDA source for a name pointwise_functor_name made (nullopt for other names):
// `static constexpr int kInputs`, `forward(const float (&in)[kInputs])` and
// `backward(const float (&in)[kInputs], float dy, float (&grad)[kInputs])`, both from the
// definition's device form. It needs templates/common/scalar_math.cuh, which it includes.
// Also for names expression_functor_name made.
std::optional<std::string> pointwise_functor_source(std::string_view functor_name);

// The functor of an expression y = f(x) built at run time rather than defined here (a C++ debug
// feature's modification, compiler/passes/debug_modify.h): "opfuse::pointwise_expr_<text>" with
// the text of compiler/ir/scalar_code.h, so that the name alone gives the source.
std::string expression_functor_name(std::string_view expression_text);

}  // namespace opfuse::ir
