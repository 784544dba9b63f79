// The op table: the one place that describes every op a .fuse program can use: its name,
// attributes with defaults and ranges, shape rule, parameters (with their init), kernel family
// and backward rule. Pointwise ops (activations) are not listed here: each is one definition in
// compiler/ir/pointwise_defs.cpp, and this table gives it an OpKind past kFirstPointwise (and one
// for its backward) made from that definition. The CPU reference of each kind is a table in
// reference/reference_kernels.cpp (the reference library builds on this one, so the entry here
// cannot name it); tests/unit/test_op_registry.cpp checks that every kind has its reference and
// every user op its backward rule. docs/architecture.md, "Adding an op", says which files a new
// op touches.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/types.h"
#include "plan/parallel.h"
#include "plan/param_init.h"

namespace opfuse::ir {

enum class OpKind : uint8_t {
  LayerNorm,
  RMSNorm,
  Linear,
  Bias,
  AddExtraInput,
  MakeExtraOutput,
  Quantize,
  ConstantScale,
  Identity,
  // A norm-like user-defined op (one using sum_last / mean_last / max_last): its row programs
  // are its attributes (compiler/ir/row_expr.h); not written by name, as the pointwise carriers.
  UserNorm,
  Reshape,
  AllReduce,  // tensor-parallel collectives (TE's AllReduce, AllGather, ReduceScatter ops)
  AllGather,
  ReduceScatter,
  Dropout,  // Philox-drawn mask, saved as bits for backward (note "Dropout" in docs/language.md)
  // Internal ops (note "Training graph" in docs/architecture.md): made by passes, never parsed.
  CastFp8,            // quantize to FP8 (row-wise and/or column-wise copy), one quantizer
  Fp8Transpose,       // the transposed copy of an FP8 value, same codes and quantizer (gather_fp8)
  EmulatedCast,       // an MXFP8 / NVFP4 / emulated block-scaled copy, decoded (plan-quantization)
  LayerNormBackward,  // (dy, x, gamma, mean, rstd) -> (dx, dgamma, dbeta)
  RMSNormBackward,    // (dy, x, gamma, rstd) -> (dx, dgamma)
  UserNormBackward,   // (dy, x, params...) -> (dx, dparams...): a norm-like user op's backward
  LinearDgrad,        // (dy, W or W^T) -> dx
  LinearWgrad,        // (dy or dy^T, x or x^T) -> dW
  BiasGrad,           // (dy) -> dbias
  GradAdd,            // (a, b) -> a + b: gradient accumulation where a value fans out
  TensorStats,        // (x) -> (): statistics of x into the record of slot `slot` (debug features)
  TensorCapture,      // (x) -> (): a copy of x into the capture of slot `slot` (debug features)
  ModifyTensor,       // (x) -> y: a GEMM operand a debug feature replaces (passes/debug_modify.h)
  DropoutBackward,    // (dy, mask bits) -> dx = dy * keep / (1 - p)
  Fused,              // a fusion: `parts` run as one kernel or one GEMM call
  // Pointwise ops have no enumerator: kFirstPointwise + i is all_pointwise_defs()[i] (a user
  // op; the last two carry user-defined ops, whose expression is an attribute: note "User-defined
  // ops" in docs/architecture.md), kFirstPointwiseBackward + i its backward (internal:
  // (dy, x) -> dx, both halves when gated), so the kind itself names the definition.
};
inline constexpr size_t kNumOpKinds = static_cast<size_t>(OpKind::Fused) + 1;  // fixed kinds
// Fixed ops a .fuse program can name come first; the rest are internal.
inline constexpr size_t kNumUserOpKinds = static_cast<size_t>(OpKind::Dropout) + 1;
inline constexpr size_t kFirstPointwise = 64;
inline constexpr size_t kFirstPointwiseBackward = 160;

enum class AttrType : uint8_t {
  Int,    // integer constant expression
  Float,  // number
  Bool,   // true / false
  Name,   // the name of one of the sequence's inputs or outputs
  Shape,  // [d0, d1, ...]: integer expressions, symbols, or -1 (inferred; at most one)
};
std::string_view attr_type_name(AttrType t);

// How the op is executed once fused (codegen picks templates by family).
enum class KernelFamily : uint8_t {
  Norm,             // templates/norm.cuh
  Activation,       // templates/activation.cuh, elementwise
  GatedActivation,  // templates/activation.cuh, halves the last dim
  Gemm,             // cuBLASLt
  Bias,             // templates/bias.cuh or a GEMM epilogue
  Residual,         // add_extra_input: GEMM beta=1 accumulation or templates/bias.cuh
  Alias,            // no data movement (make_extra_output, identity, reshape)
  Cast,             // templates/cast_transpose.cuh
  Scale,            // elementwise constant scale
  Stats,            // templates/tensor_stats.cuh: a reduction into a statistics record
  Collective,       // NCCL across the tensor-parallel ranks (runtime/comm)
  Dropout,          // templates/dropout.cuh: Philox mask (forward) or saved mask (backward)
};
std::string_view kernel_family_name(KernelFamily f);

struct AttrSpec {
  std::string_view name;
  AttrType type;
  bool required;
  double default_value;  // Int/Float/Bool (0/1) when not required
  double min;            // inclusive range for Int/Float
  double max;
  std::string_view doc;
};

using AttrValue = std::variant<int64_t, double, bool, std::string, Shape>;
struct Attr {
  std::string name;
  AttrValue value;
  friend bool operator==(const Attr&, const Attr&) = default;
};
// Attributes of one op, in the order of the op's AttrSpecs, every one present (defaults filled).
using AttrList = std::vector<Attr>;

int64_t attr_int(const AttrList& attrs, std::string_view name);
double attr_float(const AttrList& attrs, std::string_view name);
bool attr_bool(const AttrList& attrs, std::string_view name);
const std::string& attr_name(const AttrList& attrs, std::string_view name);
const Shape& attr_shape(const AttrList& attrs, std::string_view name);
std::string attr_value_string(const AttrValue& v);

// A linear's (and its dgrad's and wgrad's) `parallel` attribute.
enum class LinearParallel : uint8_t { None, Column, Row, Invalid };
LinearParallel linear_parallel(const AttrList& attrs);
// `precision = high`: the linear's GEMMs run in the sequence's dtype whatever the recipe (its
// sequence gets a high-precision QuantOverride for the layer; docs/language.md, `linear`).
bool linear_high_precision(const AttrList& attrs);
bool is_collective(OpKind kind);  // all_reduce, all_gather, reduce_scatter

// What a shape rule sees.
struct ShapeInput {
  const TensorType& in;
  const AttrList& attrs;
  // add_extra_input: the named input's type; make_extra_output: the named output's declared type.
  const TensorType* extra = nullptr;
  // The sequence's tensor-parallel group size (`with parallel(tp = N)`; 1 without).
  int64_t tp = 1;
};

// A user error found by a shape rule; `attr` names the attribute to point at (empty: the op).
struct ShapeError {
  std::string attr;
  std::string message;
  std::string hint;
};

// How a parameter starts out (fusec run, Session::own_parameters): declared by the op that owns
// it, carried on the IR value and into the plan, so nothing downstream guesses from names or
// ranks (plan/param_init.h).
using plan::param_init_string;
using plan::ParamInit;

// A trainable parameter the op owns, e.g. {"weight", bf16[28672, 4096], normal(0.02)}.
struct ParamDecl {
  std::string role;
  TensorType type;  // the rank's shard in a tensor-parallel sequence
  ParamInit init{};
  plan::ShardSpec shard{};  // how the unsharded parameter is cut (plan/parallel.h)
};

struct ShapeResult {
  TensorType out;
  std::vector<ParamDecl> params;
  std::vector<ShapeError> errors;
};
using ShapeRule = ShapeResult (*)(const ShapeInput&);

// Declared here, not in compiler/ir/graph.h or backward_rules.h (which include this header), so
// that an entry can name its backward rule.
class BackwardBuilder;     // compiler/ir/backward_rules.h
struct Operation;          // compiler/ir/graph.h
using ValueId = uint32_t;  // an index into Sequence::values
// Emits the backward of `forward`, whose result's gradient is `dy` (never kNoValue). The rules
// are in compiler/ir/backward_rules.cpp (namespace backward).
using BackwardRule = void (*)(BackwardBuilder& builder, const Operation& forward, ValueId dy);

struct PointwiseDef;  // compiler/ir/pointwise_ops.h

struct OpInfo {
  OpKind kind;
  std::string_view name;  // as written in .fuse (internal ops: as printed)
  KernelFamily family;
  std::span<const AttrSpec> attrs;
  ShapeRule shape_rule;        // user ops; internal ops are typed by the pass that makes them
  std::string_view shape_doc;  // e.g. "[..., in] -> [..., out]"
  std::string_view doc;        // one sentence for docs/language.md and `fusec ops`
  // User ops; nullptr for internal ops, which build-backward never differentiates (it runs on
  // the forward ops as written, before any pass makes an internal op).
  BackwardRule backward = nullptr;
  // Pointwise ops and their backward: the definition (nullptr for the other ops).
  const PointwiseDef* pointwise = nullptr;
};

const OpInfo& op_info(OpKind kind);  // every kind, pointwise ones included
bool is_internal(OpKind kind);
// User ops only: internal ops cannot be written in a .fuse file.
const OpInfo* find_op(std::string_view name);
std::span<const OpInfo> all_ops();  // user ops, in table order (pointwise ops after bias)

// Pointwise kinds (see OpKind): the forward op of a definition, its backward, and the tests.
OpKind pointwise_kind(const PointwiseDef& def);
OpKind pointwise_backward_kind(const PointwiseDef& def);
bool is_pointwise(OpKind kind);           // a forward pointwise op (plain or gated)
bool is_pointwise_backward(OpKind kind);  // the backward of one
// The definition of a pointwise op or of its backward; nullptr for other kinds.
const PointwiseDef* pointwise_def(OpKind kind);
// Closest op name within edit distance 2, for "did you mean" hints; empty if none.
std::string suggest_op(std::string_view name);

}  // namespace opfuse::ir
