// One statistics record of an instrumented plan variant (precision-debug features).
#pragma once

#include <string>

#include "plan/enums.h"

namespace opfuse::plan {

// Which layout a slot's record has (debug/stats.h): the moments of the high-precision tensor
// (LogTensorStats), the statistics of one cast of it (LogFp8TensorStats), or a part of the
// scale-exponent histogram of the cast in the Quantized record before it (11 of its counts).
enum class StatRecordKind : uint8_t { Moments, Quantized, ExponentHistogram };

// The cast a Quantized record measures (docs/debugging.md, "LogFp8TensorStats"): the layer's own
// quantizer of the tensor (its format and the scale the step's cast uses), or a what-if cast
// with per-tensor current scaling, Float8BlockScaling blocks (power-of-2 FP32 scales) or MXFP8
// blocks (E8M0 scales rounded up).
enum class QuantStatCast : uint8_t { Quantizer, Current, Float8Block, Mxfp8 };

template <>
struct EnumNames<StatRecordKind> {
  static constexpr std::pair<StatRecordKind, std::string_view> kNames[] = {
      {StatRecordKind::Moments, "moments"},
      {StatRecordKind::Quantized, "quantized"},
      {StatRecordKind::ExponentHistogram, "exponent_histogram"}};
};
template <>
struct EnumNames<QuantStatCast> {
  static constexpr std::pair<QuantStatCast, std::string_view> kNames[] = {
      {QuantStatCast::Quantizer, "quantizer"},
      {QuantStatCast::Current, "current"},
      {QuantStatCast::Float8Block, "float8_block"},
      {QuantStatCast::Mxfp8, "mxfp8"}};
};

// What one statistics record measures (docs/debugging.md, "Statistics on the device"): the
// executor keeps one 88-byte record per slot, written by the statistics kernels of an
// instrumented plan variant and read back after the run.
struct StatSlot {
  std::string layer;   // the layer's name (`as fc1`)
  std::string tensor;  // activation, weight, gradient, output, dgrad, wgrad
  // Moments: max_blockwise_dynamic_range's blocks (0: not measured). Quantized: the scale blocks
  // of a block cast (128 or 32; 0 for a per-tensor scale). A Quantizer cast with blocks is the
  // layer's own block-scaled quantizer whose settings differ from the Float8Block what-if's
  // (its blocks, power of 2 and epsilon are its spec's).
  int block_size = 0;
  int dims = 1;  // 1: blocks along a row (down a column when columnwise); 2: square tiles
  StatRecordKind record = StatRecordKind::Moments;
  // Quantized only:
  QuantStatCast cast = QuantStatCast::Quantizer;
  bool columnwise = false;     // dims-1 blocks run down the columns (the column-wise copy's)
  DType format = DType::E4M3;  // what-if casts: e4m3 or e5m2 (the quantizer's own otherwise)
  // A Quantized slot of a block cast whose scale-exponent histogram is logged: the next
  // debug::kExponentHistogramRecords slots are its ExponentHistogram parts (part 0, 1, ...; the
  // same layer, tensor and cast), written by the same kernels. Parts have no op of their own.
  bool exponent_histogram = false;
  int part = 0;
  friend bool operator==(const StatSlot&, const StatSlot&) = default;
};

}  // namespace opfuse::plan
