// opfuse generated kernel cast_transpose_bf16_e4m3_t
// Written by fusec from gemma_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gemma_mlp, forward:
//     cast_fp8 "gate_up.weight" (gemma_block.fuse:21)
//     cast bf16 -> e4m3 + transposed copy
//     quantizers: gate_up.weight (e4m3)
//   sequence gemma_mlp, forward:
//     cast_fp8 "down.weight" (gemma_block.fuse:23)
//     cast bf16 -> e4m3 + transposed copy
//     quantizers: down.weight (e4m3)
//
// Name expression (NVRTC):
//   opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false>
// Parameter, by value (templates/README.md):
//   opfuse::CastParams<__nv_bfloat16, __nv_fp8_e4m3>
#include "cast_transpose.cuh"

template __global__ void opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false>(opfuse::CastParams<__nv_bfloat16, __nv_fp8_e4m3>);
