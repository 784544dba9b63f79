// The FP8 scaling recipes' arithmetic on the CPU: delayed scaling (amax history + scale update)
// and current scaling (scale from this tensor's amax). The GPU scale-update kernel must produce
// the same bits, so every rule here is plain IEEE fp32 with one rounding per operation and no
// expression the compiler could contract into an FMA (there is no a * b + c anywhere).
// The rules follow NVIDIA Transformer Engine (TE); each one's comment in the .cpp says which part.
#pragma once

#include <cstdint>
#include <vector>

#include "numerics.h"  // same directory: works with or without runtime/ on the include path

namespace opfuse::cpu {

// Which amax the delayed-scaling update turns into a scale (TE's amax_compute_algo).
enum class AmaxCompute { Max, MostRecent };

struct DelayedScalingParams {
  float fp8_max = 448.0f;  // fp8_max(format) of the quantized tensor
  AmaxCompute algo = AmaxCompute::Max;
  int margin = 0;  // the scale is divided by 2^margin
};

// Per quantized tensor. Slot 0 of the history holds the amax of the step in progress (kernels
// max-reduce into it); slots 1..L-1 hold the previous L-1 steps' amaxes, oldest first.
struct DelayedScalingState {
  std::vector<float> amax_history = std::vector<float>(1, 0.0f);  // length L >= 1
  float scale = 1.0f;
  float scale_inv = 1.0f;
  // Current scaling (and NVFP4's tensor scale): how many times the amax was measured, wrapping
  // (the device record's word 3, templates/common/quantizer_record.cuh). Stochastic rounding uses
  // it as the step of its random bits, so a checkpoint keeps it (docs/state_files.md). 0 under
  // delayed scaling.
  std::uint32_t measurements = 0;
};

// Ends a step (TE's fused amax-and-scale update):
//   1. amax = Max: fmaxf over all L slots, starting from 0 (NaN never wins);
//      MostRecent: slot 0 as it is (NaN included).
//   2. roll: new[i] = old[i + 1] for 1 <= i <= L-2, new[L-1] = old[0], new[0] = 0.
//   3. scale = (fp8_max / amax) / 2^margin if amax is finite and > 0, else the old scale;
//      an infinite scale becomes FLT_MAX; scale_inv = 1 / scale.
// Returns the amax used in step 3. Throws InternalError for an empty history.
float update_delayed(DelayedScalingState& state, const DelayedScalingParams& params);

struct CurrentScale {
  float scale = 1.0f;
  float scale_inv = 1.0f;
};

// Current scaling (TE Float8CurrentScaling): scale = fp8_max / max(amax, eps); 1 when amax is NaN
// or Inf or max(amax, eps) is 0; FLT_MAX when the quotient overflows; with power_of_2 the scale
// is rounded down to a power of two (its mantissa bits cleared). scale_inv = 1 / scale.
CurrentScale compute_current_scale(float amax, float fp8_max, float eps, bool power_of_2);

// FP8 format of a GEMM operand: HYBRID uses E4M3 forward (activations, weights) and E5M2 for
// gradients; the E4M3 recipe format (hybrid = false) uses E4M3 everywhere.
Fp8Format format_for(bool is_gradient, bool hybrid);

}  // namespace opfuse::cpu
