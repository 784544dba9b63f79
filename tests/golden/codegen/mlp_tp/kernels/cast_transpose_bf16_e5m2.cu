// opfuse generated kernel cast_transpose_bf16_e5m2
// Written by fusec from mlp_tp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, backward:
//     cast_fp8 "fc2.grad_output" (mlp_tp.fuse:17)
//     cast bf16 -> e5m2
//     quantizers: fc2.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, false, false>
// Parameter, by value (templates/README.md):
//   opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "cast_transpose.cuh"

template __global__ void opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, false, false>(opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>);
