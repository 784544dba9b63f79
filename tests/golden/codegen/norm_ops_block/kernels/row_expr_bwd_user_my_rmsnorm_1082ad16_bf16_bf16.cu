// opfuse generated kernel row_expr_bwd_user_my_rmsnorm_1082ad16_bf16_bf16
// Written by fusec from norm_ops_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence norm_mlp, backward:
//     user_norm_backward "norm1" (norm_ops_block.fuse:18)
//     user_norm_backward backward (row program) bf16 -> bf16 + parameter partial sums
//
// Name expression (NVRTC):
//   opfuse::row_expr_bwd<opfuse::row_user_10_my_rmsnorm_m_Lbv_v0_v2_mul1x0_mul0x0_v4_c1em06_add4x5_rsqrt6_mul2x7_v1_v5_v3_div10x11_mul7x7_mul7x13_cm0p5_mul15x14_mul2x16_mul17x9_mul1x7_mul19x9_add0x0_mul21x12_add20x22_mul0x7_mul24x9_out3x8x3x18x23x25, __nv_bfloat16, __nv_bfloat16>
// Parameter, by value (templates/README.md):
//   opfuse::RowExprBwdParams<__nv_bfloat16, __nv_bfloat16>
#include "row_expr.cuh"

// The norm-like op my_rmsnorm (user-defined with last-dimension reductions, docs/language.md
// "User-defined ops"): its forward and backward row programs (compiler/ir/row_expr.h)
// for templates/row_expr.cuh, generated from its definition.
#include "common/scalar_math.cuh"
#include "common/types.cuh"
namespace opfuse {
struct row_user_10_my_rmsnorm_m_Lbv_v0_v2_mul1x0_mul0x0_v4_c1em06_add4x5_rsqrt6_mul2x7_v1_v5_v3_div10x11_mul7x7_mul7x13_cm0p5_mul15x14_mul2x16_mul17x9_mul1x7_mul19x9_add0x0_mul21x12_add20x22_mul0x7_mul24x9_out3x8x3x18x23x25 {
  static constexpr int kParams = 1;
  static constexpr int kParamSlots = 1;  // kParams, at least 1 (array sizes)
  static constexpr int kForwardStages = 1;
  static constexpr int kBackwardStages = 2;
  __device__ __forceinline__ static int forward_kind(int k) {
    constexpr int kinds[] = {kRowMean};
    return kinds[k];
  }
  __device__ __forceinline__ static int backward_kind(int k) {
    constexpr int kinds[] = {kRowMean, kRowSum};
    return kinds[k];
  }
  __device__ __forceinline__ static float param(const void* const (&learned)[kMaxLearnedParams],
                                                int k, int col) {
    if (k == 0) return to_float(static_cast<const __nv_bfloat16*>(learned[0])[col]);
    return 0.0f;
  }
  __device__ __forceinline__ static float forward_stage(int k, float x, const float (&p)[kParamSlots],
                                                        float n, const float* s) {
    float r = 0.0f;
    switch (k) {
      case 0: {
        const float t0 = x;
        const float t3 = t0 * t0;
        r = t3;
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
    const float t1 = p[0];
    const float t2 = t1 * t0;
    const float t4 = s[0];
    const float t5 = 1e-06f;
    const float t6 = t4 + t5;
    const float t7 = rsqrtf(t6);
    const float t8 = t2 * t7;
    value = t8;
    return value;
  }
  __device__ __forceinline__ static float backward_stage(int k, float x, float dy,
                                                         const float (&p)[kParamSlots], float n,
                                                         const float* s) {
    float r = 0.0f;
    switch (k) {
      case 0: {
        const float t0 = x;
        const float t3 = t0 * t0;
        r = t3;
        break;
      }
      case 1: {
        const float t0 = x;
        const float t1 = p[0];
        const float t2 = t1 * t0;
        const float t4 = s[0];
        const float t5 = 1e-06f;
        const float t6 = t4 + t5;
        const float t7 = rsqrtf(t6);
        const float t9 = dy;
        const float t13 = t7 * t7;
        const float t14 = t7 * t13;
        const float t15 = -0.5f;
        const float t16 = t15 * t14;
        const float t17 = t2 * t16;
        const float t18 = t17 * t9;
        r = t18;
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
    const float t1 = p[0];
    const float t4 = s[0];
    const float t5 = 1e-06f;
    const float t6 = t4 + t5;
    const float t7 = rsqrtf(t6);
    const float t9 = dy;
    const float t10 = s[1];
    const float t11 = n;
    const float t12 = __fdividef(t10, t11);
    const float t19 = t1 * t7;
    const float t20 = t19 * t9;
    const float t21 = t0 + t0;
    const float t22 = t21 * t12;
    const float t23 = t20 + t22;
    const float t24 = t0 * t7;
    const float t25 = t24 * t9;
    dx = t23;
    dparam[0] = t25;
  }
};
}  // namespace opfuse

template __global__ void opfuse::row_expr_bwd<opfuse::row_user_10_my_rmsnorm_m_Lbv_v0_v2_mul1x0_mul0x0_v4_c1em06_add4x5_rsqrt6_mul2x7_v1_v5_v3_div10x11_mul7x7_mul7x13_cm0p5_mul15x14_mul2x16_mul17x9_mul1x7_mul19x9_add0x0_mul21x12_add20x22_mul0x7_mul24x9_out3x8x3x18x23x25, __nv_bfloat16, __nv_bfloat16>(opfuse::RowExprBwdParams<__nv_bfloat16, __nv_bfloat16>);
