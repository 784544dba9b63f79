// FP8 recipes as TE defines them (DelayedScaling, Float8CurrentScaling) plus plain bf16.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "support/source_manager.h"

namespace opfuse::ir {

// Float8BlockScaling: TE's Float8BlockScaling (DeepSeek-V3's recipe): FP32 scales per 1 x 128 or
// 128 x 128 block, computed from each block's own amax while it is cast.
// Mxfp8BlockScaling: TE's MXFP8BlockScaling (1 x 32 blocks, E8M0 scales rounded up).
// Nvfp4BlockScaling: TE's NVFP4BlockScaling (E2M1 values, 16-element blocks with E4M3 scales and
// a per-tensor FP32 scale). Both are emulated on Hopper: GEMMs read the decoded copies (note
// "Emulated micro-scaling" in docs/architecture.md).
enum class RecipeKind {
  BF16,
  DelayedScaling,
  CurrentScaling,
  Float8BlockScaling,
  Mxfp8BlockScaling,
  Nvfp4BlockScaling
};
// HYBRID: E4M3 forward, E5M2 gradients. E4M3: E4M3 everywhere (TE's Format enum).
enum class Fp8Format { Hybrid, E4M3 };
enum class AmaxCompute { Max, MostRecent };

struct Recipe {
  std::string name;  // as declared ("fp8"); empty for the implicit bf16 recipe
  SourceLoc loc;
  RecipeKind kind = RecipeKind::BF16;
  Fp8Format format = Fp8Format::Hybrid;
  // Delayed scaling (TE defaults).
  int amax_history = 1024;
  AmaxCompute amax_compute = AmaxCompute::Max;
  int margin = 0;
  // Current scaling and block scaling.
  double amax_epsilon = 0.0;
  bool power_of_2_scale = false;  // block scaling: true unless given
  // Block scaling: the dimensions of each tensor's blocks, 1 (1 x 128) or 2 (128 x 128), for the
  // inputs (x), weights (w) and output gradients (grad) of linears (TE's x_block_scaling_dim ...).
  int x_block = 1;
  int w_block = 2;
  int grad_block = 1;
  // NVFP4: the random Hadamard transform of the wgrad copies, stochastic rounding of gradients
  // (its Philox seed), 16 x 16 weight blocks.
  bool rht = true;
  bool stochastic_rounding = true;
  bool w_2d = true;
  uint32_t seed = 0;

  // Whether GEMM operands are quantized (FP8, or MXFP8 / NVFP4 emulated).
  bool is_fp8() const { return kind != RecipeKind::BF16; }
  bool micro_scaled() const {
    return kind == RecipeKind::Mxfp8BlockScaling || kind == RecipeKind::Nvfp4BlockScaling;
  }
};

// The block length a micro-scaled recipe needs every blocked dimension to be a multiple of: 32
// (MXFP8), 16 (NVFP4); 0 for the other recipes.
int micro_block_multiple(const Recipe& r);

std::string_view recipe_kind_name(RecipeKind k);    // bf16 | delayed_scaling | current_scaling
std::string_view fp8_format_name(Fp8Format f);      // hybrid | e4m3
std::string_view amax_compute_name(AmaxCompute a);  // max | most_recent
// One line, e.g. "delayed_scaling(format = hybrid, amax_history = 1024, amax_compute = max, margin
// = 0)".
std::string recipe_string(const Recipe& r);

}  // namespace opfuse::ir
