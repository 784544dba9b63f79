// opfuse generated kernel rmsnorm_fwd_bf16_bf16_4096
// Written by fusec from rmsnorm_swiglu.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence llama_mlp, forward:
//     rmsnorm "post_attention_layernorm" (rmsnorm_swiglu.fuse:14)
//     rmsnorm bf16 -> bf16
//
// Name expression (NVRTC):
//   opfuse::rmsnorm_fwd<__nv_bfloat16, __nv_bfloat16, 4096, false, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormFwdParams<__nv_bfloat16, __nv_bfloat16>
#include "norm.cuh"

template __global__ void opfuse::rmsnorm_fwd<__nv_bfloat16, __nv_bfloat16, 4096, false, false>(opfuse::NormFwdParams<__nv_bfloat16, __nv_bfloat16>);
