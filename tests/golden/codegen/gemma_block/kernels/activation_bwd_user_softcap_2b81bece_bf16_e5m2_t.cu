// opfuse generated kernel activation_bwd_user_softcap_2b81bece_bf16_e5m2_t
// Written by fusec from gemma_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gemma_mlp, backward, fused dact_cast:
//     activation_backward "softcap_0" (gemma_block.fuse:24)
//     cast_fp8 "down.grad_output" (gemma_block.fuse:23)
//     softcap backward bf16 -> e5m2 + transposed copy
//     quantizers: down.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::activation_bwd<opfuse::pointwise_user_7_softcap_v0_c50_div0x1_tanh2_mul1x3_v1_c1_mul3x3_sub6x7_mul5x8_out4x9x4x9, __nv_bfloat16, __nv_fp8_e5m2, true, false>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "activation.cuh"

// The pointwise op softcap = 50 * tanh(x / 50) (user-defined, docs/language.md "User-defined ops"), generated from its definition.
#include "common/scalar_math.cuh"
namespace opfuse {
struct pointwise_user_7_softcap_v0_c50_div0x1_tanh2_mul1x3_v1_c1_mul3x3_sub6x7_mul5x8_out4x9x4x9 {
  static constexpr int kInputs = 1;
  __device__ __forceinline__ static float forward(const float (&in)[1]) {
    float value;
    const float t0 = in[0];
    const float t1 = 50.0f;
    const float t2 = __fdividef(t0, t1);
    const float t3 = tanhf(t2);
    const float t4 = t1 * t3;
    value = t4;
    return value;
  }
  __device__ __forceinline__ static void backward(const float (&in)[1], float dy,
                                                  float (&grad)[1]) {
    const float t0 = in[0];
    const float t1 = 50.0f;
    const float t2 = __fdividef(t0, t1);
    const float t3 = tanhf(t2);
    const float t5 = dy;
    const float t6 = 1.0f;
    const float t7 = t3 * t3;
    const float t8 = t6 - t7;
    const float t9 = t5 * t8;
    grad[0] = t9;
  }
};
}  // namespace opfuse

template __global__ void opfuse::activation_bwd<opfuse::pointwise_user_7_softcap_v0_c50_div0x1_tanh2_mul1x3_v1_c1_mul3x3_sub6x7_mul5x8_out4x9x4x9, __nv_bfloat16, __nv_fp8_e5m2, true, false>(opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>);
