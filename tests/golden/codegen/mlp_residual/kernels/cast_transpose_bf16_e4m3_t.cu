// opfuse generated kernel cast_transpose_bf16_e4m3_t
// Written by fusec from mlp_residual.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence fc1, forward:
//     cast_fp8 "up_proj.weight" (mlp_residual.fuse:21)
//     cast bf16 -> e4m3 + transposed copy
//     quantizers: up_proj.weight (e4m3)
//   sequence fc2, forward:
//     cast_fp8 "down_proj.weight" (mlp_residual.fuse:30)
//     cast bf16 -> e4m3 + transposed copy
//     quantizers: down_proj.weight (e4m3)
//
// Name expression (NVRTC):
//   opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false>
// Parameter, by value (templates/README.md):
//   opfuse::CastParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "cast_transpose.cuh"

template __global__ void opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false>(opfuse::CastParams<__nv_bfloat16, __nv_fp8_e4m3>);
