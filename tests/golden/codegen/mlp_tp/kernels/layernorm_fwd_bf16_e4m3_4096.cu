// opfuse generated kernel layernorm_fwd_bf16_e4m3_4096
// Written by fusec from mlp_tp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, forward, fused norm_cast:
//     layernorm "layernorm_0" (mlp_tp.fuse:14)
//     cast_fp8 "fc1.input" (mlp_tp.fuse:15)
//     layernorm bf16 -> e4m3
//     quantizers: fc1.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::layernorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 4096, false, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "norm.cuh"

template __global__ void opfuse::layernorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 4096, false, false>(opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
