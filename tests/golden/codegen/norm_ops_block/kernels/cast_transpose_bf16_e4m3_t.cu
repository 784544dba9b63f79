// opfuse generated kernel cast_transpose_bf16_e4m3_t
// Written by fusec from norm_ops_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence norm_mlp, forward:
//     cast_fp8 "fc1.input" (norm_ops_block.fuse:19)
//     cast bf16 -> e4m3 + transposed copy
//     quantizers: fc1.input (e4m3)
//   sequence norm_mlp, forward:
//     cast_fp8 "fc1.weight" (norm_ops_block.fuse:19)
//     cast bf16 -> e4m3 + transposed copy
//     quantizers: fc1.weight (e4m3)
//   sequence norm_mlp, forward:
//     cast_fp8 "fc2.weight" (norm_ops_block.fuse:21)
//     cast bf16 -> e4m3 + transposed copy
//     quantizers: fc2.weight (e4m3)
//
// Name expression (NVRTC):
//   opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false>
// Parameter, by value (templates/README.md):
//   opfuse::CastParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "cast_transpose.cuh"

template __global__ void opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false>(opfuse::CastParams<__nv_bfloat16, __nv_fp8_e4m3>);
