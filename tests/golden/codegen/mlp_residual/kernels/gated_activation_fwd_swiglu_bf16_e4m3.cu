// opfuse generated kernel gated_activation_fwd_swiglu_bf16_e4m3
// Written by fusec from mlp_residual.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence fc1, forward, fused activation_cast:
//     swiglu "swiglu_0" (mlp_residual.fuse:22)
//     cast_fp8 "h" (mlp_residual.fuse:23)
//     swiglu bf16 -> e4m3 (inference: without the transposed copy)
//     quantizers: h (e4m3)
//
// Name expression (NVRTC):
//   opfuse::gated_activation_fwd<opfuse::pointwise_swiglu, __nv_bfloat16, __nv_fp8_e4m3, false>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "activation.cuh"

// The pointwise op swiglu (compiler/ir/pointwise_defs.cpp), generated from its definition.
#include "common/scalar_math.cuh"
namespace opfuse {
struct pointwise_swiglu {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static float forward(const float (&in)[2]) {
    float value;
    const float t0 = in[0];
    const float t1 = in[1];
    const float t2 = opfuse::sigmoid(t0);
    const float t3 = t0 * t2;
    const float t9 = t3 * t1;
    value = t9;
    return value;
  }
  __device__ __forceinline__ static void backward(const float (&in)[2], float dy,
                                                  float (&grad)[2]) {
    const float t0 = in[0];
    const float t1 = in[1];
    const float t2 = opfuse::sigmoid(t0);
    const float t3 = t0 * t2;
    const float t4 = 1.0f;
    const float t5 = t4 - t2;
    const float t6 = t0 * t5;
    const float t7 = t4 + t6;
    const float t8 = t2 * t7;
    const float t10 = dy;
    const float t12 = t8 * t1;
    const float t13 = t12 * t10;
    const float t14 = t3 * t10;
    grad[0] = t13;
    grad[1] = t14;
  }
};
}  // namespace opfuse

template __global__ void opfuse::gated_activation_fwd<opfuse::pointwise_swiglu, __nv_bfloat16, __nv_fp8_e4m3, false>(opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
