// plan-quantization (DESIGN.md 3, "Quantization planning"): under an FP8 recipe, gives every GEMM
// operand a quantizer (E4M3 forward; E5M2 gradients under HYBRID, E4M3 under the E4M3 format) and
// inserts the cast_fp8 op that makes its FP8 copies: the row-wise copy the GEMM reads and, where a
// backward GEMM needs it, the column-wise (transposed) copy, because cuBLASLt FP8 on Hopper takes
// only the TN layout. Each cast sits right before its first consumer so that the fusion passes
// find it next to the producing kernel and fold it in. The bf16 recipe adds nothing.
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

bool plan_quantization(ir::Program& program);

}  // namespace opfuse::passes
