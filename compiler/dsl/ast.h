// The syntax tree of one .fuse file, as written (no name resolution, no shapes).
// docs/language.md has the grammar each node comes from.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "support/source_manager.h"

namespace opfuse::dsl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// An expression: constant arithmetic, names, literals, or a bracketed list (reshape shapes).
struct Expr {
  enum class Kind {
    Int,     // 4096            int_value
    Float,   // 1e-5, 0.5       float_value
    Bool,    // true / false    int_value (0/1)
    String,  // "text"          text (unescaped)
    Name,    // hidden, tokens, hybrid   text
    Unary,   // -x              op = '-', operands[0]
    Binary,  // a + b           op in + - * / % ^, operands[0..1] (^: op definitions only)
    List,    // [a, b, -1]      operands
    // Op definitions only (docs/language.md, "User-defined ops"):
    Compare,  // a <= b         text in < <= > >= == !=, operands[0..1]
    Call,     // f(a, k = b)    text = f, operands = arguments, arg_names ("" if positional)
  };
  Kind kind = Kind::Int;
  SourceLoc loc;
  int64_t int_value = 0;
  double float_value = 0.0;
  std::string text;  // Name/String payload; for Int/Float the literal as written
  char op = 0;
  std::vector<ExprPtr> operands;
  std::vector<std::string> arg_names;  // Call: per operand, its name if given as `name = value`
  std::vector<SourceLoc> arg_name_locs;
};

// One call argument: positional (`4096`) or named (`eps = 1e-5`).
struct Arg {
  std::optional<std::string> name;
  SourceLoc name_loc;  // valid only when named
  ExprPtr value;
};

// `dtype[dim, dim, ...]`
struct TensorTypeExpr {
  std::string dtype;
  SourceLoc loc;  // of the dtype word
  std::vector<ExprPtr> dims;
};

// `quantized(rowwise, columnwise)` after a signature type (docs/language.md, "Quantized inputs
// and outputs"): the usages as written, each with its location.
struct QuantizedExpr {
  SourceLoc loc;  // of the word `quantized`
  std::vector<std::pair<std::string, SourceLoc>> usages;
};

// `name: bf16[tokens, hidden]` in a sequence signature; `name: e4m3[tokens, hidden]
// quantized(rowwise, columnwise)` for a quantized input or output.
struct Param {
  std::string name;
  SourceLoc loc;
  TensorTypeExpr type;
  std::optional<QuantizedExpr> quantized;
};

// `op_name(args) [as instance]` inside a sequence body.
struct OpStmt {
  std::string op;
  SourceLoc loc;  // of the op name
  std::vector<Arg> args;
  std::optional<std::string> instance;
  SourceLoc instance_loc;
};

// `import "other.fuse"`
struct ImportDecl {
  std::string path;  // as written, relative to the importing file's directory
  SourceLoc loc;
};

// `const hidden = 4096`
struct ConstDecl {
  std::string name;
  SourceLoc loc;
  ExprPtr value;
};

// `recipe fp8 = delayed_scaling(format = hybrid, ...)`
struct RecipeDecl {
  std::string name;
  SourceLoc loc;
  std::string kind;  // delayed_scaling | current_scaling | bf16 (checked by sema)
  SourceLoc kind_loc;
  std::vector<Arg> args;
};

// An option after `with` in a sequence header: a flag (`with fp8_weights`) or an option with
// arguments (`with parallel(tp = 2, sp = true)`).
struct SequenceFlag {
  std::string name;
  SourceLoc loc;
  bool has_args = false;  // written with parentheses (possibly empty)
  std::vector<Arg> args;
};

// sequence NAME(inputs) -> (outputs) [uses RECIPE] [with OPTION, ...] { ops }
struct SequenceDecl {
  std::string name;
  SourceLoc loc;
  std::vector<Param> inputs;
  std::vector<Param> outputs;
  std::optional<std::string> recipe;
  SourceLoc recipe_loc;
  std::vector<SequenceFlag> flags;
  std::vector<OpStmt> body;
  SourceLoc close_loc;  // of the closing brace
};

// An input or attribute of an op definition: `x`, or `slope: number = 0.01` (an attribute;
// without a default it is required at every use).
struct OpParam {
  std::string name;
  SourceLoc loc;
  bool is_attr = false;
  ExprPtr default_value;  // attributes only; null: required
};

// A learned parameter of an op definition, `scale: fp32[] = 1.0` in its `params(...)`: a scalar
// (no dims) or one value per feature (one dim); `init` is what every element starts at.
struct OpLearnedParam {
  std::string name;
  SourceLoc loc;
  TensorTypeExpr type;
  ExprPtr init;  // null only after a parse error
};

// `[gated] op NAME(inputs, attrs) [params(...)] = EXPR [backward(inputs, dy) = EXPR]`: a
// user-defined pointwise op (docs/language.md, "User-defined ops"). A gated op's backward is a
// list [d_gate, d_value]; an op with parameters lists their gradients after the inputs'.
struct OpDecl {
  std::string name;
  SourceLoc loc;  // of the name
  bool gated = false;
  std::vector<OpParam> params;
  bool has_learned = false;  // written with `params(...)` (possibly empty)
  SourceLoc learned_loc;     // of the word `params`
  std::vector<OpLearnedParam> learned;
  ExprPtr body;
  bool has_backward = false;
  SourceLoc backward_loc;
  std::vector<OpParam> backward_params;  // the op's inputs, then the incoming gradient
  ExprPtr backward;
};

// A step of a fusion declaration: an op's name, `?` when the step may be absent.
struct FusionStep {
  std::string op;
  SourceLoc loc;
  bool optional = false;
};

// `fusion NAME[(phase = forward|backward, priority = N)] { op; op?; ... }`: a declared fusion
// pattern (docs/language.md, "Declared fusions"). Each step reads the result of the step before
// it (the last one present).
struct FusionDecl {
  std::string name;
  SourceLoc loc;  // of the name
  std::vector<Arg> args;
  std::vector<FusionStep> steps;
  SourceLoc close_loc;  // of the closing brace
};

using Decl = std::variant<ImportDecl, ConstDecl, RecipeDecl, SequenceDecl, OpDecl, FusionDecl>;

// One parsed file, declarations in source order.
struct Module {
  FileId file = kNoFile;
  std::vector<Decl> decls;
};

// Renders a module as an indented tree (golden tests compare it; stable, no pointers).
std::string dump_ast(const Module& module);

}  // namespace opfuse::dsl
