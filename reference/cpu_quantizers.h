// One FP8 quantizer of the CPU reference (an input, weight or grad_output of a linear): its
// recipe's parameters and its state (amax history, scale, scale_inv), and the fake-quantize cast
// the reference applies to a GEMM operand: x -> fp8(x * scale) * scale_inv.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "block_quantization.h"
#include "block_summary.h"
#include "micro_scaling.h"
#include "plan/quant_spec.h"
#include "quantizer_math.h"

namespace opfuse::cpu {

struct Quantizer {
  std::string name;  // "<layer>.input", "<layer>.weight", "<layer>.grad_output"
  Fp8Format format = Fp8Format::E4M3;
  bool current_scaling = false;   // else delayed scaling
  DelayedScalingParams delayed;   // fp8_max, amax algorithm, margin
  float amax_epsilon = 0.0f;      // current scaling
  bool power_of_2_scale = false;  // current scaling
  // Delayed scaling: the history ring and the scale in use. Current scaling: a one-slot history
  // holding the amax of the latest cast, and the scale computed from it. Block scaling: unused
  // (each block's scale comes from the block; runtime/cpu/block_quantization.h).
  DelayedScalingState state;
  bool block_scaled = false;  // 1 x 128 or 128 x 128 blocks (block.two_d); MXFP8 and NVFP4 too
  BlockQuantParams block;
  // MXFP8 / NVFP4 (runtime/cpu/micro_scaling.h), emulated: casts decode their copies. NVFP4's
  // tensor scale is kept as current scaling keeps its scale (state, with fp8_max 2688), and
  // state.measurements counts its amax measurements as the device record's word 3 does: the step
  // of stochastic rounding's Philox bits.
  bool micro_scaled = false;
  plan::QuantSpec micro;
  // Its index among the sequence's quantizers (the reference executor sets it): the Philox stream
  // of its row-wise copy is 2 * index, of its column-wise copy 2 * index + 1, as on the device.
  uint32_t index = 0;
  // Tensor-parallel current scaling: the amax of the whole tensor from this rank's share's (the
  // max over the ranks); unset: the share is the whole tensor.
  std::function<float(float)> reduce_amax;
};

// Note "Block summaries" (runtime/cpu/block_summary.h): one quantized copy of a block-scaled or
// micro-scaled quantizer as its latest cast made it.
struct BlockCopySummary {
  std::string quantizer;  // "fc1.input"
  bool columnwise = false;
  std::string format_name;  // the spec's format: "e4m3", "e5m2", "e2m1"
  int block_rows = 0;       // in the source's orientation: 1 x 128 row-wise, 128 x 1 column-wise
  int block_cols = 0;
  BlockSummary summary;
  bool has_tensor_scale = false;  // NVFP4
  float tensor_scale = 0.0f;      // NVFP4: the S_enc the copy was cast with
};

// A quantizer with `spec`: per-tensor delayed or current scaling, 1-D or 2-D block scaling, MXFP8
// or NVFP4 (ReferenceError for another format).
Quantizer make_quantizer(std::string name, const plan::QuantSpec& spec);

// In place: values ([rows, cols] row-major) become fp8(x * scale) * scale_inv. Delayed scaling
// casts with the current scale and max-reduces |x| into history slot 0; current scaling first takes
// this tensor's amax and computes the scale from it (compute_current_scale), then casts; block
// scaling takes each block's scale from the block (its rows of `cols` values, 1 x 128 or 128 x 128
// blocks).
void fake_quantize(Quantizer& quantizer, std::span<float> values, int64_t cols);

// The GPU's per-tensor cast: writes fp8(x * scale) (the FP8 value itself, decoded to float) to
// `codes` and returns the scale_inv a GEMM must apply to it. Scale and amax bookkeeping as
// fake_quantize. Not for block-scaled quantizers (block_quantize_rowwise / _columnwise).
float quantize(Quantizer& quantizer, std::span<const float> values, std::span<float> codes);

// Note "Emulated micro-scaling" (docs/architecture.md): one MXFP8 / NVFP4 copy of x ([rows,
// cols] row-major, values rounded to the source dtype) quantized and decoded in the source's
// layout, as the GEMMs of a Hopper read it. NVFP4 first measures its tensor scale when `measure`
// (the amax of x, or of its Hadamard-transformed columns for an rht column-wise copy); a copy
// made right after its quantizer's other copy of the same tensor reuses that measurement, as the
// device does. Stochastic rounding draws from the stream of Quantizer::index and the copy, as
// the device does. ReferenceError for a quantizer that is not micro-scaled. `summary`, when given,
// receives the copy's block summary (note "Block summaries").
std::vector<float> micro_cast(Quantizer& quantizer, std::span<const float> x, int64_t rows,
                              int64_t cols, bool columnwise, bool measure,
                              BlockSummary* summary = nullptr);

// One MXFP8 or NVFP4 copy as stored: micro_cast without the decode (a quantized boundary's
// codes and scales; note "Quantized boundaries" in docs/architecture.md), and its decoded values
// in x's orientation.
struct MicroCopy {
  bool nvfp4 = false;
  Mxfp8Copy fp8;
  Nvfp4Copy fp4;
};
MicroCopy micro_quantize(Quantizer& quantizer, std::span<const float> x, int64_t rows, int64_t cols,
                         bool columnwise, bool measure, BlockSummary* summary = nullptr);
std::vector<float> micro_decode(const MicroCopy& copy);

// Ends a step: the delayed-scaling update (update_delayed); a no-op under current scaling.
void end_step(Quantizer& quantizer);

}  // namespace opfuse::cpu
