// opfuse generated kernel update_scales_256
// Written by fusec from gelu_bias_mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gpt_mlp, backward:
//     the end-of-step scale update
//     update every quantizer's amax history, scale and scale_inv (delayed scaling)
//     quantizers: c_fc.input (e4m3), c_fc.weight (e4m3), c_fc.grad_output (e5m2), c_proj.input (e4m3), c_proj.weight (e4m3), c_proj.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::update_scales<256>
// Parameter, by value (templates/README.md):
//   opfuse::ScaleUpdateParams
#include "scale_update.cuh"

template __global__ void opfuse::update_scales<256>(opfuse::ScaleUpdateParams);
