// The names a debug config uses for what it selects (docs/debugging.md, "Layers, GEMMs and
// tensors"): TE's six tensors of a linear layer and its three GEMMs (plan::GemmRole), with the
// GEMMs each tensor feeds.
#pragma once

#include <cstdint>
#include <span>

#include "plan/enums.h"

namespace opfuse::debug {

using plan::GemmRole;

// TE's tensor names. Activation, weight and gradient are GEMM operands (quantized under an FP8
// recipe); output, dgrad and wgrad are GEMM results (fprop's, dgrad's and wgrad's).
enum class TensorKind : uint8_t { Activation, Weight, Gradient, Output, Dgrad, Wgrad };

// True for the three GEMM operands: the only tensors with a quantized form to inspect.
constexpr bool is_operand(TensorKind t) {
  return t == TensorKind::Activation || t == TensorKind::Weight || t == TensorKind::Gradient;
}

// The GEMMs a tensor feeds (operands: the row-wise use first, then the column-wise one) or comes
// out of (results).
std::span<const GemmRole> gemms_of(TensorKind t);

// The two operand tensors of a GEMM, in TE's order (fprop: activation, weight; dgrad: gradient,
// weight; wgrad: gradient, activation).
std::span<const TensorKind> operands_of(GemmRole g);

// The result tensor of a GEMM.
TensorKind result_of(GemmRole g);

}  // namespace opfuse::debug

namespace opfuse::plan {
template <>
struct EnumNames<debug::TensorKind> {
  static constexpr std::pair<debug::TensorKind, std::string_view> kNames[] = {
      {debug::TensorKind::Activation, "activation"}, {debug::TensorKind::Weight, "weight"},
      {debug::TensorKind::Gradient, "gradient"},     {debug::TensorKind::Output, "output"},
      {debug::TensorKind::Dgrad, "dgrad"},           {debug::TensorKind::Wgrad, "wgrad"}};
};
}  // namespace opfuse::plan
