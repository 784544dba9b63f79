// debug-instrument (docs/debugging.md, "Plan variants"): places a tensor_stats op at each
// statistics record a debug config's routing asked for (Sequence::inspections, set by the compile
// driver): the layer's activation and weight where its fprop reads them, its output after fprop,
// its gradient where its first backward GEMM reads it, its dgrad and wgrad after those GEMMs. The
// op reads the high-precision tensor, so a fusion that kept that tensor inside one kernel (the
// norm's FP8 cast, a GEMM epilogue) leaves it in memory instead: only an inspected tensor loses
// its fusion. Records whose tensor the sequence lacks (a gradient without backward) are dropped.
// Tensor captures (Sequence::captures: DumpTensors, C++ features' inspect_tensor) get a
// tensor_capture op at the same places, after the statistics ops of the same tensor. A sequence
// without inspections or captures is left unchanged.
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

bool debug_instrument(ir::Program& program);

// debug-capture-quantized: the captures of FP8 copies (plan::CaptureSlot::quantized, which
// debug-instrument keeps without an op): a tensor_capture op right before the GEMM that reads the
// copy (the layer's fprop for its activation and weight, its dgrad for its gradient), reading the
// GEMM's FP8 operand, with that operand's quantizer (whose scale_inv the capture copies). Runs
// after plan-quantization, before fusion (an op between a cast and its GEMM leaves the casts'
// fusions into norms and activations alone).
bool debug_capture_quantized(ir::Program& program);

}  // namespace opfuse::passes
