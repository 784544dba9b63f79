// The CPU oracle of the micro-scaled formats (runtime/cpu/micro_scaling.h): MXFP8's E8M0 exponents
// and casts, NVFP4's E2M1 codes, block and tensor scales, 2-D blocks, the random Hadamard
// transform, stochastic rounding with Philox4x32-10 (templates/common/philox.cuh), and the sm_100
// scale swizzle. Values worked out by hand in the comments; E2M1 also against cuda_fp4.h's host
// conversion. The suite is named micro_scaling so that `ctest -R micro` selects it.
#include <cuda_fp4.h>
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "../../templates/common/philox.cuh"
#include "cpu/micro_scaling.h"
#include "cpu/numerics.h"

namespace opfuse::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

std::vector<float> random_values(size_t count, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = bf16_to_float(float_to_bf16(normal(rng)));
  return values;
}

// ------------------------------------------------------------------------------------------------
// E8M0

TEST(micro_scaling, E8m0RoundsUp) {
  EXPECT_EQ(e8m0_round_up(1.0f), 127);                    // exactly 2^0
  EXPECT_EQ(e8m0_round_up(2.0f), 128);                    // exactly 2^1
  EXPECT_EQ(e8m0_round_up(0x1p-20f), 107);                // exactly 2^-20
  EXPECT_EQ(e8m0_round_up(from_bits(0x3F800001u)), 128);  // just above 1: up to 2^1
  EXPECT_EQ(e8m0_round_up(0.75f), 127);                   // 1.5 * 2^-1 -> 2^0
  EXPECT_EQ(e8m0_round_up(0x1p127f), 254);
  EXPECT_EQ(e8m0_round_up(FLT_MAX), 254);  // saturates: 0xFF is NaN
  EXPECT_EQ(e8m0_round_up(0.0f), 0);
  EXPECT_EQ(e8m0_round_up(-0.0f), 0);
  EXPECT_EQ(e8m0_round_up(kInf), 0xFE);
  EXPECT_EQ(e8m0_round_up(kNaN), 0xFF);
  // Subnormals: up to 2^-127 (E8M0's 0) gives 0, above it 2^-126.
  EXPECT_EQ(e8m0_round_up(from_bits(0x00000001u)), 0);  // 2^-149
  EXPECT_EQ(e8m0_round_up(from_bits(0x00400000u)), 0);  // 2^-127 exactly
  EXPECT_EQ(e8m0_round_up(from_bits(0x00400001u)), 1);
  EXPECT_EQ(e8m0_round_up(0x1p-126f), 1);  // the smallest normal
  EXPECT_EQ(e8m0_round_up(0x1.8p-126f), 2);

  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f);
  EXPECT_EQ(e8m0_to_float(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
}

// ------------------------------------------------------------------------------------------------
// MXFP8

// One 1 x 32 block, amax 3: 3 / 448 = 1.71 * 2^-8 -> e = 127 - 8 + 1 = 120 (scale 2^-7), so the
// multiplier is 2^7: 3 -> 384 (E4M3 0x7C), 1 -> 128 (0x70), -0.5 -> -64 (0xE8). E5M2: 3 / 57344 =
// 1.71 * 2^-15 -> e = 113, multiplier 2^14: 3 -> 49152 (0x7A), 1 -> 16384 (0x74), -0.5 (0xF0).
TEST(micro_scaling, Mxfp8BlockOfKnownAmax) {
  std::vector<float> x(32, 0.25f);
  x[0] = 3.0f;
  x[1] = 1.0f;
  x[2] = -0.5f;
  const Mxfp8Copy e4m3 = mxfp8_quantize(x, 1, 32, Fp8Format::E4M3, false);
  ASSERT_EQ(e4m3.scales.size(), 1u);
  EXPECT_EQ(e4m3.scales[0], 120);
  EXPECT_EQ(e4m3.data[0], 0x7C);
  EXPECT_EQ(e4m3.data[1], 0x70);
  EXPECT_EQ(e4m3.data[2], 0xE8);
  EXPECT_EQ(e4m3.data[3], 0x60);  // 0.25 * 128 = 32 = 2^5: exponent 12
  const std::vector<float> decoded = mxfp8_dequantize(e4m3);
  EXPECT_EQ(decoded[0], 3.0f);
  EXPECT_EQ(decoded[2], -0.5f);

  const Mxfp8Copy e5m2 = mxfp8_quantize(x, 1, 32, Fp8Format::E5M2, false);
  EXPECT_EQ(e5m2.scales[0], 113);
  EXPECT_EQ(e5m2.data[0], 0x7A);
  EXPECT_EQ(e5m2.data[1], 0x74);
  EXPECT_EQ(e5m2.data[2], 0xF0);
  EXPECT_EQ(mxfp8_dequantize(e5m2)[0], 3.0f);

  // Rounding inside the block: 0.01 * 128 = 1.28 -> E4M3 1.25 (0x3A), decoded 1.25 * 2^-7.
  x[5] = 0.01f;
  const Mxfp8Copy rounded = mxfp8_quantize(x, 1, 32, Fp8Format::E4M3, false);
  EXPECT_EQ(rounded.data[5], 0x3A);
  EXPECT_EQ(mxfp8_fake_quantize(x, 1, 32, Fp8Format::E4M3, false)[5], 1.25f * 0x1p-7f);
}

// A zero block: exponent 0, codes 0, decoded 0. A NaN element casts to NaN and leaves the block's
// exponent to the others (amax 1: 1 / 448 = 1.14 * 2^-9 -> 119). An Inf: exponent 0xFE, the Inf
// saturates to +-448 (0x7E / 0xFE) and decodes to 448 * 2^127 = Inf in fp32, finite elements
// underflow to 0.
TEST(micro_scaling, Mxfp8ZeroNanAndInfBlocks) {
  std::vector<float> x(size_t{3} * 32, 1.0f);
  for (int c = 0; c < 32; ++c) x[size_t(c)] = 0.0f;
  x[32 + 3] = kNaN;
  x[64] = kInf;
  x[65] = -kInf;
  const Mxfp8Copy copy = mxfp8_quantize(x, 3, 32, Fp8Format::E4M3, false);
  EXPECT_EQ(copy.scales[0], 0);
  EXPECT_EQ(copy.scales[1], 119);
  EXPECT_EQ(copy.scales[2], 0xFE);
  const std::vector<float> decoded = mxfp8_dequantize(copy);
  for (int c = 0; c < 32; ++c) {
    EXPECT_EQ(copy.data[size_t(c)], 0);
    EXPECT_EQ(decoded[size_t(c)], 0.0f);
  }
  EXPECT_EQ(copy.data[32 + 3], 0x7F);
  EXPECT_TRUE(std::isnan(decoded[32 + 3]));
  EXPECT_EQ(copy.data[32 + 4], 0x78);  // 1 * 2^8 = 256 (exponent 15, mantissa 0)
  EXPECT_EQ(decoded[32 + 4], 1.0f);
  EXPECT_EQ(copy.data[64], 0x7E);
  EXPECT_EQ(copy.data[65], 0xFE);
  EXPECT_EQ(copy.data[66], 0x00);
  EXPECT_EQ(decoded[64], kInf);
  EXPECT_EQ(decoded[65], -kInf);
  EXPECT_EQ(decoded[66], 0.0f);
  // E5M2 saturates Inf to 57344 (0x7B) under SATFINITE.
  EXPECT_EQ(mxfp8_quantize(x, 3, 32, Fp8Format::E5M2, false).data[64], 0x7B);
}

// The columnwise copy (32 x 1 blocks down the columns, data not transposed) is the rowwise copy
// of the transposed source, transposed back, scales included.
TEST(micro_scaling, Mxfp8ColumnwiseIsTheRowwiseCopyOfTheTranspose) {
  const int64_t rows = 64, cols = 5;
  std::vector<float> x = random_values(size_t(rows * cols), 1);
  for (int64_t r = 32; r < 64; ++r) x[size_t(r * cols + 2)] = 0.0f;  // a zero column block
  x[7] = kNaN;
  const Mxfp8Copy col = mxfp8_quantize(x, rows, cols, Fp8Format::E4M3, true);
  const Mxfp8Copy ref =
      mxfp8_quantize(transposed(x, rows, cols), cols, rows, Fp8Format::E4M3, false);
  ASSERT_EQ(col.data.size(), size_t(rows * cols));
  ASSERT_EQ(col.scales.size(), size_t(2 * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(col.data[size_t(r * cols + c)], ref.data[size_t(c * rows + r)]);
  for (int64_t rb = 0; rb < 2; ++rb)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(col.scales[size_t(rb * cols + c)], ref.scales[size_t(c * 2 + rb)]);
  EXPECT_EQ(col.scales[size_t(1 * cols + 2)], 0);
  const std::vector<float> decoded = mxfp8_dequantize(col);
  const std::vector<float> ref_decoded = mxfp8_dequantize(ref);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float a = decoded[size_t(r * cols + c)], b = ref_decoded[size_t(c * rows + r)];
      EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b)));
    }
  }
}

TEST(micro_scaling, Mxfp8ShapeRules) {
  const std::vector<float> x(size_t{48} * 32, 1.0f);
  EXPECT_NO_THROW(mxfp8_quantize(x, 48, 32, Fp8Format::E4M3, false));
  EXPECT_THROW(mxfp8_quantize(x, 48, 32, Fp8Format::E4M3, true), std::invalid_argument);
  EXPECT_THROW(mxfp8_quantize(x, 32, 48, Fp8Format::E4M3, false), std::invalid_argument);
  EXPECT_NO_THROW(mxfp8_quantize(x, 32, 48, Fp8Format::E4M3, true));
  EXPECT_THROW(mxfp8_quantize(x, 32, 32, Fp8Format::E4M3, false), std::invalid_argument);
  Mxfp8Copy broken = mxfp8_quantize(x, 48, 32, Fp8Format::E4M3, false);
  broken.scales.pop_back();
  EXPECT_THROW(mxfp8_dequantize(broken), std::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// E2M1

TEST(micro_scaling, E2m1EncodesEveryValueAndTiesToEven) {
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 8; ++code) {
    EXPECT_EQ(e2m1_rne(values[code]), code);
    EXPECT_EQ(e2m1_rne(-values[code]), code | 0x8);
    EXPECT_EQ(e2m1_to_float(code), values[code]);
    EXPECT_EQ(e2m1_to_float(uint8_t(code | 0x8)), -values[code]);
  }
  // Midpoints go to the even code (mantissa bit 0).
  EXPECT_EQ(e2m1_rne(0.25f), 0);   // 0 / 0.5
  EXPECT_EQ(e2m1_rne(0.75f), 2);   // 0.5 / 1
  EXPECT_EQ(e2m1_rne(1.25f), 2);   // 1 / 1.5
  EXPECT_EQ(e2m1_rne(1.75f), 4);   // 1.5 / 2
  EXPECT_EQ(e2m1_rne(2.5f), 4);    // 2 / 3
  EXPECT_EQ(e2m1_rne(3.5f), 6);    // 3 / 4
  EXPECT_EQ(e2m1_rne(5.0f), 6);    // 4 / 6
  EXPECT_EQ(e2m1_rne(-5.0f), 14);  // the same with the sign
  // Just past the midpoints.
  EXPECT_EQ(e2m1_rne(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(e2m1_rne(std::nextafter(1.25f, 2.0f)), 3);
  EXPECT_EQ(e2m1_rne(std::nextafter(5.0f, 6.0f)), 7);
  // Saturation and specials.
  EXPECT_EQ(e2m1_rne(6.5f), 7);
  EXPECT_EQ(e2m1_rne(1e30f), 7);
  EXPECT_EQ(e2m1_rne(kInf), 7);
  EXPECT_EQ(e2m1_rne(-kInf), 15);
  EXPECT_EQ(e2m1_rne(kNaN), 7);
  EXPECT_EQ(e2m1_rne(-0.0f), 8);
  EXPECT_EQ(e2m1_rne(-0.1f), 8);
}

// cuda_fp4.h's own conversion (host: the double-precision software path) over magnitudes from 0 to
// 8 in steps of 2^-10, the midpoints' neighbours, and specials.
TEST(micro_scaling, E2m1MatchesCudaFp4) {
  std::vector<float> values = {0.0f, -0.0f, kInf, -kInf, 1e-30f, -1e-30f, 6.0f, 1e38f};
  for (int i = 0; i <= 8 * 1024; ++i) {
    const float v = float(i) * 0x1p-10f;
    for (const float w : {v, -v, std::nextafter(v, 0.0f), std::nextafter(v, 100.0f)})
      values.push_back(w);
  }
  for (const float v : values) {
    const unsigned cuda = __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest);
    EXPECT_EQ(unsigned(e2m1_rne(v)), cuda) << v;
  }
  EXPECT_EQ(unsigned(__nv_cvt_float_to_fp4(kNaN, __NV_E2M1, cudaRoundNearest)),
            unsigned(e2m1_rne(kNaN)));
}

// ------------------------------------------------------------------------------------------------
// Philox and stochastic rounding

// Random123's known-answer vectors (kat_vectors) of philox4x32 with 10 rounds.
TEST(micro_scaling, PhiloxKnownAnswers) {
  struct Case {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> expected;
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Case& c : cases) {
    const Philox4x32 out = philox4x32_10(
        Philox4x32{{c.counter[0], c.counter[1], c.counter[2], c.counter[3]}}, c.key[0], c.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], c.expected[size_t(i)]) << i;
  }
  // The cast's counter layout: {i / 4 low, i / 4 high, stream, step}, key {seed low, seed high}.
  const Philox4x32 words = micro_scale_random_words(0x123456789ull, 0xa4093822299f31d0ull, 7, 9);
  const Philox4x32 direct =
      philox4x32_10(Philox4x32{{0x23456789u, 0x1u, 7u, 9u}}, 0x299f31d0u, 0xa4093822u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(words.v[i], direct.v[i]);
}

TEST(micro_scaling, StochasticRoundingPicksANeighbour) {
  // Representable values never move; everything else goes to one of its two neighbours, with the
  // draw deciding: bits 0 (draw 0) always rounds up, all ones (draw 1 - 2^-24) down.
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 8; ++code) {
    for (const uint32_t bits : {0u, 0x80000000u, 0xFFFFFFFFu}) {
      EXPECT_EQ(e2m1_stochastic(values[code], bits), code);
      EXPECT_EQ(e2m1_stochastic(-values[code], bits), code | 0x8);
    }
  }
  EXPECT_EQ(e2m1_stochastic(1.2f, 0u), 3);  // up to 1.5
  EXPECT_EQ(e2m1_stochastic(1.2f, 0xFFFFFFFFu), 2);
  EXPECT_EQ(e2m1_stochastic(-4.5f, 0u), 15);  // -6
  EXPECT_EQ(e2m1_stochastic(-4.5f, 0xFFFFFFFFu), 14);
  // (1.2 - 1) * 2 = 0.4: a draw of 0.39999 rounds up, 0.40001 down.
  EXPECT_EQ(e2m1_stochastic(1.25f, uint32_t(0x7FFFFF) << 8), 3);  // draw 0.49999994 < 0.5
  EXPECT_EQ(e2m1_stochastic(1.25f, uint32_t(0x800000) << 8), 2);  // draw 0.5, not < 0.5
  EXPECT_EQ(e2m1_stochastic(6.5f, 0u), 7);
  EXPECT_EQ(e2m1_stochastic(kInf, 0u), 7);
  EXPECT_EQ(e2m1_stochastic(kNaN, 0u), 7);
  EXPECT_EQ(e2m1_stochastic(0.1f, 0xFFFFFFFFu), 0);
  EXPECT_EQ(e2m1_stochastic(-0.1f, 0xFFFFFFFFu), 8);
}

// Unbiased: 100000 draws of 1.2 (between 1 and 1.5: p(up) = 0.4, sd 0.5 * sqrt(0.24)) average to
// 1.2 within 4 standard errors; and of -4.6 (between -4 and -6).
TEST(micro_scaling, StochasticRoundingIsUnbiased) {
  constexpr int kDraws = 100000;
  for (const auto& [value, step] : {std::pair{1.2f, 0.5}, std::pair{-4.6f, 2.0}}) {
    double sum = 0.0;
    for (int i = 0; i < kDraws; ++i) {
      const uint32_t bits = micro_scale_random_words(uint64_t(i) / 4, 42, 3, 5).v[i % 4];
      sum += double(e2m1_to_float(e2m1_stochastic(value, bits)));
    }
    const double p = std::fabs(double(value) - std::trunc(double(value) / step) * step) / step;
    const double standard_error = step * std::sqrt(p * (1.0 - p) / kDraws);
    EXPECT_NEAR(sum / kDraws, double(value), 4.0 * standard_error) << value;
  }
}

// Through a whole cast: a [6250, 16] tensor of 1.2 with a 6 per block (so s_b = 448, the
// multiplier 1 and 1.2 stays between the codes of 1 and 1.5): stochastic rounding's decoded
// values average to 1.2, and without it every 1.2 rounds to 1 (RNE, never SR).
TEST(micro_scaling, Nvfp4StochasticCastIsUnbiasedAndRneWithoutIt) {
  const int64_t rows = 6250, cols = 16;
  std::vector<float> x(size_t(rows * cols), 1.2f);
  for (int64_t r = 0; r < rows; ++r) x[size_t(r * cols)] = 6.0f;
  const float s_enc = nvfp4_tensor_scale(6.0f);
  Nvfp4Params params;
  params.stochastic = true;
  params.seed = 0x1234567890ull;
  params.stream = 2;
  params.step = 11;
  const Nvfp4Copy copy = nvfp4_quantize(x, rows, cols, s_enc, params);
  EXPECT_EQ(copy.scales[0], 0x7E);  // 448
  const std::vector<float> sr = nvfp4_dequantize(copy);
  // The two decoded values: (q * 448) * fl(1 / 448).
  const float low = (1.0f * 448.0f) * (1.0f / 448.0f), high = (1.5f * 448.0f) * (1.0f / 448.0f);
  double sum = 0.0;
  int count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 1; c < cols; ++c) {
      const float v = sr[size_t(r * cols + c)];
      ASSERT_TRUE(v == low || v == high) << v;
      sum += double(v);
      ++count;
    }
  }
  const double standard_error = 0.5 * std::sqrt(0.4 * 0.6 / count);
  EXPECT_NEAR(sum / count, 1.2, 4.0 * standard_error);
  // The same seed, stream and step give the same bits; another step other bits.
  EXPECT_EQ(nvfp4_quantize(x, rows, cols, s_enc, params).data, copy.data);
  params.step = 12;
  EXPECT_NE(nvfp4_quantize(x, rows, cols, s_enc, params).data, copy.data);
  params.stochastic = false;
  const std::vector<float> rne = nvfp4_fake_quantize(x, rows, cols, s_enc, params);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 1; c < cols; ++c) ASSERT_EQ(rne[size_t(r * cols + c)], 1.0f);
}

// ------------------------------------------------------------------------------------------------
// NVFP4

TEST(micro_scaling, Nvfp4TensorScale) {
  EXPECT_EQ(nvfp4_tensor_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_tensor_scale(6.0f), 448.0f);
  EXPECT_EQ(nvfp4_tensor_scale(1.0f), 2688.0f);
  EXPECT_EQ(nvfp4_tensor_scale(0.0f), 1.0f);
  EXPECT_EQ(nvfp4_tensor_scale(kNaN), 1.0f);
  EXPECT_EQ(nvfp4_tensor_scale(kInf), 1.0f);
  EXPECT_EQ(nvfp4_tensor_scale(from_bits(1)), FLT_MAX);  // 2688 / 2^-149 overflows
  EXPECT_EQ(nvfp4_tensor_scale(3.0f), 2688.0f / 3.0f);   // IEEE division, no power of 2
}

// Global amax 6 -> S_enc 448, S_dec = fl(1/448). A block of amax 3: s_b = e4m3(3 * (448 *
// fl(1/6))) = e4m3(224.00002) = 224 (0x76); the multiplier 1 / (224 * fl(1/448)) is 2 (to an
// ulp): 3 -> 6 (code 7), 1 -> 2 (4), -1.2 -> -2.4 (0xC), 0.3 -> 0.6 (1), 0.1 -> 0.2 (0), -0.7 ->
// -1.4 (0xB). Decoded (q * 224) * fl(1/448): 6 -> 3, 2 -> 1, 1.5 -> 0.75.
TEST(micro_scaling, Nvfp4BlockOfKnownAmax) {
  std::vector<float> x(16, 0.0f);
  x[0] = 3.0f;
  x[1] = 1.0f;
  x[2] = -1.2f;
  x[3] = 0.3f;
  x[4] = 0.1f;
  x[5] = -0.7f;
  const float s_enc = nvfp4_tensor_scale(6.0f);
  EXPECT_EQ(nvfp4_block_scale(3.0f, s_enc), 0x76);
  EXPECT_NEAR(nvfp4_encode_multiplier(0x76, s_enc), 2.0f, 1e-6f);
  const Nvfp4Copy copy = nvfp4_quantize(x, 1, 16, s_enc, {});
  ASSERT_EQ(copy.data.size(), 8u);
  ASSERT_EQ(copy.scales.size(), 1u);
  EXPECT_EQ(copy.scales[0], 0x76);
  EXPECT_EQ(copy.data[0], 0x47);  // element 0 in the low nibble
  EXPECT_EQ(copy.data[1], 0x1C);
  EXPECT_EQ(copy.data[2], 0xB0);
  const std::vector<float> decoded = nvfp4_dequantize(copy);
  EXPECT_FLOAT_EQ(decoded[0], 3.0f);
  EXPECT_FLOAT_EQ(decoded[1], 1.0f);
  EXPECT_FLOAT_EQ(decoded[2], -1.0f);
  EXPECT_FLOAT_EQ(decoded[3], 0.25f);
  EXPECT_EQ(decoded[4], 0.0f);
  EXPECT_FLOAT_EQ(decoded[5], -0.75f);
  // The decoded value's rounding: (q * s_b) exact, then one product with S_dec = fl(1/448),
  // which is above 1/448 by 0.75 * 2^-24 relative: 6 * 224 / 448 comes out one ulp above 3.
  EXPECT_EQ(decoded[0], (6.0f * 224.0f) * (1.0f / 448.0f));
  EXPECT_EQ(decoded[0], std::nextafter(3.0f, 4.0f));
  EXPECT_EQ(decoded[1], 1.0f);
}

// A block whose s_b underflows E4M3 (1e-6 / 6 * 1 < 2^-10) stores codes 0 and decodes to 0; an
// Inf saturates s_b to 448 and itself to 6; NaN codes +6 (0x7).
TEST(micro_scaling, Nvfp4ZeroScaleNanAndInf) {
  std::vector<float> x(32, 1e-6f);
  x[1] = -1e-6f;
  for (int c = 16; c < 32; ++c) x[size_t(c)] = 1.0f;
  x[16] = kInf;
  x[17] = kNaN;
  x[18] = -kInf;
  const Nvfp4Copy copy = nvfp4_quantize(x, 1, 32, 1.0f, {});
  EXPECT_EQ(copy.scales[0], 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(copy.data[size_t(i)], 0);
  EXPECT_EQ(copy.scales[1], 0x7E);  // 448
  EXPECT_EQ(copy.data[8], 0x77);    // Inf -> 6, NaN -> +6
  EXPECT_EQ(copy.data[9] & 0xF, 0xF);
  const std::vector<float> decoded = nvfp4_dequantize(copy);
  EXPECT_EQ(decoded[1], 0.0f);
  EXPECT_EQ(decoded[16], 6.0f * 448.0f);
  EXPECT_EQ(decoded[18], -6.0f * 448.0f);
  EXPECT_EQ(decoded[19], 0.0f);  // 1 * (1 / 448 / 1) = 0.0022 -> code 0
}

TEST(micro_scaling, Nvfp4ColumnwiseIsTheRowwiseCopyOfTheTranspose) {
  const int64_t rows = 48, cols = 20;
  const std::vector<float> x = random_values(size_t(rows * cols), 3);
  const float s_enc = nvfp4_tensor_scale(4.0f);
  Nvfp4Params columnwise;
  columnwise.columnwise = true;
  const Nvfp4Copy col = nvfp4_quantize(x, rows, cols, s_enc, columnwise);
  const Nvfp4Copy ref = nvfp4_quantize(transposed(x, rows, cols), cols, rows, s_enc, {});
  EXPECT_EQ(col.data, ref.data);
  EXPECT_EQ(col.scales, ref.scales);
  EXPECT_EQ(col.data.size(), size_t(cols * rows / 2));
  EXPECT_EQ(col.scales.size(), size_t(cols * rows / 16));
  EXPECT_EQ(nvfp4_dequantize(col), transposed(nvfp4_dequantize(ref), cols, rows));
  // Fake quantization stays close: |error| <= half a step of the block's grid (at most a sixth
  // of the block amax, plus the block scale's rounding).
  const std::vector<float> fq = nvfp4_fake_quantize(x, rows, cols, s_enc, columnwise);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(fq[i], x[i], 1.0f) << i;
}

// 2-D: one scale per 16 x 16 block, repeated on the block's 16 rows; the columnwise copy is the
// rowwise codes and scales transposed.
TEST(micro_scaling, Nvfp4TwoDimensionalBlocks) {
  const int64_t rows = 32, cols = 48;
  std::vector<float> x = random_values(size_t(rows * cols), 4, 0.1f);
  x[size_t(3 * cols + 20)] = 5.0f;    // block (0, 1)
  x[size_t(17 * cols + 40)] = -2.0f;  // block (1, 2)
  const float s_enc = nvfp4_tensor_scale(5.0f);
  Nvfp4Params params;
  params.two_d = true;
  const Nvfp4Copy row = nvfp4_quantize(x, rows, cols, s_enc, params);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(row.scales[size_t(r * 3 + 1)], row.scales[size_t((r / 16) * 16 * 3 + 1)]);
    EXPECT_EQ(row.scales[size_t(r * 3 + 2)], row.scales[size_t((r / 16) * 16 * 3 + 2)]);
  }
  EXPECT_EQ(row.scales[1], nvfp4_block_scale(5.0f, s_enc));
  EXPECT_EQ(row.scales[size_t(16 * 3 + 2)], nvfp4_block_scale(2.0f, s_enc));
  // Rows 0-15 and 16-31 of block column 1 differ in amax, and so in scale.
  EXPECT_NE(row.scales[1], row.scales[size_t(16 * 3 + 1)]);
  params.columnwise = true;
  const Nvfp4Copy col = nvfp4_quantize(x, rows, cols, s_enc, params);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int row_code = (row.data[size_t((r * cols + c) / 2)] >> (4 * (c % 2))) & 0xF;
      const int col_code = (col.data[size_t((c * rows + r) / 2)] >> (4 * (r % 2))) & 0xF;
      EXPECT_EQ(row_code, col_code);
      EXPECT_EQ(row.scales[size_t(r * 3 + c / 16)], col.scales[size_t(c * 2 + r / 16)]);
    }
  }
  EXPECT_EQ(nvfp4_dequantize(row), nvfp4_dequantize(col));
}

TEST(micro_scaling, Nvfp4ShapeRules) {
  const std::vector<float> x(size_t{24} * 32, 1.0f);
  Nvfp4Params p;
  EXPECT_NO_THROW(nvfp4_quantize(x, 24, 32, 1.0f, p));
  EXPECT_THROW(nvfp4_quantize(x, 32, 24, 1.0f, p), std::invalid_argument);
  p.columnwise = true;
  EXPECT_THROW(nvfp4_quantize(x, 24, 32, 1.0f, p), std::invalid_argument);
  EXPECT_NO_THROW(nvfp4_quantize(x, 32, 24, 1.0f, p));
  p.rht = true;
  EXPECT_THROW(nvfp4_quantize(x, 24, 32, 1.0f, p), std::invalid_argument);
  p.columnwise = false;
  EXPECT_THROW(nvfp4_quantize(x, 32, 24, 1.0f, p), std::invalid_argument);  // rowwise RHT
  p.columnwise = true;
  p.two_d = true;
  EXPECT_THROW(nvfp4_quantize(x, 32, 24, 1.0f, p), std::invalid_argument);  // RHT + 2-D
  p.rht = false;
  EXPECT_THROW(nvfp4_quantize(x, 32, 24, 1.0f, p), std::invalid_argument);  // 24 % 16
  EXPECT_THROW(nvfp4_quantize(x, 24, 32, 0.0f, {}), std::invalid_argument);
  EXPECT_THROW(nvfp4_quantize(x, 24, 31, 1.0f, {}), std::invalid_argument);
  EXPECT_THROW(rht_columns(x, 24, 32), std::invalid_argument);
  Nvfp4Copy broken = nvfp4_quantize(x, 24, 32, 1.0f, {});
  broken.data.pop_back();
  EXPECT_THROW(nvfp4_dequantize(broken), std::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Random Hadamard transform

TEST(micro_scaling, RhtIsOrthogonal) {
  const std::vector<float> x = random_values(16, 5);
  std::array<float, 16> v{};
  for (int k = 0; k < 16; ++k) v[size_t(k)] = x[size_t(k)];
  rht16(v);
  double norm_x = 0.0, norm_v = 0.0;
  for (int k = 0; k < 16; ++k) {
    norm_x += double(x[size_t(k)]) * x[size_t(k)];
    norm_v += double(v[size_t(k)]) * v[size_t(k)];
  }
  EXPECT_NEAR(norm_v, norm_x, 1e-5 * norm_x);
  rht16_transpose(v);
  for (int k = 0; k < 16; ++k) EXPECT_NEAR(v[size_t(k)], x[size_t(k)], 1e-6f) << k;
  // The first basis vector maps to (H16 D / 4) e_0 = column 0 of H16 times D[0][0] = +1, / 4.
  std::array<float, 16> e{};
  e[0] = 1.0f;
  rht16(e);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(e[size_t(k)], 0.25f);
  // e_3 (D[3][3] = -1): -column 3 of H16 / 4; H16[j][3] = (-1)^popcount(j & 3).
  std::array<float, 16> e3{};
  e3[3] = 1.0f;
  rht16(e3);
  for (int k = 0; k < 16; ++k)
    EXPECT_EQ(e3[size_t(k)], (std::popcount(unsigned(k & 3)) % 2 == 0 ? -0.25f : 0.25f)) << k;
}

// A GEMM over the transformed dimension is unchanged: sum_r a[r, i] * b[r, j] over the rows of
// two [64, n] operands equals the same sum over their transformed columns, within fp32 rounding.
TEST(micro_scaling, RhtLeavesTheGemmOverTheTransformedDimensionUnchanged) {
  const int64_t k = 64, m = 5, n = 7;
  const std::vector<float> a = random_values(size_t(k * m), 6);
  const std::vector<float> b = random_values(size_t(k * n), 7);
  const std::vector<float> ta = rht_columns(a, k, m);
  const std::vector<float> tb = rht_columns(b, k, n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double plain = 0.0, transformed = 0.0, scale = 0.0;
      for (int64_t r = 0; r < k; ++r) {
        plain += double(a[size_t(r * m + i)]) * b[size_t(r * n + j)];
        transformed += double(ta[size_t(r * m + i)]) * tb[size_t(r * n + j)];
        scale += std::fabs(double(a[size_t(r * m + i)]) * b[size_t(r * n + j)]);
      }
      EXPECT_NEAR(transformed, plain, 1e-6 * scale + 1e-6) << i << ", " << j;
    }
  }
  // The transform changes the values (so the test above can fail), and rht_amax is the amax of
  // the transformed values.
  EXPECT_NE(ta, a);
  float amax = 0.0f;
  for (const float v : ta) amax = std::fmax(amax, std::fabs(v));
  EXPECT_EQ(rht_amax(a, k, m), amax);
  // The columnwise RHT copy quantizes the transformed values: decoded, it approximates ta.
  Nvfp4Params params;
  params.columnwise = true;
  params.rht = true;
  const std::vector<float> fq = nvfp4_fake_quantize(a, k, m, nvfp4_tensor_scale(amax), params);
  Nvfp4Params plain_params;
  plain_params.columnwise = true;
  EXPECT_EQ(fq, nvfp4_fake_quantize(ta, k, m, nvfp4_tensor_scale(amax), plain_params));
}

// Up to quantization: the wgrad-style product over the rows of two NVFP4 columnwise RHT copies
// (each with S_enc from its transformed amax) approximates the unquantized, untransformed product
// within NVFP4's error (|error| <= 10% of sqrt(sum a^2 * sum b^2), Cauchy-Schwarz's bound on the
// product; measured a few percent), and on Gaussian data (no outliers for the transform to spread)
// the squared error with RHT is within 1.5x of quantizing without it (measured 1.08x here, 1.12x
// at k = 1024 over 32 x 32 products).
TEST(micro_scaling, RhtGemmMatchesUpToQuantization) {
  const int64_t k = 512, m = 16, n = 16;
  const std::vector<float> a = random_values(size_t(k * m), 8);
  const std::vector<float> b = random_values(size_t(k * n), 9);
  Nvfp4Params rht;
  rht.columnwise = true;
  rht.rht = true;
  Nvfp4Params plain;
  plain.columnwise = true;
  const std::vector<float> qa =
      nvfp4_fake_quantize(a, k, m, nvfp4_tensor_scale(rht_amax(a, k, m)), rht);
  const std::vector<float> qb =
      nvfp4_fake_quantize(b, k, n, nvfp4_tensor_scale(rht_amax(b, k, n)), rht);
  float amax_a = 0.0f, amax_b = 0.0f;
  for (const float v : a) amax_a = std::fmax(amax_a, std::fabs(v));
  for (const float v : b) amax_b = std::fmax(amax_b, std::fabs(v));
  const std::vector<float> pa = nvfp4_fake_quantize(a, k, m, nvfp4_tensor_scale(amax_a), plain);
  const std::vector<float> pb = nvfp4_fake_quantize(b, k, n, nvfp4_tensor_scale(amax_b), plain);
  double rht_error = 0.0, plain_error = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0.0, with_rht = 0.0, without = 0.0, norm_a = 0.0, norm_b = 0.0;
      for (int64_t r = 0; r < k; ++r) {
        const double x = a[size_t(r * m + i)], y = b[size_t(r * n + j)];
        exact += x * y;
        norm_a += x * x;
        norm_b += y * y;
        with_rht += double(qa[size_t(r * m + i)]) * qb[size_t(r * n + j)];
        without += double(pa[size_t(r * m + i)]) * pb[size_t(r * n + j)];
      }
      const double bound = 0.1 * std::sqrt(norm_a * norm_b);
      EXPECT_NEAR(with_rht, exact, bound) << i << ", " << j;
      rht_error += (with_rht - exact) * (with_rht - exact);
      plain_error += (without - exact) * (without - exact);
    }
  }
  EXPECT_GT(rht_error, 0.0);  // quantization did change the values
  EXPECT_LT(rht_error, 1.5 * plain_error);
}

// ------------------------------------------------------------------------------------------------
// sm_100 swizzled scales

TEST(micro_scaling, SwizzledScaleLayout) {
  EXPECT_EQ(swizzled_scale_offset(0, 0, 4), 0);
  EXPECT_EQ(swizzled_scale_offset(0, 3, 4), 3);
  EXPECT_EQ(swizzled_scale_offset(1, 0, 4), 16);
  EXPECT_EQ(swizzled_scale_offset(31, 0, 4), 496);
  EXPECT_EQ(swizzled_scale_offset(32, 0, 4), 4);
  EXPECT_EQ(swizzled_scale_offset(33, 2, 4), 16 + 4 + 2);
  EXPECT_EQ(swizzled_scale_offset(127, 3, 4), 31 * 16 + 3 * 4 + 3);
  EXPECT_EQ(swizzled_scale_offset(0, 4, 5), 512);        // the next inner tile
  EXPECT_EQ(swizzled_scale_offset(128, 0, 5), 2 * 512);  // the next outer tile: 2 inner tiles
  EXPECT_EQ(swizzled_scale_offset(130, 6, 9), (3 + 1) * 512 + 2 * 16 + 2);
  EXPECT_EQ(swizzled_scales_size(129, 5), 256 * 8);
  EXPECT_EQ(swizzled_scales_size(128, 4), 512);
  EXPECT_EQ(swizzled_scales_size(0, 0), 0);

  const int64_t outer = 129, inner = 5;
  std::vector<uint8_t> compact(size_t(outer * inner));
  for (size_t i = 0; i < compact.size(); ++i) compact[i] = uint8_t(1 + i % 200);
  const std::vector<uint8_t> swizzled = swizzle_scales(compact, outer, inner);
  ASSERT_EQ(swizzled.size(), size_t(swizzled_scales_size(outer, inner)));
  size_t nonzero = 0;
  for (const uint8_t s : swizzled) nonzero += s != 0;
  EXPECT_EQ(nonzero, compact.size());  // every padding entry 0
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      EXPECT_EQ(swizzled[size_t(swizzled_scale_offset(o, i, inner))],
                compact[size_t(o * inner + i)]);
  EXPECT_THROW(swizzle_scales(compact, outer, inner + 1), std::invalid_argument);
  EXPECT_THROW(swizzled_scale_offset(0, 5, 5), std::invalid_argument);
  EXPECT_THROW(swizzled_scale_offset(-1, 0, 5), std::invalid_argument);
}

}  // namespace
}  // namespace opfuse::cpu
