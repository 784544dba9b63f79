// One statistics record of an instrumented plan variant (precision-debug features).
#pragma once

#include <string>

namespace opfuse::plan {

// What one statistics record measures (docs/debugging.md, "Statistics on the device"): the
// executor keeps one record per slot (debug/stats.h's TensorMoments layout), written by the
// tensor_stats kernels of an instrumented plan variant and read back after the run.
struct StatSlot {
  std::string layer;   // the layer's name (`as fc1`)
  std::string tensor;  // activation, weight, gradient, output, dgrad, wgrad
  int block_size = 0;  // max_blockwise_dynamic_range's blocks; 0: not measured
  int dims = 1;        // 1: blocks along a row; 2: square tiles
  friend bool operator==(const StatSlot&, const StatSlot&) = default;
};

}  // namespace opfuse::plan
