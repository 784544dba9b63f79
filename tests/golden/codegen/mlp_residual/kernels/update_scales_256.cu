// opfuse generated kernel update_scales_256
// Written by fusec from mlp_residual.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence fc1, backward:
//     the end-of-step scale update
//     update every quantizer's amax history, scale and scale_inv (delayed scaling)
//     quantizers: up_proj.input (e4m3), up_proj.weight (e4m3), up_proj.grad_output (e5m2), h (e4m3)
//   sequence fc2, backward:
//     the end-of-step scale update
//     update every quantizer's amax history, scale and scale_inv (delayed scaling)
//     quantizers: h (e4m3), down_proj.weight (e4m3), down_proj.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::update_scales<256>
// Parameter, by value (templates/README.md):
//   opfuse::ScaleUpdateParams
#include "scale_update.cuh"

template __global__ void opfuse::update_scales<256>(opfuse::ScaleUpdateParams);
