#include "cpu_quantizers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_tensor.h"
#include "micro_scaling.h"

namespace opfuse::cpu {

namespace {

// TE's amax reduction: fmaxf(|x|, amax) from 0, so NaN elements never win.
float tensor_amax(std::span<const float> values) {
  float amax = 0.0f;
  for (float v : values) amax = std::fmax(std::fabs(v), amax);
  return amax;
}

}  // namespace

Quantizer make_quantizer(std::string name, const plan::QuantSpec& spec) {
  if (!plan::dtype_is_fp8(spec.format) && !spec.nvfp4()) {
    throw ReferenceError(fmt::format(
        "quantizer '{}' uses {} scaling to {}, which the CPU reference does not run (FP8, MXFP8 "
        "and NVFP4 formats only)",
        name, plan::name(spec.scaling), plan::name(spec.format)));
  }
  Quantizer q;
  if (spec.micro_scaled()) {
    q.name = std::move(name);
    q.micro_scaled = true;
    q.micro = spec;
    q.block_scaled = !spec.nvfp4();  // MXFP8 keeps no state
    q.current_scaling = spec.nvfp4();
    q.format = spec.format == plan::DType::E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
    q.delayed.fp8_max = spec.fp8_max();  // NVFP4: 448 * 6
    q.state.amax_history.assign(1, 0.0f);
    return q;
  }
  q.name = std::move(name);
  q.format = spec.format == plan::DType::E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  q.current_scaling = spec.scaling == plan::ScalingKind::Current;
  q.delayed.fp8_max = fp8_max(q.format);
  q.delayed.algo =
      spec.amax_compute == plan::AmaxCompute::Max ? AmaxCompute::Max : AmaxCompute::MostRecent;
  q.delayed.margin = spec.margin;
  q.amax_epsilon = static_cast<float>(spec.epsilon);
  q.power_of_2_scale = spec.power_of_2_scale;
  q.state.amax_history.assign(static_cast<size_t>(spec.history_slots()), 0.0f);
  q.block_scaled = !spec.per_tensor();
  q.block.format = q.format;
  q.block.two_d = spec.scaling == plan::ScalingKind::Block2D;
  q.block.power_of_2_scale = spec.power_of_2_scale;
  q.block.epsilon = static_cast<float>(spec.epsilon);
  return q;
}

float quantize(Quantizer& quantizer, std::span<const float> values, std::span<float> codes) {
  if (quantizer.block_scaled) {
    throw ReferenceError(
        fmt::format("quantizer '{}' is block-scaled: it has no per-tensor cast", quantizer.name));
  }
  DelayedScalingState& state = quantizer.state;
  if (quantizer.current_scaling) {
    float amax = tensor_amax(values);
    if (quantizer.reduce_amax) amax = quantizer.reduce_amax(amax);
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

std::vector<float> micro_cast(Quantizer& quantizer, std::span<const float> x, int64_t rows,
                              int64_t cols, bool columnwise, bool measure, BlockSummary* summary) {
  return micro_decode(micro_quantize(quantizer, x, rows, cols, columnwise, measure, summary));
}

std::vector<float> micro_decode(const MicroCopy& copy) {
  return copy.nvfp4 ? nvfp4_dequantize(copy.fp4) : mxfp8_dequantize(copy.fp8);
}

MicroCopy micro_quantize(Quantizer& quantizer, std::span<const float> x, int64_t rows, int64_t cols,
                         bool columnwise, bool measure, BlockSummary* summary) {
  if (!quantizer.micro_scaled) {
    throw ReferenceError(fmt::format("quantizer '{}' is not micro-scaled", quantizer.name));
  }
  const plan::QuantSpec& spec = quantizer.micro;
  MicroCopy out;
  if (!spec.nvfp4()) {
    out.fp8 = mxfp8_quantize(x, rows, cols, quantizer.format, columnwise);
    if (summary) *summary = summarize_mxfp8_copy(x, out.fp8);
    return out;
  }
  out.nvfp4 = true;
  Nvfp4Params params;
  params.columnwise = columnwise;
  params.two_d = spec.block.rows > 1;
  params.rht = spec.rht && columnwise;
  params.stochastic = spec.stochastic_rounding;
  params.seed = spec.seed;
  params.stream = 2 * quantizer.index + (columnwise ? 1u : 0u);
  DelayedScalingState& state = quantizer.state;
  if (measure) {
    const float amax = params.rht ? rht_amax(x, rows, cols) : tensor_amax(x);
    const CurrentScale s = compute_current_scale(amax, quantizer.delayed.fp8_max, 0.0f, false);
    state.amax_history[0] = amax;
    state.scale = s.scale;
    state.scale_inv = s.scale_inv;
    ++state.measurements;
  }
  params.step = state.measurements;
  out.fp4 = nvfp4_quantize(x, rows, cols, state.scale, params);
  if (summary) *summary = summarize_nvfp4_copy(x, out.fp4);
  return out;
}

void fake_quantize(Quantizer& quantizer, std::span<float> values, int64_t cols) {
  if (quantizer.micro_scaled) {
    const int64_t rows = cols == 0 ? 0 : static_cast<int64_t>(values.size()) / cols;
    const std::vector<float> decoded = micro_cast(quantizer, values, rows, cols, false, true);
    std::copy(decoded.begin(), decoded.end(), values.begin());
    return;
  }
  if (quantizer.block_scaled) {
    const int64_t rows = cols == 0 ? 0 : static_cast<int64_t>(values.size()) / cols;
    const BlockQuantizedCopy copy = block_quantize_rowwise(values, rows, cols, quantizer.block);
    const std::vector<float> decoded =
        block_dequantize(copy, quantizer.format, quantizer.block.two_d);
    std::copy(decoded.begin(), decoded.end(), values.begin());
    return;
  }
  std::vector<float> codes(values.size());
  const float scale_inv = quantize(quantizer, values, codes);
  // Decoding with scale_inv 1 is exact, so this equals decoding with scale_inv directly.
  for (size_t i = 0; i < values.size(); ++i) values[i] = codes[i] * scale_inv;
}

void end_step(Quantizer& quantizer) {
  if (!quantizer.current_scaling) update_delayed(quantizer.state, quantizer.delayed);
}

}  // namespace opfuse::cpu
