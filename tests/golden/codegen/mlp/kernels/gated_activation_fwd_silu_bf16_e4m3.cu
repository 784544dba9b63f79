// opfuse generated kernel gated_activation_fwd_silu_bf16_e4m3
// Written by fusec from mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, forward, fused activation_cast:
//     swiglu "swiglu_0" (mlp.fuse:16)
//     cast_fp8 "fc2.input" (mlp.fuse:17)
//     swiglu bf16 -> e4m3 (inference: without the transposed copy)
//     quantizers: fc2.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::gated_activation_fwd<opfuse::Silu, __nv_bfloat16, __nv_fp8_e4m3, false>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "activation.cuh"

template __global__ void opfuse::gated_activation_fwd<opfuse::Silu, __nv_bfloat16, __nv_fp8_e4m3, false>(opfuse::ActivationFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
