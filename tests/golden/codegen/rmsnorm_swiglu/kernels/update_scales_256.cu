// opfuse generated kernel update_scales_256
// Written by fusec from rmsnorm_swiglu.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence llama_mlp, forward:
//     cast_fp8 "gate_up_proj.input" (rmsnorm_swiglu.fuse:15)
//     scale of quantizer gate_up_proj.input from its amax (current scaling)
//     quantizers: gate_up_proj.input (e4m3)
//   sequence llama_mlp, forward:
//     cast_fp8 "gate_up_proj.weight" (rmsnorm_swiglu.fuse:15)
//     scale of quantizer gate_up_proj.weight from its amax (current scaling)
//     quantizers: gate_up_proj.weight (e4m3)
//   sequence llama_mlp, forward:
//     cast_fp8 "down_proj.input" (rmsnorm_swiglu.fuse:17)
//     scale of quantizer down_proj.input from its amax (current scaling)
//     quantizers: down_proj.input (e4m3)
//   sequence llama_mlp, forward:
//     cast_fp8 "down_proj.weight" (rmsnorm_swiglu.fuse:17)
//     scale of quantizer down_proj.weight from its amax (current scaling)
//     quantizers: down_proj.weight (e4m3)
//   sequence llama_mlp, backward:
//     cast_fp8 "down_proj.grad_output" (rmsnorm_swiglu.fuse:17)
//     scale of quantizer down_proj.grad_output from its amax (current scaling)
//     quantizers: down_proj.grad_output (e5m2)
//   sequence llama_mlp, backward:
//     cast_fp8 "gate_up_proj.grad_output" (rmsnorm_swiglu.fuse:15)
//     scale of quantizer gate_up_proj.grad_output from its amax (current scaling)
//     quantizers: gate_up_proj.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::update_scales<256>
// Parameter, by value (templates/README.md):
//   opfuse::ScaleUpdateParams
#include "scale_update.cuh"

template __global__ void opfuse::update_scales<256>(opfuse::ScaleUpdateParams);
