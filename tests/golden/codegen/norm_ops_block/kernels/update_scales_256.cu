// opfuse generated kernel update_scales_256
// Written by fusec from norm_ops_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence norm_mlp, backward:
//     the end-of-step scale update
//     update every quantizer's amax history, scale and scale_inv (delayed scaling)
//     quantizers: fc1.input (e4m3), fc1.weight (e4m3), fc1.grad_output (e5m2), fc2.input (e4m3), fc2.weight (e4m3), fc2.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::update_scales<256>
// Parameter, by value (templates/README.md):
//   opfuse::ScaleUpdateParams
#include "scale_update.cuh"

template __global__ void opfuse::update_scales<256>(opfuse::ScaleUpdateParams);
