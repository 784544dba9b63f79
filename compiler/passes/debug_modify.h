// debug-modify (docs/debugging.md, "Modifying GEMM operands"): computes each GEMM operand a debug
// config's routing replaces (Sequence::modifications, TE's modify_tensor) in a modify_tensor op
// placed right before that one GEMM op, which then reads the op's result; the other GEMMs reading
// the tensor (an activation feeds fprop and wgrad, a weight fprop and dgrad, a gradient dgrad and
// wgrad) keep reading it unchanged. Fake quantization gets its own current-scaling quantizer
// ("<layer>.<role>.fake_quant_<gemm>"); a pointwise modification carries its expression. Runs
// after debug-instrument (statistics read the tensor as the layer received it, as TE's
// inspect_tensor does) and before plan-quantization (a quantized GEMM casts the modified tensor
// with a quantizer of its own). Modifications of a GEMM the sequence lacks (no backward) are
// dropped; a sequence without modifications is left unchanged.
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

bool debug_modify(ir::Program& program);

}  // namespace opfuse::passes
