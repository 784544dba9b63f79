// opfuse generated kernel gated_activation_bwd_silu_bf16_bf16
// Written by fusec from rmsnorm_swiglu.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence llama_mlp, backward:
//     gated_activation_backward "swiglu_0" (rmsnorm_swiglu.fuse:16)
//     swiglu backward bf16 -> bf16
//
// Name expression (NVRTC):
//   opfuse::gated_activation_bwd<opfuse::Silu, __nv_bfloat16, __nv_bfloat16, false, false>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationBwdParams<__nv_bfloat16, __nv_bfloat16>
#include "activation.cuh"

template __global__ void opfuse::gated_activation_bwd<opfuse::Silu, __nv_bfloat16, __nv_bfloat16, false, false>(opfuse::ActivationBwdParams<__nv_bfloat16, __nv_bfloat16>);
