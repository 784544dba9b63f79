// opfuse generated kernel layernorm_fwd_bf16_e4m3_1024
// Written by fusec from gelu_bias_mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gpt_mlp, forward, fused norm_cast:
//     layernorm "ln_2" (gelu_bias_mlp.fuse:14)
//     cast_fp8 "c_fc.input" (gelu_bias_mlp.fuse:15)
//     layernorm bf16 -> e4m3 (inference: without the transposed copy)
//     quantizers: c_fc.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::layernorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 1024, false, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "norm.cuh"

template __global__ void opfuse::layernorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 1024, false, false>(opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
