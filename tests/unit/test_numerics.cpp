// Checks the CPU storage-dtype emulation bit for bit against CUDA's own host conversions
// (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h are __host__ __device__ and compile with the host
// compiler), plus hand-written expectations that do not trust either implementation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cpu/numerics.h"
#include "support/assert.h"

namespace opfuse::cpu {
namespace {

uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }
float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

// ---- CUDA's host conversions, the reference ----------------------------------------------------

uint16_t cuda_float_to_bf16(float value) {
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(value)).x;
}
float cuda_bf16_to_float(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}
uint16_t cuda_float_to_fp16(float value) {
  return static_cast<__half_raw>(__float2half_rn(value)).x;
}
float cuda_fp16_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}
__nv_fp8_interpretation_t cuda_interpretation(Fp8Format format) {
  return format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}
uint8_t cuda_float_to_fp8(float value, Fp8Format format) {
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, cuda_interpretation(format));
}
float cuda_fp8_to_float(uint8_t bits, Fp8Format format) {
  if (format == Fp8Format::E4M3) {
    __nv_fp8_e4m3 value;
    value.__x = bits;
    return static_cast<float>(value);
  }
  __nv_fp8_e5m2 value;
  value.__x = bits;
  return static_cast<float>(value);
}

// ---- One narrowing conversion under test, with its reference -----------------------------------

// Plain function pointers, not std::function: each sweep below calls these 2^26 times, in Debug
// too.
using Narrow = uint32_t (*)(float);

struct Narrowing {
  const char* name;
  Narrow ours;
  Narrow cuda;
  int min_exponent;  // unbiased exponent of the smallest subnormal
  int max_exponent;  // unbiased exponent of the largest finite value
};

constexpr Narrowing kBf16{"bf16", [](float v) { return uint32_t{float_to_bf16(v)}; },
                          [](float v) { return uint32_t{cuda_float_to_bf16(v)}; }, -133, 127};
constexpr Narrowing kFp16{"fp16", [](float v) { return uint32_t{float_to_fp16(v)}; },
                          [](float v) { return uint32_t{cuda_float_to_fp16(v)}; }, -24, 15};
constexpr Narrowing kE4M3{
    "e4m3", [](float v) { return uint32_t{float_to_fp8(v, Fp8Format::E4M3)}; },
    [](float v) { return uint32_t{cuda_float_to_fp8(v, Fp8Format::E4M3)}; }, -9, 8};
constexpr Narrowing kE5M2{
    "e5m2", [](float v) { return uint32_t{float_to_fp8(v, Fp8Format::E5M2)}; },
    [](float v) { return uint32_t{cuda_float_to_fp8(v, Fp8Format::E5M2)}; }, -16, 15};
constexpr Narrowing kAllNarrowings[] = {kBf16, kFp16, kE4M3, kE5M2};

std::string describe_mismatch(const Narrowing& narrowing, uint32_t input) {
  const float value = float_of(input);
  return fmt::format("\n  float bits 0x{:08X} ({:g}): ours 0x{:X}, cuda 0x{:X}", input, value,
                     narrowing.ours(value), narrowing.cuda(value));
}

// Compares ours with CUDA on every input; reports the count and the first few differences.
void expect_same_as_cuda(const Narrowing& narrowing, const std::vector<uint32_t>& inputs) {
  std::size_t mismatches = 0;
  std::string first_mismatches;
  for (const uint32_t input : inputs) {
    const float value = float_of(input);
    if (narrowing.ours(value) == narrowing.cuda(value)) continue;
    if (++mismatches <= 5) first_mismatches += describe_mismatch(narrowing, input);
  }
  EXPECT_EQ(mismatches, 0u) << narrowing.name << " differs from CUDA on " << mismatches << " of "
                            << inputs.size() << " inputs:" << first_mismatches;
}

// ---- Hand-written expectations -----------------------------------------------------------------

TEST(Numerics, Fp8MaxIsTheLargestFiniteValue) {
  EXPECT_EQ(fp8_max(Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(fp8_to_float(0x7E, Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_to_float(0x7B, Fp8Format::E5M2), 57344.0f);
}

TEST(Numerics, Fp8SaturatesOverflowAndInfinity) {
  EXPECT_EQ(float_to_fp8(449.0f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(float_to_fp8(464.0f, Fp8Format::E4M3), 0x7E);  // tie between 448 and (absent) 480
  EXPECT_EQ(float_to_fp8(1e30f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(float_to_fp8(-1e30f, Fp8Format::E4M3), 0xFE);
  EXPECT_EQ(float_to_fp8(INFINITY, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(float_to_fp8(-INFINITY, Fp8Format::E4M3), 0xFE);
  EXPECT_EQ(float_to_fp8(61440.0f, Fp8Format::E5M2), 0x7B);  // tie that would round to Inf
  EXPECT_EQ(float_to_fp8(INFINITY, Fp8Format::E5M2), 0x7B);
  EXPECT_EQ(float_to_fp8(-INFINITY, Fp8Format::E5M2), 0xFB);
  EXPECT_EQ(float_to_fp8(FLT_MAX, Fp8Format::E5M2), 0x7B);
}

TEST(Numerics, Fp8NanBecomesCanonicalNan) {
  for (const uint32_t nan_bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFBFFFFFu}) {
    EXPECT_EQ(float_to_fp8(float_of(nan_bits), Fp8Format::E4M3), 0x7F) << std::hex << nan_bits;
    EXPECT_EQ(float_to_fp8(float_of(nan_bits), Fp8Format::E5M2), 0x7F) << std::hex << nan_bits;
  }
  EXPECT_EQ(bits_of(fp8_to_float(0xFF, Fp8Format::E4M3)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(fp8_to_float(0xFD, Fp8Format::E5M2)), 0x7FFFFFFFu);
  EXPECT_EQ(fp8_to_float(0xFC, Fp8Format::E5M2), -INFINITY);
}

TEST(Numerics, Fp8SubnormalsAndSignedZero) {
  EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -9), Fp8Format::E4M3), 0x01);   // smallest subnormal
  EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -10), Fp8Format::E4M3), 0x00);  // half of it: to even
  EXPECT_EQ(float_to_fp8(std::nextafter(std::ldexp(1.0f, -10), 1.0f), Fp8Format::E4M3), 0x01);
  EXPECT_EQ(float_to_fp8(3 * std::ldexp(1.0f, -10), Fp8Format::E4M3), 0x02);  // 1.5 ulp: to even
  EXPECT_EQ(float_to_fp8(-std::ldexp(1.0f, -16), Fp8Format::E5M2), 0x81);
  EXPECT_EQ(float_to_fp8(-0.0f, Fp8Format::E4M3), 0x80);
  EXPECT_EQ(float_to_fp8(-1e-30f, Fp8Format::E5M2), 0x80);
  EXPECT_EQ(bits_of(fp8_to_float(0x80, Fp8Format::E4M3)), 0x80000000u);
  EXPECT_EQ(fp8_to_float(0x07, Fp8Format::E4M3), 7 * std::ldexp(1.0f, -9));
}

TEST(Numerics, SixteenBitFormatsOverflowToInfinityAndKeepNanQuiet) {
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // the tie above max rounds to Inf
  EXPECT_EQ(float_to_fp16(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_fp16(float_of(0xFF800001u)), 0x7FFF);
  EXPECT_EQ(float_to_bf16(FLT_MAX), 0x7F80);  // rounds up past bf16's max
  EXPECT_EQ(float_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(float_of(0xFF800001u)), 0x7FFF);
  EXPECT_EQ(float_to_bf16(float_of(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(float_of(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(float_of(0x00008000u)), 0x0000);  // float subnormal tie to even zero
  EXPECT_EQ(float_to_bf16(float_of(0x00018000u)), 0x0002);
  EXPECT_EQ(bits_of(bf16_to_float(0xFFC1)), 0xFFC10000u);  // widening keeps the NaN payload
  EXPECT_EQ(bits_of(fp16_to_float(0xFE01)), 0x7FFFFFFFu);
}

// ---- Against CUDA ------------------------------------------------------------------------------

// Special floats: zeros, the float subnormal range ends, FLT_MAX, infinities, NaNs with several
// payloads and both signs, and each format's max, max + ulp and overflow threshold.
std::vector<uint32_t> special_inputs() {
  std::vector<uint32_t> inputs = {
      0x00000000u, 0x80000000u,               // +-0
      0x00000001u, 0x80000001u, 0x007FFFFFu,  // float min / max subnormal
      0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,  // FLT_MIN, +-FLT_MAX
      0x7F800000u, 0xFF800000u,               // +-Inf
      0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu, 0xFFFFFFFFu, 0x7FC12345u,
      0xFF812345u, 0x7F7F7FFFu, 0x7F7F8000u, 0xFF7F8000u,  // bf16 max's overflow tie and the float
                                                           // below it
  };
  for (const float value :
       {448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65504.0f, 65520.0f, 3.3895314e38f}) {
    for (const float signed_value : {value, -value}) {
      inputs.push_back(bits_of(signed_value));
      inputs.push_back(bits_of(signed_value) + 1);
      inputs.push_back(bits_of(signed_value) - 1);
    }
  }
  return inputs;
}

TEST(Numerics, SpecialValuesMatchCuda) {
  const std::vector<uint32_t> inputs = special_inputs();
  for (const Narrowing& narrowing : kAllNarrowings) expect_same_as_cuda(narrowing, inputs);
}

// Every value of the narrow format, every midpoint between neighbours (the halfway cases) and
// the floats one ulp either side of each.
std::vector<uint32_t> halfway_inputs(const std::vector<float>& representable) {
  std::vector<uint32_t> inputs;
  for (std::size_t i = 0; i < representable.size(); ++i) {
    const float value = representable[i];
    inputs.push_back(bits_of(value));
    if (i + 1 == representable.size()) continue;
    // Neighbours are at most one binade apart, so their midpoint is exact in double and float.
    const float midpoint =
        static_cast<float>((static_cast<double>(value) + representable[i + 1]) / 2.0);
    for (const uint32_t near : {bits_of(midpoint) - 1, bits_of(midpoint), bits_of(midpoint) + 1}) {
      inputs.push_back(near);
      inputs.push_back(near | 0x80000000u);
    }
  }
  return inputs;
}

// Sorted non-negative finite values of a format, from its widening function.
std::vector<float> finite_values(int bit_count, const std::function<float(uint32_t)>& widen) {
  std::vector<float> values;
  for (uint32_t bits = 0; bits < (1u << (bit_count - 1)); ++bits) {
    const float value = widen(bits);
    if (std::isfinite(value)) values.push_back(value);
  }
  return values;
}

TEST(Numerics, HalfwayCasesMatchCuda) {
  const std::vector<std::vector<float>> values = {
      finite_values(16, [](uint32_t b) { return bf16_to_float(static_cast<uint16_t>(b)); }),
      finite_values(16, [](uint32_t b) { return fp16_to_float(static_cast<uint16_t>(b)); }),
      finite_values(
          8, [](uint32_t b) { return fp8_to_float(static_cast<uint8_t>(b), Fp8Format::E4M3); }),
      finite_values(
          8, [](uint32_t b) { return fp8_to_float(static_cast<uint8_t>(b), Fp8Format::E5M2); }),
  };
  ASSERT_EQ(values[2].size(), 127u);  // E4M3: 0x00..0x7E
  ASSERT_EQ(values[3].size(), 124u);  // E5M2: 0x00..0x7B
  for (std::size_t i = 0; i < values.size(); ++i) {
    expect_same_as_cuda(kAllNarrowings[i], halfway_inputs(values[i]));
  }
}

TEST(Numerics, EveryFp8PatternWidensLikeCudaAndRoundTrips) {
  for (const Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    for (uint32_t pattern = 0; pattern < 256; ++pattern) {
      const auto bits = static_cast<uint8_t>(pattern);
      const float widened = fp8_to_float(bits, format);
      ASSERT_EQ(bits_of(widened), bits_of(cuda_fp8_to_float(bits, format)))
          << "pattern 0x" << std::hex << pattern;
      const uint8_t sign = bits & 0x80;
      uint8_t expected = bits;  // finite values come back unchanged
      if (std::isnan(widened)) expected = 0x7F;
      if (std::isinf(widened)) expected = sign | 0x7B;  // E5M2 Inf saturates to max
      EXPECT_EQ(float_to_fp8(widened, format), expected) << "pattern 0x" << std::hex << pattern;
      EXPECT_EQ(cuda_float_to_fp8(widened, format), expected)
          << "pattern 0x" << std::hex << pattern;
    }
  }
}

TEST(Numerics, EverySixteenBitPatternWidensLikeCudaAndRoundTrips) {
  std::size_t mismatches = 0;
  for (uint32_t pattern = 0; pattern < 0x10000u; ++pattern) {
    const auto bits = static_cast<uint16_t>(pattern);
    const float bf16 = bf16_to_float(bits);
    const float fp16 = fp16_to_float(bits);
    mismatches += bits_of(bf16) != bits_of(cuda_bf16_to_float(bits));
    mismatches += bits_of(fp16) != bits_of(cuda_fp16_to_float(bits));
    mismatches += float_to_bf16(bf16) != (std::isnan(bf16) ? 0x7FFF : bits);
    mismatches += float_to_fp16(fp16) != (std::isnan(fp16) ? 0x7FFF : bits);
  }
  EXPECT_EQ(mismatches, 0u);
}

// The i-th of 2^26 sweep inputs: the even ones spread over all 2^32 bit patterns (every exponent,
// sign and NaN payload), the odd ones aimed at the binades where the format has values or just
// overflows, with random mantissas and signs. Multiplying by an odd constant permutes 32-bit
// numbers, so the inputs are distinct and well spread.
uint32_t sweep_input(const Narrowing& narrowing, uint32_t i) {
  const uint32_t hash = (i >> 1) * 2654435761u + 0x9E3779B9u;
  if ((i & 1u) == 0) return hash;
  // Float exponent fields from 3 binades below the smallest subnormal to 3 above the largest
  // finite value (clamped to the finite floats: for bf16 that is all of them).
  const int lowest_field = std::max(127 + narrowing.min_exponent - 3, 0);
  const int highest_field = std::min(127 + narrowing.max_exponent + 3, 254);
  const auto field_count = static_cast<uint32_t>(highest_field - lowest_field + 1);
  const uint32_t exponent_field = static_cast<uint32_t>(lowest_field) + (hash >> 8) % field_count;
  const uint32_t mantissa = (hash * 2246822519u) >> 9;  // 23 well-mixed bits
  return (hash & 0x80000000u) | exponent_field << 23 | mantissa;
}

// 2^26 inputs per format, split over threads (the reference conversions are slow in Debug).
void expect_sweep_same_as_cuda(const Narrowing& narrowing) {
  constexpr uint32_t kInputs = 1u << 26;
  const unsigned thread_count = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::vector<std::size_t> mismatches(thread_count, 0);
  std::vector<std::string> first_mismatch(thread_count);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < thread_count; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = t; i < kInputs; i += thread_count) {
        const uint32_t input = sweep_input(narrowing, i);
        const float value = float_of(input);
        if (narrowing.ours(value) == narrowing.cuda(value)) continue;
        if (mismatches[t]++ == 0) first_mismatch[t] = describe_mismatch(narrowing, input);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::size_t total = 0;
  std::string examples;
  for (unsigned t = 0; t < thread_count; ++t) {
    total += mismatches[t];
    examples += first_mismatch[t];
  }
  EXPECT_EQ(total, 0u) << narrowing.name << " differs from CUDA on " << total << " of " << kInputs
                       << " inputs, e.g.:" << examples;
}

TEST(Numerics, ManyFloatsMatchCudaForBf16) { expect_sweep_same_as_cuda(kBf16); }
TEST(Numerics, ManyFloatsMatchCudaForFp16) { expect_sweep_same_as_cuda(kFp16); }
TEST(Numerics, ManyFloatsMatchCudaForE4M3) { expect_sweep_same_as_cuda(kE4M3); }
TEST(Numerics, ManyFloatsMatchCudaForE5M2) { expect_sweep_same_as_cuda(kE5M2); }

// ---- Vectorised helpers ------------------------------------------------------------------------

TEST(Numerics, RoundToBf16AndFp16ActElementwise) {
  std::vector<float> values = {
      1.0f + std::ldexp(1.0f, -9), 3.14159265f, -65519.0f, 70000.0f, 1e-8f, NAN};
  std::vector<float> as_bf16 = values;
  std::vector<float> as_fp16 = values;
  round_to_bf16(as_bf16);
  round_to_fp16(as_fp16);
  EXPECT_EQ(as_bf16[0], 1.0f);
  EXPECT_EQ(as_bf16[1], 3.140625f);
  EXPECT_EQ(as_fp16[1], 3.140625f);
  EXPECT_EQ(as_fp16[2], -65504.0f);
  EXPECT_EQ(as_fp16[3], INFINITY);
  EXPECT_EQ(bits_of(as_fp16[4]), 0u);  // below half of fp16's smallest subnormal
  EXPECT_EQ(bits_of(as_bf16[5]), 0x7FFF0000u);
  EXPECT_EQ(bits_of(as_fp16[5]), 0x7FFFFFFFu);
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(bits_of(as_bf16[i]), bits_of(cuda_bf16_to_float(cuda_float_to_bf16(values[i]))));
    EXPECT_EQ(bits_of(as_fp16[i]), bits_of(cuda_fp16_to_float(cuda_float_to_fp16(values[i]))));
  }
}

TEST(Numerics, QuantizeScalesInFp32AndReportsAmax) {
  const std::vector<float> in = {1.0f, -2.5f, 300.0f, 0.001f, -0.0f};
  std::vector<uint8_t> out(in.size());
  float amax = -1.0f;
  quantize_fp8(in, 2.0f, Fp8Format::E4M3, out, &amax);
  EXPECT_EQ(amax, 300.0f);
  // 2, -5, 600 saturated to 448, 0.002 to the smallest subnormal 2^-9, -0.
  EXPECT_EQ(out, (std::vector<uint8_t>{0x40, 0xCA, 0x7E, 0x01, 0x80}));
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i], cuda_float_to_fp8(in[i] * 2.0f, Fp8Format::E4M3));
  }
}

TEST(Numerics, QuantizeAmaxSkipsNanButNotInfinity) {
  std::vector<uint8_t> out(3);
  float amax = 0.0f;
  quantize_fp8(std::vector<float>{NAN, 3.0f, -NAN}, 1.0f, Fp8Format::E5M2, out, &amax);
  EXPECT_EQ(amax, 3.0f);
  EXPECT_EQ(out[0], 0x7F);
  quantize_fp8(std::vector<float>{NAN, -INFINITY, 1.0f}, 1.0f, Fp8Format::E5M2, out, &amax);
  EXPECT_EQ(amax, INFINITY);
  EXPECT_EQ(out[1], 0xFB);
  quantize_fp8(std::vector<float>{}, 1.0f, Fp8Format::E5M2, std::span<uint8_t>{}, &amax);
  EXPECT_EQ(amax, 0.0f);
  quantize_fp8(std::vector<float>{1.0f, 2.0f, 3.0f}, 1.0f, Fp8Format::E5M2, out, nullptr);
  EXPECT_EQ(out[2], float_to_fp8(3.0f, Fp8Format::E5M2));
}

TEST(Numerics, DequantizeMultipliesByScaleInverse) {
  const std::vector<uint8_t> in = {0x40, 0xCA, 0x7E, 0x7F};
  std::vector<float> out(in.size());
  dequantize_fp8(in, 0.5f, Fp8Format::E4M3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], 224.0f);
  EXPECT_TRUE(std::isnan(out[3]));
}

TEST(Numerics, MismatchedSpanSizesAreInternalErrors) {
  std::vector<uint8_t> bytes(2);
  std::vector<float> floats(3);
  EXPECT_THROW(quantize_fp8(floats, 1.0f, Fp8Format::E4M3, bytes, nullptr), InternalError);
  EXPECT_THROW(dequantize_fp8(bytes, 1.0f, Fp8Format::E4M3, floats), InternalError);
}

}  // namespace
}  // namespace opfuse::cpu
