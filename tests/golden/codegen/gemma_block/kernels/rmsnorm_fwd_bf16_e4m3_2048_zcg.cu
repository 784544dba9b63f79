// opfuse generated kernel rmsnorm_fwd_bf16_e4m3_2048_zcg
// Written by fusec from gemma_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gemma_mlp, forward, fused norm_cast:
//     rmsnorm "rmsnorm_0" (gemma_block.fuse:20)
//     cast_fp8 "gate_up.input" (gemma_block.fuse:21)
//     rmsnorm bf16 -> e4m3 (inference: without the transposed copy)
//     quantizers: gate_up.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::rmsnorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 2048, true, false>
// Parameter, by value (templates/README.md):
//   opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "norm.cuh"

template __global__ void opfuse::rmsnorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 2048, true, false>(opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>);
