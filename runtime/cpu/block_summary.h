// Note "Block summaries": what `fusec run` prints per step for each copy of a block-scaled or
// micro-scaled quantizer, which keeps no tensor scale to show (float8_block_scaling, MXFP8) or
// more scales than the tensor's (NVFP4). One summary per quantized copy (the row-wise and the
// column-wise copy have grids of their own):
//   - blocks: the copy's blocks, each counted once: the padding entries of a scale grid
//     (block_quantization.h, note "Block scale grids") are no blocks, and a 16 x 16 NVFP4 block,
//     whose scale is stored on each of its 16 rows, is one;
//   - zero_blocks: blocks whose amax is 0, the amax the cast takes (fmaxf over |x| from 0, NaN
//     skipped, over the values the copy quantizes: an RHT copy's transformed ones). A Float8
//     copy's are told from the copy alone, which every GEMM reads and so always exists (its
//     source may not: a cast folded into an activation keeps it in registers): a block whose
//     codes are all +-0 or NaN. That is a block of amax 0, but for blocks whose values all round
//     to 0, which only amax_epsilon far above them (or fp32 subnormals) can make;
//   - scale_inv_min / _max: over the blocks, the factor that decodes a block as stored: Float8
//     block scaling's FP32 scale_inv, MXFP8's 2^(e - 127), NVFP4's E4M3 block scale s_b (its
//     per-tensor S_dec comes on top: the copy's tensor scale is shown beside it).
// The GPU computes the same (templates/block_summary.cuh, runtime/gpu/block_summaries.h), bit for
// bit, from the same scales.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "block_quantization.h"  // same directory: works with or without runtime/ on the include path
#include "micro_scaling.h"

namespace opfuse::cpu {

struct BlockSummary {
  int64_t blocks = 0;
  int64_t zero_blocks = 0;
  float scale_inv_min = 0.0f;  // 0 and 0 for a copy without blocks
  float scale_inv_max = 0.0f;
  friend bool operator==(const BlockSummary&, const BlockSummary&) = default;
};

// The summary of a block-scaled copy (either: its blocks run along the rows of the stored
// matrix, 1 x 128, or 128 x 128 with two_d) of FP8 `format`. Throws std::invalid_argument when
// its data or grid do not fit its shape.
BlockSummary summarize_block_copy(const BlockQuantizedCopy& copy, Fp8Format format, bool two_d);
// The summary of an MXFP8 / NVFP4 copy of x (the source the copy was quantized from, before any
// Hadamard transform). Throws std::invalid_argument when the copy does not fit x.
BlockSummary summarize_mxfp8_copy(std::span<const float> x, const Mxfp8Copy& copy);
BlockSummary summarize_nvfp4_copy(std::span<const float> x, const Nvfp4Copy& copy);

// A block's shape as `fusec run` prints it, in the source's orientation: "1x128", "128x1",
// "128x128", "1x32", "32x1", "1x16", "16x1", "16x16".
std::string block_shape_name(int block_rows, int block_cols);

}  // namespace opfuse::cpu
