// opfuse generated kernel cast_transpose_bf16_e5m2_t_dbias
// Written by fusec from gelu_bias_mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gpt_mlp, backward, fused cast_dbias:
//     bias_grad "c_proj" (gelu_bias_mlp.fuse:17)
//     cast_fp8 "c_proj.grad_output" (gelu_bias_mlp.fuse:17)
//     cast bf16 -> e5m2 + transposed copy + dbias partial sums
//     quantizers: c_proj.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, true, true>
// Parameter, by value (templates/README.md):
//   opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "cast_transpose.cuh"

template __global__ void opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e5m2, true, true>(opfuse::CastParams<__nv_bfloat16, __nv_fp8_e5m2>);
