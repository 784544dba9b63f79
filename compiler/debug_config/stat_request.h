// One entry of a feature's `stats:` list, understood (docs/debugging.md, "Statistics"):
// LogTensorStats' `max` or `{max_blockwise_dynamic_range: {block_size: 32, dims: 2}}`,
// LogFp8TensorStats' `[recipe_]stat[_columnwise]` such as `fp8_current_scaling_mse_columnwise`.
#pragma once

#include <optional>
#include <string>

#include "debug/stats.h"
#include "debug_config/config_node.h"
#include "plan/enums.h"

namespace opfuse::debug {

struct StatRequest {
  std::string name;  // the stat part of the metric name, as logged
  StatKind kind = StatKind::Max;
  // Quantized statistics: a what-if recipe ("as if this tensor were quantized with it": an extra
  // cast); nullopt: the tensor's own quantization.
  std::optional<plan::ScalingKind> recipe;
  bool columnwise = false;  // of the column-wise copy (the one wgrad or dgrad reads)
  int block_size = 0;       // max_blockwise_dynamic_range
  int dims = 1;
  friend bool operator==(const StatRequest&, const StatRequest&) = default;
};

// Reads one entry for `family`. On a bad entry returns nullopt with `error` (and maybe `hint`).
std::optional<StatRequest> parse_stat_request(const ConfigNode& entry, StatFamily family,
                                              std::string& error, std::string& hint);

}  // namespace opfuse::debug
