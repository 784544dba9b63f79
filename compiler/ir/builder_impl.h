// Internal to the IR builder: the Builder class that builder.cpp (declarations, constants, the
// two-pass run), builder_eval.cpp (constant expressions, dimensions, types), builder_recipes.cpp
// (recipes), builder_sequences.cpp (sequences, their inputs and outputs), builder_quantized.cpp
// (quantized inputs and outputs) and builder_ops.cpp (op statements: attributes, shape rules,
// parameters) define between them.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "dsl/ast.h"
#include "ir/builder.h"
#include "ir/graph.h"
#include "ir/parallel.h"
#include "ir/pointwise_ops.h"
#include "ir/row_expr.h"
#include "ir/scalar_expr.h"
#include "support/diagnostics.h"

namespace opfuse::ir {
struct PointwiseDef;
namespace builder_detail::user_ops {
struct MathFunction;
}
}  // namespace opfuse::ir

namespace opfuse::ir::builder_detail {

using dsl::Expr;

// A constant's value: integer, number or bool.
using ConstValue = std::variant<int64_t, double, bool>;

std::string const_value_string(const ConstValue& v);

// What a top-level name refers to, for messages like "'fp8' is a recipe".
struct GlobalName {
  enum class Kind { Const, Recipe, Sequence, Op, Fusion } kind;
  SourceLoc loc;
};

const char* kind_word(GlobalName::Kind k);

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& items);

class Builder {
 public:
  Builder(DiagnosticEngine& diags, const BuildOptions& options)
      : diags_(diags), options_(options) {}

  std::optional<Program> run(const std::vector<const dsl::Module*>& modules);

 private:
  // ---- declarations --------------------------------------------------------------------------

  void declare(const dsl::Decl& d);

  std::vector<std::string> const_names() const;

  void define_const(const dsl::ConstDecl& c);

  // ---- constant expressions ---------------------------------------------------------------------

  // Evaluates a constant expression. Names must be constants. Reports and returns nullopt on error.
  std::optional<ConstValue> eval(const Expr& e, bool allow_float);

  std::optional<ConstValue> overflow(const Expr& e);

  std::optional<ConstValue> eval_binary(const Expr& e, bool allow_float);

  void unknown_name(const Expr& e);

  std::optional<int64_t> eval_int(const Expr& e);

  std::optional<double> eval_number(const Expr& e);

  std::optional<bool> eval_bool(const Expr& e);

  // A plain identifier (enum words in recipes, I/O names in ops).
  std::optional<std::string> eval_word(const Expr& e, std::string_view what);

  // One dimension of a signature type or reshape: a constant expression or a symbol.
  std::optional<Dim> eval_dim(const Expr& e, bool allow_minus_one);

  // The first name in `e` that is neither a constant nor another top-level name: a symbol.
  const Expr* find_symbol(const Expr& e) const;

  // A signature type; `quantized`: declared quantized(...), so its dtype word is an FP8 format and
  // the value it gives is the dequantized bf16 tensor.
  std::optional<TensorType> eval_type(const dsl::TensorTypeExpr& t, bool quantized = false);

  // ---- recipes ----------------------------------------------------------------------------------

  struct ArgBinding {
    std::map<std::string, const dsl::Arg*> named;
  };

  void define_recipe(const dsl::RecipeDecl& d);

  bool set_recipe_param(Recipe& r, const std::string& name, const Expr& v);
  bool check_block_dims(const Recipe& r, const dsl::RecipeDecl& d);

  // Recipe names a sequence can use: the declared ones and the built-in bf16 (unless redeclared).
  std::vector<std::string> recipe_names() const;

  // Looks up a recipe by name; nullopt (with an error unless already reported) when unusable.
  std::optional<Recipe> resolve_recipe(const std::string& name, SourceLoc loc);

  void resolve_override();

  // ---- sequences --------------------------------------------------------------------------------

  struct SequenceScope {
    Sequence seq;
    std::map<std::string, ValueId> extra_inputs;   // name -> value
    std::map<std::string, size_t> extra_outputs;   // name -> index in seq.outputs
    std::map<std::string, SourceLoc> used_inputs;  // extra inputs added, where
    std::map<std::string, SourceLoc> made_outputs;
    std::map<std::string, const dsl::Param*> params_by_name;
    std::vector<Layout> layouts;  // per value: how it lies over the tensor-parallel ranks
  };

  ValueId add_value(Sequence& s, ValueKind kind, TensorType type, std::string name,
                    int32_t producer);

  void build_sequence(const dsl::SequenceDecl& d);
  // builder_quantized.cpp (docs/language.md, "Quantized inputs and outputs"): the declaration of
  // a quantized main input or output, its checks once the body is built, and the agreement of
  // producers and consumers of one name across the program's sequences.
  std::optional<QuantizedBoundary> quantized_boundary(const dsl::Param& p, bool input, bool main);
  bool check_quantized_boundaries(SequenceScope& sc, const dsl::SequenceDecl& d);
  void check_quantized_pairs();
  // `with parallel(tp = N, sp = ...)`: sets s.parallel; false after reporting an error.
  bool parallel_option(Sequence& s, const dsl::SequenceFlag& f);
  // Appends an op the builder makes itself (the collectives around tensor-parallel linears, a
  // row-parallel linear's bias) with its shape rule; its layout is checked like a written one.
  // Its parameters are named "<param_owner>.<role>" (the instance when empty).
  std::optional<ValueId> add_builder_op(SequenceScope& sc, OpKind kind, AttrList attrs, ValueId cur,
                                        const std::string& instance, SourceLoc loc,
                                        const std::string& param_owner = {});
  // A gated activation (built-in or user) on `gated_input` under tensor parallelism with split
  // features: each rank's features are [its gate part | its value part], so the column-parallel
  // linear that made them cuts its output features as two blocks (plan/parallel.h, ShardSpec).
  static void cut_gated_producer(Sequence& s, ValueId gated_input);
  // The op's parameters as its shape rule declared them, named "<owner>.<role>", appended to the
  // sequence's parameters and the op's operands.
  void add_params(Sequence& s, Operation& op, const std::vector<ParamDecl>& params,
                  const std::string& owner);
  // Records the new op's result layout; reports (at `loc`) an op that cannot take its operand's.
  bool check_layout(SequenceScope& sc, SourceLoc loc);

  // Binds the call's arguments to the op's attributes (positional in order, then named).
  std::optional<AttrList> bind_attrs(const dsl::OpStmt& stmt, const OpInfo& info);

  static Attr default_attr(const AttrSpec& spec);

  static std::string usage(const OpInfo& info);

  std::optional<AttrValue> eval_attr(const AttrSpec& spec, const Expr& e);

  SourceLoc attr_loc(const dsl::OpStmt& stmt, const OpInfo& info, const std::string& attr);

  std::optional<ValueId> build_op(SequenceScope& sc, const dsl::OpStmt& stmt, const OpInfo& info,
                                  ValueId cur, const std::string& instance,
                                  const std::vector<std::optional<TensorType>>& output_types);

  void unknown_io(const SequenceScope& sc, const std::string& name, SourceLoc loc, bool want_input);

  // ---- user-defined ops (builder_user_ops.cpp) --------------------------------------------------

  struct UserOp {
    const dsl::OpDecl* decl = nullptr;
    size_t order = 0;                // definition order: an op calls only earlier ones
    std::vector<AttrSpec> attrs;     // Float attributes, names pointing into decl
    std::vector<double> defaults;    // per attribute (required ones: 1, for checking)
    std::vector<UserParam> learned;  // its `params(...)`, in order (ir/pointwise_ops.h)
    bool valid = false;              // checked without errors
    bool differentiable = true;      // derived backward possible (or a backward is given)
    // Its expression (with the defaults) reduces over the last dimension: sum_last, mean_last,
    // max_last, its own or an inlined op's (compiler/ir/row_expr.h).
    bool norm_like = false;
  };
  // Where the last-dimension reductions of an op expression may go (Builder::lower_reduction).
  enum class Reductions : uint8_t { Allowed, InGatedOp, InBackward };
  // Names in an op expression: inputs and learned parameters (graph nodes) and attributes
  // (numbers).
  struct OpScope {
    const UserOp* op = nullptr;
    std::map<std::string, scalar::NodeId> inputs;
    std::map<std::string, double> attrs;
    bool device = false;
    bool report = true;                           // report errors (the definition's check) or not
    std::optional<SourceLoc> non_differentiable;  // first comparison used as a number
    // The reductions lowered so far (a plain op's value), each row scalar
    // var(reduction_base + index); null where none may be (`reductions` says why).
    std::vector<RowStage>* stages = nullptr;
    int reduction_base = 0;
    Reductions reductions = Reductions::Allowed;
    // Norm-like ops inlined into this graph, per op, attribute values and inputs: a second call
    // alike is the same value (hash-consing, stages deduplicated), so a chain of ops each
    // calling the last twice stays linear (Builder::inline_row_call).
    using InlineKey = std::tuple<const UserOp*, std::vector<double>, std::vector<scalar::NodeId>>;
    std::map<InlineKey, scalar::NodeId>* inlined = nullptr;
  };

  // ---- declared fusions (builder_fusions.cpp) --------------------------------------------------

  // Checks a `fusion` declaration (arguments, steps, phases, a kernel shape for every match) and
  // adds it to the program.
  void define_fusion(const dsl::FusionDecl& d);
  std::optional<DeclaredFusion::Step> fusion_step(const dsl::FusionDecl& d,
                                                  const dsl::FusionStep& step, Phase phase);

  void declare_op(const dsl::OpDecl& d);
  // Checks a definition (names, calls, arity, backward) once, reporting at its locations.
  void check_op(const dsl::OpDecl& d);
  // Checks and records the definition's `params(...)`; false after reporting an error. `seen`
  // holds the inputs' and attributes' names (a parameter may not reuse one).
  bool check_learned_params(const dsl::OpDecl& d, UserOp& op,
                            const std::map<std::string, SourceLoc>& seen);
  // The op's value and gradients with these attribute values: scalar::encode_roots text of
  // [reference value, gradients, device value, gradients] (ir::user_pointwise_attrs).
  std::optional<std::string> instantiate_op(const UserOp& op, const std::vector<double>& attrs,
                                            bool report);
  // Value and gradients in one form, into `g` (dy = var(inputs)). A norm-like op's value only,
  // its forward and backward row programs into `row` (an error where `row` is null).
  std::optional<std::vector<scalar::NodeId>> lower_op(
      const UserOp& op, const std::vector<double>& attrs, scalar::Graph& g, bool device,
      bool report, std::pair<RowProgram, RowProgram>* row = nullptr);
  // A norm-like op's carrier attributes with these attribute values (builder_reductions.cpp).
  std::optional<AttrList> instantiate_row_op(const UserOp& op, const std::vector<double>& attrs,
                                             bool report);
  // sum_last / mean_last / max_last in an op expression: a row scalar (builder_reductions.cpp).
  std::optional<scalar::NodeId> lower_reduction(const Expr& e, RowReduce kind, scalar::Graph& g,
                                                OpScope& scope);
  void reduction_error(const Expr& e, const OpScope& scope, const UserOp* callee);
  // A call of a norm-like op, inlined: its reductions become the caller's.
  std::optional<scalar::NodeId> inline_row_call(const Expr& e, const UserOp& target,
                                                const std::vector<scalar::NodeId>& in,
                                                const std::vector<double>& values, scalar::Graph& g,
                                                OpScope& scope);
  std::optional<scalar::NodeId> lower(const Expr& e, scalar::Graph& g, OpScope& scope);
  std::optional<scalar::NodeId> lower_binary(const Expr& e, scalar::Graph& g, OpScope& scope);
  std::optional<scalar::NodeId> lower_compare(const Expr& e, scalar::Graph& g, OpScope& scope);
  void op_expression_error(const Expr& e, const OpScope& scope);
  // A call in an op expression: math functions here, built-in activations and user ops below
  // (separate functions keep the frame of the recursion through ops small).
  std::optional<scalar::NodeId> lower_call(const Expr& e, scalar::Graph& g, OpScope& scope);
  std::optional<scalar::NodeId> lower_math_call(const Expr& e, const user_ops::MathFunction& f,
                                                scalar::Graph& g, OpScope& scope);
  bool math_call_ok(const Expr& e, const user_ops::MathFunction& f, const OpScope& scope);
  std::optional<scalar::NodeId> lower_builtin_call(const Expr& e, const PointwiseDef& def,
                                                   scalar::Graph& g, OpScope& scope);
  std::optional<scalar::NodeId> lower_user_call(const Expr& e, scalar::Graph& g, OpScope& scope);
  void unknown_function(const Expr& e, const OpScope& scope);
  enum class UserCallError { CallsItself, CallsLater, HasParameters, TooDeep, TooBig };
  void user_call_error(UserCallError which, const Expr& e, const OpScope& scope,
                       const UserOp& target);
  // A call's arguments: the inputs lowered (positional, first), the rest kept for the attributes.
  struct CallArgs {
    std::vector<scalar::NodeId> in;
    std::vector<const Expr*> rest;
    std::vector<std::string> names;
    std::vector<SourceLoc> name_locs;
  };
  bool split_call_args(const Expr& e, size_t inputs, scalar::Graph& g, OpScope& scope,
                       CallArgs& out);
  // A constant number over the scope's attributes and the program's constants; nullopt (quietly)
  // when `e` depends on an input.
  std::optional<double> op_constant(const Expr& e, const OpScope& scope) const;
  // A user op's attribute values from a call's arguments past its inputs (positional, named).
  std::optional<std::vector<double>> bind_op_attrs(const UserOp& op,
                                                   const std::vector<const Expr*>& args,
                                                   const std::vector<std::string>& names,
                                                   const std::vector<SourceLoc>& name_locs,
                                                   SourceLoc call_loc, const OpScope* scope);
  void op_error(const OpScope& scope, SourceLoc loc, std::string message, std::string hint = {});
  // A sequence statement that uses a user-defined op.
  std::optional<ValueId> build_user_op(SequenceScope& sc, const dsl::OpStmt& stmt, const UserOp& op,
                                       ValueId cur, const std::string& instance);

  DiagnosticEngine& diags_;
  const BuildOptions& options_;
  Program program_;
  std::map<std::string, GlobalName> globals_;
  std::map<std::string, ConstValue> consts_;
  std::set<std::string> failed_consts_;
  std::set<std::string> warned_symbols_;
  std::map<std::string, std::optional<Recipe>> recipes_;
  std::optional<Recipe> override_;
  std::map<std::string, UserOp> user_ops_;
  // A user op as a call lowers it (Builder::lower_call), per op, form and attribute values.
  struct LoweredCall {
    scalar::Graph graph;
    std::optional<std::vector<scalar::NodeId>> roots;
  };
  std::map<std::tuple<const UserOp*, bool, std::vector<double>>, LoweredCall> lowered_calls_;
  size_t op_call_depth_ = 0;       // ops being lowered inside others (Builder::lower_user_call)
  bool op_call_too_deep_ = false;  // set past user_ops::kMaxOpCallDepth, until reported
};

}  // namespace opfuse::ir::builder_detail
