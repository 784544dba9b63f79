// opfuse generated kernel rmsnorm_bwd_bf16_4096
// Written by fusec from rmsnorm_swiglu.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence llama_mlp, backward:
//     rmsnorm_backward "post_attention_layernorm" (rmsnorm_swiglu.fuse:14)
//     rmsnorm_backward bf16 + dgamma partial sums
//
// Name expression (NVRTC):
//   opfuse::rmsnorm_bwd<__nv_bfloat16, 4096, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormBwdParams<__nv_bfloat16>
#include "norm_backward.cuh"

template __global__ void opfuse::rmsnorm_bwd<__nv_bfloat16, 4096, false>(opfuse::NormBwdParams<__nv_bfloat16>);
