// Checks the FP8 recipes' scale arithmetic against expectations worked out independently: a
// literal hand-computed sequence, and a second implementation of delayed scaling written from
// the recipe's description (a deque window of step amaxes, double arithmetic, comparisons
// instead of fmax) rather than from the library's roll-the-history code.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <ostream>
#include <vector>

#include "cpu/quantizer_math.h"
#include "support/assert.h"

namespace opfuse::cpu {

// Readable failure messages for format comparisons (found by gtest through ADL, so not in the
// anonymous namespace).
void PrintTo(Fp8Format format, std::ostream* out) {
  *out << (format == Fp8Format::E4M3 ? "E4M3" : "E5M2");
}

namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }

// fp8_max / amax as fp32 division would give it: the double quotient of two floats, rounded once
// to float, is the correctly rounded float quotient (double has more than 2 * 24 + 2 bits).
float fp32_quotient(float numerator, float denominator) {
  return static_cast<float>(static_cast<double>(numerator) / static_cast<double>(denominator));
}

DelayedScalingState fresh_state(std::size_t history_length) {
  DelayedScalingState state;
  state.amax_history.assign(history_length, 0.0f);
  return state;
}

// ---- Delayed scaling: a literal, hand-worked sequence -------------------------------------------

TEST(DelayedScaling, HandWorkedSequenceWithHistoryFour) {
  DelayedScalingState state = fresh_state(4);
  const DelayedScalingParams params{448.0f, AmaxCompute::Max, 0};
  // step amax -> the window of the last 4 step amaxes -> its max -> 448 / max
  const float step_amaxes[] = {2.0f, 8.0f, 1.0f, 0.5f, 0.25f, 0.125f};
  const float expected_scales[] = {224.0f, 56.0f, 56.0f, 56.0f, 56.0f, 448.0f};
  for (int step = 0; step < 6; ++step) {
    state.amax_history[0] = step_amaxes[step];
    update_delayed(state, params);
    EXPECT_EQ(state.scale, expected_scales[step]) << "step " << step;
    EXPECT_EQ(state.scale_inv, 1.0f / expected_scales[step]) << "step " << step;
  }
  // Slot 0 cleared for the next step, then the three newest step amaxes, oldest first.
  EXPECT_EQ(state.amax_history, (std::vector<float>{0.0f, 0.5f, 0.25f, 0.125f}));
}

TEST(DelayedScaling, RollMovesCurrentAmaxToNewestSlot) {
  DelayedScalingState state;
  state.amax_history = {5.0f, 1.0f, 2.0f, 3.0f};
  const float used =
      update_delayed(state, DelayedScalingParams{448.0f, AmaxCompute::MostRecent, 0});
  EXPECT_EQ(used, 5.0f);
  EXPECT_EQ(state.amax_history, (std::vector<float>{0.0f, 2.0f, 3.0f, 5.0f}));
  EXPECT_EQ(state.scale, fp32_quotient(448.0f, 5.0f));
}

TEST(DelayedScaling, MarginDividesByPowerOfTwo) {
  DelayedScalingState state = fresh_state(1);
  state.amax_history[0] = 3.0f;
  update_delayed(state, DelayedScalingParams{57344.0f, AmaxCompute::Max, 2});
  EXPECT_EQ(state.scale, fp32_quotient(57344.0f, 3.0f) / 4.0f);
  EXPECT_EQ(state.scale_inv, 1.0f / (fp32_quotient(57344.0f, 3.0f) / 4.0f));
}

// ---- Delayed scaling: 50 steps against an independent model -------------------------------------

// The recipe as described, not as the library computes it: keep the amaxes of the last L steps
// in a deque; the scale comes from their max (or the newest), the history is what the GPU keeps.
class DelayedScalingModel {
 public:
  DelayedScalingModel(std::size_t length, AmaxCompute algo, int margin, float fp8_max)
      : length_(length), algo_(algo), margin_(margin), fp8_max_(fp8_max) {}

  void step(float step_amax) {
    window_.push_back(step_amax);
    if (window_.size() > length_) window_.pop_front();
    float amax = step_amax;
    if (algo_ == AmaxCompute::Max) {
      amax = 0.0f;
      for (const float a : window_) {
        if (a > amax) amax = a;  // NaN compares false: skipped; Inf wins
      }
    }
    if (amax > 0.0f && amax < kInf) {  // false for NaN too
      const float full_range = fp32_quotient(fp8_max_, amax);
      scale_ = std::ldexp(full_range, -margin_);  // exact: the result is a normal float
      if (std::isinf(scale_)) scale_ = FLT_MAX;
    }
  }

  float scale() const { return scale_; }

  // Slot 0 is 0 after an update; slots 1..L-1 hold the newest L-1 step amaxes, oldest first,
  // with the never-written slots still 0 at the front.
  std::vector<float> history() const {
    std::vector<float> slots(length_, 0.0f);
    const std::size_t kept = std::min(length_ - 1, window_.size());
    for (std::size_t k = 0; k < kept; ++k) {
      slots[length_ - 1 - k] = window_[window_.size() - 1 - k];
    }
    return slots;
  }

 private:
  std::size_t length_;
  AmaxCompute algo_;
  int margin_;
  float fp8_max_;
  std::deque<float> window_;
  float scale_ = 1.0f;
};

// Step amaxes spanning many binades, with a zero, a NaN, an Inf and a tiny amax (whose scale
// overflows fp32) at fixed steps, and a run of zeros so the window empties of real values.
std::vector<float> fifty_step_amaxes() {
  std::vector<float> amaxes;
  uint32_t state = 12345;
  for (int step = 0; step < 50; ++step) {
    state = state * 1664525u + 1013904223u;
    const float mantissa = 1.0f + static_cast<float>(state >> 9) / 8388608.0f;
    amaxes.push_back(std::ldexp(mantissa, static_cast<int>(state % 41) - 20));
  }
  amaxes[3] = 0.0f;
  amaxes[8] = kNan;
  amaxes[14] = kInf;
  amaxes[20] = 1e-38f;
  for (int step = 30; step < 36; ++step) amaxes[step] = 0.0f;
  amaxes[36] = 2e-39f;  // subnormal amax: 448 / amax overflows
  return amaxes;
}

std::vector<uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (const float value : values) bits.push_back(bits_of(value));
  return bits;
}

TEST(DelayedScaling, FiftyStepsMatchIndependentModel) {
  const std::vector<float> amaxes = fifty_step_amaxes();
  for (const std::size_t length : {std::size_t{1}, std::size_t{4}, std::size_t{1024}}) {
    for (const AmaxCompute algo : {AmaxCompute::Max, AmaxCompute::MostRecent}) {
      for (const int margin : {0, 2}) {
        SCOPED_TRACE(testing::Message()
                     << "L=" << length << " algo="
                     << (algo == AmaxCompute::Max ? "max" : "most_recent") << " margin=" << margin);
        DelayedScalingState state = fresh_state(length);
        DelayedScalingModel model(length, algo, margin, 448.0f);
        for (std::size_t step = 0; step < amaxes.size(); ++step) {
          state.amax_history[0] = amaxes[step];
          update_delayed(state, DelayedScalingParams{448.0f, algo, margin});
          model.step(amaxes[step]);
          ASSERT_EQ(bits_of(state.scale), bits_of(model.scale())) << "step " << step;
          ASSERT_EQ(bits_of(state.scale_inv), bits_of(1.0f / model.scale())) << "step " << step;
          ASSERT_EQ(bits_of(state.amax_history), bits_of(model.history())) << "step " << step;
        }
      }
    }
  }
}

TEST(DelayedScaling, WindowOfOneThousandTwentyFourDropsOldestAmax) {
  const std::size_t length = 1024;
  DelayedScalingState state = fresh_state(length);
  DelayedScalingModel model(length, AmaxCompute::Max, 0, 448.0f);
  // A large first amax dominates the max until it leaves the window, 1024 steps later.
  for (std::size_t step = 0; step < length + 2; ++step) {
    const float amax = step == 0 ? 400.0f : 1.0f + static_cast<float>(step % 7);
    state.amax_history[0] = amax;
    update_delayed(state, DelayedScalingParams{});
    model.step(amax);
    const float expected = fp32_quotient(448.0f, step < length ? 400.0f : 7.0f);
    ASSERT_EQ(state.scale, expected) << "step " << step;
    ASSERT_EQ(bits_of(state.scale), bits_of(model.scale())) << "step " << step;
  }
  EXPECT_EQ(bits_of(state.amax_history), bits_of(model.history()));
}

// ---- Delayed scaling: amaxes that must not become a scale ---------------------------------------

TEST(DelayedScaling, ZeroNanOrInfAmaxKeepsOldScale) {
  for (const AmaxCompute algo : {AmaxCompute::Max, AmaxCompute::MostRecent}) {
    for (const float bad_amax : {0.0f, kNan, kInf, -0.0f}) {
      DelayedScalingState state = fresh_state(1);
      state.scale = 3.5f;
      state.scale_inv = 123.0f;  // recomputed from the kept scale, as TE does
      state.amax_history[0] = bad_amax;
      update_delayed(state, DelayedScalingParams{448.0f, algo, 0});
      EXPECT_EQ(state.scale, 3.5f) << bad_amax;
      EXPECT_EQ(state.scale_inv, 1.0f / 3.5f) << bad_amax;
      EXPECT_EQ(bits_of(state.amax_history[0]), 0u);
    }
  }
}

TEST(DelayedScaling, NanInHistoryIsSkippedByMaxButNotByMostRecent) {
  DelayedScalingState max_state;
  max_state.amax_history = {kNan, 2.0f, 0.0f};
  const float max_used =
      update_delayed(max_state, DelayedScalingParams{448.0f, AmaxCompute::Max, 0});
  EXPECT_EQ(max_used, 2.0f);
  EXPECT_EQ(max_state.scale, 224.0f);
  EXPECT_TRUE(std::isnan(max_state.amax_history[2]));  // the NaN rolls into the newest slot

  DelayedScalingState recent_state;
  recent_state.amax_history = {kNan, 2.0f, 0.0f};
  recent_state.scale = 5.0f;
  update_delayed(recent_state, DelayedScalingParams{448.0f, AmaxCompute::MostRecent, 0});
  EXPECT_EQ(recent_state.scale, 5.0f);
}

TEST(DelayedScaling, InfInHistoryWinsMaxAndKeepsOldScale) {
  DelayedScalingState state;
  state.amax_history = {1.0f, kInf, 2.0f};
  state.scale = 7.0f;
  EXPECT_EQ(update_delayed(state, DelayedScalingParams{}), kInf);
  EXPECT_EQ(state.scale, 7.0f);
}

TEST(DelayedScaling, TinyAmaxGivesFltMaxScale) {
  DelayedScalingState state = fresh_state(1);
  state.amax_history[0] = 1e-38f;  // 448 / 1e-38 = 4.48e40: Inf in fp32
  update_delayed(state, DelayedScalingParams{});
  EXPECT_EQ(state.scale, FLT_MAX);
  EXPECT_EQ(state.scale_inv, 1.0f / FLT_MAX);
  EXPECT_GT(state.scale_inv, 0.0f);  // a subnormal, not flushed to zero
}

TEST(DelayedScaling, QuotientOverflowsBeforeMarginIsApplied) {
  // (fp8_max / amax) / 2^margin: 448 / 1e-36 overflows to Inf before the division by 4, so the
  // scale is FLT_MAX even though 112 / 1e-36 would fit. Pinned so the GPU kernel copies the order.
  DelayedScalingState state = fresh_state(1);
  state.amax_history[0] = 1e-36f;
  update_delayed(state, DelayedScalingParams{448.0f, AmaxCompute::Max, 2});
  EXPECT_EQ(state.scale, FLT_MAX);
  // Just inside the range, the margin applies normally.
  state.amax_history[0] = 2e-36f;
  update_delayed(state, DelayedScalingParams{448.0f, AmaxCompute::Max, 2});
  EXPECT_EQ(state.scale, fp32_quotient(448.0f, 2e-36f) / 4.0f);
}

TEST(DelayedScaling, EmptyHistoryIsAnInternalError) {
  DelayedScalingState state;
  state.amax_history.clear();
  EXPECT_THROW(update_delayed(state, DelayedScalingParams{}), InternalError);
}

// ---- Current scaling
// -----------------------------------------------------------------------------

TEST(CurrentScaling, ScaleIsFp8MaxOverAmax) {
  const CurrentScale result = compute_current_scale(3.0f, 448.0f, 0.0f, false);
  EXPECT_EQ(result.scale, fp32_quotient(448.0f, 3.0f));
  EXPECT_EQ(result.scale_inv, 1.0f / fp32_quotient(448.0f, 3.0f));
  EXPECT_EQ(compute_current_scale(57344.0f, 57344.0f, 0.0f, false).scale, 1.0f);
}

TEST(CurrentScaling, EpsilonFloorsTheAmax) {
  EXPECT_EQ(compute_current_scale(1e-10f, 448.0f, 1e-4f, false).scale,
            fp32_quotient(448.0f, 1e-4f));
  EXPECT_EQ(compute_current_scale(0.0f, 448.0f, 1e-4f, false).scale, fp32_quotient(448.0f, 1e-4f));
  EXPECT_EQ(compute_current_scale(2.0f, 448.0f, 1e-4f, false).scale, 224.0f);
}

TEST(CurrentScaling, ZeroInfOrNanAmaxGivesScaleOne) {
  for (const float amax : {0.0f, kInf, kNan}) {
    const CurrentScale result = compute_current_scale(amax, 448.0f, 0.0f, false);
    EXPECT_EQ(result.scale, 1.0f) << amax;
    EXPECT_EQ(result.scale_inv, 1.0f) << amax;
  }
  // eps does not rescue a NaN or Inf amax.
  EXPECT_EQ(compute_current_scale(kNan, 448.0f, 1e-4f, true).scale, 1.0f);
  EXPECT_EQ(compute_current_scale(kInf, 448.0f, 1e-4f, true).scale, 1.0f);
}

TEST(CurrentScaling, PowerOfTwoRoundsScaleDown) {
  const CurrentScale third = compute_current_scale(3.0f, 448.0f, 0.0f, true);  // 149.33 -> 128
  EXPECT_EQ(third.scale, 128.0f);
  EXPECT_EQ(third.scale_inv, 1.0f / 128.0f);
  EXPECT_EQ(compute_current_scale(1000.0f, 448.0f, 0.0f, true).scale, 0.25f);  // 0.448 -> 0.25
  EXPECT_EQ(compute_current_scale(1.0f, 57344.0f, 0.0f, true).scale, 32768.0f);
  EXPECT_EQ(compute_current_scale(448.0f, 448.0f, 0.0f, true).scale, 1.0f);  // already exact
}

TEST(CurrentScaling, OverflowingScaleBecomesFltMax) {
  EXPECT_EQ(compute_current_scale(1e-38f, 448.0f, 0.0f, false).scale, FLT_MAX);
  EXPECT_EQ(compute_current_scale(1e-38f, 448.0f, 0.0f, true).scale, std::ldexp(1.0f, 127));
}

// ---- Format choice
// -------------------------------------------------------------------------------

TEST(FormatFor, HybridUsesE5M2ForGradientsOnly) {
  EXPECT_EQ(format_for(/*is_gradient=*/false, /*hybrid=*/true), Fp8Format::E4M3);
  EXPECT_EQ(format_for(/*is_gradient=*/true, /*hybrid=*/true), Fp8Format::E5M2);
  EXPECT_EQ(format_for(/*is_gradient=*/false, /*hybrid=*/false), Fp8Format::E4M3);
  EXPECT_EQ(format_for(/*is_gradient=*/true, /*hybrid=*/false), Fp8Format::E4M3);
}

}  // namespace
}  // namespace opfuse::cpu
