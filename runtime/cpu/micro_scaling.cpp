#include "micro_scaling.h"

#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "../../templates/common/philox.cuh"
#include "quantizer_math.h"

namespace opfuse::cpu {

namespace {

constexpr float kE2m1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
// 1 / (hi - lo) for the interval above each magnitude but the last (powers of 2: exact products).
constexpr float kE2m1InverseSteps[7] = {2.0f, 2.0f, 2.0f, 2.0f, 1.0f, 1.0f, 0.5f};
// fl(1 / 6), TE's fp4_max_inv.
constexpr float kInverseE2m1Max = 1.0f / 6.0f;

[[noreturn]] void fail(const std::string& where, const std::string& message) {
  throw std::invalid_argument(where + ": " + message);
}

void check_extents(const char* where, std::span<const float> x, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<uint64_t>(x.size()) != uint64_t(rows) * uint64_t(cols))
    fail(where, std::to_string(x.size()) + " values for a " + std::to_string(rows) + " x " +
                    std::to_string(cols) + " tensor");
}

void check_multiple(const char* where, const char* what, int64_t extent, int64_t multiple) {
  if (extent % multiple != 0)
    fail(where, std::string(what) + " (" + std::to_string(extent) + ") must be a multiple of " +
                    std::to_string(multiple));
}

// 2^k for -127 <= k <= 127 from its bits (2^-127 is subnormal), as the device builds it.
float pow2f(int k) {
  if (k >= -126) return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
  return std::bit_cast<float>(uint32_t{0x00400000});
}

bool sign_bit(float v) { return (std::bit_cast<uint32_t>(v) & 0x80000000u) != 0; }

std::vector<float> transpose(std::span<const float> x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

void butterflies(std::span<float, 16> v) {
  for (size_t h = 1; h < 16; h *= 2) {
    for (size_t j = 0; j < 16; ++j) {
      if ((j & h) != 0) continue;
      const float a = v[j], b = v[j + h];
      v[j] = a + b;
      v[j + h] = a - b;
    }
  }
}

void apply_signs(std::span<float, 16> v) {
  for (int k = 0; k < 16; ++k)
    if (((kRhtSignMask >> k) & 1) != 0) v[size_t(k)] = -v[size_t(k)];
}

// Stochastic rounding's bits of element `index` of a copy.
class RandomBits {
 public:
  RandomBits(uint64_t seed, uint32_t stream, uint32_t step)
      : seed_(seed), stream_(stream), step_(step) {}
  uint32_t at(uint64_t index) {
    const uint64_t group = index / 4;
    if (!valid_ || group != group_) {
      words_ = micro_scale_random_words(group, seed_, stream_, step_);
      group_ = group;
      valid_ = true;
    }
    return words_.v[index % 4];
  }

 private:
  uint64_t seed_;
  uint32_t stream_;
  uint32_t step_;
  bool valid_ = false;
  uint64_t group_ = 0;
  Philox4x32 words_{};
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// MXFP8

uint8_t e8m0_round_up(float value) {
  if (std::isnan(value)) return 0xFF;
  if (std::isinf(value)) return 0xFE;
  const uint32_t bits = std::bit_cast<uint32_t>(value) & 0x7FFFFFFFu;
  if (bits == 0) return 0;
  uint32_t e = bits >> 23;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  // Round up, so 2^(e - 127) >= value and x * 2^(127 - e) never clips; E8M0's 0 is 2^-127, which
  // already covers the subnormals up to 2^-127 (mantissa 0x400000); 0xFE is the largest finite.
  if (mantissa != 0 && e != 0xFE && !(e == 0 && mantissa <= 0x400000u)) ++e;
  return static_cast<uint8_t>(e);
}

float e8m0_to_float(uint8_t e) {
  if (e == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return pow2f(int(e) - 127);
}

Mxfp8Copy mxfp8_quantize(std::span<const float> x, int64_t rows, int64_t cols, Fp8Format format,
                         bool columnwise) {
  constexpr const char* kWhere = "mxfp8_quantize";
  check_extents(kWhere, x, rows, cols);
  if (columnwise)
    check_multiple(kWhere, "rows (the columnwise copy's blocked dimension)", rows, kMxfp8BlockSize);
  else
    check_multiple(kWhere, "cols (the rowwise copy's blocked dimension)", cols, kMxfp8BlockSize);
  Mxfp8Copy copy;
  copy.rows = rows;
  copy.cols = cols;
  copy.columnwise = columnwise;
  copy.format = format;
  copy.data.assign(x.size(), 0);
  copy.scales.assign(x.size() / kMxfp8BlockSize, 0);
  const float limit = fp8_max(format);
  // A block: kMxfp8BlockSize elements at `first`, `stride` apart; its scale at `scale_index`.
  auto quantize_block = [&](int64_t first, int64_t stride, int64_t scale_index) {
    float amax = 0.0f;
    for (int k = 0; k < kMxfp8BlockSize; ++k)
      amax = std::fmax(amax, std::fabs(x[size_t(first + k * stride)]));
    const uint8_t e = e8m0_round_up(amax / limit);
    const float multiplier = e == 0xFF ? std::numeric_limits<float>::quiet_NaN() : pow2f(127 - e);
    copy.scales[size_t(scale_index)] = e;
    for (int k = 0; k < kMxfp8BlockSize; ++k) {
      const size_t i = size_t(first + k * stride);
      copy.data[i] = float_to_fp8(x[i] * multiplier, format);
    }
  };
  if (columnwise) {
    for (int64_t rb = 0; rb < rows / kMxfp8BlockSize; ++rb)
      for (int64_t c = 0; c < cols; ++c)
        quantize_block(rb * kMxfp8BlockSize * cols + c, cols, rb * cols + c);
  } else {
    const int64_t blocks = cols / kMxfp8BlockSize;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t cb = 0; cb < blocks; ++cb)
        quantize_block(r * cols + cb * kMxfp8BlockSize, 1, r * blocks + cb);
  }
  return copy;
}

std::vector<float> mxfp8_dequantize(const Mxfp8Copy& copy) {
  constexpr const char* kWhere = "mxfp8_dequantize";
  if (copy.rows < 0 || copy.cols < 0 || copy.data.size() != size_t(copy.rows * copy.cols) ||
      copy.scales.size() != copy.data.size() / kMxfp8BlockSize)
    fail(kWhere, "the copy's data or scales do not fit its shape");
  check_multiple(kWhere, copy.columnwise ? "rows" : "cols", copy.columnwise ? copy.rows : copy.cols,
                 kMxfp8BlockSize);
  std::vector<float> out(copy.data.size());
  const int64_t blocks = copy.cols / kMxfp8BlockSize;
  for (int64_t r = 0; r < copy.rows; ++r) {
    for (int64_t c = 0; c < copy.cols; ++c) {
      const int64_t scale_index = copy.columnwise ? (r / kMxfp8BlockSize) * copy.cols + c
                                                  : r * blocks + c / kMxfp8BlockSize;
      const size_t i = size_t(r * copy.cols + c);
      out[i] =
          fp8_to_float(copy.data[i], copy.format) * e8m0_to_float(copy.scales[size_t(scale_index)]);
    }
  }
  return out;
}

std::vector<float> mxfp8_fake_quantize(std::span<const float> x, int64_t rows, int64_t cols,
                                       Fp8Format format, bool columnwise) {
  return mxfp8_dequantize(mxfp8_quantize(x, rows, cols, format, columnwise));
}

// ------------------------------------------------------------------------------------------------
// E2M1

uint8_t e2m1_rne(float v) {
  if (std::isnan(v)) return 0x7;
  const float a = std::fabs(v);
  // The midpoints between neighbours, each tie going to the even code (mantissa bit 0).
  uint8_t code = 0;
  if (a <= 0.25f)
    code = 0;
  else if (a < 0.75f)
    code = 1;
  else if (a <= 1.25f)
    code = 2;
  else if (a < 1.75f)
    code = 3;
  else if (a <= 2.5f)
    code = 4;
  else if (a < 3.5f)
    code = 5;
  else if (a <= 5.0f)
    code = 6;
  else
    code = 7;
  return static_cast<uint8_t>(code | (sign_bit(v) ? 0x8 : 0x0));
}

uint8_t e2m1_stochastic(float v, uint32_t bits) {
  if (std::isnan(v)) return 0x7;
  const float a = std::fabs(v);
  uint8_t code = 7;
  if (a < 6.0f) {
    int k = 0;
    while (k < 6 && kE2m1Magnitudes[k + 1] <= a) ++k;
    // Exact: a - lo by Sterbenz (a in [lo, 2 lo], or lo = 0), the step's inverse a power of 2.
    const float fraction = (a - kE2m1Magnitudes[k]) * kE2m1InverseSteps[k];
    const float draw = static_cast<float>(bits >> 8) * 0x1p-24f;  // uniform on [0, 1), exact
    code = static_cast<uint8_t>(draw < fraction ? k + 1 : k);
  }
  return static_cast<uint8_t>(code | (sign_bit(v) ? 0x8 : 0x0));
}

float e2m1_to_float(uint8_t code) {
  const float magnitude = kE2m1Magnitudes[code & 0x7];
  return (code & 0x8) != 0 ? -magnitude : magnitude;
}

// ------------------------------------------------------------------------------------------------
// NVFP4

float nvfp4_tensor_scale(float global_amax) {
  return compute_current_scale(global_amax, kNvfp4TensorScaleMax, 0.0f, false).scale;
}

uint8_t nvfp4_block_scale(float block_amax, float tensor_scale) {
  const float multiplier = tensor_scale * kInverseE2m1Max;
  return float_to_fp8(block_amax * multiplier, Fp8Format::E4M3);
}

float nvfp4_encode_multiplier(uint8_t block_scale, float tensor_scale) {
  const float decode = 1.0f / tensor_scale;
  const float product = fp8_to_float(block_scale, Fp8Format::E4M3) * decode;
  return std::fmin(1.0f / product, FLT_MAX);
}

Nvfp4Copy nvfp4_quantize(std::span<const float> x, int64_t rows, int64_t cols, float tensor_scale,
                         const Nvfp4Params& params) {
  constexpr const char* kWhere = "nvfp4_quantize";
  check_extents(kWhere, x, rows, cols);
  if (!(tensor_scale > 0.0f) || std::isinf(tensor_scale))
    fail(kWhere,
         "the tensor scale must be finite and positive, got " + std::to_string(tensor_scale));
  if (params.rht && !params.columnwise)
    fail(kWhere, "the random Hadamard transform applies to the columnwise copy only");
  if (params.rht && params.two_d)
    fail(kWhere, "the random Hadamard transform is not combined with 2-D blocks");
  if (params.two_d) {
    check_multiple(kWhere, "rows (2-D blocks)", rows, kNvfp4BlockSize);
    check_multiple(kWhere, "cols (2-D blocks)", cols, kNvfp4BlockSize);
  } else if (params.columnwise) {
    check_multiple(kWhere, "rows (the columnwise copy's blocked dimension)", rows, kNvfp4BlockSize);
  } else {
    check_multiple(kWhere, "cols (the rowwise copy's blocked dimension)", cols, kNvfp4BlockSize);
  }
  // The stored matrix [R, C], blocks along its rows.
  std::vector<float> stored;
  int64_t R = rows, C = cols;
  if (params.columnwise) {
    stored =
        params.rht ? transpose(rht_columns(x, rows, cols), rows, cols) : transpose(x, rows, cols);
    R = cols;
    C = rows;
  } else {
    stored.assign(x.begin(), x.end());
  }
  Nvfp4Copy copy;
  copy.rows = rows;
  copy.cols = cols;
  copy.params = params;
  copy.tensor_scale = tensor_scale;
  copy.data.assign(size_t(R * C / 2), 0);
  copy.scales.assign(size_t(R * (C / kNvfp4BlockSize)), 0);
  RandomBits random(params.seed, params.stream, params.step);
  const int64_t blocks = C / kNvfp4BlockSize;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t cb = 0; cb < blocks; ++cb) {
      const int64_t c0 = cb * kNvfp4BlockSize;
      const int64_t r0 = params.two_d ? r - r % kNvfp4BlockSize : r;
      const int64_t r1 = params.two_d ? r0 + kNvfp4BlockSize : r + 1;
      float amax = 0.0f;
      for (int64_t rr = r0; rr < r1; ++rr)
        for (int64_t c = c0; c < c0 + kNvfp4BlockSize; ++c)
          amax = std::fmax(amax, std::fabs(stored[size_t(rr * C + c)]));
      const uint8_t scale = nvfp4_block_scale(amax, tensor_scale);
      copy.scales[size_t(r * blocks + cb)] = scale;
      const bool zero_scale = (scale & 0x7F) == 0;
      const float multiplier = nvfp4_encode_multiplier(scale, tensor_scale);
      for (int64_t c = c0; c < c0 + kNvfp4BlockSize; ++c) {
        const int64_t i = r * C + c;
        const float v = stored[size_t(i)] * multiplier;
        uint8_t code = 0;
        if (!zero_scale)
          code = params.stochastic ? e2m1_stochastic(v, random.at(uint64_t(i))) : e2m1_rne(v);
        copy.data[size_t(i / 2)] |= static_cast<uint8_t>(code << (4 * (c % 2)));
      }
    }
  }
  return copy;
}

std::vector<float> nvfp4_dequantize(const Nvfp4Copy& copy) {
  constexpr const char* kWhere = "nvfp4_dequantize";
  const bool columnwise = copy.params.columnwise;
  const int64_t R = columnwise ? copy.cols : copy.rows;
  const int64_t C = columnwise ? copy.rows : copy.cols;
  if (R < 0 || C < 0) fail(kWhere, "negative extent");
  check_multiple(kWhere, "the blocked dimension", C, kNvfp4BlockSize);
  if (copy.data.size() != size_t(R * C / 2) ||
      copy.scales.size() != size_t(R * (C / kNvfp4BlockSize)))
    fail(kWhere, "the copy's data or scales do not fit its shape");
  const float decode = 1.0f / copy.tensor_scale;
  std::vector<float> out(size_t(R * C));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = r * C + c;
      const uint8_t code = static_cast<uint8_t>(copy.data[size_t(i / 2)] >> (4 * (c % 2))) & 0xF;
      const float scale = fp8_to_float(
          copy.scales[size_t(r * (C / kNvfp4BlockSize) + c / kNvfp4BlockSize)], Fp8Format::E4M3);
      const float value = (e2m1_to_float(code) * scale) * decode;
      out[size_t(columnwise ? c * R + r : i)] = value;
    }
  }
  return out;
}

std::vector<float> nvfp4_fake_quantize(std::span<const float> x, int64_t rows, int64_t cols,
                                       float tensor_scale, const Nvfp4Params& params) {
  return nvfp4_dequantize(nvfp4_quantize(x, rows, cols, tensor_scale, params));
}

// ------------------------------------------------------------------------------------------------
// Random Hadamard transform

void rht16(std::span<float, 16> v) {
  apply_signs(v);
  butterflies(v);
  for (float& value : v) value *= 0.25f;
}

void rht16_transpose(std::span<float, 16> v) {
  butterflies(v);
  for (float& value : v) value *= 0.25f;
  apply_signs(v);
}

std::vector<float> rht_columns(std::span<const float> x, int64_t rows, int64_t cols) {
  constexpr const char* kWhere = "rht_columns";
  check_extents(kWhere, x, rows, cols);
  check_multiple(kWhere, "rows (the transformed dimension)", rows, kNvfp4BlockSize);
  std::vector<float> out(x.begin(), x.end());
  std::array<float, 16> group{};
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    for (int64_t c = 0; c < cols; ++c) {
      for (int k = 0; k < 16; ++k) group[size_t(k)] = x[size_t((r0 + k) * cols + c)];
      rht16(group);
      for (int k = 0; k < 16; ++k) out[size_t((r0 + k) * cols + c)] = group[size_t(k)];
    }
  }
  return out;
}

float rht_amax(std::span<const float> x, int64_t rows, int64_t cols) {
  float amax = 0.0f;
  for (const float v : rht_columns(x, rows, cols)) amax = std::fmax(amax, std::fabs(v));
  return amax;
}

// ------------------------------------------------------------------------------------------------
// sm_100 scale layouts

int64_t swizzled_scales_size(int64_t outer, int64_t inner) {
  if (outer < 0 || inner < 0) fail("swizzled_scales_size", "negative extent");
  return (outer + 127) / 128 * 128 * ((inner + 3) / 4 * 4);
}

int64_t swizzled_scale_offset(int64_t outer_index, int64_t inner_index, int64_t inner) {
  if (outer_index < 0 || inner_index < 0 || inner_index >= inner)
    fail("swizzled_scale_offset", "entry (" + std::to_string(outer_index) + ", " +
                                      std::to_string(inner_index) + ") outside an array of " +
                                      std::to_string(inner) + " columns");
  const int64_t inner_tiles = (inner + 3) / 4;
  const int64_t tile = (outer_index / 128) * inner_tiles + inner_index / 4;
  return tile * 512 + (outer_index % 32) * 16 + ((outer_index % 128) / 32) * 4 + inner_index % 4;
}

std::vector<uint8_t> swizzle_scales(std::span<const uint8_t> compact, int64_t outer,
                                    int64_t inner) {
  if (outer < 0 || inner < 0 || static_cast<uint64_t>(compact.size()) != uint64_t(outer * inner))
    fail("swizzle_scales", std::to_string(compact.size()) + " scales for a " +
                               std::to_string(outer) + " x " + std::to_string(inner) + " array");
  std::vector<uint8_t> out(size_t(swizzled_scales_size(outer, inner)), 0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      out[size_t(swizzled_scale_offset(o, i, inner))] = compact[size_t(o * inner + i)];
  return out;
}

}  // namespace opfuse::cpu
