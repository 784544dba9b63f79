// opfuse generated kernel layernorm_bwd_bf16_4096
// Written by fusec from mlp_tp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, backward:
//     layernorm_backward "layernorm_0" (mlp_tp.fuse:14)
//     layernorm_backward bf16 + dgamma/dbeta partial sums
//
// Name expression (NVRTC):
//   opfuse::layernorm_bwd<__nv_bfloat16, 4096, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormBwdParams<__nv_bfloat16>
#include "norm_backward.cuh"

template __global__ void opfuse::layernorm_bwd<__nv_bfloat16, 4096, false>(opfuse::NormBwdParams<__nv_bfloat16>);
