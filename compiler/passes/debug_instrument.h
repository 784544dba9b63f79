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

}  // namespace opfuse::passes
