// The CPU oracle of block scaling (runtime/cpu/block_quantization.h, TE's Float8BlockScaling)
// against expectations worked out independently: scales and codes computed by hand, the scale
// grids' shapes and indices from the cuBLASLt layout, a per-element re-derivation of every block
// (each element looks up its own block, instead of walking blocks), the dequantization error
// bound of the formats, and the block-scaled GEMM against a double-precision product.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "cpu/block_quantization.h"
#include "cpu/numerics.h"

namespace opfuse::cpu {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kE4m3Max = 448.0f;
constexpr float kE5m2Max = 57344.0f;

uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }

BlockQuantParams params_for(Fp8Format format, bool two_d, bool power_of_2, float epsilon = 0.0f) {
  BlockQuantParams params;
  params.format = format;
  params.two_d = two_d;
  params.power_of_2_scale = power_of_2;
  params.epsilon = epsilon;
  return params;
}

// N(0, 1) values with a few of them huge (x 1e4), rounded to bf16 like a kernel's input.
std::vector<float> random_input(size_t count, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<size_t> pick(0, count == 0 ? 0 : count - 1);
  std::vector<float> x(count);
  for (float& v : x) v = bf16_to_float(float_to_bf16(static_cast<float>(normal(rng))));
  for (int i = 0; i < 5 && count > 0; ++i) x[pick(rng)] *= 1e4f;
  return x;
}

// --- block_scale --------------------------------------------------------------------------------

TEST(BlockScale, PowerOfTwoQuotientIsExactWithOrWithoutRounding) {
  // 448 / 3.5 = 128 exactly: a power of 2 already, so the mask changes nothing.
  EXPECT_EQ(block_scale(3.5f, kE4m3Max, 0.0f, false, bf16_max_finite()), 128.0f);
  EXPECT_EQ(block_scale(3.5f, kE4m3Max, 0.0f, true, bf16_max_finite()), 128.0f);
  // 57344 / 3.5 = 16384.
  EXPECT_EQ(block_scale(3.5f, kE5m2Max, 0.0f, false, bf16_max_finite()), 16384.0f);
  EXPECT_EQ(block_scale(3.5f, kE5m2Max, 0.0f, true, bf16_max_finite()), 16384.0f);
}

TEST(BlockScale, PowerOfTwoRoundsTheQuotientDown) {
  // 448 / 3 = 149.33...: rounded to the nearest float without pow2, down to 128 with it.
  EXPECT_EQ(block_scale(3.0f, kE4m3Max, 0.0f, false, bf16_max_finite()), 448.0f / 3.0f);
  EXPECT_EQ(block_scale(3.0f, kE4m3Max, 0.0f, true, bf16_max_finite()), 128.0f);
  // 57344 / 3 = 19114.67 -> 16384; 448 / 0.3 = 1493.3 -> 1024.
  EXPECT_EQ(block_scale(3.0f, kE5m2Max, 0.0f, true, bf16_max_finite()), 16384.0f);
  EXPECT_EQ(block_scale(0.3f, kE4m3Max, 0.0f, true, bf16_max_finite()), 1024.0f);
  // The quotient itself is IEEE-rounded: 448 / 0.3f in fp32, not in double first.
  EXPECT_EQ(bits_of(block_scale(0.3f, kE4m3Max, 0.0f, false, bf16_max_finite())),
            bits_of(448.0f / 0.3f));
}

TEST(BlockScale, EpsilonFloorsTheAmax) {
  // amax 0.25 below epsilon 0.5: 448 / 0.5 = 896, pow2 512.
  EXPECT_EQ(block_scale(0.25f, kE4m3Max, 0.5f, false, bf16_max_finite()), 896.0f);
  EXPECT_EQ(block_scale(0.25f, kE4m3Max, 0.5f, true, bf16_max_finite()), 512.0f);
  // A zero block with epsilon > 0 gets the floor's scale, not 1.
  EXPECT_EQ(block_scale(0.0f, kE4m3Max, 0.5f, false, bf16_max_finite()), 896.0f);
  // 448 / 1e-3 = 448000 -> 2^18 = 262144 with pow2.
  EXPECT_EQ(block_scale(0.0f, kE4m3Max, 1e-3f, true, bf16_max_finite()), 262144.0f);
  // Above the floor, the amax itself.
  EXPECT_EQ(block_scale(3.5f, kE4m3Max, 0.5f, false, bf16_max_finite()), 128.0f);
}

TEST(BlockScale, ZeroInfAndNanAmaxGiveOne) {
  for (const bool pow2 : {false, true}) {
    EXPECT_EQ(block_scale(0.0f, kE4m3Max, 0.0f, pow2, bf16_max_finite()), 1.0f);
    EXPECT_EQ(block_scale(kInf, kE4m3Max, 0.0f, pow2, bf16_max_finite()), 1.0f);
    EXPECT_EQ(block_scale(kNan, kE4m3Max, 0.0f, pow2, bf16_max_finite()), 1.0f);
    // A NaN amax stays NaN past the epsilon floor (NaN < eps is false): still 1.
    EXPECT_EQ(block_scale(kNan, kE4m3Max, 1e-3f, pow2, bf16_max_finite()), 1.0f);
  }
}

TEST(BlockScale, InfiniteQuotientBecomesTheSourceDtypesMax) {
  EXPECT_EQ(bf16_max_finite(), 3.38953139e38f);
  EXPECT_EQ(bits_of(bf16_max_finite()), 0x7F7F0000u);
  EXPECT_EQ(fp16_max_finite(), 65504.0f);
  // 448 / 1e-39 (subnormal) overflows fp32.
  EXPECT_EQ(block_scale(1e-39f, kE4m3Max, 0.0f, false, bf16_max_finite()), bf16_max_finite());
  EXPECT_EQ(block_scale(1e-39f, kE4m3Max, 0.0f, false, fp16_max_finite()), 65504.0f);
  EXPECT_EQ(block_scale(1e-39f, kE4m3Max, 0.0f, false, FLT_MAX), FLT_MAX);
  // Then pow2 applies to it: 0x7F7F0000 -> 2^127, 65504 -> 32768.
  EXPECT_EQ(block_scale(1e-39f, kE4m3Max, 0.0f, true, bf16_max_finite()), std::ldexp(1.0f, 127));
  EXPECT_EQ(block_scale(1e-39f, kE4m3Max, 0.0f, true, fp16_max_finite()), 32768.0f);
  // Just finite: 448 / 2^-119 = 7 * 2^125, kept as is (pow2: 2^127).
  EXPECT_EQ(block_scale(std::ldexp(1.0f, -119), kE4m3Max, 0.0f, false, fp16_max_finite()),
            std::ldexp(7.0f, 125));
  EXPECT_EQ(block_scale(std::ldexp(1.0f, -119), kE4m3Max, 0.0f, true, fp16_max_finite()),
            std::ldexp(1.0f, 127));
}

// --- grids --------------------------------------------------------------------------------------

TEST(BlockScaleGrid, OneDimensionalGridIsColumnBlocksByPaddedRows) {
  // [5, 16]: one column block, rows padded to 8.
  EXPECT_EQ(scale_grid_shape(5, 16, false), (ScaleGridShape{1, 8}));
  EXPECT_EQ(scale_grid_shape(5, 300, false), (ScaleGridShape{3, 8}));
  EXPECT_EQ(scale_grid_shape(128, 128, false), (ScaleGridShape{1, 128}));
  EXPECT_EQ(scale_grid_shape(0, 128, false), (ScaleGridShape{1, 0}));
  EXPECT_EQ(scale_grid_shape(300, 272, false).size(), 3 * 300);
  // Entry (r, c) at (c / 128) * inner + r.
  EXPECT_EQ(scale_grid_index(5, 300, false, 4, 299), 2 * 8 + 4);
  EXPECT_EQ(scale_grid_index(5, 300, false, 0, 127), 0);
  EXPECT_EQ(scale_grid_index(5, 300, false, 0, 128), 8);
  EXPECT_EQ(scale_grid_index(301, 300, false, 300, 200), 304 + 300);
}

TEST(BlockScaleGrid, TwoDimensionalGridIsRowBlocksByPaddedColumnBlocks) {
  EXPECT_EQ(scale_grid_shape(300, 272, true), (ScaleGridShape{3, 4}));
  EXPECT_EQ(scale_grid_shape(272, 300, true), (ScaleGridShape{3, 4}));
  EXPECT_EQ(scale_grid_shape(128, 640, true), (ScaleGridShape{1, 8}));
  EXPECT_EQ(scale_grid_shape(1, 16, true), (ScaleGridShape{1, 4}));
  // Entry (r, c) at (r / 128) * inner + c / 128.
  EXPECT_EQ(scale_grid_index(300, 272, true, 299, 271), 2 * 4 + 2);
  EXPECT_EQ(scale_grid_index(300, 272, true, 127, 128), 1);
  EXPECT_EQ(scale_grid_index(300, 272, true, 128, 0), 4);
}

TEST(BlockQuantize, PaddingEntriesOfTheGridStayZero) {
  // 5 rows of 16: one block per row, entries 5..7 are padding.
  std::vector<float> x(80);  // [5, 16]
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i % 7);
  const BlockQuantizedCopy copy =
      block_quantize_rowwise(x, 5, 16, params_for(Fp8Format::E4M3, false, true));
  ASSERT_EQ(copy.scale_inv.size(), 8u);
  for (int r = 0; r < 5; ++r) EXPECT_GT(copy.scale_inv[size_t(r)], 0.0f) << r;
  for (int r = 5; r < 8; ++r) EXPECT_EQ(copy.scale_inv[size_t(r)], 0.0f) << r;
  // 2-D: [1][4] with one real block.
  const BlockQuantizedCopy two_d =
      block_quantize_rowwise(x, 5, 16, params_for(Fp8Format::E4M3, true, true));
  ASSERT_EQ(two_d.scale_inv.size(), 4u);
  EXPECT_GT(two_d.scale_inv[0], 0.0f);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(two_d.scale_inv[size_t(i)], 0.0f);
}

// --- quantization -------------------------------------------------------------------------------

TEST(BlockQuantize, HandComputedRowBlock) {
  // One row of 128: amax 3.5 -> scale 128 (both modes), scale_inv 1/128.
  std::vector<float> x(128, 1.0f);
  x[3] = 3.5f;
  x[4] = -1.0f;
  x[5] = 0.0f;
  for (const bool pow2 : {false, true}) {
    const BlockQuantizedCopy copy =
        block_quantize_rowwise(x, 1, 128, params_for(Fp8Format::E4M3, false, pow2));
    EXPECT_EQ(copy.scale_inv[0], 1.0f / 128.0f);
    EXPECT_EQ(copy.data[3], 0x7E);  // 3.5 * 128 = 448, the E4M3 max
    EXPECT_EQ(copy.data[0], 0x70);  // 128 = 2^7: exponent 14, mantissa 0
    EXPECT_EQ(copy.data[4], 0xF0);  // -128
    EXPECT_EQ(copy.data[5], 0x00);
  }
}

TEST(BlockQuantize, ZeroBlockHasScaleOneAndZeroCodes) {
  std::vector<float> x(512, 1.0f);                    // [2, 256]
  std::fill(x.begin() + 128, x.begin() + 256, 0.0f);  // row 0, second block
  const BlockQuantizedCopy copy =
      block_quantize_rowwise(x, 2, 256, params_for(Fp8Format::E4M3, false, true));
  EXPECT_EQ(copy.scale_inv_at(0, 200, false), 1.0f);
  for (int c = 128; c < 256; ++c) EXPECT_EQ(copy.data[size_t(c)], 0x00) << c;
  EXPECT_EQ(copy.scale_inv_at(0, 0, false), 1.0f / 256.0f);  // 448 -> 256 (pow2)
  // With epsilon the zero block gets the floor's scale: 448 / 1e-3 -> 2^18; codes still 0.
  const BlockQuantizedCopy floored =
      block_quantize_rowwise(x, 2, 256, params_for(Fp8Format::E4M3, false, true, 1e-3f));
  EXPECT_EQ(floored.scale_inv_at(0, 200, false), 1.0f / 262144.0f);
  for (int c = 128; c < 256; ++c) EXPECT_EQ(floored.data[size_t(c)], 0x00) << c;
}

TEST(BlockQuantize, InfInABlockGivesScaleOneAndSaturates) {
  std::vector<float> x(128, 1.0f);
  x[0] = kInf;
  x[1] = -kInf;
  x[2] = 1000.0f;
  const BlockQuantizedCopy e4m3 =
      block_quantize_rowwise(x, 1, 128, params_for(Fp8Format::E4M3, false, true));
  EXPECT_EQ(e4m3.scale_inv[0], 1.0f);
  EXPECT_EQ(e4m3.data[0], 0x7E);  // +448
  EXPECT_EQ(e4m3.data[1], 0xFE);  // -448
  EXPECT_EQ(e4m3.data[2], 0x7E);  // 1000 saturates too
  EXPECT_EQ(e4m3.data[3], 0x38);  // 1.0 * 1
  const BlockQuantizedCopy e5m2 =
      block_quantize_rowwise(x, 1, 128, params_for(Fp8Format::E5M2, false, false));
  EXPECT_EQ(e5m2.scale_inv[0], 1.0f);
  EXPECT_EQ(e5m2.data[0], 0x7B);  // +57344
  EXPECT_EQ(e5m2.data[3], 0x3C);  // 1.0
}

TEST(BlockQuantize, NanElementCastsToNanAndTheOthersSetTheScale) {
  std::vector<float> x(128, 1.0f);
  x[7] = kNan;
  x[9] = 3.5f;
  const BlockQuantizedCopy copy =
      block_quantize_rowwise(x, 1, 128, params_for(Fp8Format::E4M3, false, false));
  EXPECT_EQ(copy.scale_inv[0], 1.0f / 128.0f);  // amax 3.5, the NaN skipped
  EXPECT_EQ(copy.data[7], 0x7F);
  EXPECT_EQ(copy.data[9], 0x7E);
  EXPECT_EQ(copy.data[0], 0x70);
  // E5M2's NaN code is 0x7F as well.
  const BlockQuantizedCopy e5m2 =
      block_quantize_rowwise(x, 1, 128, params_for(Fp8Format::E5M2, false, false));
  EXPECT_EQ(e5m2.data[7], 0x7F);
}

TEST(BlockQuantize, TinyBlockUsesTheValueForInf) {
  // A block of bf16 subnormals: 448 / 1e-39 overflows, so the scale is bf16's max (pow2 off):
  // 1e-39 * 3.39e38 = 0.339, an E4M3 value of its own.
  std::vector<float> x(128, 0.0f);
  x[0] = bf16_to_float(float_to_bf16(1e-39f));
  x[1] = -x[0];
  BlockQuantParams params = params_for(Fp8Format::E4M3, false, false);
  params.value_for_inf = bf16_max_finite();
  const BlockQuantizedCopy copy = block_quantize_rowwise(x, 1, 128, params);
  EXPECT_EQ(copy.scale_inv[0], 1.0f / bf16_max_finite());
  EXPECT_EQ(copy.data[0], float_to_fp8(x[0] * bf16_max_finite(), Fp8Format::E4M3));
  EXPECT_NE(copy.data[0], 0x00);
  EXPECT_EQ(copy.data[1], copy.data[0] | 0x80);
  // fp16's max with pow2: 32768.
  params.value_for_inf = fp16_max_finite();
  params.power_of_2_scale = true;
  EXPECT_EQ(block_quantize_rowwise(x, 1, 128, params).scale_inv[0], 1.0f / 32768.0f);
}

// The amax of the block holding element (r, c), computed from the source with comparisons (a NaN
// compares false, so it is skipped) and remembered per block.
class BlockAmax {
 public:
  BlockAmax(std::span<const float> x, int64_t rows, int64_t cols, bool two_d)
      : x_(x), rows_(rows), cols_(cols), block_rows_(two_d ? 128 : 1) {}
  float at(int64_t r, int64_t c) {
    const int64_t r0 = r / block_rows_ * block_rows_, c0 = c / 128 * 128;
    const auto [it, inserted] = cache_.try_emplace(r0 * cols_ + c0, 0.0f);
    if (inserted) {
      for (int64_t i = r0; i < std::min(rows_, r0 + block_rows_); ++i) {
        for (int64_t j = c0; j < std::min(cols_, c0 + 128); ++j) {
          const float v = std::fabs(x_[size_t(i * cols_ + j)]);
          if (v > it->second) it->second = v;
        }
      }
    }
    return it->second;
  }

 private:
  std::span<const float> x_;
  int64_t rows_, cols_, block_rows_;
  std::map<int64_t, float> cache_;
};

// Every element of a copy looked up in its own block: the scale from the block's amax, the code,
// and the block's scale_inv entry.
void expect_blocks_match_a_per_element_derivation(std::span<const float> stored, int64_t rows,
                                                  int64_t cols, const BlockQuantParams& params,
                                                  const BlockQuantizedCopy& copy) {
  ASSERT_EQ(copy.rows, rows);
  ASSERT_EQ(copy.cols, cols);
  ASSERT_EQ(copy.data.size(), size_t(rows * cols));
  BlockAmax amax(stored, rows, cols, params.two_d);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = block_scale(amax.at(r, c), fp8_max(params.format), params.epsilon,
                                      params.power_of_2_scale, params.value_for_inf);
      ASSERT_EQ(copy.data[size_t(r * cols + c)],
                float_to_fp8(stored[size_t(r * cols + c)] * scale, params.format))
          << "element (" << r << ", " << c << ")";
      ASSERT_EQ(bits_of(copy.scale_inv_at(r, c, params.two_d)), bits_of(1.0f / scale))
          << "element (" << r << ", " << c << ")";
    }
  }
}

std::vector<float> transposed(std::span<const float> x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

TEST(BlockQuantize, RaggedShapesHavePartialBlocks) {
  std::mt19937_64 rng(21);
  const int64_t shapes[][2] = {{1, 16}, {5, 136}, {127, 144}, {130, 272}, {300, 128}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], cols = shape[1];
    const std::vector<float> x = random_input(size_t(rows * cols), rng);
    for (const bool two_d : {false, true}) {
      const BlockQuantParams params = params_for(Fp8Format::E4M3, two_d, two_d, 1e-3f);
      SCOPED_TRACE(testing::Message() << rows << " x " << cols << (two_d ? " 2-D" : " 1-D"));
      const BlockQuantizedCopy rowwise = block_quantize_rowwise(x, rows, cols, params);
      EXPECT_EQ(rowwise.scale_inv.size(), size_t(scale_grid_shape(rows, cols, two_d).size()));
      expect_blocks_match_a_per_element_derivation(x, rows, cols, params, rowwise);
      const BlockQuantizedCopy columnwise = block_quantize_columnwise(x, rows, cols, params);
      EXPECT_EQ(columnwise.scale_inv.size(), size_t(scale_grid_shape(cols, rows, two_d).size()));
      expect_blocks_match_a_per_element_derivation(transposed(x, rows, cols), cols, rows, params,
                                                   columnwise);
    }
  }
}

TEST(BlockQuantize, TwoDimensionalColumnwiseIsTheRowwiseCopyTransposed) {
  std::mt19937_64 rng(22);
  const int64_t rows = 300, cols = 272;
  const std::vector<float> x = random_input(size_t(rows * cols), rng);
  for (const Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const BlockQuantParams params = params_for(format, true, false);
    const BlockQuantizedCopy rowwise = block_quantize_rowwise(x, rows, cols, params);
    const BlockQuantizedCopy columnwise = block_quantize_columnwise(x, rows, cols, params);
    ASSERT_EQ(columnwise.rows, cols);
    ASSERT_EQ(columnwise.cols, rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(columnwise.data[size_t(c * rows + r)], rowwise.data[size_t(r * cols + c)]);
        ASSERT_EQ(bits_of(columnwise.scale_inv_at(c, r, true)),
                  bits_of(rowwise.scale_inv_at(r, c, true)));
      }
    }
    // The grids themselves: [3][4] and [3][4], entry (rb, cb) <-> (cb, rb).
    for (int64_t rb = 0; rb < 3; ++rb)
      for (int64_t cb = 0; cb < 3; ++cb)
        EXPECT_EQ(columnwise.scale_inv[size_t(cb * 4 + rb)],
                  rowwise.scale_inv[size_t(rb * 4 + cb)]);
  }
}

TEST(BlockQuantize, OneDimensionalColumnwiseIsQuantizedAgainFromTheSource) {
  // All ones but x[0][0] = 3.5: row 0 and column 0 have amax 3.5 (scale 128), every other row and
  // column amax 1 (scale 448). Element (0, 1): row-wise 1 * 128 (0x70), column-wise 1 * 448 (0x7E).
  const int64_t n = 128;
  std::vector<float> x(size_t(n * n), 1.0f);
  x[0] = 3.5f;
  const BlockQuantParams params = params_for(Fp8Format::E4M3, false, false);
  const BlockQuantizedCopy rowwise = block_quantize_rowwise(x, n, n, params);
  const BlockQuantizedCopy columnwise = block_quantize_columnwise(x, n, n, params);
  EXPECT_EQ(rowwise.data[1], 0x70);
  EXPECT_EQ(columnwise.data[size_t(1 * n + 0)], 0x7E);  // stored [cols, rows]: (c = 1, r = 0)
  EXPECT_EQ(rowwise.scale_inv_at(0, 0, false), 1.0f / 128.0f);
  EXPECT_EQ(rowwise.scale_inv_at(1, 0, false), 1.0f / 448.0f);
  EXPECT_EQ(columnwise.scale_inv_at(0, 0, false), 1.0f / 128.0f);  // column 0 of x
  EXPECT_EQ(columnwise.scale_inv_at(1, 0, false), 1.0f / 448.0f);  // column 1 of x
  // In general the two copies differ: random data, many codes apart.
  std::mt19937_64 rng(23);
  const std::vector<float> y = random_input(size_t(n * n), rng);
  const BlockQuantizedCopy a = block_quantize_rowwise(y, n, n, params);
  const BlockQuantizedCopy b = block_quantize_columnwise(y, n, n, params);
  size_t differ = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < n; ++c)
      differ += a.data[size_t(r * n + c)] != b.data[size_t(c * n + r)];
  EXPECT_GT(differ, size_t(n * n / 4));
}

TEST(BlockQuantize, RejectsATensorWhoseSizeIsNotRowsTimesCols) {
  const std::vector<float> x(10, 1.0f);
  const BlockQuantParams params;
  EXPECT_THROW(block_quantize_rowwise(x, 3, 4, params), std::invalid_argument);
  EXPECT_THROW(block_quantize_columnwise(x, 2, 4, params), std::invalid_argument);
}

// --- dequantization -----------------------------------------------------------------------------

// |dequantized - x| <= half an ulp of the format at the block's amax: 2^-(mantissa bits + 1) *
// amax (every scaled value is at most fp8_max; below the normal range the spacing is smaller
// still), plus the rounding of scale_inv and of the product (a few fp32 ulps: the 1e-5 slack).
TEST(BlockDequantize, ErrorIsWithinHalfAnUlpOfTheBlockAmax) {
  std::mt19937_64 rng(24);
  const int64_t rows = 257, cols = 400;
  const std::vector<float> x = random_input(size_t(rows * cols), rng);
  for (const Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const int mantissa_bits = format == Fp8Format::E4M3 ? 3 : 2;
    for (const bool two_d : {false, true}) {
      for (const bool pow2 : {false, true}) {
        const BlockQuantParams params = params_for(format, two_d, pow2);
        const BlockQuantizedCopy copy = block_quantize_rowwise(x, rows, cols, params);
        const std::vector<float> back = block_dequantize(copy, format, two_d);
        BlockAmax block_amax(x, rows, cols, two_d);
        double worst = 0.0;  // the largest error as a fraction of the bound
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const double amax = block_amax.at(r, c);
            const double bound = std::ldexp(amax, -(mantissa_bits + 1)) * (1.0 + 1e-5);
            const double error =
                std::fabs(double(back[size_t(r * cols + c)]) - x[size_t(r * cols + c)]);
            ASSERT_LE(error, bound) << "element (" << r << ", " << c << ")";
            worst = std::max(worst, error / bound);
          }
        }
        // The bound is not vacuous: some element comes close to it.
        EXPECT_GT(worst, 0.25);
      }
    }
  }
}

// --- GEMM ---------------------------------------------------------------------------------------

TEST(BlockScaledGemm, TinyCaseByHand) {
  // a = [1, 256]: block 0 all 2 (pow2 scale 448/2 -> 128, codes 256, scale_inv 2^-7), block 1 all
  // 0.5 (896 -> 512, codes 256, 2^-9). b = [1, 256] 2-D, all 1 (448 -> 256, codes 256, 2^-8).
  // Block 0: partial = 128 * 256 * 256 = 2^23, * 2^-7 * 2^-8 = 256; block 1: 2^23 * 2^-9 * 2^-8 =
  // 64. d = 320 = 128 * 2 * 1 + 128 * 0.5 * 1.
  std::vector<float> a(256, 2.0f);
  std::fill(a.begin() + 128, a.end(), 0.5f);
  const std::vector<float> b(256, 1.0f);
  const BlockQuantizedCopy qa =
      block_quantize_rowwise(a, 1, 256, params_for(Fp8Format::E4M3, false, true));
  const BlockQuantizedCopy qb =
      block_quantize_rowwise(b, 1, 256, params_for(Fp8Format::E4M3, true, true));
  EXPECT_EQ(qa.scale_inv_at(0, 0, false), std::ldexp(1.0f, -7));
  EXPECT_EQ(qa.scale_inv_at(0, 128, false), std::ldexp(1.0f, -9));
  EXPECT_EQ(qb.scale_inv_at(0, 0, true), std::ldexp(1.0f, -8));
  EXPECT_EQ(qb.scale_inv.size(), 4u);  // [1][roundup(2, 4)]
  const std::vector<float> d =
      block_scaled_gemm(qa, false, qb, true, Fp8Format::E4M3, Fp8Format::E4M3);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0], 320.0f);
  EXPECT_THROW(block_scaled_gemm(qa, false,
                                 block_quantize_rowwise(std::vector<float>(128, 1.0f), 1, 128,
                                                        BlockQuantParams{}),
                                 false, Fp8Format::E4M3, Fp8Format::E4M3),
               std::invalid_argument);
}

// d against sum_k dequant(a)[i, k] * dequant(b)[j, k] in double: the FP32 evaluation (a chain of
// up to 128 fma per K block, two scalings, one fma per block into the running sum) is within
// (128 + K / 128 + 4) fp32 ulps of the sum of |products| (the usual gamma_n bound).
TEST(BlockScaledGemm, MatchesADoublePrecisionProductOfTheDequantizedOperands) {
  std::mt19937_64 rng(25);
  const int64_t m = 37, n = 21, k = 400;  // a ragged last K block
  const std::vector<float> a = random_input(size_t(m * k), rng);
  const std::vector<float> b = random_input(size_t(n * k), rng);
  struct Case {
    bool a_two_d, b_two_d, pow2;
    Fp8Format a_format, b_format;
  };
  for (const Case& c : {Case{false, true, true, Fp8Format::E4M3, Fp8Format::E4M3},
                        Case{false, false, false, Fp8Format::E5M2, Fp8Format::E4M3},
                        Case{true, false, false, Fp8Format::E4M3, Fp8Format::E5M2}}) {
    const BlockQuantizedCopy qa =
        block_quantize_rowwise(a, m, k, params_for(c.a_format, c.a_two_d, c.pow2));
    const BlockQuantizedCopy qb =
        block_quantize_rowwise(b, n, k, params_for(c.b_format, c.b_two_d, c.pow2));
    const std::vector<float> da = block_dequantize(qa, c.a_format, c.a_two_d);
    const std::vector<float> db = block_dequantize(qb, c.b_format, c.b_two_d);
    const std::vector<float> d =
        block_scaled_gemm(qa, c.a_two_d, qb, c.b_two_d, c.a_format, c.b_format);
    ASSERT_EQ(d.size(), size_t(m * n));
    const double ulps = 128.0 + std::ceil(double(k) / 128.0) + 4.0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0.0, magnitude = 0.0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double product = double(da[size_t(i * k + kk)]) * db[size_t(j * k + kk)];
          want += product;
          magnitude += std::fabs(product);
        }
        ASSERT_NEAR(d[size_t(i * n + j)], want, ulps * std::ldexp(magnitude, -24) + 1e-30)
            << "d[" << i << ", " << j << "]";
      }
    }
  }
}

}  // namespace
}  // namespace opfuse::cpu
