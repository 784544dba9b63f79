// The CPU reference of LogFp8TensorStats (docs/debugging.md, "LogFp8TensorStats"): one cast of a
// high-precision tensor, as the layer's quantizer or a what-if recipe would make it, measured
// against the tensor into a debug::QuantizedMoments record. templates/quant_stats.cuh computes
// the same on the device: every scale and every dequantized value bit for bit (the same fp32
// operations, one rounding each), the sums in a different order.
#pragma once

#include <cstdint>
#include <span>

#include "debug/stats.h"
#include "micro_scaling.h"  // e8m0_round_up
#include "numerics.h"
#include "plan/stat_slot.h"

namespace opfuse::cpu {

struct QuantStatsCast {
  plan::QuantStatCast cast = plan::QuantStatCast::Current;
  Fp8Format format = Fp8Format::E4M3;
  int block_size = 0;  // Float8Block / Mxfp8: 128 or 32
  int dims = 1;        // 1: 1 x block_size (block_size x 1 when columnwise); 2: square tiles
  bool columnwise = false;
  // Quantizer: a delayed-scaling quantizer's scale and scale_inv as the step's cast uses them
  // (overflows are counted), or a current-scaling one's epsilon and power_of_2 (the scale comes
  // from this tensor's amax).
  bool delayed = false;
  float scale = 1.0f;
  float scale_inv = 1.0f;
  float epsilon = 0.0f;
  bool power_of_2 = false;
  // Float8Block: the blocks' amax floor and power-of-2 rounding (the what-if's are TE's defaults;
  // a block-scaled quantizer's own cast has its spec's).
  float block_epsilon = 0.0f;
  bool block_power_of_2 = true;
};

// The statistics of casting the row-major rows x cols tensor x as `c` says:
//  - per-tensor (Quantizer, Current): q = fp8(x * scale), dequantized q * scale_inv; Current's
//    scale = fp8_max / amax (compute_current_scale, epsilon 0), amax = max |x| with a NaN giving
//    NaN (so scale 1);
//  - Float8Block: per block, the same with the block's amax and a power-of-2 scale;
//  - Mxfp8: per block, e = e8m0_round_up(amax / fp8_max), q = fp8(x * 2^(127 - e)), dequantized
//    q * 2^(e - 127).
// Only real blocks count (the last block of a row or column may be partial). With `histogram`,
// a block cast also counts each block's scale exponent there (debug::exponent_bin; a per-tensor
// cast leaves it empty). Throws std::invalid_argument for rows * cols != x.size() or a block cast
// without a block size.
debug::QuantizedMoments quantized_stats(std::span<const float> x, int64_t rows, int64_t cols,
                                        const QuantStatsCast& c,
                                        debug::ExponentHistogram* histogram = nullptr);

}  // namespace opfuse::cpu
