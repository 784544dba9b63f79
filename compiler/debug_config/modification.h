// What TE's modify_tensor call returns, in compiled form (docs/debugging.md, "C++ features"): a
// feature that answers modify_tensor_enabled for a GEMM operand describes how that operand is
// replaced, and the plan variant computes it in front of that one GEMM (passes/debug_modify.h).
#pragma once

#include <cstdint>
#include <string>

#include "debug/names.h"
#include "ir/graph.h"
#include "ir/scalar_expr.h"

namespace opfuse::debug {

struct Modification {
  enum class Kind : uint8_t {
    // Quantize-dequantize through `format` with per-tensor current scaling (TE's FakeQuant:
    // scale = fp8_max / amax, no epsilon; amax 0, Inf or NaN gives scale 1). The result is in
    // the tensor's high-precision dtype.
    FakeQuant,
    // The GEMM's FP8 cast of this operand uses per-tensor current scaling (TE's
    // PerTensorScaling); nothing to do for a GEMM in high precision.
    PerTensorScaling,
    // y = f(x) elementwise, f a scalar expression of var(0) evaluated in fp32, stored in the
    // tensor's dtype.
    Pointwise,
  };
  Kind kind = Kind::FakeQuant;
  plan::DType format = plan::DType::E4M3;  // FakeQuant
  ir::scalar::Graph graph;                 // Pointwise
  ir::scalar::NodeId value = 0;            // Pointwise: the node of `graph` that is f(x)
  std::string description;                 // Pointwise: what it does, for readers (may be empty)

  static Modification fake_quant(plan::DType format);
  static Modification per_tensor_scaling();
  // `value` must depend on var(0) only.
  static Modification pointwise(ir::scalar::Graph graph, ir::scalar::NodeId value,
                                std::string description = {});

  // A text naming the computation (part of the plan variant's key).
  std::string key() const;
  // For `fusec debug-plan` and the debug log: "quantize-dequantize through e4m3, per-tensor
  // current scaling".
  std::string describe() const;
};

// The quantizer role that casts an operand tensor (activation: input; gradient: grad_output).
ir::QuantizerRole role_of(TensorKind tensor);

// Adds the modification of `tensor` as `gemm` of `layer` reads it to `seq` (feature: the name of
// the feature doing it): FakeQuant and Pointwise as an ir::TensorModification, PerTensorScaling as
// a quantizer override of that GEMM's copy (when the GEMM is quantized). Returns an error message
// for what cannot be compiled (empty: done).
std::string add_modification(ir::Sequence& seq, const std::string& layer, GemmRole gemm,
                             TensorKind tensor, bool gemm_quantized, const std::string& feature,
                             const Modification& modification);

}  // namespace opfuse::debug
