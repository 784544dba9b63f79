// The IR: a program is a set of sequences; a sequence is a list of ops over SSA values.
// Values are created once and never reassigned; every op carries its .fuse location.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/op_table.h"
#include "ir/recipe.h"
#include "ir/types.h"
#include "plan/capture_slot.h"
#include "plan/parallel.h"
#include "plan/quant_spec.h"
#include "plan/stat_slot.h"
#include "support/source_manager.h"

namespace opfuse::ir {

// ValueId, an index into Sequence::values, is declared in ir/op_table.h (BackwardRule names it).
inline constexpr ValueId kNoValue = ~ValueId(0);

// OutputGrad: the gradient backward receives for a sequence output (see Sequence::output_grads).
enum class ValueKind : uint8_t { Input, Param, Result, OutputGrad };

// Forward ops run in forward(); backward ops (made by the build-backward pass) in backward().
using plan::Phase;
using plan::phase_name;

struct Value {
  ValueId id = 0;
  ValueKind kind = ValueKind::Result;
  TensorType type;
  // Input: the signature name. Param: "<instance>.<role>" (e.g. "up_proj.weight"). Result: "".
  std::string name;
  int32_t producer = -1;  // index of the producing op for results
  // An FP8 value made by cast_fp8: the index of its quantizer in Sequence::quantizers (GEMMs
  // read its scale_inv); -1 otherwise.
  int32_t quantizer = -1;
  // Param: how it starts out, as the owning op's shape rule declared it.
  ParamInit init{};
  // Param of a tensor-parallel sequence: how the unsharded parameter is cut into this rank's.
  plan::ShardSpec shard{};
};

// Which GEMM operand a quantizer serves (TE's names); gradients use E5M2 under HYBRID.
using plan::quantizer_role_name;
using plan::QuantizerRole;

// One quantizer (note "Quantization specs" in docs/architecture.md): how it scales (its spec,
// expanded from the sequence's recipe by plan-quantization, or an override's), which copies it
// makes, and the high-precision value it casts. Its state (amax history, scale, scale_inv) lives
// on the device at run time.
struct QuantizerDecl {
  std::string name;  // "<layer>.<role>": "fc1.input", "fc1.weight", "fc1.grad_output"
  QuantizerRole role = QuantizerRole::Input;
  plan::QuantSpec spec;
  plan::Usages usages;  // rowwise: the copy GEMMs read as is; columnwise: the K-major copy
  // How the column-wise copy is stored: transposed ([k, rows...]) for TN-only FP8 GEMMs
  // (plan/gemm_caps.h), else with the source's layout.
  plan::CopyLayout columnwise_layout = plan::CopyLayout::Transposed;
  ValueId source = kNoValue;  // the high-precision value it casts
  // A quantized input's (note "Quantized boundaries" in docs/architecture.md): the caller gives
  // its copies and scale_inv; it casts nothing (source stays kNoValue) and keeps no state.
  bool boundary = false;
  DType format() const { return spec.format; }
};

// A quantized main input or output (docs/language.md, "Quantized inputs and outputs"): the copies
// it carries and where the signature declares them. Its format and scales are those the
// sequence's recipe gives a linear's input; plan-quantization makes the copies real.
struct QuantizedBoundary {
  plan::Usages usages;
  DType format = DType::E4M3;  // as declared
  SourceLoc loc;               // of the word `quantized`
  // Set by plan-quantization: the column-wise copy (an input value, or the output's cast's
  // result; kNoValue without one). The row-wise copy is the input / output value itself.
  ValueId columnwise = kNoValue;
};

// Where an override applies: the quantizers of layers whose instance name matches `layer`
// (empty: every layer), of one GEMM of the layer's (fprop / dgrad / wgrad; none: all three) and
// one tensor role (none: all). The precision-debug features, `linear(..., precision = high)` (the
// builder) and tests write these.
struct QuantOverride {
  std::string layer;
  std::optional<plan::GemmRole> gemm;
  std::optional<QuantizerRole> tensor;
  // High precision: the GEMMs it selects run in the sequence's high-precision dtype (no cast).
  // Otherwise the quantizers it selects use `spec` instead of the recipe's.
  bool high_precision = false;
  plan::QuantSpec spec;
};

// A GEMM operand replaced for one GEMM by a precision-debug feature (TE's modify_tensor): the
// debug-modify pass (passes/debug_modify.h) computes it in front of that GEMM op only; the other
// GEMMs reading the tensor read it unchanged. Set from a debug config's routing.
struct TensorModification {
  std::string layer;
  plan::GemmRole gemm = plan::GemmRole::Fprop;
  QuantizerRole tensor = QuantizerRole::Input;  // activation: input, weight, gradient: grad_output
  std::string feature;                          // the feature's name, for readers
  // Quantize-dequantize through this format with per-tensor current scaling (FakeQuant); or,
  // when not set, `expression` (compiler/ir/scalar_code.h) applied elementwise.
  std::optional<DType> fake_quant;
  std::string expression;
};

struct Operation {
  OpKind kind = OpKind::Identity;
  Phase phase = Phase::Forward;
  // User ops: operands[0] is the main stream; then params; then the extra input. Internal ops:
  // as op_table.cpp documents each.
  std::vector<ValueId> operands;
  std::vector<ValueId> results;  // user ops: one; norms gain their saved statistics (mean, rstd)
  AttrList attrs;
  std::string instance;  // layer name: from `as NAME`, else "<op>_<k>" (k counts that op kind)
  SourceLoc loc;
  int32_t quantizer = -1;  // cast_fp8 and quantize: index into Sequence::quantizers
  // A fused op (OpKind::Fused): the ops it replaced, in order. Its operands are the values its
  // parts read from outside, its results the values they make that are used outside.
  std::vector<Operation> parts;
};

struct SequenceOutput {
  std::string name;
  ValueId value = 0;
  SourceLoc loc;
};

struct Sequence {
  std::string name;
  SourceLoc loc;
  std::vector<ValueId> inputs;          // inputs[0] is the main stream; the rest are extra inputs
  std::vector<SequenceOutput> outputs;  // outputs[0] is the main stream's final value
  std::vector<ValueId> params;          // in order of creation
  // The main input / output when declared quantized; until plan-quantization their values carry
  // the dequantized (bf16) type, so every op and rule sees a high-precision tensor.
  std::optional<QuantizedBoundary> quantized_input;
  std::optional<QuantizedBoundary> quantized_output;
  std::vector<Operation> ops;
  std::vector<Value> values;  // indexed by ValueId
  Recipe recipe;
  bool fp8_weights = false;  // TE's quantized_model_init: weights stored in FP8 only
  // Float8 block-scaled quantizers make decoded high-precision copies (emulated_cast) for BF16
  // GEMMs instead of FP8 copies with scale grids (note "Emulated block scaling" in
  // docs/architecture.md). Set by the compile driver where the target has no block-scale GEMM
  // modes (plan/gemm_caps.h) or its options ask for it; read by plan-quantization.
  bool emulate_block_scaling = false;
  // `with parallel(tp = N, sp = ...)`: the sequence as one of N ranks runs it (every shape and
  // parameter is the rank's; collective ops join the ranks). tp = 1: one GPU, no collectives.
  plan::ParallelSpec parallel{};

  // Made by build-backward (empty before): one per output / input / param, signature order.
  bool has_backward = false;
  std::vector<ValueId> output_grads;  // ValueKind::OutputGrad values seeded by the caller
  std::vector<ValueId> input_grads;
  std::vector<ValueId> param_grads;
  // Per-layer / per-GEMM / per-tensor quantization choices that replace the recipe's default,
  // in order (a later one wins where two select the same quantizer). Read by plan-quantization.
  std::vector<QuantOverride> quant_overrides;
  // Statistics records the debug-instrument pass gives TensorStats ops (slot = index); set from a
  // debug config's routing by the compile driver, empty otherwise.
  std::vector<plan::StatSlot> inspections;
  // Tensor captures the debug-instrument pass gives TensorCapture ops (slot = index), likewise.
  std::vector<plan::CaptureSlot> captures;
  // GEMM operands a debug config's routing replaces; the debug-modify pass applies and clears them.
  std::vector<TensorModification> modifications;
  // Made by plan-quantization; empty under the bf16 recipe.
  std::vector<QuantizerDecl> quantizers;

  const Value& value(ValueId id) const { return values.at(id); }
  // Appends a value and returns its id.
  ValueId add_value(ValueKind kind, TensorType type, std::string name = {});
  // Symbolic dimensions used anywhere in the sequence, sorted (bound at run time).
  std::vector<std::string> symbols() const;
};

// A fusion pattern declared with `fusion` or through the compile options (docs/language.md,
// "Declared fusions"). The fuse passes try it with the built-in patterns of its phase, by
// priority (built-ins have 0; ties keep declaration order, built-ins first).
struct DeclaredFusion {
  struct Step {
    OpKind kind = OpKind::Fused;
    std::string user_op;  // a user-defined op's name (kind is its carrier); empty: any op of kind
    bool optional = false;
  };
  std::string name;
  Phase phase = Phase::Forward;
  int priority = 1;
  std::vector<Step> steps;  // each reads the first result of the last step present before it
  SourceLoc loc;
};

struct Program {
  std::vector<Sequence> sequences;
  std::vector<Recipe> recipes;          // declared recipes, in declaration order
  std::vector<DeclaredFusion> fusions;  // in declaration order

  const Sequence* find_sequence(std::string_view name) const;
};

}  // namespace opfuse::ir
