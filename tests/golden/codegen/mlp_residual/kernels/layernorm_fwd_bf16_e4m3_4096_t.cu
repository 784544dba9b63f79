// opfuse generated kernel layernorm_fwd_bf16_e4m3_4096_t
// Written by fusec from mlp_residual.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence fc1, forward, fused norm_cast:
//     layernorm "layernorm_0" (mlp_residual.fuse:20)
//     cast_fp8 "up_proj.input" (mlp_residual.fuse:21)
//     layernorm bf16 -> e4m3 + transposed copy
//     quantizers: up_proj.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::layernorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 4096, false, true>
// Parameter, by value (templates/README.md):
//   opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "norm.cuh"

template __global__ void opfuse::layernorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 4096, false, true>(opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
