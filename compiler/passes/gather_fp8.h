// gather-fp8 (TE's FP8 all-gather, docs/parallel.md "FP8 across ranks"): under sequence
// parallelism a column-parallel linear's input, and a row-parallel linear's output gradient in
// backward, arrive as an all_gather of the ranks' token shares that plan-quantization then casts
// to FP8. Where the gathered tensor feeds nothing but that per-tensor cast, this pass casts each
// rank's share instead (row-wise only, which the norm or activation before it can fold), gathers
// the FP8 codes (half the bytes of bf16 on the wire) and makes the column-wise copy from the
// gathered codes (fp8_transpose). Every rank casts with the scale of the whole tensor (delayed
// scaling: the amaxes are max-reduced over the ranks in step(); current scaling: before the
// scale is derived), so the codes equal those the cast after the gather made.
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

bool gather_fp8(ir::Program& program);

}  // namespace opfuse::passes
