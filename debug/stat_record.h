// One logged statistic: what the statistics log writes (one JSON object per line, beside TE's text
// format) and what `fusec debug-report` reads back. docs/debugging.md, "Log files", documents the
// line format:
//   {"layer":"fc1","tensor":"activation","gemm":null,"stat":"max","iteration":3,"value":1.25}
// `gemm` is null for statistics of a tensor (LogTensorStats) and the GEMM's name where the
// statistic belongs to one GEMM's quantized operand. Non-finite values are written as the strings
// "nan", "inf" and "-inf" (JSON has no literal for them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace opfuse::debug {

struct StatRecord {
  std::string layer;   // the .fuse layer name (`as fc1`)
  std::string tensor;  // activation, weight, gradient, output, wgrad, dgrad
  std::string gemm;    // fprop, dgrad, wgrad; empty: the statistic is of the tensor
  std::string stat;    // as configured: "max", "underflows%", "fp8_current_scaling_mse", ...
  int64_t iteration = 0;
  double value = 0;
  friend bool operator==(const StatRecord&, const StatRecord&) = default;
};

// TE's metric name: "{layer}_{tensor}_{stat}" (the GEMM is not part of it).
std::string metric_name(const StatRecord& r);

// One JSON line, without the newline.
std::string format_json_line(const StatRecord& r);

// Parses one line written by format_json_line. On a malformed line returns nullopt and sets
// `error` to what is wrong with it (the caller adds file and line number).
std::optional<StatRecord> parse_json_line(std::string_view line, std::string& error);

}  // namespace opfuse::debug
