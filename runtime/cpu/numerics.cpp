#include "cpu/numerics.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>

#include "support/assert.h"

namespace opfuse::cpu {
namespace {

// One narrow binary format (1 sign bit, then exponent, then mantissa), described by the few
// numbers the rounding needs. Encodings below are magnitudes, the sign bit cleared.
struct NarrowFormat {
  int mantissa_bits;
  int exponent_bias;
  int sign_bit;          // position of the sign bit: 15 for 16-bit formats, 7 for FP8
  uint32_t max_finite;   // encoding of the largest finite value
  uint32_t infinity;     // encoding of +Inf, 0 when the format has none (E4M3)
  bool saturates;        // overflow and Inf clamp to max_finite (FP8 __NV_SATFINITE)
  uint32_t nan_written;  // what any NaN input becomes (the CUDA conversions' canonical NaN)
};

constexpr NarrowFormat kBf16{7, 127, 15, 0x7F7F, 0x7F80, false, 0x7FFF};
constexpr NarrowFormat kFp16{10, 15, 15, 0x7BFF, 0x7C00, false, 0x7FFF};
// Why 0x7F for both FP8 NaNs: cuda_fp8.h replaces any NaN input by 0x7FFFFFFF before converting,
// which lands on 0x7F (E4M3's only NaN; E5M2's all-ones-mantissa quiet NaN).
constexpr NarrowFormat kE4M3{3, 7, 7, 0x7E, 0, true, 0x7F};
constexpr NarrowFormat kE5M2{2, 15, 7, 0x7B, 0x7C, true, 0x7F};

constexpr uint32_t kFloatMagnitudeMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInfinityBits = 0x7F800000u;
constexpr uint32_t kFloatCanonicalNanBits = 0x7FFFFFFFu;
constexpr int kFloatMantissaBits = 23;
constexpr int kFloatExponentBias = 127;

const NarrowFormat& narrow_format(Fp8Format format) {
  return format == Fp8Format::E4M3 ? kE4M3 : kE5M2;
}

// value / 2^shift rounded to nearest, ties to even. 64-bit so that every shift below 64 is
// defined; anything shifted further is below one half and rounds to 0.
uint32_t shift_right_round_even(uint32_t value, int shift) {
  if (shift <= 0) return value;
  if (shift >= 64) return 0;
  const uint64_t wide = value;
  uint64_t kept = wide >> shift;
  const uint64_t dropped = wide & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (dropped > half || (dropped == half && (kept & 1u) != 0)) ++kept;
  return static_cast<uint32_t>(kept);
}

// Rounds a float to the narrow format. One code path for every format so that the four dtypes
// cannot drift apart in their rounding rules.
uint32_t narrow_from_float(float value, const NarrowFormat& format) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 31) << format.sign_bit;
  const uint32_t magnitude = bits & kFloatMagnitudeMask;
  if (magnitude > kFloatInfinityBits) return format.nan_written;
  if (magnitude == kFloatInfinityBits) {
    return sign | (format.saturates ? format.max_finite : format.infinity);
  }

  const int exponent_field = static_cast<int>(magnitude >> kFloatMantissaBits);
  const uint32_t mantissa = magnitude & ((1u << kFloatMantissaBits) - 1);
  const int dropped_bits = kFloatMantissaBits - format.mantissa_bits;
  const int target_exponent = exponent_field - kFloatExponentBias + format.exponent_bias;

  uint32_t rounded;
  if (exponent_field != 0 && target_exponent >= 1) {
    // Normal in the target: re-bias the exponent in place and round away the low mantissa bits.
    // A carry out of the mantissa lands in the exponent, which is exactly the next binade.
    const uint32_t rebiased =
        (static_cast<uint32_t>(target_exponent) << kFloatMantissaBits) | mantissa;
    rounded = shift_right_round_even(rebiased, dropped_bits);
  } else {
    // Subnormal in the target (or a float subnormal): the encoding is the value counted in the
    // target's smallest subnormal, 2^(1 - bias - mantissa_bits); rounding up to 2^mantissa_bits
    // yields the smallest normal's encoding, as it should.
    const uint32_t significand =
        exponent_field != 0 ? (mantissa | (1u << kFloatMantissaBits)) : mantissa;
    const int unbiased_exponent = (exponent_field != 0 ? exponent_field : 1) - kFloatExponentBias;
    const int denormalising_shift = 1 - format.exponent_bias - unbiased_exponent;
    rounded = shift_right_round_even(significand, dropped_bits + denormalising_shift);
  }

  if (rounded > format.max_finite) {
    rounded = format.saturates ? format.max_finite : format.infinity;
  }
  return sign | rounded;
}

// Widens a narrow encoding to float; always exact, NaN canonicalised as cuda_fp16.h does.
float float_from_narrow(uint32_t bits, const NarrowFormat& format) {
  const bool negative = ((bits >> format.sign_bit) & 1u) != 0;
  const uint32_t magnitude = bits & ((1u << format.sign_bit) - 1);
  if (magnitude > format.max_finite) {
    if (format.infinity != 0 && magnitude == format.infinity) {
      constexpr float kInfinity = std::numeric_limits<float>::infinity();
      return negative ? -kInfinity : kInfinity;
    }
    return std::bit_cast<float>(kFloatCanonicalNanBits);
  }

  const uint32_t exponent_field = magnitude >> format.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << format.mantissa_bits) - 1);
  float result;
  if (exponent_field == 0) {
    // Subnormal or zero: mantissa units of 2^(1 - bias - mantissa_bits), a power of two that is a
    // normal float for every format here, so the product is exact.
    result =
        std::ldexp(static_cast<float>(mantissa), 1 - format.exponent_bias - format.mantissa_bits);
  } else {
    const uint32_t float_exponent = exponent_field - format.exponent_bias + kFloatExponentBias;
    result = std::bit_cast<float>((float_exponent << kFloatMantissaBits) |
                                  (mantissa << (kFloatMantissaBits - format.mantissa_bits)));
  }
  return negative ? -result : result;
}

}  // namespace

uint16_t float_to_bf16(float value) {
  return static_cast<uint16_t>(narrow_from_float(value, kBf16));
}

float bf16_to_float(uint16_t bits) {
  // bf16 is the top half of a float: widening is a shift, NaN payloads included, as in cuda_bf16.h.
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_fp16(float value) {
  return static_cast<uint16_t>(narrow_from_float(value, kFp16));
}

float fp16_to_float(uint16_t bits) { return float_from_narrow(bits, kFp16); }

uint8_t float_to_fp8(float value, Fp8Format format) {
  return static_cast<uint8_t>(narrow_from_float(value, narrow_format(format)));
}

float fp8_to_float(uint8_t bits, Fp8Format format) {
  return float_from_narrow(bits, narrow_format(format));
}

float fp8_max(Fp8Format format) { return format == Fp8Format::E4M3 ? 448.0f : 57344.0f; }

void round_to_bf16(std::span<float> values) {
  for (float& value : values) value = bf16_to_float(float_to_bf16(value));
}

void round_to_fp16(std::span<float> values) {
  for (float& value : values) value = fp16_to_float(float_to_fp16(value));
}

void quantize_fp8(std::span<const float> in, float scale, Fp8Format format, std::span<uint8_t> out,
                  float* amax_out) {
  OPFUSE_ASSERT(in.size() == out.size(), "quantize_fp8: {} inputs but {} outputs", in.size(),
                out.size());
  const NarrowFormat& narrow = narrow_format(format);
  // Why start at 0 and use fmax: TE's cast kernels do `amax = fmaxf(fabsf(x), amax)` from 0, and
  // fmaxf returns the other operand when one is NaN, so NaN elements never reach the amax.
  float amax = 0.0f;
  for (std::size_t i = 0; i < in.size(); ++i) {
    amax = std::fmax(std::fabs(in[i]), amax);
    const float scaled = in[i] * scale;  // one fp32 rounding, as in the kernel
    out[i] = static_cast<uint8_t>(narrow_from_float(scaled, narrow));
  }
  if (amax_out != nullptr) *amax_out = amax;
}

void dequantize_fp8(std::span<const uint8_t> in, float scale_inv, Fp8Format format,
                    std::span<float> out) {
  OPFUSE_ASSERT(in.size() == out.size(), "dequantize_fp8: {} inputs but {} outputs", in.size(),
                out.size());
  const NarrowFormat& narrow = narrow_format(format);
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = float_from_narrow(in[i], narrow) * scale_inv;
}

}  // namespace opfuse::cpu
