// opfuse generated kernel row_expr_bwd_user_l2_normalization_163de6c2_bf16_bf16
// Written by fusec from norm_ops_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence norm_mlp, backward:
//     user_norm_backward "l2_normalization_0" (norm_ops_block.fuse:22)
//     user_norm_backward backward (row program) bf16 -> bf16
//
// Name expression (NVRTC):
//   opfuse::row_expr_bwd<opfuse::row_user_16_l2_normalization_s_L_v0_mul0x0_v3_c1em06_add2x3_rsqrt4_mul0x5_v1_v4_mul5x5_mul5x9_cm0p5_mul11x10_mul0x12_mul13x7_mul5x7_add0x0_mul16x8_add15x17_out1x6x1x14x18, __nv_bfloat16, __nv_bfloat16>
// Parameter, by value (templates/README.md):
//   opfuse::RowExprBwdParams<__nv_bfloat16, __nv_bfloat16>
#include "row_expr.cuh"

// The norm-like op l2_normalization (user-defined with last-dimension reductions, docs/language.md
// "User-defined ops"): its forward and backward row programs (compiler/ir/row_expr.h)
// for templates/row_expr.cuh, generated from its definition.
#include "common/scalar_math.cuh"
#include "common/types.cuh"
namespace opfuse {
struct row_user_16_l2_normalization_s_L_v0_mul0x0_v3_c1em06_add2x3_rsqrt4_mul0x5_v1_v4_mul5x5_mul5x9_cm0p5_mul11x10_mul0x12_mul13x7_mul5x7_add0x0_mul16x8_add15x17_out1x6x1x14x18 {
  static constexpr int kParams = 0;
  static constexpr int kParamSlots = 1;  // kParams, at least 1 (array sizes)
  static constexpr int kForwardStages = 1;
  static constexpr int kBackwardStages = 2;
  __device__ __forceinline__ static int forward_kind(int k) {
    constexpr int kinds[] = {kRowSum};
    return kinds[k];
  }
  __device__ __forceinline__ static int backward_kind(int k) {
    constexpr int kinds[] = {kRowSum, kRowSum};
    return kinds[k];
  }
  __device__ __forceinline__ static float param(const void* const (&learned)[kMaxLearnedParams],
                                                int k, int col) {
    return 0.0f;
  }
  __device__ __forceinline__ static float forward_stage(int k, float x, const float (&p)[kParamSlots],
                                                        float n, const float* s) {
    float r = 0.0f;
    switch (k) {
      case 0: {
        const float t0 = x;
        const float t1 = t0 * t0;
        r = t1;
        break;
      }
      default:
        break;
    }
    return r;
  }
  __device__ __forceinline__ static float forward_value(float x, const float (&p)[kParamSlots],
                                                        float n, const float* s) {
    float value;
    const float t0 = x;
    const float t2 = s[0];
    const float t3 = 1e-06f;
    const float t4 = t2 + t3;
    const float t5 = rsqrtf(t4);
    const float t6 = t0 * t5;
    value = t6;
    return value;
  }
  __device__ __forceinline__ static float backward_stage(int k, float x, float dy,
                                                         const float (&p)[kParamSlots], float n,
                                                         const float* s) {
    float r = 0.0f;
    switch (k) {
      case 0: {
        const float t0 = x;
        const float t1 = t0 * t0;
        r = t1;
        break;
      }
      case 1: {
        const float t0 = x;
        const float t2 = s[0];
        const float t3 = 1e-06f;
        const float t4 = t2 + t3;
        const float t5 = rsqrtf(t4);
        const float t7 = dy;
        const float t9 = t5 * t5;
        const float t10 = t5 * t9;
        const float t11 = -0.5f;
        const float t12 = t11 * t10;
        const float t13 = t0 * t12;
        const float t14 = t13 * t7;
        r = t14;
        break;
      }
      default:
        break;
    }
    return r;
  }
  __device__ __forceinline__ static void backward_outputs(float x, float dy,
                                                          const float (&p)[kParamSlots], float n,
                                                          const float* s, float& dx,
                                                          float (&dparam)[kParamSlots]) {
    const float t0 = x;
    const float t2 = s[0];
    const float t3 = 1e-06f;
    const float t4 = t2 + t3;
    const float t5 = rsqrtf(t4);
    const float t7 = dy;
    const float t8 = s[1];
    const float t15 = t5 * t7;
    const float t16 = t0 + t0;
    const float t17 = t16 * t8;
    const float t18 = t15 + t17;
    dx = t18;
  }
};
}  // namespace opfuse

template __global__ void opfuse::row_expr_bwd<opfuse::row_user_16_l2_normalization_s_L_v0_mul0x0_v3_c1em06_add2x3_rsqrt4_mul0x5_v1_v4_mul5x5_mul5x9_cm0p5_mul11x10_mul0x12_mul13x7_mul5x7_add0x0_mul16x8_add15x17_out1x6x1x14x18, __nv_bfloat16, __nv_bfloat16>(opfuse::RowExprBwdParams<__nv_bfloat16, __nv_bfloat16>);
