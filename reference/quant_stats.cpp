#include "quant_stats.h"

#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "quantizer_math.h"

namespace opfuse::cpu {

namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

// NaN-propagating min/max (debug/stats.h's rule: a NaN anywhere makes the statistic NaN).
double nan_min(double a, double b) {
  return std::isnan(a) ? a : (std::isnan(b) ? b : std::fmin(a, b));
}
double nan_max(double a, double b) {
  return std::isnan(a) ? a : (std::isnan(b) ? b : std::fmax(a, b));
}

// 2^k as a float for -127 <= k <= 127 (2^-127 is subnormal), built from its bits as the device
// does.
float pow2f(int k) {
  if (k >= -126) return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
  return std::bit_cast<float>(uint32_t{0x00400000});  // 2^-127
}

// The scale of one block (or of the whole tensor) and what the statistics need of it.
struct BlockScale {
  float scale = 1.0f;      // the multiplier before the FP8 cast
  float scale_inv = 1.0f;  // the dequantization factor
};

BlockScale block_scale(const QuantStatsCast& c, float amax, float fp8_max) {
  if (c.cast == plan::QuantStatCast::Mxfp8) {
    const uint8_t e = e8m0_round_up(amax / fp8_max);
    if (e == 0xFF) return {kNaNf, kNaNf};
    return {pow2f(127 - int(e)), pow2f(int(e) - 127)};
  }
  const bool block = c.cast == plan::QuantStatCast::Float8Block;
  const bool pow2 = block ? c.block_power_of_2 : c.power_of_2;
  const float eps =
      block ? c.block_epsilon : (c.cast == plan::QuantStatCast::Quantizer ? c.epsilon : 0.0f);
  const CurrentScale s = compute_current_scale(amax, fp8_max, eps, pow2);
  return {s.scale, s.scale_inv};
}

struct Element {
  bool underflow = false;
  double sq_err = 0;
};

Element cast_one(float v, const BlockScale& s, Fp8Format format) {
  const float q = fp8_to_float(float_to_fp8(v * s.scale, format), format);
  const float dq = q * s.scale_inv;
  const double err = double(v) - double(dq);
  // NaN != 0 holds, but a NaN's cast is NaN, not 0: a NaN is not an underflow.
  return {v != 0.0f && q == 0.0f, err * err};
}

}  // namespace

debug::QuantizedMoments quantized_stats(std::span<const float> x, int64_t rows, int64_t cols,
                                        const QuantStatsCast& c,
                                        debug::ExponentHistogram* histogram) {
  if (histogram != nullptr) *histogram = {};
  if (rows < 0 || cols < 0 || uint64_t(rows) * uint64_t(cols) != x.size()) {
    throw std::invalid_argument(
        fmt::format("quantized_stats: {} values for a {} x {} tensor", x.size(), rows, cols));
  }
  const bool blocked =
      c.cast == plan::QuantStatCast::Float8Block || c.cast == plan::QuantStatCast::Mxfp8;
  if (blocked && c.block_size < 1) {
    throw std::invalid_argument("quantized_stats: a block cast needs a block size");
  }
  const float fp8_max = cpu::fp8_max(c.format);
  debug::QuantizedMoments m;
  m.count = int64_t(x.size());
  if (!blocked) {
    BlockScale s{c.scale, c.scale_inv};
    if (c.cast != plan::QuantStatCast::Quantizer || !c.delayed) {
      float amax = 0.0f;
      for (const float v : x)
        amax = std::isnan(v) || std::isnan(amax) ? kNaNf : std::fmax(amax, std::fabs(v));
      s = block_scale(c, amax, fp8_max);
    }
    const bool count_overflows = c.cast == plan::QuantStatCast::Quantizer && c.delayed;
    const float overflow_above = fp8_max * s.scale_inv;
    for (const float v : x) {
      const Element e = cast_one(v, s, c.format);
      m.underflows += e.underflow;
      m.sq_err += e.sq_err;
      if (count_overflows && std::fabs(v) > overflow_above) ++m.overflows;
    }
    m.scale_inv_min = m.scale_inv_max = s.scale_inv;
    return m;
  }
  const int64_t b = c.block_size;
  const int64_t bh = c.dims == 2 || c.columnwise ? b : 1;
  const int64_t bw = c.dims == 2 || !c.columnwise ? b : 1;
  for (int64_t r0 = 0; r0 < rows; r0 += bh) {
    for (int64_t c0 = 0; c0 < cols; c0 += bw) {
      const int64_t r1 = std::min(rows, r0 + bh), c1 = std::min(cols, c0 + bw);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = c0; k < c1; ++k) {
          const float v = x[size_t(r * cols + k)];
          amax = std::isnan(v) || std::isnan(amax) ? kNaNf : std::fmax(amax, std::fabs(v));
        }
      const BlockScale s = block_scale(c, amax, fp8_max);
      bool any_underflow = false;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = c0; k < c1; ++k) {
          const Element e = cast_one(x[size_t(r * cols + k)], s, c.format);
          any_underflow |= e.underflow;
          m.underflows += e.underflow;
          m.sq_err += e.sq_err;
        }
      ++m.blocks;
      m.underflow_blocks += any_underflow;
      m.scale_inv_min = nan_min(m.scale_inv_min, s.scale_inv);
      m.scale_inv_max = nan_max(m.scale_inv_max, s.scale_inv);
      if (std::isfinite(amax) && amax > 0.0f) {
        const double l = std::log2(double(s.scale_inv));
        ++m.scaled_blocks;
        m.log2_scale_inv_sum += l;
        m.log2_scale_inv_sq_sum += l * l;
      }
      if (histogram != nullptr) {
        if (const int bin = debug::exponent_bin(amax, s.scale_inv); bin >= 0)
          ++histogram->bins[bin];
      }
    }
  }
  return m;
}

}  // namespace opfuse::cpu
