// opfuse generated kernel activation_fwd_gelu_bf16_e4m3
// Written by fusec from gelu_bias_mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gpt_mlp, forward, fused activation_cast:
//     gelu "gelu_0" (gelu_bias_mlp.fuse:16)
//     cast_fp8 "c_proj.input" (gelu_bias_mlp.fuse:17)
//     gelu bf16 -> e4m3 (inference: without the transposed copy)
//     quantizers: c_proj.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::activation_fwd<opfuse::Gelu, __nv_bfloat16, __nv_fp8_e4m3, false>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "activation.cuh"

template __global__ void opfuse::activation_fwd<opfuse::Gelu, __nv_bfloat16, __nv_fp8_e4m3, false>(opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
