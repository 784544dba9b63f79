// opfuse generated kernel gated_activation_fwd_user_geglu_tanh_74f1a390_bf16_e4m3_t
// Written by fusec from gemma_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gemma_mlp, forward, fused activation_cast:
//     geglu_tanh "geglu_tanh_0" (gemma_block.fuse:22)
//     cast_fp8 "down.input" (gemma_block.fuse:23)
//     geglu_tanh bf16 -> e4m3 + transposed copy
//     quantizers: down.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::gated_activation_fwd<opfuse::pointwise_user_10_geglu_tanh_v0_v1_c0p044715_mul2x0_mul3x0_mul4x0_add0x5_c0p7978845608028654_mul7x6_tanh8_c1_add10x9_c0p5_mul12x0_mul13x11_c0p134145_mul15x0_mul16x0_add10x17_mul7x18_mul9x9_sub10x20_mul13x21_mul22x19_mul12x11_add24x23_mul14x1_v2_mul25x1_mul28x27_mul14x27_mul0x0_mul2x31_add10x32_mul7x0_mul34x33_c2_mul36x35_sig37_mul0x38_mul15x31_add10x40_mul7x41_sub10x38_mul36x0_mul44x38_mul45x43_mul46x42_add38x47_mul39x1_mul48x1_mul50x27_mul39x27_out26x29x30x49x51x52, __nv_bfloat16, __nv_fp8_e4m3, true>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "activation.cuh"

// The pointwise op geglu_tanh = x * sigmoid(2 * 0.7978845608028654 * x * (1 + 0.044715 * x * x)) * x1 (user-defined, docs/language.md "User-defined ops"), generated from its definition.
#include "common/scalar_math.cuh"
namespace opfuse {
struct pointwise_user_10_geglu_tanh_v0_v1_c0p044715_mul2x0_mul3x0_mul4x0_add0x5_c0p7978845608028654_mul7x6_tanh8_c1_add10x9_c0p5_mul12x0_mul13x11_c0p134145_mul15x0_mul16x0_add10x17_mul7x18_mul9x9_sub10x20_mul13x21_mul22x19_mul12x11_add24x23_mul14x1_v2_mul25x1_mul28x27_mul14x27_mul0x0_mul2x31_add10x32_mul7x0_mul34x33_c2_mul36x35_sig37_mul0x38_mul15x31_add10x40_mul7x41_sub10x38_mul36x0_mul44x38_mul45x43_mul46x42_add38x47_mul39x1_mul48x1_mul50x27_mul39x27_out26x29x30x49x51x52 {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static float forward(const float (&in)[2]) {
    float value;
    const float t0 = in[0];
    const float t1 = in[1];
    const float t2 = 0.044715f;
    const float t3 = 0.7978846f;
    const float t4 = 1.0f;
    const float t7 = t0 * t0;
    const float t8 = t2 * t7;
    const float t9 = t4 + t8;
    const float t10 = t3 * t0;
    const float t11 = t10 * t9;
    const float t12 = 2.0f;
    const float t13 = t12 * t11;
    const float t14 = opfuse::sigmoid(t13);
    const float t15 = t0 * t14;
    const float t25 = t15 * t1;
    value = t25;
    return value;
  }
  __device__ __forceinline__ static void backward(const float (&in)[2], float dy,
                                                  float (&grad)[2]) {
    const float t0 = in[0];
    const float t1 = in[1];
    const float t2 = 0.044715f;
    const float t3 = 0.7978846f;
    const float t4 = 1.0f;
    const float t5 = 0.134145f;
    const float t6 = dy;
    const float t7 = t0 * t0;
    const float t8 = t2 * t7;
    const float t9 = t4 + t8;
    const float t10 = t3 * t0;
    const float t11 = t10 * t9;
    const float t12 = 2.0f;
    const float t13 = t12 * t11;
    const float t14 = opfuse::sigmoid(t13);
    const float t15 = t0 * t14;
    const float t16 = t5 * t7;
    const float t17 = t4 + t16;
    const float t18 = t3 * t17;
    const float t19 = t4 - t14;
    const float t20 = t12 * t0;
    const float t21 = t20 * t14;
    const float t22 = t21 * t19;
    const float t23 = t22 * t18;
    const float t24 = t14 + t23;
    const float t26 = t24 * t1;
    const float t27 = t26 * t6;
    const float t28 = t15 * t6;
    grad[0] = t27;
    grad[1] = t28;
  }
};
}  // namespace opfuse

template __global__ void opfuse::gated_activation_fwd<opfuse::pointwise_user_10_geglu_tanh_v0_v1_c0p044715_mul2x0_mul3x0_mul4x0_add0x5_c0p7978845608028654_mul7x6_tanh8_c1_add10x9_c0p5_mul12x0_mul13x11_c0p134145_mul15x0_mul16x0_add10x17_mul7x18_mul9x9_sub10x20_mul13x21_mul22x19_mul12x11_add24x23_mul14x1_v2_mul25x1_mul28x27_mul14x27_mul0x0_mul2x31_add10x32_mul7x0_mul34x33_c2_mul36x35_sig37_mul0x38_mul15x31_add10x40_mul7x41_sub10x38_mul36x0_mul44x38_mul45x43_mul46x42_add38x47_mul39x1_mul48x1_mul50x27_mul39x27_out26x29x30x49x51x52, __nv_bfloat16, __nv_fp8_e4m3, true>(opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
