#include "debug/stats.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

namespace opfuse::debug {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// min/max that keep a NaN from either side: std::min/std::max return one argument or the other
// depending on position when a NaN is involved, which would make a NaN in x vanish or not
// depending on where it sits (and on the merge order).
double nan_min(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return b < a ? b : a;
}
double nan_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return b > a ? b : a;
}

// log2(top) - log2(bottom) of a range of nonzero magnitudes; 0 when there was no nonzero value
// (top still 0); NaN when either end is NaN.
double log2_range(double bottom, double top) {
  if (std::isnan(bottom) || std::isnan(top)) return kNaN;
  if (top == 0) return 0;
  return std::log2(top) - std::log2(bottom);
}

const StatInfo& info(StatKind kind) {
  for (const StatInfo& s : kStatTable)
    if (s.kind == kind) return s;
  throw std::invalid_argument(fmt::format("unknown statistic kind {}", static_cast<int>(kind)));
}

void require_family(StatKind kind, StatFamily family) {
  if (info(kind).family != family) {
    throw std::invalid_argument(fmt::format(
        "statistic '{}' is a {} statistic", info(kind).name,
        info(kind).family == StatFamily::Tensor ? "LogTensorStats" : "LogFp8TensorStats"));
  }
}

}  // namespace

std::string_view stat_name(StatKind kind) {
  for (const StatInfo& s : kStatTable)
    if (s.kind == kind) return s.name;
  return "?";
}

std::optional<StatKind> parse_stat(std::string_view name) {
  for (const StatInfo& s : kStatTable)
    if (s.name == name) return s.kind;
  return std::nullopt;
}

StatFamily stat_family(StatKind kind) { return info(kind).family; }

TensorMoments moments_of(std::span<const float> x) {
  TensorMoments m;
  m.count = static_cast<int64_t>(x.size());
  if (x.empty()) return m;
  // Two passes: the mean first, then squared deviations from it. Welford's one-pass update would
  // turn [inf, 1] into a NaN mean (inf + (1 - inf) / 2); the two-pass sum keeps it inf and is the
  // more accurate M2 besides.
  double sum = 0;
  for (const float v : x) {
    const double d = v;
    const double a = std::fabs(d);
    sum += d;
    m.sum_abs += a;
    m.sum_sq += d * d;
    m.min = nan_min(m.min, d);
    m.max = nan_max(m.max, d);
    m.amax = nan_max(m.amax, a);
    if (a != 0) {  // NaN is "nonzero" here, so it reaches the dynamic range too
      m.min_nonzero_abs = nan_min(m.min_nonzero_abs, a);
      m.max_nonzero_abs = nan_max(m.max_nonzero_abs, a);
    }
  }
  m.mean = sum / static_cast<double>(m.count);
  for (const float v : x) {
    const double dev = static_cast<double>(v) - m.mean;
    m.m2 += dev * dev;
  }
  return m;
}

TensorMoments merge(const TensorMoments& a, const TensorMoments& b) {
  // An empty side changes nothing; returning the other as is also keeps the record bitwise equal
  // to moments_of() when a micro-batch happens to be empty.
  if (a.count == 0 || b.count == 0) {
    TensorMoments m = a.count == 0 ? b : a;
    m.max_blockwise_dynamic_range =
        nan_max(a.max_blockwise_dynamic_range, b.max_blockwise_dynamic_range);
    return m;
  }
  TensorMoments m;
  m.count = a.count + b.count;
  const double na = static_cast<double>(a.count);
  const double nb = static_cast<double>(b.count);
  const double n = static_cast<double>(m.count);
  // Chan, Golub and LeVeque's pairwise update: M2 = M2a + M2b + delta^2 * na * nb / n, where
  // delta = mean_b - mean_a. (TE's merge gets the sign of a term wrong.)
  const double delta = b.mean - a.mean;
  if (std::isfinite(delta)) {
    m.mean = a.mean + delta * (nb / n);
  } else {
    // A side with an infinite or NaN mean: the weighted form keeps inf + finite = inf, where
    // a.mean + (b.mean - a.mean) * w would give inf - inf = NaN.
    m.mean = (a.mean * na + b.mean * nb) / n;
  }
  m.m2 = a.m2 + b.m2 + delta * delta * (na * (nb / n));
  m.min = nan_min(a.min, b.min);
  m.max = nan_max(a.max, b.max);
  m.sum_abs = a.sum_abs + b.sum_abs;
  m.sum_sq = a.sum_sq + b.sum_sq;
  m.amax = nan_max(a.amax, b.amax);
  m.min_nonzero_abs = nan_min(a.min_nonzero_abs, b.min_nonzero_abs);
  m.max_nonzero_abs = nan_max(a.max_nonzero_abs, b.max_nonzero_abs);
  m.max_blockwise_dynamic_range =
      nan_max(a.max_blockwise_dynamic_range, b.max_blockwise_dynamic_range);
  return m;
}

double value(const TensorMoments& m, StatKind kind) {
  require_family(kind, StatFamily::Tensor);
  const bool empty = m.count == 0;
  switch (kind) {
    case StatKind::Min:
      return empty ? kNaN : m.min;
    case StatKind::Max:
      return empty ? kNaN : m.max;
    case StatKind::Mean:
      return empty ? kNaN : m.mean;
    case StatKind::Std:
      if (empty) return kNaN;
      // One element: no spread (0), unless it was NaN or infinite (M2 NaN).
      if (m.count == 1) return std::isnan(m.m2) ? kNaN : 0.0;
      return std::sqrt(m.m2 / static_cast<double>(m.count - 1));
    case StatKind::L1Norm:
      return m.sum_abs;
    case StatKind::L2Norm:
      return std::sqrt(m.sum_sq);
    case StatKind::CurAmax:
      return m.amax;
    case StatKind::DynamicRange:
      return log2_range(m.min_nonzero_abs, m.max_nonzero_abs);
    case StatKind::MaxBlockwiseDynamicRange:
      return m.max_blockwise_dynamic_range;
    default:
      break;
  }
  throw std::invalid_argument("unreachable statistic kind");
}

double max_blockwise_dynamic_range(std::span<const float> x, int64_t rows, int64_t cols,
                                   int block_size, int dims) {
  if (rows < 0 || cols < 0 || (cols != 0 && rows > static_cast<int64_t>(x.size()) / cols) ||
      rows * cols != static_cast<int64_t>(x.size())) {
    throw std::invalid_argument(
        fmt::format("max_blockwise_dynamic_range: a {} x {} matrix needs {} values, got {}", rows,
                    cols, rows * cols, x.size()));
  }
  if (block_size < 1) {
    throw std::invalid_argument(fmt::format(
        "max_blockwise_dynamic_range: block_size must be positive, got {}", block_size));
  }
  if (dims != 1 && dims != 2) {
    throw std::invalid_argument(
        fmt::format("max_blockwise_dynamic_range: dims must be 1 or 2, got {}", dims));
  }
  const int64_t b = block_size;
  // A block is rows [r0, r1) x columns [c0, c1): dims 1 takes one row at a time.
  const int64_t row_step = dims == 1 ? 1 : b;
  double result = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += row_step) {
    const int64_t r1 = std::min(rows, r0 + row_step);
    for (int64_t c0 = 0; c0 < cols; c0 += b) {
      const int64_t c1 = std::min(cols, c0 + b);
      double top = 0;
      double bottom = std::numeric_limits<double>::infinity();
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const double a = std::fabs(static_cast<double>(x[static_cast<size_t>(r * cols + c)]));
          if (a != 0) {
            top = nan_max(top, a);
            bottom = nan_min(bottom, a);
          }
        }
      }
      // A block without a nonzero value (top 0) gives 0, which never raises the maximum: skipped.
      result = nan_max(result, log2_range(bottom, top));
    }
  }
  return result;
}

QuantizedMoments quantized_moments(std::span<const float> x, std::span<const float> dequantized,
                                   std::span<const float> scale_invs, double fp8_max) {
  if (x.size() != dequantized.size()) {
    throw std::invalid_argument(fmt::format(
        "quantized_moments: {} values but {} dequantized values", x.size(), dequantized.size()));
  }
  if (!(fp8_max > 0)) {
    throw std::invalid_argument(
        fmt::format("quantized_moments: fp8_max must be positive, got {}", fp8_max));
  }
  QuantizedMoments m;
  m.count = static_cast<int64_t>(x.size());
  for (const float s : scale_invs) {
    m.scale_inv_min = nan_min(m.scale_inv_min, s);
    m.scale_inv_max = nan_max(m.scale_inv_max, s);
  }
  const bool per_tensor = scale_invs.size() == 1;
  const double overflow_above = per_tensor ? fp8_max * static_cast<double>(scale_invs[0]) : 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double q = dequantized[i];
    // NaN != 0 holds but a NaN dequantized value is not 0: a NaN is not an underflow.
    if (v != 0 && q == 0) ++m.underflows;
    if (per_tensor && std::fabs(v) > overflow_above) ++m.overflows;
    const double err = v - q;
    m.sq_err += err * err;
  }
  return m;
}

QuantizedMoments merge(const QuantizedMoments& a, const QuantizedMoments& b) {
  QuantizedMoments m;
  m.count = a.count + b.count;
  m.underflows = a.underflows + b.underflows;
  m.overflows = a.overflows + b.overflows;
  m.sq_err = a.sq_err + b.sq_err;
  m.scale_inv_min = nan_min(a.scale_inv_min, b.scale_inv_min);
  m.scale_inv_max = nan_max(a.scale_inv_max, b.scale_inv_max);
  m.blocks = a.blocks + b.blocks;
  m.underflow_blocks = a.underflow_blocks + b.underflow_blocks;
  m.scaled_blocks = a.scaled_blocks + b.scaled_blocks;
  m.log2_scale_inv_sum = a.log2_scale_inv_sum + b.log2_scale_inv_sum;
  m.log2_scale_inv_sq_sum = a.log2_scale_inv_sq_sum + b.log2_scale_inv_sq_sum;
  return m;
}

QuantizedMoments as_quantized(const TensorMoments& record) {
  return std::bit_cast<QuantizedMoments>(record);
}

TensorMoments as_record(const QuantizedMoments& moments) {
  return std::bit_cast<TensorMoments>(moments);
}

bool is_per_block_stat(StatKind kind) {
  switch (kind) {
    case StatKind::UnderflowBlocks:
    case StatKind::ScaleInvLog2Min:
    case StatKind::ScaleInvLog2Max:
    case StatKind::ScaleInvLog2Mean:
    case StatKind::ScaleInvLog2Std:
    case StatKind::ScaleExponentHistogram:
      return true;
    default:
      return false;
  }
}

double value(const QuantizedMoments& m, StatKind kind) {
  require_family(kind, StatFamily::Quantized);
  const double n = static_cast<double>(m.count);
  const bool empty = m.count == 0;
  // No scale_inv seen: min is still +inf and max -inf.
  const bool no_scales = !(m.scale_inv_min <= m.scale_inv_max) && !std::isnan(m.scale_inv_min) &&
                         !std::isnan(m.scale_inv_max);
  switch (kind) {
    case StatKind::Underflows:
      return empty ? kNaN : 100.0 * static_cast<double>(m.underflows) / n;
    case StatKind::Overflows:
      return empty ? kNaN : 100.0 * static_cast<double>(m.overflows) / n;
    case StatKind::Mse:
      return empty ? kNaN : m.sq_err / n;
    case StatKind::ScaleInvMin:
      return no_scales ? kNaN : m.scale_inv_min;
    case StatKind::ScaleInvMax:
      return no_scales ? kNaN : m.scale_inv_max;
    case StatKind::UnderflowBlocks:
      return m.blocks == 0
                 ? kNaN
                 : 100.0 * static_cast<double>(m.underflow_blocks) / static_cast<double>(m.blocks);
    case StatKind::ScaleInvLog2Min:
      return no_scales ? kNaN : std::log2(m.scale_inv_min);
    case StatKind::ScaleInvLog2Max:
      return no_scales ? kNaN : std::log2(m.scale_inv_max);
    case StatKind::ScaleInvLog2Mean:
    case StatKind::ScaleInvLog2Std: {
      if (m.scaled_blocks == 0) return kNaN;
      const double b = static_cast<double>(m.scaled_blocks);
      const double mean = m.log2_scale_inv_sum / b;
      if (kind == StatKind::ScaleInvLog2Mean) return mean;
      const double var = m.log2_scale_inv_sq_sum / b - mean * mean;
      // Rounding can leave a tiny negative variance when every exponent is equal.
      return var > 0 ? std::sqrt(var) : (std::isnan(var) ? var : 0.0);
    }
    case StatKind::ScaleExponentHistogram:
      throw std::invalid_argument("scale_exponent_histogram has one value per bin (histogram_of)");
    default:
      break;
  }
  throw std::invalid_argument("unreachable statistic kind");
}

int exponent_bin(float amax, float scale_inv) {
  if (!std::isfinite(amax)) return kNonFiniteBin;
  if (amax == 0.0f) return -1;
  if (std::isnan(scale_inv)) return kNonFiniteBin;
  return static_cast<int>((std::bit_cast<uint32_t>(scale_inv) >> 23) & 0xFFu);
}

std::string exponent_bin_name(int bin) {
  if (bin == kNonFiniteBin) return "nonfinite";
  return "e" + std::to_string(bin - 127);
}

std::optional<int> parse_exponent_bin(std::string_view name) {
  for (int bin = 0; bin < kExponentBins; ++bin)
    if (exponent_bin_name(bin) == name) return bin;
  return std::nullopt;
}

ExponentHistogram histogram_of(std::span<const TensorMoments> records) {
  static_assert(sizeof(TensorMoments) == kCountsPerRecord * sizeof(int64_t));
  if (records.size() != size_t(kExponentHistogramRecords))
    throw std::invalid_argument("histogram_of: wrong number of records");
  ExponentHistogram h;
  for (int b = 0; b < kExponentBins; ++b) {
    const auto counts =
        std::bit_cast<std::array<int64_t, kCountsPerRecord>>(records[size_t(b / kCountsPerRecord)]);
    h.bins[b] = counts[size_t(b % kCountsPerRecord)];
  }
  return h;
}

void histogram_to_records(const ExponentHistogram& h, std::span<TensorMoments> records) {
  if (records.size() != size_t(kExponentHistogramRecords))
    throw std::invalid_argument("histogram_to_records: wrong number of records");
  for (size_t r = 0; r < records.size(); ++r) {
    std::array<int64_t, kCountsPerRecord> counts{};
    for (size_t k = 0; k < counts.size(); ++k) {
      const size_t b = r * kCountsPerRecord + k;
      counts[k] = b < size_t(kExponentBins) ? h.bins[b] : 0;
    }
    records[r] = std::bit_cast<TensorMoments>(counts);
  }
}

ExponentHistogram merge(const ExponentHistogram& a, const ExponentHistogram& b) {
  ExponentHistogram m;
  for (int i = 0; i < kExponentBins; ++i) m.bins[i] = a.bins[i] + b.bins[i];
  return m;
}

}  // namespace opfuse::debug
