// opfuse generated kernel amax_reduce_bf16
// Written by fusec from rmsnorm_swiglu.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence llama_mlp, forward:
//     cast_fp8 "gate_up_proj.weight" (rmsnorm_swiglu.fuse:15)
//     amax of bf16 and the scale of quantizer gate_up_proj.weight (current scaling)
//     quantizers: gate_up_proj.weight (e4m3)
//   sequence llama_mlp, forward:
//     cast_fp8 "down_proj.weight" (rmsnorm_swiglu.fuse:17)
//     amax of bf16 and the scale of quantizer down_proj.weight (current scaling)
//     quantizers: down_proj.weight (e4m3)
//   sequence llama_mlp, backward:
//     cast_fp8 "down_proj.grad_output" (rmsnorm_swiglu.fuse:17)
//     amax of bf16 and the scale of quantizer down_proj.grad_output (current scaling)
//     quantizers: down_proj.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::amax_reduce<__nv_bfloat16>
// Parameter, by value (templates/README.md):
//   opfuse::AmaxParams<__nv_bfloat16>
#include "amax.cuh"

template __global__ void opfuse::amax_reduce<__nv_bfloat16>(opfuse::AmaxParams<__nv_bfloat16>);
