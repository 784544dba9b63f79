// The scale of one float8_block_scaling block from its amax (TE's compute_scale_from_amax), shared
// by the block casts (block_cast.cuh, block_activation.cuh) and the norm that writes its output's
// 1 x 128 row-wise copy (norm.cuh). The CPU oracle, bit for bit, is
// runtime/cpu/block_quantization.h.
#ifndef OPFUSE_TEMPLATES_COMMON_BLOCK_SCALE_CUH_
#define OPFUSE_TEMPLATES_COMMON_BLOCK_SCALE_CUH_

#include "types.cuh"

namespace opfuse {
namespace detail {

// The scale an infinite quotient fp8_max / amax becomes: the input dtype's largest finite value
// (TE's block quantizers pass it as value_for_inf).
template <typename Input>
struct BlockScaleValueForInf;
template <>
struct BlockScaleValueForInf<__nv_bfloat16> {
  static constexpr float kValue = 0x1.fep+127f;  // bf16 0x7F7F = 3.38953139e38
};
template <>
struct BlockScaleValueForInf<__half> {
  static constexpr float kValue = 65504.0f;
};
template <>
struct BlockScaleValueForInf<float> {
  static constexpr float kValue = kFloatMax;
};

// The scale of one block from its amax (TE's compute_scale_from_amax; cpu::block_scale): amax
// raised to epsilon; Inf, NaN or 0 gives 1; else fp8_max / amax (IEEE division), an infinite
// quotient becoming value_for_inf; with power_of_2 the mantissa bits cleared (rounded down).
__device__ __forceinline__ float block_scale(float amax, float fp8_max, float epsilon,
                                             bool power_of_2, float value_for_inf) {
  if (amax < epsilon) amax = epsilon;
  if (!is_finite_float(amax) || amax == 0.0f) return 1.0f;
  float scale = __fdiv_rn(fp8_max, amax);
  if (is_inf_float(scale)) scale = value_for_inf;
  if (power_of_2) scale = __uint_as_float(__float_as_uint(scale) & 0xFF800000u);
  return scale;
}

}  // namespace detail
}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_BLOCK_SCALE_CUH_
