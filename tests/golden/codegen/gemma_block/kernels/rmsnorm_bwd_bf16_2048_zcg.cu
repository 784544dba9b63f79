// opfuse generated kernel rmsnorm_bwd_bf16_2048_zcg
// Written by fusec from gemma_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gemma_mlp, backward:
//     rmsnorm_backward "rmsnorm_0" (gemma_block.fuse:20)
//     rmsnorm_backward bf16 + dgamma partial sums
//
// Name expression (NVRTC):
//   opfuse::rmsnorm_bwd<__nv_bfloat16, 2048, true>
// Parameter, by value (templates/README.md):
//   opfuse::NormBwdParams<__nv_bfloat16>
#include "norm_backward.cuh"

template __global__ void opfuse::rmsnorm_bwd<__nv_bfloat16, 2048, true>(opfuse::NormBwdParams<__nv_bfloat16>);
