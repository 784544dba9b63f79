// opfuse generated kernel layernorm_bwd_bf16_1024
// Written by fusec from gelu_bias_mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gpt_mlp, backward:
//     layernorm_backward "ln_2" (gelu_bias_mlp.fuse:14)
//     layernorm_backward bf16 + dgamma/dbeta partial sums
//
// Name expression (NVRTC):
//   opfuse::layernorm_bwd<__nv_bfloat16, 1024, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormBwdParams<__nv_bfloat16>
#include "norm_backward.cuh"

template __global__ void opfuse::layernorm_bwd<__nv_bfloat16, 1024, false>(opfuse::NormBwdParams<__nv_bfloat16>);
