// Note "Quantization specs" (docs/architecture.md): every quantizer carries its own spec (how it
// scales, its format, block shape and scale dtype) and its usages (which copies it makes), kept
// apart from the layout of each copy. A recipe is only the default plan-quantization expands into
// specs; an override for one layer, GEMM or tensor is another spec on that quantizer.
#pragma once

#include <cstdint>
#include <string>

#include "plan/enums.h"

namespace opfuse::plan {

// A block of elements sharing one scale: rows x cols of the row-wise copy (1 x 128, 128 x 128,
// 1 x 32). Per-tensor scaling has no block (0 x 0).
struct BlockShape {
  int rows = 0;
  int cols = 0;
  friend bool operator==(const BlockShape&, const BlockShape&) = default;
};

struct QuantSpec {
  ScalingKind scaling = ScalingKind::Delayed;
  DType format = DType::E4M3;  // e4m3 or e5m2; e2m1 for NVFP4 (micro-scaled only)
  BlockShape block;            // Block1D / Block2D / MicroScaled only
  ScaleDType scale_dtype = ScaleDType::FP32;
  bool power_of_2_scale = false;  // current / block: scales rounded down to a power of two
  double epsilon = 0.0;           // current / block: amax floor (TE's amax_epsilon)
  int margin = 0;                 // delayed: scale = (fp8_max / amax) / 2^margin
  int history_length = 1;         // delayed: amax history; current keeps one amax
  AmaxCompute amax_compute = AmaxCompute::Max;  // delayed: over the history or most recent
  // NVFP4 (micro-scaled e2m1): the random Hadamard transform of the copy before it is quantized
  // (the wgrad copies of inputs and gradients), and stochastic rounding (gradients) drawing
  // Philox bits from `seed` (templates/common/philox.cuh).
  bool rht = false;
  bool stochastic_rounding = false;
  uint32_t seed = 0;

  // One scale for the whole tensor (a device scalar scale_inv), as today's recipes.
  bool per_tensor() const {
    return scaling == ScalingKind::Delayed || scaling == ScalingKind::Current;
  }
  // Float8 block scaling (1 x 128 / 128 x 128 FP32 scales): real FP8 GEMMs where cuBLASLt has the
  // block-scale modes (sm_90), decoded copies elsewhere (note "Emulated block scaling" in
  // docs/architecture.md).
  bool block_scaled() const {
    return scaling == ScalingKind::Block1D || scaling == ScalingKind::Block2D;
  }
  // MXFP8 / NVFP4: on Hopper the GEMMs read the decoded copies (note "Emulated micro-scaling" in
  // docs/architecture.md).
  bool micro_scaled() const { return scaling == ScalingKind::MicroScaled; }
  // NVFP4: a per-tensor FP32 scale (S_enc = 448 * 6 / amax) on top of the block scales, derived
  // from the measured amax as current scaling derives its scale (with fp8_max() = 2688).
  bool nvfp4() const { return scaling == ScalingKind::MicroScaled && format == DType::E2M1; }
  // Whether the quantizer keeps a measured amax and a scale in its device state: delayed and
  // current scaling, and NVFP4's per-tensor scale. Float8 block scaling and MXFP8 keep none.
  bool has_tensor_scale() const { return per_tensor() || nvfp4(); }
  // Updated once per step by the fused scale update (delayed) rather than before each cast.
  bool delayed() const { return scaling == ScalingKind::Delayed; }
  // The largest magnitude the scale maps the amax to: the format's largest finite value; for NVFP4
  // the product of its two levels' (448 * 6), which makes S_enc a current-scaling scale.
  float fp8_max() const {
    return format == DType::E5M2 ? 57344.0f : format == DType::E2M1 ? 2688.0f : 448.0f;
  }
  // Amax history slots the device state keeps: the history for delayed, one amax otherwise.
  int history_slots() const { return delayed() ? history_length : 1; }
  friend bool operator==(const QuantSpec&, const QuantSpec&) = default;
};

// One line, as the IR printer and plan readers show it, e.g.
// "delayed(e4m3, history = 1024, amax = max, margin = 0)", "current(e5m2, epsilon = 0)",
// "block_1d(e4m3, 1x128, scale = fp32, power_of_2)".
std::string quant_spec_string(const QuantSpec& spec);

// The copies a quantizer makes.
struct Usages {
  bool rowwise = false;
  bool columnwise = false;
  friend bool operator==(const Usages&, const Usages&) = default;
};

}  // namespace opfuse::plan
