// plan-quantization (docs/design.md, "Quantization planning"): under an FP8 recipe, gives every
// GEMM operand a quantizer (E4M3 forward; E5M2 gradients under HYBRID, E4M3 under the E4M3 format)
// and inserts the cast_fp8 op that makes its FP8 copies: the row-wise copy the GEMM reads and,
// where a backward GEMM needs it, the column-wise (transposed) copy, because cuBLASLt FP8 on Hopper
// takes only the TN layout. Per-layer, per-GEMM and per-tensor overrides
// (Sequence::quant_overrides) replace the recipe's spec of a quantizer or keep a GEMM in high
// precision. Each cast sits right before its first consumer so that the fusion passes find it next
// to the producing kernel and fold it in. The bf16 recipe adds nothing.
#pragma once

#include <optional>

#include "ir/graph.h"

namespace opfuse::passes {

bool plan_quantization(ir::Program& program);

// The spec the sequence's recipe gives the quantizer of `role` (before overrides): delayed or
// current scaling, E5M2 for gradients under the HYBRID format, blocks by role under the block
// recipes; `gemm`: the one GEMM the quantizer's copy serves, where the spec depends on it (NVFP4's
// Hadamard transform is for wgrad's copies only).
plan::QuantSpec recipe_spec(const ir::Recipe& recipe, ir::QuantizerRole role,
                            std::optional<plan::GemmRole> gemm = std::nullopt);

}  // namespace opfuse::passes
