// opfuse generated kernel gated_activation_fwd_silu_bf16_bf16
// Written by fusec from mlp_residual.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence fc1, forward:
//     swiglu "swiglu_0" (mlp_residual.fuse:16)
//     swiglu bf16 -> bf16
//
// Name expression (NVRTC):
//   opfuse::gated_activation_fwd<opfuse::Silu, __nv_bfloat16, __nv_bfloat16, false>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationFwdParams<__nv_bfloat16, __nv_bfloat16>
#include "activation.cuh"

template __global__ void opfuse::gated_activation_fwd<opfuse::Silu, __nv_bfloat16, __nv_bfloat16, false>(opfuse::ActivationFwdParams<__nv_bfloat16, __nv_bfloat16>);
