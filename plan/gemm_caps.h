// Note "GEMM capabilities": one table of what cuBLASLt runs on each architecture opfuse targets,
// read by the IR builder's checks (feature counts of FP8 linears), codegen (the layout of
// column-wise FP8 copies, which scale modes a recipe can use) and the executor (the bound sizes of
// every GEMM), so a rule such as "FP8 GEMM dimensions are multiples of 16" lives here only.
// Sources: cuBLASLt 13's documentation as summarized in docs/architecture.md ("GEMM
// capabilities").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "plan/enums.h"
#include "plan/quant_spec.h"

namespace opfuse::plan {

// The architecture the compiler targets when none is given (`fusec build --arch`).
inline constexpr std::string_view kDefaultArch = "sm_90a";

struct GemmCaps {
  std::string_view arch;             // the table's name: "sm_89", "sm_90", "sm_100", "sm_120"
  bool fp8 = false;                  // FP8 (E4M3 / mixed E4M3-E5M2) tensor-core GEMMs
  bool fp8_tn_only = false;          // FP8 operands need K contiguous (cuBLASLt "TN")
  int fp8_dim_multiple = 16;         // every m, n, k of an FP8 GEMM
  int bf16_dim_multiple = 8;         // 16-bit GEMMs: 16-byte leading dimensions
  int pointer_alignment_bytes = 16;  // A, B, C, D, bias, aux and scale pointers
  // Block-scale modes: VEC128_32F (1x128 FP32 scales), BLK128x128_32F, and whether both operands
  // may be 2-D; VEC32_UE8M0 (MXFP8); VEC16_UE4M3 (NVFP4).
  bool block_1d = false;
  bool block_2d = false;
  bool block_2d_x_2d = false;
  bool mxfp8 = false;
  bool nvfp4 = false;
};

// The table for `arch` ("sm_90a" and "sm_90" share one); nullptr for an architecture the table
// does not list.
const GemmCaps* find_gemm_caps(std::string_view arch);
// As find_gemm_caps, but an unknown arch gets the most restrictive FP8 rules (sm_89's) so that
// checks made for it never accept what a listed arch would refuse.
const GemmCaps& gemm_caps(std::string_view arch);
const std::vector<GemmCaps>& all_gemm_caps();

// The multiple every m, n and k of a GEMM must be: FP8 or 16-bit operands.
int gemm_dim_multiple(const GemmCaps& caps, bool fp8);
// How a column-wise FP8 copy is stored for `caps`: transposed where GEMMs are TN-only.
CopyLayout columnwise_layout(const GemmCaps& caps);
// Whether a quantizer with `spec` can feed a real FP8 GEMM on `caps` (per-tensor everywhere FP8
// exists; block and micro-scaled specs by their scale modes). Empty when it can, else why not.
std::string gemm_support_problem(const GemmCaps& caps, const QuantSpec& spec);

}  // namespace opfuse::plan
