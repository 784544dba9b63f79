#include "gpu/quantizer_state.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "jit/kernel_cache.h"
#include "opfuse/error.h"

namespace opfuse::gpu {
namespace {

constexpr const char* kUpdateExpression = "opfuse::update_scales<256>";
constexpr const char* kFinishExpression = "opfuse::finish_current_scales<32>";
constexpr unsigned kUpdateThreads = 256;  // launch::kScaleUpdateThreads

struct ScaleUpdateParams {  // templates/scale_update.cuh
  const QuantizerRecord* records;
  int count;
};

std::size_t align16(std::size_t offset) { return (offset + 15) / 16 * 16; }

int scaling_mode(const QuantizerSettings& settings) {
  if (settings.current_scaling) return 2;
  return settings.amax_compute == cpu::AmaxCompute::Max ? 0 : 1;
}

jit::CompiledKernel compile_update_kernel(jit::KernelCache* cache) {
  jit::CompileRequest request;
  request.kernel_name = "update_scales";
  request.source = "#include \"scale_update.cuh\"\n";
  request.name_expressions = {kUpdateExpression, kFinishExpression};
  request.arch = current_device().arch;
  if (cache == nullptr) return jit::compile_kernel(request);
  return std::move(jit::compile_all({request}, cache, 1).kernels.at(0));
}

}  // namespace

QuantizerSettings quantizer_settings(std::string name, const plan::QuantSpec& spec) {
  if (!plan::dtype_is_fp8(spec.format) && !spec.nvfp4()) {
    throw UsageError(fmt::format("quantizer '{}' has the format {}, not an FP8 format", name,
                                 plan::name(spec.format)));
  }
  QuantizerSettings settings;
  settings.name = std::move(name);
  settings.format = spec.format == plan::DType::E5M2 ? cpu::Fp8Format::E5M2 : cpu::Fp8Format::E4M3;
  // NVFP4's per-tensor scale is a current-scaling scale over 448 * 6 (QuantSpec::nvfp4); MXFP8,
  // like Float8 block scaling, keeps no state (its E8M0 scales come from each block).
  settings.current_scaling = spec.scaling == plan::ScalingKind::Current || spec.nvfp4();
  settings.block_scaled = !spec.has_tensor_scale();
  settings.fp8_max = spec.fp8_max();
  settings.history_length = spec.history_slots();
  settings.amax_compute = spec.amax_compute == plan::AmaxCompute::Max
                              ? cpu::AmaxCompute::Max
                              : cpu::AmaxCompute::MostRecent;
  settings.margin = spec.margin;
  settings.amax_epsilon = static_cast<float>(spec.epsilon);
  settings.power_of_2_scale = spec.power_of_2_scale;
  return settings;
}

QuantizerLayout plan_quantizer_layout(const std::vector<QuantizerSettings>& settings) {
  QuantizerLayout layout;
  const std::size_t count = settings.size();
  layout.records_offset = 0;
  layout.scales_offset = align16(count * sizeof(QuantizerRecord));
  layout.scale_invs_offset = layout.scales_offset + count * QuantizerLayout::kScalarSlotBytes;
  layout.amaxes_offset = layout.scale_invs_offset + count * QuantizerLayout::kScalarSlotBytes;
  std::size_t offset = layout.amaxes_offset + count * QuantizerLayout::kScalarSlotBytes;
  for (const QuantizerSettings& quantizer : settings) {
    if (!quantizer.current_scaling && quantizer.history_length < 1) {
      throw UsageError(fmt::format(
          "quantizer '{}' has an amax history of length {}: delayed scaling needs at least 1",
          quantizer.name, quantizer.history_length));
    }
    const int length = quantizer.current_scaling ? 1 : quantizer.history_length;
    // Current scaling: the measured amax, the arrival count and the running max of
    // templates/common/quantizer_record.cuh (kCurrentScalingWords). Delayed scaling: the older
    // slots (slot 0 is in the amaxes section).
    const int words =
        quantizer.current_scaling ? QuantizerLayout::kCurrentScalingWords : length - 1;
    layout.history_offsets.push_back(offset);
    layout.history_lengths.push_back(length);
    offset = align16(offset + static_cast<std::size_t>(words) * sizeof(float));
  }
  layout.total_bytes = offset;
  return layout;
}

QuantizerState::QuantizerState(std::vector<QuantizerSettings> settings, cudaStream_t stream,
                               jit::KernelCache* cache)
    : settings_(std::move(settings)),
      layout_(plan_quantizer_layout(settings_)),
      memory_(layout_.total_bytes, stream),
      module_(compile_update_kernel(cache)),
      update_kernel_(module_.kernel(kUpdateExpression)),
      finish_kernel_(module_.kernel(kFinishExpression)) {
  std::vector<cpu::DelayedScalingState> initial(settings_.size());
  for (std::size_t i = 0; i < settings_.size(); ++i) {
    initial[i].amax_history.assign(static_cast<std::size_t>(layout_.history_lengths[i]), 0.0f);
  }
  upload(initial, stream);
}

float* QuantizerState::float_at(std::size_t offset) const {
  return reinterpret_cast<float*>(memory_.as<unsigned char>() + offset);
}

std::size_t QuantizerState::offset_of(const float* pointer) const {
  return static_cast<std::size_t>(reinterpret_cast<const unsigned char*>(pointer) -
                                  memory_.as<unsigned char>());
}

float* QuantizerState::amax_history(int index) const {
  return float_at(layout_.history_offsets.at(static_cast<std::size_t>(index)));
}

float* QuantizerState::amax(int index) const {
  if (settings_.at(static_cast<std::size_t>(index)).current_scaling) return amax_history(index);
  return float_at(layout_.amaxes_offset +
                  static_cast<std::size_t>(index) * QuantizerLayout::kScalarSlotBytes);
}

void QuantizerState::require_current(int index) const {
  if (!settings_.at(static_cast<std::size_t>(index)).current_scaling) {
    throw UsageError(fmt::format("quantizer '{}' uses delayed scaling: it has no running amax",
                                 settings_[static_cast<std::size_t>(index)].name));
  }
}

float* QuantizerState::running_amax(int index) const {
  require_current(index);
  return amax_history(index) + QuantizerLayout::kRunningAmaxWord;
}

unsigned int* QuantizerState::measurements(int index) const {
  require_current(index);
  // The word is an unsigned int by the record's definition (templates/common/quantizer_record.cuh).
  return reinterpret_cast<unsigned int*>(amax_history(index) + QuantizerLayout::kMeasurementsWord);
}

float* QuantizerState::scale(int index) const {
  return float_at(layout_.scales_offset +
                  static_cast<std::size_t>(index) * QuantizerLayout::kScalarSlotBytes);
}

float* QuantizerState::scale_inv(int index) const {
  return float_at(layout_.scale_invs_offset +
                  static_cast<std::size_t>(index) * QuantizerLayout::kScalarSlotBytes);
}

const QuantizerRecord* QuantizerState::records() const {
  return reinterpret_cast<const QuantizerRecord*>(memory_.as<unsigned char>() +
                                                  layout_.records_offset);
}

std::vector<unsigned char> QuantizerState::host_image(
    const std::vector<cpu::DelayedScalingState>& states) const {
  std::vector<unsigned char> image(layout_.total_bytes, 0);
  for (std::size_t i = 0; i < settings_.size(); ++i) {
    const QuantizerSettings& quantizer = settings_[i];
    const int index = static_cast<int>(i);
    QuantizerRecord record{};
    record.amax = amax(index);
    record.amax_history = amax_history(index);
    record.scale = scale(index);
    record.scale_inv = scale_inv(index);
    record.history_length = layout_.history_lengths[i];
    record.mode = scaling_mode(quantizer);
    record.fp8_max = quantizer.fp8_max;
    record.margin = quantizer.margin;
    record.epsilon = quantizer.amax_epsilon;
    record.power_of_2_scale = quantizer.power_of_2_scale ? 1 : 0;
    std::memcpy(image.data() + layout_.records_offset + i * sizeof(QuantizerRecord), &record,
                sizeof(record));
    std::memcpy(image.data() + layout_.scales_offset + i * QuantizerLayout::kScalarSlotBytes,
                &states[i].scale, sizeof(float));
    std::memcpy(image.data() + layout_.scale_invs_offset + i * QuantizerLayout::kScalarSlotBytes,
                &states[i].scale_inv, sizeof(float));
    // Slot 0 is the amax (its own slot under delayed scaling, word 0 of the history under
    // current scaling); a delayed history's older slots follow it in its history section.
    const std::vector<float>& history = states[i].amax_history;
    std::memcpy(image.data() + offset_of(amax(index)), history.data(), sizeof(float));
    if (!quantizer.current_scaling && history.size() > 1) {
      std::memcpy(image.data() + layout_.history_offsets[i], history.data() + 1,
                  (history.size() - 1) * sizeof(float));
    }
    // Current scaling: the count of measurements (stochastic rounding's step), so that a loaded
    // checkpoint goes on drawing where it stopped; the running max and arrival count stay 0.
    if (quantizer.current_scaling) {
      std::memcpy(image.data() + layout_.history_offsets[i] +
                      QuantizerLayout::kMeasurementsWord * sizeof(float),
                  &states[i].measurements, sizeof(std::uint32_t));
    }
  }
  return image;
}

void QuantizerState::upload(const std::vector<cpu::DelayedScalingState>& states,
                            cudaStream_t stream) {
  if (states.size() != settings_.size()) {
    throw UsageError(
        fmt::format("quantizer state upload with {} quantizers into a sequence that has {}: load a "
                    "checkpoint of the same program",
                    states.size(), settings_.size()));
  }
  for (std::size_t i = 0; i < states.size(); ++i) {
    const auto expected = static_cast<std::size_t>(layout_.history_lengths[i]);
    if (states[i].amax_history.size() != expected) {
      throw UsageError(fmt::format(
          "quantizer '{}' gets an amax history of length {} but its recipe keeps {}: load a "
          "checkpoint made with the same recipe",
          settings_[i].name, states[i].amax_history.size(), expected));
    }
  }
  const std::vector<unsigned char> image = host_image(states);
  // Why a pageable copy is safe to let go of: for pageable sources cudaMemcpyAsync returns only
  // after the bytes are staged, so `image` may be destroyed on return.
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(memory_.data(), image.data(), image.size(), cudaMemcpyHostToDevice, stream),
      "uploading the quantizer state");
}

std::vector<cpu::DelayedScalingState> QuantizerState::download(cudaStream_t stream) const {
  std::vector<unsigned char> image(layout_.total_bytes);
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(image.data(), memory_.data(), image.size(), cudaMemcpyDeviceToHost, stream),
      "downloading the quantizer state");
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "downloading the quantizer state");
  std::vector<cpu::DelayedScalingState> states(settings_.size());
  for (std::size_t i = 0; i < settings_.size(); ++i) {
    std::memcpy(&states[i].scale,
                image.data() + layout_.scales_offset + i * QuantizerLayout::kScalarSlotBytes,
                sizeof(float));
    std::memcpy(&states[i].scale_inv,
                image.data() + layout_.scale_invs_offset + i * QuantizerLayout::kScalarSlotBytes,
                sizeof(float));
    std::vector<float>& history = states[i].amax_history;
    history.resize(static_cast<std::size_t>(layout_.history_lengths[i]));
    std::memcpy(history.data(), image.data() + offset_of(amax(static_cast<int>(i))), sizeof(float));
    if (!settings_[i].current_scaling && history.size() > 1) {
      std::memcpy(history.data() + 1, image.data() + layout_.history_offsets[i],
                  (history.size() - 1) * sizeof(float));
    }
    if (settings_[i].current_scaling) {
      std::memcpy(&states[i].measurements,
                  image.data() + layout_.history_offsets[i] +
                      QuantizerLayout::kMeasurementsWord * sizeof(float),
                  sizeof(std::uint32_t));
    }
  }
  return states;
}

void QuantizerState::finish_current(int index, cudaStream_t stream) {
  require_current(index);
  const ScaleUpdateParams params{records() + index, 1};
  launch(finish_kernel_, dim3(1), dim3(32), 0, stream, params);
}

void QuantizerState::update(cudaStream_t stream) {
  if (settings_.empty()) return;
  const ScaleUpdateParams params{records(), count()};
  launch(update_kernel_, dim3(static_cast<unsigned>(count())), dim3(kUpdateThreads), 0, stream,
         params);
}

}  // namespace opfuse::gpu
