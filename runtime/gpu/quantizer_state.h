// Device-resident FP8 quantizer state of one sequence (docs/design.md, "Quantizer state"): every
// quantizer's amax history, scale and scale_inv in one allocation, the QuantizerRecord array of
// templates/scale_update.cuh pointing into it, and one update_scales launch per step for all of
// them. The CPU twin is reference/cpu_quantizers.h + quantizer_math.h, bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "cpu/quantizer_math.h"
#include "gpu/device_memory.h"
#include "gpu/module.h"
#include "plan/quant_spec.h"

namespace opfuse::jit {
class KernelCache;
}

namespace opfuse::gpu {

// One quantizer's recipe settings; the same fields cpu::Quantizer holds.
struct QuantizerSettings {
  std::string name;  // "<layer>.input", "<layer>.weight", "<layer>.grad_output"
  cpu::Fp8Format format = cpu::Fp8Format::E4M3;
  bool current_scaling = false;  // else delayed scaling
  int history_length = 1024;     // delayed scaling (>= 1); current scaling keeps one slot
  cpu::AmaxCompute amax_compute = cpu::AmaxCompute::Max;
  int margin = 0;
  float amax_epsilon = 0.0f;      // current scaling
  bool power_of_2_scale = false;  // current scaling
  // The largest magnitude the scale maps the amax to: the format's largest finite value (448,
  // 57344); NVFP4's per-tensor scale: 448 * 6 (plan::QuantSpec::fp8_max).
  float fp8_max = 448.0f;
  // Block scaling keeps no state here: each FP8 copy carries its scale grid (a plan buffer), and
  // its slot (one history word, scale and scale_inv 1) is never read or written by a kernel.
  bool block_scaled = false;
};

// The settings of a quantizer with `spec`, derived as cpu::make_quantizer does: NVFP4 holds its
// per-tensor scale as current scaling does, MXFP8 and Float8 block scaling hold nothing. Throws
// UsageError for a format that is neither FP8 nor NVFP4's.
QuantizerSettings quantizer_settings(std::string name, const plan::QuantSpec& spec);

// Host mirror of templates/common/quantizer_record.cuh's QuantizerRecord, field for field (56
// bytes).
struct QuantizerRecord {
  float* amax;          // delayed: its slot of the amax section; current: word 0 of the history
  float* amax_history;  // delayed: the older slots (history_length - 1 words); current: 4 words
  float* scale;
  float* scale_inv;
  int history_length;
  int mode;  // 0 delayed/max, 1 delayed/most_recent, 2 current
  float fp8_max;
  int margin;
  float epsilon;
  int power_of_2_scale;
};
static_assert(sizeof(QuantizerRecord) == 56, "must match templates/common/quantizer_record.cuh");

// Byte offsets inside the one allocation: the records, then all scales, all scale_invs, all
// amaxes (delayed scaling's slot 0 of the history: the amax the step in progress raises), then
// each history's older slots; every section starts 16-byte aligned, and so does every scale,
// scale_inv and amax (the amaxes section is one contiguous array of 16-byte slots, so one
// all-reduce covers every quantizer's amax: note "Amax reduction" in executor_comm.cpp):
// cuBLASLt 13 rejects FP8 GEMMs (CUBLAS_STATUS_NOT_SUPPORTED at cublasLtMatmul, after the
// heuristic accepted them) whose scale or amax pointers are only 4-byte aligned (measured on an
// H100, bench/RESULTS.md).
struct QuantizerLayout {
  static constexpr std::size_t kScalarSlotBytes = 16;  // one float per 16-byte slot
  // A current-scaling history: the measured amax, the arrival count, the running max, unused.
  static constexpr int kCurrentScalingWords = 4;
  static constexpr int kRunningAmaxWord = 2;
  static constexpr int kMeasurementsWord = 3;
  std::size_t records_offset = 0;     // QuantizerRecord[count]
  std::size_t scales_offset = 0;      // float slot[count]
  std::size_t scale_invs_offset = 0;  // float slot[count]
  std::size_t amaxes_offset = 0;      // float slot[count]; unused by current scaling
  // Delayed scaling: history_length - 1 words (the older slots); current scaling:
  // kCurrentScalingWords words.
  std::vector<std::size_t> history_offsets;
  std::vector<int> history_lengths;  // 1 under current scaling
  std::size_t total_bytes = 0;
};

// Throws UsageError for a delayed-scaling history length below 1.
QuantizerLayout plan_quantizer_layout(const std::vector<QuantizerSettings>& settings);

class QuantizerState {
 public:
  // Allocates and initializes the state on `stream` (scale 1, scale_inv 1, history zero) and
  // compiles update_scales for the current device through the JIT (consulting `cache` when
  // given). Throws UsageError for bad settings, CudaError, or jit::JitError.
  QuantizerState(std::vector<QuantizerSettings> settings, cudaStream_t stream,
                 jit::KernelCache* cache = nullptr);

  int count() const { return static_cast<int>(settings_.size()); }
  const QuantizerSettings& settings(int index) const { return settings_.at(index); }

  // Slot 0 of the amax history: under delayed scaling the amax the cast kernels of this step
  // max-reduce into (the update zeroes it for the next step), in the amaxes section; under
  // current scaling the measured amax, written by the last block of the kernel that measures it.
  // Device pointers; valid while this object lives.
  float* amax(int index) const;
  // The amaxes section: count() 16-byte slots, one float each (zero padding between them, and
  // zero in the slots of current-scaling and block-scaled quantizers). A max over ranks of the
  // whole section (an all-reduce of amaxes_floats() floats) reduces every delayed-scaling amax.
  float* amaxes() const { return float_at(layout_.amaxes_offset); }
  std::size_t amaxes_floats() const {
    return settings_.size() * (QuantizerLayout::kScalarSlotBytes / sizeof(float));
  }
  // Current scaling only (UsageError otherwise): the running max the measuring kernel's blocks
  // raise; 0 between measurements (templates/common/quantizer_record.cuh).
  float* running_amax(int index) const;
  // Current scaling only (UsageError otherwise): the count of its measurements (an unsigned int,
  // word 3), NVFP4's stochastic-rounding step.
  unsigned int* measurements(int index) const;
  // Delayed scaling: the older slots (history_length - 1 words); current scaling: the
  // kCurrentScalingWords words of templates/common/quantizer_record.cuh.
  float* amax_history(int index) const;
  float* scale(int index) const;      // read by the cast kernels
  float* scale_inv(int index) const;  // given to the GEMM as the operand's scale_inv
  const QuantizerRecord* records() const;
  const QuantizerLayout& layout() const { return layout_; }

  // Ends a step: ONE update_scales<256> launch over every record, on `stream`, no host sync.
  void update(cudaStream_t stream);
  // Current scaling over ranks: after a measuring kernel that ran without its record and an
  // all-reduce (max) of running_amax(index) over the ranks, takes the reduced max as the measured
  // amax, zeroes the running max and derives scale and scale_inv (templates/scale_update.cuh,
  // finish_current_scales), on `stream`. UsageError for a delayed-scaling quantizer.
  void finish_current(int index, cudaStream_t stream);

  // Copies the whole state to the host (waits for `stream`), e.g. for tests and checkpoints.
  std::vector<cpu::DelayedScalingState> download(cudaStream_t stream) const;
  // Replaces the state (checkpoint load), enqueued on `stream`. Throws UsageError, copying
  // nothing, when the count or a history length differs from this state's.
  void upload(const std::vector<cpu::DelayedScalingState>& states, cudaStream_t stream);

 private:
  std::vector<unsigned char> host_image(const std::vector<cpu::DelayedScalingState>& states) const;
  void require_current(int index) const;  // UsageError for a delayed-scaling quantizer
  float* float_at(std::size_t offset) const;
  std::size_t offset_of(const float* pointer) const;  // inverse of float_at

  std::vector<QuantizerSettings> settings_;
  QuantizerLayout layout_;
  DeviceBuffer memory_;
  Module module_;
  Kernel update_kernel_;
  Kernel finish_kernel_;
};

}  // namespace opfuse::gpu
