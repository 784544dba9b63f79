#include "cpu/quantizer_math.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "support/assert.h"

// No FMA contraction can change these results: every expression below is a single division,
// comparison or fmax, never a product feeding a sum. (GCC in ISO mode, which the build uses,
// does not contract across statements anyway.)

namespace opfuse::cpu {
namespace {

// Why FLT_MAX: TE replaces an infinite scale (amax too small for fp8_max / amax to fit in fp32)
// by the largest float, so the tensor still quantizes, to somewhat less than the FP8 range.
float finite_scale(float scale) { return std::isinf(scale) ? FLT_MAX : scale; }

}  // namespace

float update_delayed(DelayedScalingState& state, const DelayedScalingParams& params) {
  std::vector<float>& history = state.amax_history;
  OPFUSE_ASSERT(!history.empty(), "delayed scaling needs an amax history of length >= 1");

  const float most_recent = history[0];
  // Why fmax from 0: TE's update kernel reduces `amax = fmaxf(amax, a)` from 0 over the rolled
  // history, so a NaN slot is skipped while an Inf slot wins (and then keeps the old scale).
  float window_max = 0.0f;
  for (const float slot : history) window_max = std::fmax(window_max, slot);

  // Why this roll: TE's kernel writes new[i] = old[i + 1] (i < L-1), new[L-1] = old[0], then
  // zeroes slot 0 for the next step: the just-finished amax becomes the newest entry and the
  // oldest one drops out. For L == 1 the rotation is a no-op and only the zeroing remains.
  std::rotate(history.begin(), history.begin() + 1, history.end());
  history[0] = 0.0f;

  // Why MostRecent reads slot 0 unfiltered: TE takes `last_amax` as is; a NaN there simply fails
  // the isfinite test below.
  const float amax = params.algo == AmaxCompute::Max ? window_max : most_recent;

  // Why keep the old scale: TE only trusts a finite, positive amax; 0 (tensor never written, or all
  // zeros) and Inf/NaN (overflowed step) would give a useless or poisonous scale.
  float scale = state.scale;
  if (std::isfinite(amax) && amax > 0.0f) {
    // Why two divisions in this order: TE's (fp8_max / amax) / 2^margin. Dividing by a power of
    // two is exact, but the first quotient can overflow to Inf first, which then gives FLT_MAX.
    const float full_range_scale = params.fp8_max / amax;
    scale = full_range_scale / std::ldexp(1.0f, params.margin);
  }
  state.scale = finite_scale(scale);
  state.scale_inv = 1.0f / state.scale;
  return amax;
}

CurrentScale compute_current_scale(float amax, float fp8_max, float eps, bool power_of_2) {
  // Why clamp with `<`: TE's compute_scale_from_amax raises amax to eps this way, so a NaN amax
  // (which compares false) stays NaN and is caught just below.
  const float floored_amax = amax < eps ? eps : amax;
  // Why 1: TE returns scale 1 for an amax that is Inf, NaN or (after the eps floor) zero.
  if (std::isinf(floored_amax) || std::isnan(floored_amax) || floored_amax == 0.0f) {
    return CurrentScale{1.0f, 1.0f};
  }
  // Why plain division: TE uses __fdiv_rn (IEEE round-to-nearest), which is what C++ float
  // division is without fast-math.
  float scale = finite_scale(fp8_max / floored_amax);
  if (power_of_2) {
    // Why the mask: TE rounds the scale down to a power of two by clearing its mantissa bits,
    // so that scaling and unscaling are exact.
    scale = std::bit_cast<float>(std::bit_cast<uint32_t>(scale) & 0xFF800000u);
  }
  return CurrentScale{scale, 1.0f / scale};
}

Fp8Format format_for(bool is_gradient, bool hybrid) {
  // Why: TE's Format.HYBRID trades precision for range only where gradients need it (E5M2);
  // Format.E4M3 keeps every tensor in E4M3.
  return hybrid && is_gradient ? Fp8Format::E5M2 : Fp8Format::E4M3;
}

}  // namespace opfuse::cpu
