#include "plan/gemm_caps.h"

#include <fmt/format.h>

namespace opfuse::plan {

namespace {

std::vector<GemmCaps> make_table() {
  GemmCaps ada{"sm_89"};
  ada.fp8 = true;
  ada.fp8_tn_only = true;
  // Hopper: block scaling from cuBLAS 12.9 (not 2-D x 2-D); no MXFP8 / NVFP4 modes.
  GemmCaps hopper{"sm_90"};
  hopper.fp8 = true;
  hopper.fp8_tn_only = true;
  hopper.block_1d = true;
  hopper.block_2d = true;
  // Blackwell data-center parts: every FP8 layout, the micro-scaled modes; the 1x128 / 128x128
  // modes are compute capability 9.0 only.
  GemmCaps blackwell{"sm_100"};
  blackwell.fp8 = true;
  blackwell.mxfp8 = true;
  blackwell.nvfp4 = true;
  GemmCaps blackwell_client{"sm_120"};
  blackwell_client.fp8 = true;
  blackwell_client.mxfp8 = true;
  blackwell_client.nvfp4 = true;
  return {ada, hopper, blackwell, blackwell_client};
}

// "sm_90a" -> "sm_90", "compute_90" -> "sm_90": the family an arch string names.
std::string family_of(std::string_view arch) {
  std::string s(arch);
  if (s.starts_with("compute_")) s = "sm_" + s.substr(8);
  while (!s.empty() && (s.back() == 'a' || s.back() == 'f')) s.pop_back();
  return s;
}

}  // namespace

const std::vector<GemmCaps>& all_gemm_caps() {
  static const std::vector<GemmCaps> table = make_table();
  return table;
}

const GemmCaps* find_gemm_caps(std::string_view arch) {
  const std::string family = family_of(arch);
  for (const GemmCaps& caps : all_gemm_caps())
    if (caps.arch == family) return &caps;
  return nullptr;
}

const GemmCaps& gemm_caps(std::string_view arch) {
  const GemmCaps* caps = find_gemm_caps(arch);
  return caps != nullptr ? *caps : all_gemm_caps().front();
}

int gemm_dim_multiple(const GemmCaps& caps, bool fp8) {
  return fp8 ? caps.fp8_dim_multiple : caps.bf16_dim_multiple;
}

CopyLayout columnwise_layout(const GemmCaps& caps) {
  return caps.fp8_tn_only ? CopyLayout::Transposed : CopyLayout::AsIs;
}

std::string gemm_support_problem(const GemmCaps& caps, const QuantSpec& spec) {
  if (!caps.fp8) return fmt::format("{} has no FP8 GEMMs", caps.arch);
  switch (spec.scaling) {
    case ScalingKind::Delayed:
    case ScalingKind::Current:
      return {};
    case ScalingKind::Block1D:
      if (caps.block_1d) return {};
      return fmt::format("cuBLASLt on {} has no 1x128 block-scale mode (VEC128_32F)", caps.arch);
    case ScalingKind::Block2D:
      if (caps.block_2d) return {};
      return fmt::format("cuBLASLt on {} has no 128x128 block-scale mode (BLK128x128_32F)",
                         caps.arch);
    case ScalingKind::MicroScaled:
      if (spec.scale_dtype == ScaleDType::E8M0 ? caps.mxfp8 : caps.nvfp4) return {};
      return fmt::format("cuBLASLt on {} has no micro-scaled mode for {} scales", caps.arch,
                         name(spec.scale_dtype));
  }
  return "unknown scaling";
}

}  // namespace opfuse::plan
