// Note "Quantization specs" (docs/architecture.md): every quantizer carries its own spec (how it
// scales, its format, block shape and scale dtype) and its usages (which copies it makes), kept
// apart from the layout of each copy. A recipe is only the default plan-quantization expands into
// specs; an override for one layer, GEMM or tensor is another spec on that quantizer.
#pragma once

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
  DType format = DType::E4M3;  // e4m3 or e5m2
  BlockShape block;            // Block1D / Block2D / MicroScaled only
  ScaleDType scale_dtype = ScaleDType::FP32;
  bool power_of_2_scale = false;  // current / block: scales rounded down to a power of two
  double epsilon = 0.0;           // current / block: amax floor (TE's amax_epsilon)
  int margin = 0;                 // delayed: scale = (fp8_max / amax) / 2^margin
  int history_length = 1;         // delayed: amax history; current keeps one amax
  AmaxCompute amax_compute = AmaxCompute::Max;  // delayed: over the history or most recent

  // One scale for the whole tensor (a device scalar scale_inv), as today's recipes.
  bool per_tensor() const {
    return scaling == ScalingKind::Delayed || scaling == ScalingKind::Current;
  }
  // Updated once per step by the fused scale update (delayed) rather than before each cast.
  bool delayed() const { return scaling == ScalingKind::Delayed; }
  float fp8_max() const { return format == DType::E5M2 ? 57344.0f : 448.0f; }
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
