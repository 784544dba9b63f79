#include "cpu_quantizers.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace opfuse::cpu {

namespace {

// TE's amax reduction: fmaxf(|x|, amax) from 0, so NaN elements never win.
float tensor_amax(std::span<const float> values) {
  float amax = 0.0f;
  for (float v : values) amax = std::fmax(std::fabs(v), amax);
  return amax;
}

}  // namespace

Quantizer make_quantizer(std::string name, const ir::Recipe& recipe, bool is_gradient) {
  Quantizer q;
  q.name = std::move(name);
  q.format = format_for(is_gradient, recipe.format == ir::Fp8Format::Hybrid);
  q.current_scaling = recipe.kind == ir::RecipeKind::CurrentScaling;
  q.delayed.fp8_max = fp8_max(q.format);
  q.delayed.algo =
      recipe.amax_compute == ir::AmaxCompute::Max ? AmaxCompute::Max : AmaxCompute::MostRecent;
  q.delayed.margin = recipe.margin;
  q.amax_epsilon = static_cast<float>(recipe.amax_epsilon);
  q.power_of_2_scale = recipe.power_of_2_scale;
  const size_t history = q.current_scaling ? 1 : static_cast<size_t>(recipe.amax_history);
  q.state.amax_history.assign(history, 0.0f);
  return q;
}

float quantize(Quantizer& quantizer, std::span<const float> values, std::span<float> codes) {
  DelayedScalingState& state = quantizer.state;
  if (quantizer.current_scaling) {
    const float amax = tensor_amax(values);
    const CurrentScale s = compute_current_scale(
        amax, quantizer.delayed.fp8_max, quantizer.amax_epsilon, quantizer.power_of_2_scale);
    state.amax_history[0] = amax;
    state.scale = s.scale;
    state.scale_inv = s.scale_inv;
  }
  std::vector<uint8_t> bits(values.size());
  float amax = 0.0f;
  quantize_fp8(values, state.scale, quantizer.format, bits, &amax);
  if (!quantizer.current_scaling) state.amax_history[0] = std::fmax(state.amax_history[0], amax);
  dequantize_fp8(bits, 1.0f, quantizer.format, codes);
  return state.scale_inv;
}

void fake_quantize(Quantizer& quantizer, std::span<float> values) {
  std::vector<float> codes(values.size());
  const float scale_inv = quantize(quantizer, values, codes);
  // Decoding with scale_inv 1 is exact, so this equals decoding with scale_inv directly.
  for (size_t i = 0; i < values.size(); ++i) values[i] = codes[i] * scale_inv;
}

void end_step(Quantizer& quantizer) {
  if (!quantizer.current_scaling) update_delayed(quantizer.state, quantizer.delayed);
}

}  // namespace opfuse::cpu
