// opfuse generated kernel cast_transpose_bf16_e5m2_t_dbias
// Written by fusec from norm_ops_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence norm_mlp, backward, fused cast_dbias:
//     bias_grad "fc2" (norm_ops_block.fuse:21)
//     cast_fp8 "fc2.grad_output" (norm_ops_block.fuse:21)
//     cast bf16 -> e5m2 + transposed copy + dbias partial sums
//     quantizers: fc2.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, true, true>
// Parameter, by value (templates/README.md):
//   opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "cast_transpose.cuh"

template __global__ void opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, true, true>(opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>);
