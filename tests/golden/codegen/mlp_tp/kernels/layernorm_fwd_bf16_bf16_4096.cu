// opfuse generated kernel layernorm_fwd_bf16_bf16_4096
// Written by fusec from mlp_tp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, forward:
//     layernorm "layernorm_0" (mlp_tp.fuse:14)
//     layernorm bf16 -> bf16
//
// Name expression (NVRTC):
//   opfuse::layernorm_fwd<__nv_bfloat16, __nv_bfloat16, 4096, false, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormFwdParams<__nv_bfloat16, __nv_bfloat16>
#include "norm.cuh"

template __global__ void opfuse::layernorm_fwd<__nv_bfloat16, __nv_bfloat16, 4096, false, false>(opfuse::NormFwdParams<__nv_bfloat16, __nv_bfloat16>);
