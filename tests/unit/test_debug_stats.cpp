// The precision-debug statistics (debug/stats.h): each statistic against hand-computed values, the
// merge of split inputs against the whole input, determinism, the blockwise dynamic range on
// matrices with partial blocks, the quantization statistics, and NaN/Inf inputs; the CPU
// reference's LogFp8TensorStats casts (reference/quant_stats.h) on hand-computed tensors.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "debug/stats.h"
#include "reference/quant_stats.h"

namespace opfuse::debug {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

double tensor_stat(const std::vector<float>& x, StatKind k) { return value(moments_of(x), k); }

void expect_relative(double got, double want, double tol, const char* what) {
  EXPECT_LE(std::fabs(got - want), tol * std::fabs(want))
      << what << ": got " << got << " want " << want;
}

TEST(DebugStats, NameTableHasTeSpellingsInEnumOrder) {
  const char* names[] = {"min",
                         "max",
                         "mean",
                         "std",
                         "l1_norm",
                         "l2_norm",
                         "cur_amax",
                         "dynamic_range",
                         "max_blockwise_dynamic_range",
                         "underflows%",
                         "overflows%",
                         "scale_inv_min",
                         "scale_inv_max",
                         "mse",
                         "underflow_blocks%",
                         "scale_inv_log2_min",
                         "scale_inv_log2_max",
                         "scale_inv_log2_mean",
                         "scale_inv_log2_std",
                         "scale_exponent_histogram"};
  ASSERT_EQ(std::size(kStatTable), std::size(names));
  for (size_t i = 0; i < std::size(names); ++i) {
    const auto kind = static_cast<StatKind>(i);
    EXPECT_EQ(kStatTable[i].kind, kind);
    EXPECT_EQ(stat_name(kind), names[i]);
    EXPECT_EQ(parse_stat(names[i]), kind);
    EXPECT_EQ(stat_family(kind), i < 9 ? StatFamily::Tensor : StatFamily::Quantized) << names[i];
  }
  for (const char* bad : {"", "Max", "underflows", "max ", "fp8_delayed_scaling_mse", "amax"}) {
    EXPECT_EQ(parse_stat(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(stat_name(static_cast<StatKind>(200)), "?");
}

TEST(DebugStats, TensorStatsMatchHandComputedValues) {
  // sum 6, mean 1.2; deviations -0.2 -3.2 1.8 -1.2 2.8, squared sum 22.8: sample variance 5.7.
  const std::vector<float> x = {1, -2, 3, 0, 4};
  EXPECT_EQ(tensor_stat(x, StatKind::Min), -2);
  EXPECT_EQ(tensor_stat(x, StatKind::Max), 4);
  EXPECT_DOUBLE_EQ(tensor_stat(x, StatKind::Mean), 1.2);
  EXPECT_DOUBLE_EQ(tensor_stat(x, StatKind::Std), std::sqrt(5.7));
  EXPECT_EQ(tensor_stat(x, StatKind::L1Norm), 10);
  EXPECT_DOUBLE_EQ(tensor_stat(x, StatKind::L2Norm), std::sqrt(30.0));
  EXPECT_EQ(tensor_stat(x, StatKind::CurAmax), 4);
  EXPECT_EQ(tensor_stat(x, StatKind::DynamicRange), 2);  // log2(4) - log2(1), the 0 left out
  // Not computed by moments_of (it needs the shape).
  EXPECT_EQ(tensor_stat(x, StatKind::MaxBlockwiseDynamicRange), 0);

  // |x| from 0.25 to 8: 2 + 3 binades; a negative value counts by magnitude.
  EXPECT_EQ(tensor_stat({0.25f, -8, 0, 3}, StatKind::DynamicRange), 5);
  EXPECT_EQ(tensor_stat({-8, -0.5f}, StatKind::CurAmax), 8);
  // Population {2,4,4,4,5,5,7,9}: mean 5, sum of squared deviations 32, sample variance 32/7.
  EXPECT_DOUBLE_EQ(tensor_stat({2, 4, 4, 4, 5, 5, 7, 9}, StatKind::Std), std::sqrt(32.0 / 7));
}

TEST(DebugStats, EdgeCountsFollowTheDocumentedChoices) {
  // One element: std 0 (TE/torch: NaN).
  EXPECT_EQ(tensor_stat({3.5f}, StatKind::Std), 0);
  EXPECT_EQ(tensor_stat({3.5f}, StatKind::DynamicRange), 0);
  // No nonzero value: dynamic range 0.
  EXPECT_EQ(tensor_stat({0, -0.0f, 0}, StatKind::DynamicRange), 0);
  EXPECT_EQ(tensor_stat({0, 0}, StatKind::CurAmax), 0);
  // No element at all: NaN for the order/mean statistics, 0 for the sums.
  const TensorMoments empty = moments_of({});
  for (const StatKind k : {StatKind::Min, StatKind::Max, StatKind::Mean, StatKind::Std}) {
    EXPECT_TRUE(std::isnan(value(empty, k))) << stat_name(k);
  }
  for (const StatKind k : {StatKind::L1Norm, StatKind::L2Norm, StatKind::CurAmax,
                           StatKind::DynamicRange, StatKind::MaxBlockwiseDynamicRange}) {
    EXPECT_EQ(value(empty, k), 0) << stat_name(k);
  }
  // The wrong family is a caller error, not a silent 0.
  EXPECT_THROW(value(empty, StatKind::Mse), std::invalid_argument);
  EXPECT_THROW(value(QuantizedMoments{}, StatKind::Max), std::invalid_argument);
}

TEST(DebugStats, TwoPiecesMergeWithChansUpdate) {
  // {0,0} and {10,10}: each piece has M2 0; the merged M2 is 10^2 * 2 * 2 / 4 = 100, sample
  // variance 100/3. A merge that subtracts the between-piece term (TE's sign error) gives 0.
  const TensorMoments m =
      merge(moments_of(std::vector<float>{0, 0}), moments_of(std::vector<float>{10, 10}));
  EXPECT_EQ(m.count, 4);
  EXPECT_EQ(m.mean, 5);
  EXPECT_EQ(m.m2, 100);
  EXPECT_DOUBLE_EQ(value(m, StatKind::Std), std::sqrt(100.0 / 3));
  EXPECT_DOUBLE_EQ(value(m, StatKind::Std), tensor_stat({0, 0, 10, 10}, StatKind::Std));
  // The empty record is the identity, on either side, bitwise.
  const TensorMoments a = moments_of(std::vector<float>{1, 2, 3});
  for (const TensorMoments& r : {merge(a, TensorMoments{}), merge(TensorMoments{}, a)}) {
    EXPECT_EQ(std::memcmp(&r, &a, sizeof a), 0);
  }
}

// Moments of random pieces merged left to right (and pairwise) against moments of the whole.
TEST(DebugStats, MergeOfRandomSplitsEqualsTheWhole) {
  std::mt19937_64 rng(20261125);
  std::normal_distribution<float> normal(3.0f, 10.0f);
  std::vector<float> x(1000);
  for (float& v : x) v = normal(rng);
  for (size_t i = 0; i < x.size(); i += 37) x[i] = 0;  // zeros stay out of the dynamic range
  x[500] = 1e-6f;  // a tiny magnitude, so the dynamic range's bottom lies in one piece
  const TensorMoments whole = moments_of(x);

  for (int trial = 0; trial < 300; ++trial) {
    const int pieces = 1 + static_cast<int>(rng() % 9);
    std::vector<size_t> cuts = {0, x.size()};
    for (int p = 1; p < pieces; ++p) cuts.push_back(rng() % (x.size() + 1));  // may be empty
    std::sort(cuts.begin(), cuts.end());
    std::vector<TensorMoments> parts;
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      parts.push_back(
          moments_of(std::span<const float>(x).subspan(cuts[p], cuts[p + 1] - cuts[p])));
    }
    TensorMoments left;
    for (const TensorMoments& p : parts) left = merge(left, p);
    // Pairwise (tree) order: a different rounding path, the same tolerance.
    std::vector<TensorMoments> level = parts;
    while (level.size() > 1) {
      std::vector<TensorMoments> next;
      for (size_t i = 0; i + 1 < level.size(); i += 2)
        next.push_back(merge(level[i], level[i + 1]));
      if (level.size() % 2) next.push_back(level.back());
      level = next;
    }
    for (const TensorMoments& m : {left, level[0]}) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << ", " << pieces << " pieces");
      EXPECT_EQ(m.count, whole.count);
      EXPECT_EQ(m.min, whole.min);
      EXPECT_EQ(m.max, whole.max);
      EXPECT_EQ(m.amax, whole.amax);
      EXPECT_EQ(m.min_nonzero_abs, whole.min_nonzero_abs);
      EXPECT_EQ(m.max_nonzero_abs, whole.max_nonzero_abs);
      EXPECT_EQ(value(m, StatKind::DynamicRange), value(whole, StatKind::DynamicRange));
      expect_relative(m.mean, whole.mean, 1e-12, "mean");
      expect_relative(m.m2, whole.m2, 1e-12, "m2");
      expect_relative(value(m, StatKind::Std), value(whole, StatKind::Std), 1e-12, "std");
      expect_relative(m.sum_abs, whole.sum_abs, 1e-12, "l1");
      expect_relative(value(m, StatKind::L2Norm), value(whole, StatKind::L2Norm), 1e-12, "l2");
    }
  }
}

TEST(DebugStats, SameInputGivesBitwiseTheSameRecord) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-100, 100);
  std::vector<float> x(4099);
  for (float& v : x) v = u(rng);
  const std::vector<float> copy = x;  // another buffer: no dependence on the address
  const TensorMoments a = moments_of(x);
  const TensorMoments b = moments_of(copy);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
  const std::span<const float> s(x);
  const TensorMoments m1 = merge(moments_of(s.first(1000)), moments_of(s.subspan(1000)));
  const TensorMoments m2 = merge(moments_of(s.first(1000)), moments_of(s.subspan(1000)));
  EXPECT_EQ(std::memcmp(&m1, &m2, sizeof m1), 0);
  const std::vector<float> dq(x.begin(), x.end());
  const std::vector<float> scales = {0.5f};
  const QuantizedMoments q1 = quantized_moments(x, dq, scales, 448);
  const QuantizedMoments q2 = quantized_moments(copy, dq, scales, 448);
  EXPECT_EQ(std::memcmp(&q1, &q2, sizeof q1), 0);
}

TEST(DebugStats, BlockwiseDynamicRangeByRowsAndTiles) {
  // 3 x 3, block 2: partial blocks at the right edge and (dims 2) at the bottom.
  const std::vector<float> m = {1,     2, 16,    //
                                0,     0, 0.5f,  //
                                0.25f, 0, 0};
  // dims 1, rows cut into [0,2) [2,3): row 0 -> log2(2/1) = 1 and 0; row 1 -> skipped (no nonzero)
  // and 0; row 2 -> 0 (one nonzero) and skipped.
  EXPECT_EQ(max_blockwise_dynamic_range(m, 3, 3, 2, 1), 1);
  // dims 2: tile (0,0) {1,2,0,0} -> 1; tile (0,1) {16, 0.5} -> 5; tile (1,0) {0.25, 0} -> 0;
  // tile (1,1) {0} skipped.
  EXPECT_EQ(max_blockwise_dynamic_range(m, 3, 3, 2, 2), 5);
  // Block 3: dims 1 is one block per row (row 0: 16/1 -> 4); dims 2 is the whole matrix
  // (16/0.25 -> 6).
  EXPECT_EQ(max_blockwise_dynamic_range(m, 3, 3, 3, 1), 4);
  EXPECT_EQ(max_blockwise_dynamic_range(m, 3, 3, 3, 2), 6);
  // A block larger than the matrix is one partial block; block 1 has no spread at all.
  EXPECT_EQ(max_blockwise_dynamic_range(m, 3, 3, 8, 2), 6);
  EXPECT_EQ(max_blockwise_dynamic_range(m, 3, 3, 1, 1), 0);
  // The same 9 values as 1 x 9 (dims 1, block 4): [1,2,16,0] -> 4, [0,0.5,0.25,0] -> 1, [0] skip.
  EXPECT_EQ(max_blockwise_dynamic_range(m, 1, 9, 4, 1), 4);
  EXPECT_EQ(max_blockwise_dynamic_range(std::vector<float>(6, 0.0f), 2, 3, 2, 2), 0);
  EXPECT_EQ(max_blockwise_dynamic_range({}, 0, 5, 2, 1), 0);

  // Merged by max, through the record.
  TensorMoments a = moments_of(m);
  a.max_blockwise_dynamic_range = max_blockwise_dynamic_range(m, 3, 3, 2, 2);
  TensorMoments b = moments_of(std::vector<float>{1, 4});
  b.max_blockwise_dynamic_range = 2;
  EXPECT_EQ(value(merge(a, b), StatKind::MaxBlockwiseDynamicRange), 5);
  EXPECT_EQ(value(merge(b, a), StatKind::MaxBlockwiseDynamicRange), 5);

  EXPECT_THROW(max_blockwise_dynamic_range(m, 2, 3, 2, 1), std::invalid_argument);
  EXPECT_THROW(max_blockwise_dynamic_range(m, -3, -3, 2, 1), std::invalid_argument);
  EXPECT_THROW(max_blockwise_dynamic_range(m, 3, 3, 0, 1), std::invalid_argument);
  EXPECT_THROW(max_blockwise_dynamic_range(m, 3, 3, 2, 3), std::invalid_argument);
}

TEST(DebugStats, QuantizedStatsOnAHandMadeCase) {
  // Per-tensor scale_inv 1, E4M3's 448: 0.001 rounds to 0 (an underflow), 500 lies above 448 (an
  // overflow, saturated), -3 rounds to -2.75.
  const std::vector<float> x = {1, 0.001f, -3, 0, 500};
  const std::vector<float> dq = {1, 0, -2.75f, 0, 448};
  const std::vector<float> scale = {1};
  const QuantizedMoments q = quantized_moments(x, dq, scale, 448);
  EXPECT_EQ(q.count, 5);
  EXPECT_EQ(q.underflows, 1);
  EXPECT_EQ(q.overflows, 1);
  const double tiny = static_cast<double>(0.001f);
  const double sq_err = tiny * tiny + 0.0625 + 52.0 * 52.0;
  EXPECT_DOUBLE_EQ(value(q, StatKind::Underflows), 20);
  EXPECT_DOUBLE_EQ(value(q, StatKind::Overflows), 20);
  EXPECT_DOUBLE_EQ(value(q, StatKind::Mse), sq_err / 5);
  EXPECT_EQ(value(q, StatKind::ScaleInvMin), 1);
  EXPECT_EQ(value(q, StatKind::ScaleInvMax), 1);

  // A smaller scale_inv (larger scale) moves the overflow threshold: 448 * 0.5 = 224.
  const std::vector<float> half = {0.5f};
  EXPECT_EQ(quantized_moments(std::vector<float>{300, 200, -225},
                              std::vector<float>{224, 200, -224}, half, 448)
                .overflows,
            2);

  // Block scales: min/max over the given blocks, no overflow count.
  const std::vector<float> blocks = {0.5f, 2, 0.25f};
  const QuantizedMoments qb = quantized_moments(x, dq, blocks, 448);
  EXPECT_EQ(qb.overflows, 0);
  EXPECT_EQ(qb.underflows, 1);
  EXPECT_EQ(value(qb, StatKind::ScaleInvMin), 0.25);
  EXPECT_EQ(value(qb, StatKind::ScaleInvMax), 2);

  // Split in two micro-batches: counts add exactly, the squared error adds, scales min/max.
  const std::span<const float> sx(x), sdq(dq);
  const std::vector<float> other = {4};
  const QuantizedMoments merged =
      merge(quantized_moments(sx.first(2), sdq.first(2), scale, 448),
            quantized_moments(sx.subspan(2), sdq.subspan(2), other, 448));
  EXPECT_EQ(merged.count, 5);
  EXPECT_EQ(merged.underflows, 1);
  EXPECT_EQ(merged.overflows, 0);  // 500 < 448 * 4: the second piece has its own scale
  EXPECT_DOUBLE_EQ(value(merged, StatKind::Mse), sq_err / 5);
  EXPECT_EQ(value(merged, StatKind::ScaleInvMin), 1);
  EXPECT_EQ(value(merged, StatKind::ScaleInvMax), 4);

  // Nothing quantized / no scale given: NaN, not 0 or inf.
  for (const StatKind k : {StatKind::Underflows, StatKind::Overflows, StatKind::Mse,
                           StatKind::ScaleInvMin, StatKind::ScaleInvMax}) {
    EXPECT_TRUE(std::isnan(value(QuantizedMoments{}, k))) << stat_name(k);
  }
  EXPECT_THROW(quantized_moments(x, sdq.first(3), scale, 448), std::invalid_argument);
  EXPECT_THROW(quantized_moments(x, dq, scale, 0), std::invalid_argument);
}

TEST(DebugStats, NanInTheInputGivesNanWhereverItSits) {
  for (const std::vector<float>& x :
       {std::vector<float>{kNaN, 1, 3}, std::vector<float>{1, kNaN, 3},
        std::vector<float>{1, 3, kNaN}}) {
    const TensorMoments m = moments_of(x);
    EXPECT_EQ(m.count, 3);
    for (const StatKind k :
         {StatKind::Min, StatKind::Max, StatKind::Mean, StatKind::Std, StatKind::L1Norm,
          StatKind::L2Norm, StatKind::CurAmax, StatKind::DynamicRange}) {
      EXPECT_TRUE(std::isnan(value(m, k))) << stat_name(k);
    }
    // Merged with a clean piece, on either side, the NaN stays.
    const TensorMoments clean = moments_of(std::vector<float>{-5, 7});
    for (const TensorMoments& r : {merge(m, clean), merge(clean, m)}) {
      EXPECT_TRUE(std::isnan(value(r, StatKind::Min)));
      EXPECT_TRUE(std::isnan(value(r, StatKind::Max)));
      EXPECT_TRUE(std::isnan(value(r, StatKind::CurAmax)));
      EXPECT_TRUE(std::isnan(value(r, StatKind::Std)));
    }
  }
  EXPECT_TRUE(
      std::isnan(max_blockwise_dynamic_range(std::vector<float>{1, 2, kNaN, 0}, 2, 2, 1, 1)));
  EXPECT_TRUE(
      std::isnan(max_blockwise_dynamic_range(std::vector<float>{1, 2, 0, kNaN}, 2, 2, 2, 2)));
  // Quantized: NaN error -> NaN mse; a NaN is neither an underflow nor (NaN > t is false) overflow.
  const std::vector<float> x = {kNaN, 1}, dq = {kNaN, 1}, s = {1};
  const QuantizedMoments q = quantized_moments(x, dq, s, 448);
  EXPECT_TRUE(std::isnan(value(q, StatKind::Mse)));
  EXPECT_EQ(q.underflows, 0);
  EXPECT_EQ(q.overflows, 0);
  const std::vector<float> nan_scale = {1, kNaN};
  EXPECT_TRUE(std::isnan(value(quantized_moments(x, dq, nan_scale, 448), StatKind::ScaleInvMin)));
}

TEST(DebugStats, InfinityGivesInfiniteStatistics) {
  const TensorMoments m = moments_of(std::vector<float>{1, kInf, -2});
  EXPECT_EQ(value(m, StatKind::Max), kInf);
  EXPECT_EQ(value(m, StatKind::Min), -2);
  EXPECT_EQ(value(m, StatKind::CurAmax), kInf);
  EXPECT_EQ(value(m, StatKind::Mean), kInf);
  EXPECT_EQ(value(m, StatKind::L1Norm), kInf);
  EXPECT_EQ(value(m, StatKind::L2Norm), kInf);
  EXPECT_EQ(value(m, StatKind::DynamicRange), kInf);
  EXPECT_TRUE(std::isnan(value(m, StatKind::Std)));  // inf - inf
  const TensorMoments neg = moments_of(std::vector<float>{-kInf, 1});
  EXPECT_EQ(value(neg, StatKind::Min), -kInf);
  EXPECT_EQ(value(neg, StatKind::Mean), -kInf);
  EXPECT_EQ(value(neg, StatKind::CurAmax), kInf);
  // Merging an infinite piece keeps the mean infinite (no inf - inf in Chan's mean update).
  const TensorMoments merged =
      merge(moments_of(std::vector<float>{1, 2}), moments_of(std::vector<float>{kInf}));
  EXPECT_EQ(value(merged, StatKind::Mean), kInf);
  EXPECT_EQ(value(merged, StatKind::CurAmax), kInf);
  EXPECT_EQ(max_blockwise_dynamic_range(std::vector<float>{1, kInf, 1, 2}, 2, 2, 2, 1), kInf);
  // Quantized: an infinite x saturated to 448 overflows and has an infinite error.
  const std::vector<float> x = {kInf}, dq = {448}, s = {1};
  const QuantizedMoments q = quantized_moments(x, dq, s, 448);
  EXPECT_EQ(q.overflows, 1);
  EXPECT_EQ(value(q, StatKind::Mse), kInf);
}

// ---- LogFp8TensorStats casts (reference/quant_stats.h) ---------------------------------------

using cpu::Fp8Format;
using cpu::QuantStatsCast;
using plan::QuantStatCast;

QuantStatsCast block_cast(QuantStatCast cast, int size, int dims, bool columnwise) {
  QuantStatsCast c;
  c.cast = cast;
  c.block_size = size;
  c.dims = dims;
  c.columnwise = columnwise;
  return c;
}

TEST(QuantStats, DelayedQuantizerCountsUnderflowsAndOverflows) {
  // scale 1 in E4M3: 1e-4 is under half the smallest subnormal (2^-9): 0, an underflow; 500 is
  // above 448: clamped, an overflow with error 52; 1 and 0 are exact.
  const std::vector<float> x = {0, 1e-4f, 500, 1};
  QuantStatsCast c;
  c.cast = QuantStatCast::Quantizer;
  c.delayed = true;
  const QuantizedMoments q = cpu::quantized_stats(x, 1, 4, c);
  EXPECT_EQ(q.count, 4);
  EXPECT_EQ(q.underflows, 1);
  EXPECT_EQ(q.overflows, 1);
  const double want = double(1e-4f) * double(1e-4f) + 52.0 * 52.0;
  expect_relative(q.sq_err, want, 1e-12, "sq_err");
  expect_relative(value(q, StatKind::Mse), want / 4, 1e-12, "mse");
  EXPECT_EQ(value(q, StatKind::Underflows), 25.0);
  EXPECT_EQ(value(q, StatKind::Overflows), 25.0);
  EXPECT_EQ(value(q, StatKind::ScaleInvMin), 1.0);
  EXPECT_EQ(q.blocks, 0);
  // A scale of 2^-4 (scale_inv 16): the overflow threshold is 448 * 16, nothing overflows.
  c.scale = 0.0625f;
  c.scale_inv = 16.0f;
  const QuantizedMoments r = cpu::quantized_stats(x, 2, 2, c);
  EXPECT_EQ(r.overflows, 0);
  EXPECT_EQ(r.underflows, 1);
  EXPECT_EQ(value(r, StatKind::ScaleInvMax), 16.0);
}

TEST(QuantStats, CurrentScalingWhatIfUsesTheTensorsAmax) {
  // amax 4: scale 448 / 4 = 112; 2 -> 224 and -4 -> -448 are exact, so only 1e-3 has an error:
  // 0.112 rounds to 1.75 * 2^-4 in E4M3.
  const std::vector<float> x = {2, -4, 1e-3f};
  QuantStatsCast c;
  c.cast = QuantStatCast::Current;
  const QuantizedMoments q = cpu::quantized_stats(x, 1, 3, c);
  EXPECT_EQ(q.scale_inv_min, double(1.0f / 112.0f));
  EXPECT_EQ(q.underflows, 0);
  EXPECT_EQ(q.overflows, 0);  // never counted for a current scale
  const double dq = double(0.109375f * (1.0f / 112.0f));
  const double err = double(1e-3f) - dq;
  expect_relative(q.sq_err, err * err, 1e-12, "sq_err");
  // E5M2 for a gradient: 57344 / 4.
  c.format = Fp8Format::E5M2;
  EXPECT_EQ(cpu::quantized_stats(x, 3, 1, c).scale_inv_max, double(1.0f / 14336.0f));
}

TEST(QuantStats, Float8BlockScalesArePowersOfTwoAndTheLastBlockIsPartial) {
  // One row of 130: a block of 128 (amax 3: 448 / 3 = 149.3 rounds down to 128) and a partial
  // block of 2 (amax 0.5: 896 -> 512). 1e-6 * 128 is far under E4M3's smallest subnormal.
  std::vector<float> x(130, 3.0f);
  x[5] = 1e-6f;
  x[128] = 0.5f;
  x[129] = 0.25f;
  const QuantizedMoments q =
      cpu::quantized_stats(x, 1, 130, block_cast(QuantStatCast::Float8Block, 128, 1, false));
  EXPECT_EQ(q.blocks, 2);
  EXPECT_EQ(q.scaled_blocks, 2);
  EXPECT_EQ(q.underflows, 1);
  EXPECT_EQ(q.underflow_blocks, 1);
  EXPECT_EQ(q.scale_inv_max, 1.0 / 128);
  EXPECT_EQ(q.scale_inv_min, 1.0 / 512);
  EXPECT_EQ(value(q, StatKind::UnderflowBlocks), 50.0);
  EXPECT_EQ(value(q, StatKind::ScaleInvLog2Min), -9.0);
  EXPECT_EQ(value(q, StatKind::ScaleInvLog2Max), -7.0);
  EXPECT_EQ(value(q, StatKind::ScaleInvLog2Mean), -8.0);
  EXPECT_EQ(value(q, StatKind::ScaleInvLog2Std), 1.0);
  // 3 * 128 = 384 is exact in E4M3 (1.5 * 2^8), so the only error is the underflow's.
  expect_relative(q.sq_err, double(1e-6f) * double(1e-6f), 1e-12, "sq_err");

  // Columnwise (128 x 1 blocks) of the same data as a 130 x 1 column: the same two blocks.
  const QuantizedMoments col =
      cpu::quantized_stats(x, 130, 1, block_cast(QuantStatCast::Float8Block, 128, 1, true));
  EXPECT_EQ(col.blocks, 2);
  EXPECT_EQ(col.scale_inv_min, q.scale_inv_min);
  // Rowwise blocks of a 130 x 1 column are 130 blocks of one element.
  EXPECT_EQ(
      cpu::quantized_stats(x, 130, 1, block_cast(QuantStatCast::Float8Block, 128, 1, false)).blocks,
      130);
  // 2-D: a 130 x 1 matrix in 128 x 128 tiles is two tiles (one partial).
  EXPECT_EQ(
      cpu::quantized_stats(x, 130, 1, block_cast(QuantStatCast::Float8Block, 128, 2, false)).blocks,
      2);
}

TEST(QuantStats, Mxfp8ScalesAreE8m0RoundedUp) {
  EXPECT_EQ(cpu::e8m0_round_up(1.0f), 127);               // exactly 2^0
  EXPECT_EQ(cpu::e8m0_round_up(1.0f + 1.0f / 448), 128);  // a mantissa bit: up to 2^1
  EXPECT_EQ(cpu::e8m0_round_up(0.75f), 127);
  EXPECT_EQ(cpu::e8m0_round_up(0.0f), 0);
  EXPECT_EQ(cpu::e8m0_round_up(kNaN), 0xFF);
  EXPECT_EQ(cpu::e8m0_round_up(kInf), 0xFE);
  EXPECT_EQ(cpu::e8m0_round_up(1e-45f), 0);  // a subnormal <= 2^-127: E8M0's 0 (TE's rule)

  // [[449, 2], [1, 1]]: rows have amax 449 (449 / 448 rounds up to 2^1) and 1 (1 / 448 =
  // 1.14 * 2^-9 -> 2^-8); columns 449 and 2 (2 / 448 -> 2^-7).
  const std::vector<float> x = {449, 2, 1, 1};
  const QuantizedMoments row =
      cpu::quantized_stats(x, 2, 2, block_cast(QuantStatCast::Mxfp8, 32, 1, false));
  const QuantizedMoments col =
      cpu::quantized_stats(x, 2, 2, block_cast(QuantStatCast::Mxfp8, 32, 1, true));
  EXPECT_EQ(row.blocks, 2);
  EXPECT_EQ(row.scale_inv_max, 2.0);
  EXPECT_EQ(row.scale_inv_min, std::ldexp(1.0, -8));
  EXPECT_EQ(col.scale_inv_max, 2.0);
  EXPECT_EQ(col.scale_inv_min, std::ldexp(1.0, -7));
  // 449 * 2^-1 = 224.5 -> 224 in E4M3, dequantized 448: error 1. Rowwise, 2 * 2^-1 = 1 is exact;
  // row 1 (scale 2^8): 256 is exact.
  expect_relative(row.sq_err, 1.0, 1e-12, "rowwise sq_err");

  // A zero block gets E8M0 0 (2^-127): a real block, counted in scale_inv_min (TE counts it too)
  // but not among the scaled blocks.
  const std::vector<float> z = {449, 0};
  const QuantizedMoments zq =
      cpu::quantized_stats(z, 2, 1, block_cast(QuantStatCast::Mxfp8, 32, 1, false));
  EXPECT_EQ(zq.blocks, 2);
  EXPECT_EQ(zq.scaled_blocks, 1);
  EXPECT_EQ(zq.scale_inv_min, std::ldexp(1.0, -127));
  EXPECT_EQ(value(zq, StatKind::ScaleInvLog2Mean), 1.0);
  EXPECT_EQ(value(zq, StatKind::ScaleInvLog2Std), 0.0);
}

TEST(QuantStats, NanAndInfGiveNanAndInfNotACrash) {
  std::vector<float> x(40, 1.0f);
  x[3] = kNaN;
  // Float8 block: a NaN block gets scale 1 (TE's rule for a non-finite amax); its error is NaN.
  const QuantizedMoments b =
      cpu::quantized_stats(x, 1, 40, block_cast(QuantStatCast::Float8Block, 128, 1, false));
  EXPECT_TRUE(std::isnan(value(b, StatKind::Mse)));
  EXPECT_EQ(b.scale_inv_max, 1.0);
  EXPECT_EQ(b.scaled_blocks, 0);
  EXPECT_TRUE(std::isnan(value(b, StatKind::ScaleInvLog2Mean)));
  // MXFP8: E8M0 NaN, so the block's scale_inv is NaN, and so is scale_inv_min.
  const QuantizedMoments m =
      cpu::quantized_stats(x, 1, 40, block_cast(QuantStatCast::Mxfp8, 32, 1, false));
  EXPECT_TRUE(std::isnan(value(m, StatKind::ScaleInvMin)));
  EXPECT_TRUE(std::isnan(value(m, StatKind::Mse)));
  EXPECT_EQ(m.blocks, 2);
  // Inf: scale 1 under block scaling, the Inf saturates to 448: an infinite error.
  x[3] = kInf;
  EXPECT_EQ(
      value(cpu::quantized_stats(x, 1, 40, block_cast(QuantStatCast::Float8Block, 128, 1, false)),
            StatKind::Mse),
      std::numeric_limits<double>::infinity());
  QuantStatsCast c;
  c.cast = QuantStatCast::Current;
  EXPECT_EQ(value(cpu::quantized_stats(x, 1, 40, c), StatKind::Mse),
            std::numeric_limits<double>::infinity());
  EXPECT_THROW(cpu::quantized_stats(x, 3, 3, c), std::invalid_argument);
}

TEST(QuantStats, RecordsMergeAndRoundTripThroughTheExecutorLayout) {
  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * float(1 + i % 7);
  const QuantStatsCast c = block_cast(QuantStatCast::Float8Block, 128, 1, false);
  const QuantizedMoments whole = cpu::quantized_stats(x, 3, 100, c);
  const std::span<const float> sx(x);
  const QuantizedMoments merged = merge(cpu::quantized_stats(sx.first(100), 1, 100, c),
                                        cpu::quantized_stats(sx.subspan(100), 2, 100, c));
  EXPECT_EQ(merged.blocks, whole.blocks);
  EXPECT_EQ(merged.underflows, whole.underflows);
  EXPECT_EQ(merged.scale_inv_min, whole.scale_inv_min);
  expect_relative(merged.sq_err, whole.sq_err, 1e-12, "sq_err");
  const QuantizedMoments back = as_quantized(as_record(whole));
  EXPECT_EQ(back.count, whole.count);
  EXPECT_EQ(back.underflow_blocks, whole.underflow_blocks);
  EXPECT_EQ(back.scaled_blocks, whole.scaled_blocks);
  EXPECT_EQ(back.sq_err, whole.sq_err);
  EXPECT_EQ(back.scale_inv_max, whole.scale_inv_max);
  EXPECT_EQ(back.log2_scale_inv_sq_sum, whole.log2_scale_inv_sq_sum);
  EXPECT_TRUE(is_per_block_stat(StatKind::UnderflowBlocks));
  EXPECT_TRUE(is_per_block_stat(StatKind::ScaleExponentHistogram));
  EXPECT_FALSE(is_per_block_stat(StatKind::Mse));
}

TEST(ExponentHistogram, BinsAreTheScaleInvBinadesNamedByTheirExponent) {
  EXPECT_EQ(exponent_bin(1.0f, 1.0f), 127);
  EXPECT_EQ(exponent_bin(3.0f, 0.0078125f), 127 - 7);
  EXPECT_EQ(exponent_bin(3.0f, 0.01f), 127 - 7);  // a non-power-of-2 scale: its binade
  EXPECT_EQ(exponent_bin(0.0f, 1.0f), -1);        // a block of zeros is not counted
  EXPECT_EQ(exponent_bin(kNaN, 1.0f), kNonFiniteBin);
  EXPECT_EQ(exponent_bin(kInf, 1.0f), kNonFiniteBin);
  EXPECT_EQ(exponent_bin(1.0f, std::ldexp(1.0f, -127)), 0);  // E8M0's 2^-127 (subnormal)
  EXPECT_EQ(exponent_bin(1.0f, std::ldexp(1.0f, -140)), 0);
  EXPECT_EQ(exponent_bin_name(127), "e0");
  EXPECT_EQ(exponent_bin_name(115), "e-12");
  EXPECT_EQ(exponent_bin_name(130), "e3");
  EXPECT_EQ(exponent_bin_name(0), "e-127");
  EXPECT_EQ(exponent_bin_name(kNonFiniteBin), "nonfinite");
  for (int b = 0; b < kExponentBins; ++b) EXPECT_EQ(parse_exponent_bin(exponent_bin_name(b)), b);
  for (const char* bad : {"", "e", "e+3", "e03", "e128", "e-128", "3", "nan"})
    EXPECT_EQ(parse_exponent_bin(bad), std::nullopt) << bad;

  // 24 records of 11 counts hold the 256 bins; the spare counts stay 0.
  ExponentHistogram h;
  h.bins[0] = 5;
  h.bins[10] = 7;
  h.bins[11] = 1;
  h.bins[255] = 2;
  std::vector<TensorMoments> records(static_cast<size_t>(kExponentHistogramRecords));
  histogram_to_records(h, records);
  EXPECT_EQ(records[0].count, 5);
  EXPECT_EQ(std::bit_cast<int64_t>(records[0].max_blockwise_dynamic_range), 7);
  EXPECT_EQ(records[1].count, 1);
  EXPECT_EQ(histogram_of(records), h);
  EXPECT_EQ(merge(h, h).bins[10], 14);
  EXPECT_THROW(histogram_of(std::span(records).first(3)), std::invalid_argument);
  EXPECT_THROW(value(QuantizedMoments{}, StatKind::ScaleExponentHistogram), std::invalid_argument);
}

TEST(ExponentHistogram, TheReferenceCountsEveryScaledBlockOnce) {
  // MXFP8 rows of 32: amaxes 449 (scale_inv 2^1), 1 (2^-8), 1 (2^-8), 0 (not counted), NaN.
  std::vector<float> x(5 * 32, 0.0f);
  x[0] = 449;
  x[32] = 1;
  x[64] = -1;
  x[128] = kNaN;
  ExponentHistogram h;
  h.bins[17] = 99;  // overwritten, not added to
  const QuantizedMoments m =
      cpu::quantized_stats(x, 5, 32, block_cast(QuantStatCast::Mxfp8, 32, 1, false), &h);
  EXPECT_EQ(m.blocks, 5);
  ExponentHistogram want;
  want.bins[128] = 1;
  want.bins[127 - 8] = 2;
  want.bins[kNonFiniteBin] = 1;
  EXPECT_EQ(h, want);
  // Float8BlockScaling, 1 x 128 over the same values as one row of 160: block 0 (amax 449:
  // 448 / 449 rounds down to 2^-1, scale_inv 2) and block 1 (the NaN: non-finite).
  const QuantizedMoments f =
      cpu::quantized_stats(x, 1, 160, block_cast(QuantStatCast::Float8Block, 128, 1, false), &h);
  EXPECT_EQ(f.blocks, 2);
  ExponentHistogram want_f;
  want_f.bins[128] = 1;
  want_f.bins[kNonFiniteBin] = 1;
  EXPECT_EQ(h, want_f);
  // A per-tensor cast has no blocks: the histogram stays empty.
  QuantStatsCast c;
  c.cast = QuantStatCast::Current;
  cpu::quantized_stats(x, 5, 32, c, &h);
  EXPECT_EQ(h, ExponentHistogram{});
}

}  // namespace
}  // namespace opfuse::debug
