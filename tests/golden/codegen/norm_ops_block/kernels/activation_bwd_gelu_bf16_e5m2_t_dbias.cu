// opfuse generated kernel activation_bwd_gelu_bf16_e5m2_t_dbias
// Written by fusec from norm_ops_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence norm_mlp, backward, fused dact_cast:
//     activation_backward "gelu_0" (norm_ops_block.fuse:20)
//     bias_grad "fc1" (norm_ops_block.fuse:19)
//     cast_fp8 "fc1.grad_output" (norm_ops_block.fuse:19)
//     gelu backward bf16 -> e5m2 + transposed copy + dbias partial sums
//     quantizers: fc1.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::activation_bwd<opfuse::pointwise_gelu, __nv_bfloat16, __nv_fp8_e5m2, true, true>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "activation.cuh"

// The pointwise op gelu (compiler/ir/pointwise_defs.cpp), generated from its definition.
#include "common/scalar_math.cuh"
namespace opfuse {
struct pointwise_gelu {
  static constexpr int kInputs = 1;
  __device__ __forceinline__ static float forward(const float (&in)[1]) {
    float value;
    const float t0 = in[0];
    const float t1 = t0 * t0;
    const float t2 = 0.044715f;
    const float t3 = t2 * t1;
    const float t4 = 1.0f;
    const float t5 = t4 + t3;
    const float t6 = 0.7978846f;
    const float t7 = t6 * t0;
    const float t8 = t7 * t5;
    const float t9 = 2.0f;
    const float t10 = t9 * t8;
    const float t11 = opfuse::sigmoid(t10);
    const float t12 = t0 * t11;
    value = t12;
    return value;
  }
  __device__ __forceinline__ static void backward(const float (&in)[1], float dy,
                                                  float (&grad)[1]) {
    const float t0 = in[0];
    const float t1 = t0 * t0;
    const float t2 = 0.044715f;
    const float t3 = t2 * t1;
    const float t4 = 1.0f;
    const float t5 = t4 + t3;
    const float t6 = 0.7978846f;
    const float t7 = t6 * t0;
    const float t8 = t7 * t5;
    const float t9 = 2.0f;
    const float t10 = t9 * t8;
    const float t11 = opfuse::sigmoid(t10);
    const float t13 = 0.134145f;
    const float t14 = t13 * t1;
    const float t15 = t4 + t14;
    const float t16 = t6 * t15;
    const float t17 = t4 - t11;
    const float t18 = t9 * t0;
    const float t19 = t18 * t11;
    const float t20 = t19 * t17;
    const float t21 = t20 * t16;
    const float t22 = t11 + t21;
    const float t23 = dy;
    const float t25 = t22 * t23;
    grad[0] = t25;
  }
};
}  // namespace opfuse

template __global__ void opfuse::activation_bwd<opfuse::pointwise_gelu, __nv_bfloat16, __nv_fp8_e5m2, true, true>(opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>);
