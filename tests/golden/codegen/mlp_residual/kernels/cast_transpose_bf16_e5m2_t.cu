// opfuse generated kernel cast_transpose_bf16_e5m2_t
// Written by fusec from mlp_residual.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence fc2, backward:
//     cast_fp8 "down_proj.grad_output" (mlp_residual.fuse:30)
//     cast bf16 -> e5m2 + transposed copy
//     quantizers: down_proj.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, true, false>
// Parameter, by value (templates/README.md):
//   opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "cast_transpose.cuh"

template __global__ void opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, true, false>(opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>);
